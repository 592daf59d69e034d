//! Property tests: the file API against a plain `Vec<u8>` model, for every size from 0 to a
//! few blocks, random writes (including past EOF), truncates up and down, and reopening.

use crate::common::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Write { off: u64, len: usize, seed: u8 },
    Truncate(u64),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..5 * 4096, 1usize..3 * 4096, any::<u8>()).prop_map(|(off, len, seed)| Op::Write { off, len, seed }),
        1 => (0u64..6 * 4096).prop_map(Op::Truncate),
        1 => (0u64..2_000_000).prop_map(Op::Truncate),
        1 => Just(Op::Reopen),
    ]
}

fn check_equal(v: &veilfs_core::Vault, root: &veilfs_core::CipherDir, model: &[u8]) {
    let got = read_file(v, root, "f").unwrap();
    assert_eq!(got.len(), model.len(), "size");
    assert!(got == model, "content differs");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn file_matches_model(ops in prop::collection::vec(op(), 1..25), defer in any::<bool>()) {
        let t = tempfile::tempdir().unwrap();
        let v = new_vault(t.path());
        let root = v.root().unwrap();
        let (_e, mut f) = v.create_file(&root, b"f", 0o644).unwrap();
        f.set_defer_sparse(defer);
        let mut model: Vec<u8> = Vec::new();
        for op in ops {
            let size = model.len() as u64;
            match op {
                Op::Write { off, len, seed } => {
                    let d = data(len, seed);
                    let new = f.write_at(&d, off, size).unwrap();
                    let end = off as usize + len;
                    if model.len() < end { model.resize(end, 0); }
                    model[off as usize..end].copy_from_slice(&d);
                    prop_assert_eq!(new, model.len() as u64);
                }
                Op::Truncate(n) => {
                    f.truncate(n, size).unwrap();
                    model.resize(n as usize, 0);
                }
                Op::Reopen => {
                    f.settle().unwrap();
                    let e = v.lookup(&root, b"f").unwrap().unwrap();
                    f = v.open_file(&root, &e, libc::O_RDWR).unwrap();
                    f.set_defer_sparse(defer);
                }
            }
            prop_assert_eq!(f.plain_size().unwrap(), model.len() as u64);
        }
        f.settle().unwrap();
        check_equal(&v, &root, &model);
        // Partial reads at random places agree too.
        let size = model.len() as u64;
        for (off, len) in [(0u64, 1usize), (4095, 2), (4096, 4096), (size / 2, 10_000), (size.saturating_sub(1), 5)] {
            let mut buf = vec![0u8; len];
            let n = f.read_at(&mut buf, off, size).unwrap();
            let want = &model[(off.min(size)) as usize..((off + len as u64).min(size)) as usize];
            prop_assert_eq!(&buf[..n], want);
        }
    }

    #[test]
    fn every_small_size_round_trips(len in 0usize..(4 * 4096 + 2)) {
        let t = tempfile::tempdir().unwrap();
        let v = new_vault(t.path());
        let root = v.root().unwrap();
        let d = data(len, 42);
        write_file(&v, &root, "f", &d);
        prop_assert_eq!(read_file(&v, &root, "f").unwrap(), d);
        let on_disk = std::fs::metadata(cipher_path(&v, &root, "f")).unwrap().len();
        let l = v.content().layout;
        let want = match v.content().block_map {
            true => veilfs_core::content::blockmap::MapLayout::from(l).cipher_size(len as u64),
            false => l.cipher_size(len as u64),
        };
        prop_assert_eq!(on_disk, want);
    }
}

#[test]
fn sparse_file_reads_back_and_stays_sparse() {
    let t = tempfile::tempdir().unwrap();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    let (_e, f) = v.create_file(&root, b"sparse", 0o644).unwrap();
    let size = 64u64 << 20;
    f.truncate(size, 0).unwrap();
    f.write_at(b"middle", 32 << 20, size).unwrap();
    let p = cipher_path(&v, &root, "sparse");
    let blocks = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&p).unwrap());
    assert!(blocks * 512 < 1 << 20, "a 64 MiB sparse file should use almost no disk, uses {} bytes", blocks * 512);
    let mut buf = vec![1u8; 1 << 20];
    let n = f.read_at(&mut buf, 0, size).unwrap();
    assert_eq!(n, 1 << 20);
    assert!(buf.iter().all(|&b| b == 0));
    let mut m = [0u8; 6];
    f.read_at(&mut m, 32 << 20, size).unwrap();
    assert_eq!(&m, b"middle");
}

#[test]
fn a_new_empty_file_is_zero_bytes_on_disk_and_an_emptied_one_at_most_a_header() {
    let t = tempfile::tempdir().unwrap();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    let (e, f) = v.create_file(&root, b"empty", 0o644).unwrap();
    assert_eq!(std::fs::metadata(root.path.join(&e.on_disk)).unwrap().len(), 0);
    f.write_at(b"x", 0, 0).unwrap();
    f.truncate(0, 1).unwrap();
    // Emptied, a block-map file keeps a header of 0 blocks, so that its generation goes on
    // (FORMAT.md §5.10; a v1 file is cut to 0 bytes).
    let want = if v.content().block_map { veilfs_core::content::blockmap::HEADER_V2_LEN as u64 } else { 0 };
    assert_eq!(std::fs::metadata(root.path.join(&e.on_disk)).unwrap().len(), want);
    assert_eq!(read_file(&v, &root, "empty").unwrap(), b"");
}

/// The header's SPARSE flag (bit 0 of the flags after the version).
fn sparse_flag(p: &std::path::Path) -> bool {
    let h = std::fs::read(p).unwrap();
    h[3] & 1 == 1
}

#[test]
fn deferred_holes_filled_before_settle_do_not_make_the_file_sparse() {
    let t = tempfile::tempdir().unwrap();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    let (_e, f) = v.create_file(&root, b"f", 0o644).unwrap();
    f.set_defer_sparse(true);
    let mib = 1usize << 20;
    // Write-back order as seen from a multi-threaded daemon: the second MiB first.
    let (a, b) = (data(mib, 1), data(mib, 2));
    assert_eq!(f.write_at(&b, mib as u64, 0).unwrap(), 2 * mib as u64);
    // Before the hole is filled it reads as zeros (the mount's own view).
    let mut buf = vec![1u8; 4096];
    f.read_at(&mut buf, 8192, 2 * mib as u64).unwrap();
    assert!(buf.iter().all(|&x| x == 0));
    f.write_at(&a, 0, 2 * mib as u64).unwrap();
    f.settle().unwrap();
    let p = cipher_path(&v, &root, "f");
    assert!(!sparse_flag(&p), "a file whose holes were filled must not be marked SPARSE");
    let mut want = a.clone();
    want.extend_from_slice(&b);
    assert_eq!(read_file(&v, &root, "f").unwrap(), want);
    // A zeroed block of a non-sparse file is an integrity error, not zeros.
    let cb = v.content().layout.cipher_block();
    let fd = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&fd, &vec![0u8; cb as usize], v.content().layout.block_offset(3)).unwrap();
    assert!(read_file(&v, &root, "f").is_err());
}

#[test]
fn deferred_holes_are_declared_before_they_are_made_and_read_as_zeros_after_a_crash() {
    // A v1 vault with "unsettled-tails" (FORMAT.md §5.5, §5.8): SPARSE goes out, provisionally,
    // before the write that makes the hole; a hole still open at sync keeps it. (A block-map
    // file authenticates its holes by their zero leaves instead, §5.10.)
    let t = tempfile::tempdir().unwrap();
    let v = new_v1_vault(t.path());
    let root = v.root().unwrap();
    let (_e, f) = v.create_file(&root, b"settled", 0o644).unwrap();
    f.set_defer_sparse(true);
    f.write_at(b"tail", 100_000, 0).unwrap();
    let p = cipher_path(&v, &root, "settled");
    assert!(sparse_flag(&p), "SPARSE must be written before the hole is made");
    f.sync(true).unwrap(); // sync settles
    assert!(sparse_flag(&p), "an unfilled hole must stay declared");
    assert_eq!(std::fs::read(&p).unwrap()[3] & 2, 0, "sync clears UNSETTLED");
    let mut want = vec![0u8; 100_000];
    want.extend_from_slice(b"tail");
    assert_eq!(read_file(&v, &root, "settled").unwrap(), want);

    // "Crash": the process goes away before settle. The holes read as zeros.
    let (_e, g) = v.create_file(&root, b"crashed", 0o644).unwrap();
    g.set_defer_sparse(true);
    g.write_at(b"tail", 100_000, 0).unwrap();
    std::mem::forget(g);
    assert_eq!(read_file(&v, &root, "crashed").unwrap(), want);
}
