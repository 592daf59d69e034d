//! `FileHeader::decode` of arbitrary bytes under the fixed key: no panic; failures are
//! integrity errors; a header that verifies has only known flags and re-encodes to exactly
//! its first 36 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::content::header::{FLAG_SPARSE, HEADER_LEN};
use veilfs_core::content::FileHeader;
use veilfs_core::Error;
use veilfs_fuzz::subkeys;

fuzz_target!(|data: &[u8]| {
    match FileHeader::decode(data, subkeys(), "fuzz") {
        Ok(h) => {
            assert!(data.len() >= HEADER_LEN);
            assert_eq!(h.flags & !FLAG_SPARSE, 0, "unknown flag accepted");
            assert_eq!(&h.encode(subkeys())[..], &data[..HEADER_LEN], "header does not re-encode to itself");
        }
        Err(e) => assert!(matches!(e, Error::Auth { .. }), "decode error of the wrong kind: {e:?}"),
    }
});
