//! `lock::Holder::parse` of arbitrary bytes, read as the lock reader does (lossy UTF-8) from
//! the lock file `veilfs.lock` (a file anyone who can write CIPHERDIR can write): never
//! panics; a holder is named only by a pid or a host; describing it (the text a refused
//! mount prints) never panics and is one line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::lock::Holder;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(h) = Holder::parse(&text) {
        assert!(h.pid != 0 || !h.host.is_empty(), "a holder without pid or host: {h:?}");
        let said = h.describe();
        assert!(!said.is_empty());
        assert!(!said.contains('\n'), "a holder described on two lines: {said:?}");
    }
});
