//! `VaultConfig::parse` of arbitrary bytes: never panics; every error is a config error;
//! whatever parses has a valid structure and survives a serialize/parse round trip; and a
//! config that the fixed recovery key unlocks authenticates and re-seals to the same MAC.
//! No password unlock: Argon2 costs are what the config says, not what a fuzzer can afford.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use veilfs_core::config::{FEATURES_V1, FORMAT_NAME, FORMAT_VERSION};
use veilfs_core::{Error, Secret, VaultConfig};
use veilfs_fuzz::recovery_key;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz/veilfs.conf");
    let cfg = match VaultConfig::parse(data, path) {
        Ok(cfg) => cfg,
        Err(e) => {
            assert!(matches!(e, Error::Config { .. }), "parse error of the wrong kind: {e:?}");
            return;
        }
    };
    assert_eq!(cfg.format, FORMAT_NAME);
    assert_eq!(cfg.version, FORMAT_VERSION);
    assert!(cfg.block_size.is_power_of_two() && (512..=1 << 20).contains(&cfg.block_size));
    assert!(FEATURES_V1.iter().all(|f| cfg.features.iter().any(|x| x == f)));
    assert!(cfg.root_iv().is_some());
    assert!(!cfg.slots.is_empty());

    let text = serde_json::to_vec(&cfg).expect("a parsed config serializes");
    let again = VaultConfig::parse(&text, path).expect("a serialized config parses");
    assert_eq!(again, cfg, "serialize/parse round trip changed the config");

    match cfg.unlock(&Secret::Recovery(recovery_key()), None, path) {
        Ok(master) => {
            cfg.verify(&master, path).expect("an unlocked config verifies");
            let mut resealed = cfg.clone();
            resealed.seal(&master);
            assert_eq!(resealed.mac, cfg.mac, "re-sealing an authentic config changed its MAC");
        }
        Err(e) => assert!(
            matches!(e, Error::WrongPassword | Error::Config { .. } | Error::Invalid(_)),
            "unlock error of the wrong kind: {e:?}"
        ),
    }
});
