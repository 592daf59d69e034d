//! The key slot list as unlocking walks it: `VaultConfig::parse` and then
//! `unlock_with` of arbitrary bytes, with the fixed cheap password or the fixed recovery key
//! and an Argon2 ceiling at the seed slots' cost (a slot asking for more is skipped before
//! anything is derived). Input: `selector ‖ veilfs.conf bytes`; selector bit 0: recovery key
//! instead of password; bit 1: only the slot numbered by bits 2..5. Never panics, every
//! error is a wrong-secret, config or usage error, and a key that a slot unwraps either
//! verifies the config's MAC or fails it with a config error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use veilfs_core::{Error, Secret, VaultConfig};
use veilfs_fuzz::{recovery_key, PASSWORD, SLOTS_CEILING};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, conf)) = data.split_first() else { return };
    let path = Path::new("fuzz/veilfs.conf");
    let Ok(cfg) = VaultConfig::parse(conf, path) else { return };
    let secret =
        if sel & 1 == 0 { Secret::Password(PASSWORD.to_string().into()) } else { Secret::Recovery(recovery_key()) };
    let only = (sel & 2 != 0).then_some(u32::from(sel >> 2 & 0xf));
    match cfg.unlock_with(&secret, only, path, &SLOTS_CEILING) {
        Ok(master) => match cfg.verify(&master, path) {
            Ok(()) => {}
            Err(e) => assert!(matches!(e, Error::Config { .. }), "verify error of the wrong kind: {e:?}"),
        },
        Err(e) => assert!(
            matches!(e, Error::WrongPassword | Error::Config { .. } | Error::Invalid(_)),
            "unlock error of the wrong kind: {e:?}"
        ),
    }
});
