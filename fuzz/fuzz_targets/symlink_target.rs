//! `Vault::decrypt_target` (symlink targets) for both ciphers on an in-memory vault of the
//! fixed key (input: cipher selector ‖ symlink identity (16) ‖ stored target). Invariants:
//! no panic; failures are integrity errors; a target that opens has the expected length,
//! does not open for another identity, and round-trips through `encrypt_target`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::names::b64_decode;
use veilfs_core::Error;
use veilfs_fuzz::{split_id, vault};

fuzz_target!(|data: &[u8]| {
    let Some((cipher, id, stored)) = split_id(data) else { return };
    let v = vault(cipher);
    match v.decrypt_target(&id, stored, "fuzz") {
        Ok(t) => {
            let blob = b64_decode(std::str::from_utf8(stored).expect("opened, so text")).expect("opened, so base64");
            assert_eq!(t.len() + 16 + cipher.overhead(), blob.len());
            let mut other = id;
            other[15] ^= 1;
            assert!(v.decrypt_target(&other, stored, "fuzz").is_err(), "target opened for another identity");
            let again = v.encrypt_target(&id, &t).expect("a stored target re-encrypts");
            assert_eq!(v.decrypt_target(&id, &again, "fuzz").expect("round trip"), t);
        }
        Err(e) => assert!(matches!(e, Error::Auth { .. }), "decrypt error of the wrong kind: {e:?}"),
    }
});
