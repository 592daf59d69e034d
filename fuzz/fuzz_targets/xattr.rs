//! Extended attribute records: `XattrCipher::decrypt_name` of an arbitrary stored name and
//! `decrypt_value` of an arbitrary blob for both ciphers (input: cipher selector ‖ object
//! identity (16) ‖ stored name ‖ NUL ‖ value blob; no NUL: name only). Invariants: no panic;
//! only `user.veilfs.` names are ours, and of those the continuations of long values
//! (`user.veilfs.+…`, feature "overflow") are not names; a name that decrypts is a valid `user.` name and
//! re-encrypts to the same stored name; a value that opens has the expected length, opens
//! only on its own object, and round-trips through `encrypt_value`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::xattr::{MORE_PREFIX, STORED_PREFIX, USER_PREFIX};
use veilfs_core::Error;
use veilfs_fuzz::{split_id, split_nul, xattr};

fuzz_target!(|data: &[u8]| {
    let Some((cipher, id, rest)) = split_id(data) else { return };
    let (stored, value) = split_nul(rest);
    let x = xattr(cipher);
    match x.decrypt_name(&id, stored) {
        None => assert!(
            !stored.starts_with(STORED_PREFIX.as_bytes()) || stored.starts_with(MORE_PREFIX.as_bytes()),
            "one of our names was not recognized"
        ),
        Some(Ok(name)) => {
            assert!(name.starts_with(USER_PREFIX), "decrypted a name outside user.");
            let again = x.encrypt_name(&id, &name).expect("a decrypted name re-encrypts");
            assert_eq!(again.as_bytes(), stored, "name does not re-encrypt to itself");
        }
        Some(Err(e)) => assert!(matches!(e, Error::Auth { .. }), "name error of the wrong kind: {e:?}"),
    }
    let (Some(blob), Ok(stored)) = (value, std::str::from_utf8(stored)) else { return };
    match x.decrypt_value(&id, stored, blob) {
        Ok(v) => {
            assert_eq!(v.len() + x.value_overhead(), blob.len());
            let mut other = id;
            other[0] ^= 1;
            assert!(x.decrypt_value(&other, stored, blob).is_err(), "value opened on another object");
            let sealed = x.encrypt_value(&id, stored, &v);
            assert_eq!(x.decrypt_value(&id, stored, &sealed).expect("round trip"), v);
        }
        Err(e) => assert!(matches!(e, Error::Auth { .. }), "value error of the wrong kind: {e:?}"),
    }
});
