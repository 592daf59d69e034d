//! `stash::Records::parse` of arbitrary bytes (an inner-block stash `veilfs.S.<id>`,
//! docs/FORMAT.md §5.9, which a file found UNSETTLED reads): input `record size selector
//! (u16 BE) ‖ file blocks selector (u16 BE) ‖ stash bytes`. Never panics; every block record
//! found points at a whole payload inside the input and at a block below the file's end;
//! every range listed is below the file's end, and every block in it has something said of it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::stash::{Kept, Records, RECORD_HEAD};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    // A record is RECORD_HEAD + one inner block's ciphertext: 24 bytes up to 8 KiB.
    let record = RECORD_HEAD + 8 + usize::from(u16::from_be_bytes([data[0], data[1]]) % 8192);
    let blocks = u64::from(u16::from_be_bytes([data[2], data[3]]));
    let stash = &data[4..];
    let r = Records::parse(stash, record, blocks);
    let ranges = r.ranges();
    assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0), "ranges in order, disjoint and apart");
    for &(a, b) in &ranges {
        assert!(a < b && b <= blocks, "range {a}..{b} empty or past the file's {blocks} blocks");
        // Every block of a range has something said of it: check its ends and middle.
        for n in [a, a + (b - a) / 2, b - 1] {
            let kept = r.of(n);
            assert!(!kept.is_empty(), "block {n} in a range with nothing said of it");
            for k in kept {
                if let Kept::Block(off) = k {
                    let start = off as usize - RECORD_HEAD;
                    assert_eq!(start % record, 0, "a payload offset off the record grid");
                    assert!(start + record <= stash.len(), "a payload past the stash's end");
                }
            }
        }
    }
    assert!(r.of(blocks).is_empty(), "something said of the block past the end");
});
