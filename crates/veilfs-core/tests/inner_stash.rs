//! Inner-block stashes (docs/FORMAT.md §5.9): an overwrite of an inner block that a crash
//! tears reads as the block being written (from its record, written just before), recovery
//! writes that back, and a stash is only ever trusted for what authenticates as that block
//! of that file.
//!
//! The tear is made by hand: the overwrite runs, then the second half of the block's old
//! ciphertext is put back, as a `pwrite` cut short between two pages leaves it; the file is
//! then dropped without settling, as by a crash. tests/crash.rs tears it in a real daemon
//! (points `file.inner_stashed` and `file.torn_inner`).

use crate::common::*;
use std::os::unix::fs::FileExt;
use veilfs_core::fsck::{Checker, ProblemKind};
use veilfs_core::stash::{RECORD_HEAD, RING};
use veilfs_core::{CipherDir, Vault};

const B: usize = 4096;

fn setup() -> (tempfile::TempDir, Vault, CipherDir) {
    let d = tempfile::tempdir().unwrap();
    // The inner-block stash is the v1 file format's (block-map files log their sessions).
    let v = new_v1_vault(d.path());
    let root = v.root().unwrap();
    (d, v, root)
}

fn stash_files(v: &Vault) -> Vec<String> {
    std::fs::read_dir(v.root_path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("veilfs.S."))
        .collect()
}

/// A file `name` holding `content`, settled, opened as a mount opens it (the only writer,
/// so its write sessions set UNSETTLED and stash).
fn settled_file(v: &Vault, root: &CipherDir, name: &str, content: &[u8]) -> veilfs_core::CryptFile {
    let (_, f) = v.create_file(root, name.as_bytes(), 0o644).unwrap();
    f.set_defer_sparse(true);
    f.write_at(content, 0, 0).unwrap();
    f.settle().unwrap();
    f
}

/// The second half of block `n`'s slot in the ciphertext: where a `pwrite` cut short
/// between two pages leaves the old bytes.
fn second_half(v: &Vault, n: u64) -> std::ops::Range<usize> {
    let l = v.content().layout;
    let (start, end) = (l.block_offset(n) as usize, l.block_offset(n + 1) as usize);
    start + (end - start) / 2..end
}

/// Writes `bytes` at `at` into the file at `path`, behind the vault's back.
fn overwrite(path: &std::path::Path, at: u64, bytes: &[u8]) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().write_all_at(bytes, at).unwrap();
}

/// The size of a stash record.
fn record_len(v: &Vault) -> u64 {
    RECORD_HEAD as u64 + v.content().layout.cipher_block()
}

/// Writes `old` (5 blocks) settled, then overwrites blocks 1..=2 with `new` in a write session
/// of a mount's kind and tears block 1's overwrite; returns the ciphertext path.
fn torn_overwrite(v: &Vault, root: &CipherDir, old: &[u8], new: &[u8]) -> std::path::PathBuf {
    let f = settled_file(v, root, "f", old);
    let path = cipher_path(v, root, "f");
    let before = std::fs::read(&path).unwrap();
    f.write_at(new, B as u64, old.len() as u64).unwrap();
    assert_eq!(stash_files(v).len(), 1, "the overwrite of inner blocks left no stash");
    let torn = second_half(v, 1);
    overwrite(&path, torn.start as u64, &before[torn]);
    drop(f); // a crash: never settled
    path
}

#[test]
fn torn_inner_overwrite_reads_the_block_being_written_and_recovery_writes_it_back() {
    let (_d, v, root) = setup();
    let (old, new) = (data(5 * B, 1), data(2 * B, 2));
    torn_overwrite(&v, &root, &old, &new);
    let mut want = old.clone();
    want[B..3 * B].copy_from_slice(&new);
    // Read-only, by the crash rules: block 1 from its record (new), block 2 new.
    assert_eq!(read_file(&v, &root, "f").unwrap(), want);
    // fsck reports the crash state, not damage; --repair settles it and the stash goes.
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.problems.iter().all(|p| p.kind == ProblemKind::Unsettled), "{:?}", r.problems);
    let r = Checker::new(&v, true, &|_| {}).run().unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    assert!(stash_files(&v).is_empty(), "settling left the stash");
    assert!(Checker::new(&v, false, &|_| {}).run().unwrap().problems.is_empty());
    assert_eq!(read_file(&v, &root, "f").unwrap(), want);
}

#[test]
fn without_the_stash_the_torn_block_is_an_integrity_error_not_garbage() {
    let (_d, v, root) = setup();
    torn_overwrite(&v, &root, &data(5 * B, 1), &data(2 * B, 2));
    for s in stash_files(&v) {
        std::fs::remove_file(v.root_path().join(s)).unwrap();
    }
    let e = read_file(&v, &root, "f").unwrap_err();
    assert!(matches!(e, veilfs_core::Error::Auth { .. }), "{e}");
}

#[test]
fn attack_forged_stash_records_are_never_read() {
    let (_d, v, root) = setup();
    torn_overwrite(&v, &root, &data(5 * B, 1), &data(2 * B, 2));
    let name = stash_files(&v).pop().unwrap();
    let path = v.root_path().join(&name);
    let rec = record_len(&v) as usize;
    let mut s = std::fs::read(&path).unwrap();
    // Flip a bit in every record's ciphertext (an attacker who writes the stash cannot
    // make a record that authenticates).
    for r in s.chunks_mut(rec) {
        r[RECORD_HEAD + 100] ^= 1;
    }
    std::fs::write(&path, &s).unwrap();
    assert!(matches!(read_file(&v, &root, "f"), Err(veilfs_core::Error::Auth { .. })));
}

#[test]
fn attack_stash_records_of_another_file_are_never_read() {
    let (_d, v, root) = setup();
    // Another file whose block 1 was stashed: its record, renamed to be f's stash.
    let g = settled_file(&v, &root, "g", &data(5 * B, 7));
    g.write_at(&data(B, 8), B as u64, 5 * B as u64).unwrap();
    let g_stash = stash_files(&v).pop().unwrap();
    let g_bytes = std::fs::read(v.root_path().join(&g_stash)).unwrap();
    drop(g);
    std::fs::remove_file(v.root_path().join(&g_stash)).unwrap();
    torn_overwrite(&v, &root, &data(5 * B, 1), &data(2 * B, 2));
    let f_stash = stash_files(&v).pop().unwrap();
    std::fs::write(v.root_path().join(&f_stash), &g_bytes).unwrap();
    assert!(matches!(read_file(&v, &root, "f"), Err(veilfs_core::Error::Auth { .. })));
}

#[test]
fn a_stash_beside_a_settled_file_is_not_read_and_fsck_removes_it() {
    let (_d, v, root) = setup();
    let f = settled_file(&v, &root, "f", &data(5 * B, 1));
    f.write_at(&data(B, 2), B as u64, 5 * B as u64).unwrap();
    let name = stash_files(&v).pop().unwrap();
    let kept = std::fs::read(v.root_path().join(&name)).unwrap();
    f.settle().unwrap();
    assert!(stash_files(&v).is_empty(), "settle did not remove the stash");
    drop(f);
    // Put back a stash (a crash between settling and removing it) and tear block 1: the file
    // is settled, so the stash is not consulted: the torn block is an error.
    std::fs::write(v.root_path().join(&name), &kept).unwrap();
    let path = cipher_path(&v, &root, "f");
    overwrite(&path, v.content().layout.block_offset(1) + 2000, &[0xff; 8]);
    assert!(matches!(read_file(&v, &root, "f"), Err(veilfs_core::Error::Auth { .. })));
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.problems.iter().any(|p| p.kind == ProblemKind::OrphanSideFile && p.detail.contains("stash")), "{r:?}");
    Checker::new(&v, true, &|_| {}).run().unwrap();
    assert!(stash_files(&v).is_empty(), "fsck --repair left the stash");
}

#[test]
fn the_stash_is_a_ring_and_a_shrink_starts_it_again() {
    let (_d, v, root) = setup();
    let size = 64 * B as u64;
    let f = settled_file(&v, &root, "f", &data(size as usize, 1));
    let rec = record_len(&v);
    let stash_len = || stash_files(&v).first().map_or(0, |n| std::fs::metadata(v.root_path().join(n)).unwrap().len());
    f.write_at(&data(3 * B, 2), B as u64, size).unwrap();
    assert_eq!(stash_len(), 3 * rec);
    // A rewrite of the final block alone is the tail's business (§5.8), not logged here; an
    // append past it logs the old final block's new inner ciphertext ("ordered-growth", §5.7).
    f.write_at(&data(50, 3), size - 100, size).unwrap();
    assert_eq!(stash_len(), 3 * rec);
    f.write_at(&data(B, 4), size - 100, size).unwrap();
    assert_eq!(stash_len(), 4 * rec);
    let size = size + B as u64 - 100;
    // 24 MiB of overwrites: the stash stays within its ring.
    for i in 0..(24 << 20) / (8 * B) {
        f.write_at(&data(8 * B, i as u8), (i % 7 * 8 * B) as u64, size).unwrap();
    }
    assert!(stash_len() <= RING + 8 * rec, "{} bytes", stash_len());
    // A torn overwrite after the ring started again still reads the block being written.
    f.truncate(3 * B as u64, size).unwrap();
    assert_eq!(stash_len(), 0, "a shrink starts the session's stash again");
    f.write_at(&data(10, 5), 0, 3 * B as u64).unwrap();
    assert_eq!(stash_len(), rec);
    f.settle().unwrap();
    assert!(stash_files(&v).is_empty());
}

#[test]
fn torn_overwrite_after_the_ring_started_again_reads_the_block_being_written() {
    let (_d, v, root) = setup();
    let size = 64 * B as u64;
    let f = settled_file(&v, &root, "f", &data(size as usize, 1));
    for i in 0..(12 << 20) / (8 * B) {
        f.write_at(&data(8 * B, i as u8), (i % 7 * 8 * B) as u64, size).unwrap();
    }
    let path = cipher_path(&v, &root, "f");
    let before = std::fs::read(&path).unwrap();
    let new = data(B, 99);
    f.write_at(&new, 5 * B as u64, size).unwrap();
    let torn = second_half(&v, 5);
    overwrite(&path, torn.start as u64, &before[torn]);
    drop(f);
    let got = read_file(&v, &root, "f").unwrap();
    assert_eq!(&got[5 * B..6 * B], &new[..], "the newest record wins, wherever the ring put it");
}

#[test]
fn torn_fill_of_a_hole_this_session_made_reads_as_zeros_from_one_hole_record() {
    let (_d, v, root) = setup();
    let f = settled_file(&v, &root, "f", &data(B, 1));
    // A write-back flush out of order: the block at 4 first (blocks 1..4 become holes), then
    // blocks 1..=2, which fill holes in place.
    f.write_at(&data(B, 4), 4 * B as u64, B as u64).unwrap();
    f.write_at(&data(2 * B, 2), B as u64, 5 * B as u64).unwrap();
    let name = stash_files(&v).pop().expect("a hole record");
    let len = std::fs::metadata(v.root_path().join(&name)).unwrap().len();
    // One record for block 0, the old final block the growing write re-sealed ("ordered-growth",
    // §5.7), and one for the run of holes.
    assert_eq!(len, 2 * record_len(&v), "one record for the run of holes");
    // Torn: the slot's second half is still the hole's zeros.
    let torn = second_half(&v, 1);
    overwrite(&cipher_path(&v, &root, "f"), torn.start as u64, &vec![0; torn.len()]);
    drop(f);
    let mut want = data(B, 1);
    want.extend_from_slice(&[0; B]);
    want.extend_from_slice(&data(2 * B, 2)[B..]);
    want.extend_from_slice(&[0; B]);
    want.extend_from_slice(&data(B, 4));
    assert_eq!(read_file(&v, &root, "f").unwrap(), want);
    assert!(Checker::new(&v, true, &|_| {}).run().unwrap().is_clean());
    assert!(stash_files(&v).is_empty());
    assert_eq!(read_file(&v, &root, "f").unwrap(), want);
}

#[test]
fn a_growing_write_that_cannot_log_the_old_final_block_fails_before_writing_anything() {
    // With "ordered-growth" (FORMAT.md §5.7) the old final block of a growing write is
    // written in place only after the new blocks, and read from its record if a crash comes
    // between: without the record, the write must not happen at all. (A directory at the
    // stash's name: the stash cannot be made, as on a full disk.)
    let (_d, v, root) = setup();
    let old = data(2 * B + 100, 1);
    let f = settled_file(&v, &root, "f", &old);
    let path = cipher_path(&v, &root, "f");
    let before = std::fs::read(&path).unwrap();
    let blocker = v.root_path().join(veilfs_core::stash::stash_name(f.id()));
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("x"), b"x").unwrap();
    let size = old.len() as u64;
    assert!(f.write_at(&data(3 * B, 2), size - 50, size).is_err(), "a growing write without its record");
    assert_eq!(std::fs::read(&path).unwrap()[36..], before[36..], "no block was written");
    // An overwrite inside the file goes on without its record (a full disk never refuses it).
    f.write_at(&data(10, 3), 0, size).unwrap();
    f.settle().unwrap();
    drop(f);
    let mut want = old.clone();
    want[..10].copy_from_slice(&data(10, 3));
    assert_eq!(read_file(&v, &root, "f").unwrap(), want);
}
