//! A write the kernel's write-back cache had acknowledged, refused later by a full disk
//! (`CryptFile::lost_write`): at the last close (`CryptFile::drop_lost`) the file is cut at the
//! hole the refused write left, so settling never declares that hole as zeros; a size that a
//! truncate set is kept. tests/faults.rs runs the same through a real mount on a full tmpfs.

use crate::common::*;

const B: usize = 4096;

#[test]
fn a_lost_write_back_cuts_the_file_at_its_hole_instead_of_declaring_zeros() {
    let d = tempfile::tempdir().unwrap();
    let v = new_vault(d.path());
    let root = v.root().unwrap();
    let a = data(8 * B, 1);
    // Blocks 0-1, then 6-7 (as a later write-back worker sends them): 2..6 is a hole not yet
    // declared, where the refused write of blocks 2..6 should have gone.
    let (_, f) = v.create_file(&root, b"f", 0o644).unwrap();
    f.set_defer_sparse(true);
    let size = f.write_at(&a[..2 * B], 0, 0).unwrap();
    let size = f.write_at(&a[6 * B..], 6 * B as u64, size).unwrap();
    assert_eq!(size, 8 * B as u64);
    f.lost_write(2 * B as u64);
    assert_eq!(f.drop_lost().unwrap(), Some(2 * B as u64), "cut at the lost write's hole");
    f.settle().unwrap();
    drop(f);
    assert_eq!(read_file(&v, &root, "f").unwrap(), a[..2 * B], "a prefix of what was written");

    // Without a lost write the same hole is the application's: it stays, as zeros.
    let (_, g) = v.create_file(&root, b"g", 0o644).unwrap();
    g.set_defer_sparse(true);
    let size = g.write_at(&a[..2 * B], 0, 0).unwrap();
    g.write_at(&a[6 * B..], 6 * B as u64, size).unwrap();
    assert_eq!(g.drop_lost().unwrap(), None);
    g.settle().unwrap();
    drop(g);
    let mut want = a.clone();
    want[2 * B..6 * B].fill(0);
    assert_eq!(read_file(&v, &root, "g").unwrap(), want);

    // A size set by truncate was confirmed: never cut below it (unstored data there reads
    // as the zeros the truncate promised).
    let (_, h) = v.create_file(&root, b"h", 0o644).unwrap();
    h.set_defer_sparse(true);
    h.truncate(8 * B as u64, 0).unwrap();
    h.write_at(&a[6 * B..], 6 * B as u64, 8 * B as u64).unwrap();
    h.lost_write(0);
    assert_eq!(h.drop_lost().unwrap(), Some(8 * B as u64), "kept at the truncate's size");
    h.settle().unwrap();
    drop(h);
    let mut want = vec![0u8; 6 * B];
    want.extend_from_slice(&a[6 * B..]);
    assert_eq!(read_file(&v, &root, "h").unwrap(), want);
}
