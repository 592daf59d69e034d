//! `ExchangeIntent::parse` of arbitrary bytes (an exchange's intent record, docs/FORMAT.md
//! §10, which the crash sweep and `fsck --repair` read from any directory): never panics;
//! what parses holds single names and a relative path without `..`, and encodes back to the
//! very input (one spelling per record); a record whose MAC verifies for the fixed name and
//! directory IVs verifies for no other name, no other directory and not with the two
//! directories swapped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::record::{ExchangeIntent, RecordError};
use veilfs_fuzz::{subkeys, RECORD_A_DIR_IV, RECORD_DIR_IV, RECORD_NAME};

fuzz_target!(|data: &[u8]| {
    let r = match ExchangeIntent::parse(data) {
        Ok(r) => r,
        Err(RecordError::Malformed(_) | RecordError::NoMac) => return,
        Err(e) => panic!("parse reported {e:?}"),
    };
    assert_eq!(r.encode().as_bytes(), data, "a record has one spelling");
    for n in [&r.a, &r.a_new, &r.b_new] {
        assert!(!n.is_empty() && !n.contains('/') && n != "." && n != "..", "not a name: {n:?}");
    }
    assert!(!r.a_dir.starts_with('/') && r.a_dir.split('/').all(|c| c != ".." && c != "."), "{:?}", r.a_dir);
    let k = subkeys();
    if r.verify(k, RECORD_NAME, &RECORD_DIR_IV, &RECORD_A_DIR_IV).is_ok() {
        assert!(r.verify(k, "veilfs.xchg.BBBBBBBBBBBBBBBB", &RECORD_DIR_IV, &RECORD_A_DIR_IV).is_err());
        assert!(r.verify(k, RECORD_NAME, &[0; 16], &RECORD_A_DIR_IV).is_err());
        assert!(r.verify(k, RECORD_NAME, &RECORD_A_DIR_IV, &RECORD_DIR_IV).is_err());
    }
});
