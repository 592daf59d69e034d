//! Files with a block map (feature `"block-map"`, docs/FORMAT.md §5.10): round trips at the
//! edges of blocks, groups and spans, holes, a session of mixed writes against a model, and
//! the rollbacks the map exists to catch, each named by attack. Vaults here use 512-byte
//! blocks so that a span (2^15 blocks) is 16 MiB.

use crate::common::*;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use veilfs_core::content::blockmap::{group_start, MapLayout, HEADER_V2_LEN, SPAN_BLOCKS};
use veilfs_core::{CipherDir, Vault};

const B: u64 = 512;
const L: MapLayout = MapLayout::new(B, 28);

fn setup() -> (tempfile::TempDir, Vault, CipherDir) {
    let t = tempfile::tempdir().unwrap();
    let v = vault_with_block_map(t.path(), B as u32);
    assert!(v.content().block_map);
    let root = v.root().unwrap();
    (t, v, root)
}

fn open_rw(v: &Vault, root: &CipherDir, name: &str) -> veilfs_core::CryptFile {
    let e = v.lookup(root, name.as_bytes()).unwrap().unwrap();
    v.open_file(root, &e, libc::O_RDWR).unwrap()
}

/// Reads `name` through a new handle of a reopened vault (nothing cached).
fn read_fresh(dir: &std::path::Path, root: &CipherDir, name: &str) -> veilfs_core::Result<Vec<u8>> {
    read_file(&reopen(dir), root, name)
}

fn snapshot(p: &PathBuf) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

#[test]
fn files_round_trip_at_block_and_group_edges() {
    let (t, v, root) = setup();
    let sizes = [0, 1, B - 1, B, B + 1, 2 * B, 3 * B + 7, 4 * B, 5 * B - 1, 8 * B + 1, 255 * B, 256 * B, 256 * B + 1];
    let sizes = sizes.iter().chain(&[257 * B + 3, 512 * B, 512 * B + 1]);
    for (i, &s) in sizes.enumerate() {
        let name = format!("f{i}");
        let d = data(s as usize, i as u8);
        write_file(&v, &root, &name, &d);
        assert_eq!(read_fresh(t.path(), &root, &name).unwrap(), d, "size {s}");
        let c = snapshot(&cipher_path(&v, &root, &name));
        assert_eq!(c.len() as u64, L.cipher_size(s), "size {s}");
        if s > 0 {
            assert_eq!(&c[..2], &[0, 2], "header v2");
        }
    }
}

#[test]
fn files_round_trip_at_span_edges_and_a_changed_node_is_an_integrity_error() {
    let (t, v, root) = setup();
    for (i, k) in [SPAN_BLOCKS - 1, SPAN_BLOCKS, SPAN_BLOCKS + 1, 2 * SPAN_BLOCKS + 1].into_iter().enumerate() {
        let name = format!("s{i}");
        let d = data((k * B - 3) as usize, i as u8);
        // Written in 1 MiB pieces, as import does.
        let (_, f) = v.create_file(&root, name.as_bytes(), 0o644).unwrap();
        let mut size = 0;
        for piece in d.chunks(1 << 20) {
            size = f.write_at(piece, size, size).unwrap();
        }
        drop(f);
        assert_eq!(read_fresh(t.path(), &root, &name).unwrap(), d, "{k} blocks");
        assert_eq!(std::fs::metadata(cipher_path(&v, &root, &name)).unwrap().len(), L.cipher_size(k * B - 3));
    }
    // Cut back into span 0 (node 0 goes), grown past it again (node 0 is written anew), and
    // a block of span 0 rewritten (node 0 changes).
    let f = open_rw(&v, &root, "s3");
    let mut d = data(((2 * SPAN_BLOCKS + 1) * B - 3) as usize, 3);
    let size = d.len() as u64;
    f.truncate((SPAN_BLOCKS - 1) * B + 9, size).unwrap();
    d.truncate(((SPAN_BLOCKS - 1) * B + 9) as usize);
    f.write_at(b"past the span", (SPAN_BLOCKS + 4) * B, d.len() as u64).unwrap();
    d.resize(((SPAN_BLOCKS + 4) * B) as usize, 0);
    d.extend_from_slice(b"past the span");
    f.write_at(b"inside", 7 * B, d.len() as u64).unwrap();
    d[7 * B as usize..7 * B as usize + 6].copy_from_slice(b"inside");
    drop(f);
    assert!(read_fresh(t.path(), &root, "s3").unwrap() == d);
    // Node 0 of the file of S + 1 blocks, changed: the root no longer matches.
    let p = cipher_path(&v, &root, "s2");
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&[0xff], L.node_offset(0) + 5).unwrap();
    assert_auth(read_fresh(t.path(), &root, "s2"), "root");
}

#[test]
fn appends_overwrites_holes_and_truncates_in_one_session_match_a_model() {
    model_session(false, 25, 300);
}

/// The same with one owner (as the mount): one write session until the handle settles, and
/// after every step the file as a crash at that point leaves it — UNSETTLED, read by its
/// session's log by a new reader (FORMAT.md §5.10, "Write sessions and their log") — reads as
/// written so far. Every 40 steps the handle settles (a new session starts).
#[test]
fn every_state_of_a_write_session_reads_as_written_so_far() {
    model_session(true, 1, 200);
}

/// Random truncates, appends, writes inside and past the end (holes) against a model; a new
/// reader checks the file every `fresh_every` steps.
fn model_session(defer: bool, fresh_every: usize, steps: usize) {
    let (t, v, root) = setup();
    write_file(&v, &root, "m", b"");
    let f = open_rw(&v, &root, "m");
    f.set_defer_sparse(defer);
    let mut model: Vec<u8> = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let p = cipher_path(&v, &root, "m");
    let mut unsettled = 0;
    for step in 0..steps {
        let size = model.len() as u64;
        match next(10) {
            // Truncate to anywhere in 0..size + 40 blocks.
            0 => {
                let n = next(size + 40 * B + 1);
                f.truncate(n, size).unwrap();
                model.resize(n as usize, 0);
            }
            // Append, write inside, or write past the end (a hole).
            _ => {
                let off = match next(3) {
                    0 => size,
                    1 => next(size + 1),
                    _ => size + next(300 * B),
                };
                let d = data(next(6 * B) as usize + 1, step as u8);
                let new = f.write_at(&d, off, size).unwrap();
                let end = off as usize + d.len();
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&d);
                assert_eq!(new, model.len() as u64);
            }
        }
        let mut buf = vec![0u8; model.len()];
        assert_eq!(f.read_at(&mut buf, 0, model.len() as u64).unwrap(), model.len());
        assert!(buf == model, "step {step}: the handle reads what was written");
        if step % fresh_every == 0 {
            unsettled += usize::from(snapshot(&p).get(3).is_some_and(|f| f & 2 != 0));
            assert!(read_fresh(t.path(), &root, "m").unwrap() == model, "step {step}: a new reader too");
        }
        if defer && step % 40 == 39 && step + 1 < steps {
            f.settle().unwrap();
        }
    }
    // Dropped without settling: a crash. Settling the file (as a writer's open, the crash
    // sweep or fsck --repair do) keeps what it reads.
    drop(f);
    assert!(open_rw(&v, &root, "m").recover_tail().unwrap().is_some() == defer);
    assert!(snapshot(&p).get(3).is_none_or(|f| f & 2 == 0), "settled");
    assert!(read_fresh(t.path(), &root, "m").unwrap() == model);
    // With one owner most states checked were UNSETTLED (a shrinking truncate commits).
    assert_eq!(defer, unsettled > steps / 2, "{unsettled} UNSETTLED states of {steps}");
}

#[test]
fn holes_read_as_zeros_and_a_written_block_replaced_by_zeros_is_an_integrity_error() {
    let (t, v, root) = setup();
    let (_, f) = v.create_file(&root, b"h", 0o644).unwrap();
    f.write_at(b"start", 0, 0).unwrap();
    f.write_at(b"end", 100 * B, 5).unwrap();
    drop(f);
    let mut want = vec![0u8; 100 * B as usize + 3];
    want[..5].copy_from_slice(b"start");
    want[100 * B as usize..].copy_from_slice(b"end");
    assert_eq!(read_fresh(t.path(), &root, "h").unwrap(), want);
    // A v1 file with SPARSE reads any all-zero inner block as a hole; here only a block the
    // map says is a hole does.
    let p = cipher_path(&v, &root, "h");
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&[0u8; (B + 28) as usize], L.block_offset(0)).unwrap();
    assert_auth(read_fresh(t.path(), &root, "h"), "block 0 is not the version");
}

#[test]
fn a_size_beyond_the_writers_limit_is_efbig_at_once_and_the_file_stays_as_it_was() {
    // A sparse file of an absurd size would cost the map in memory (one hash per group) and
    // its nodes on disk in proportion to its block count: the daemon's memory ran out and the
    // kernel killed it. Past the limit the writer refuses with EFBIG before anything changes.
    let (t, v, root) = setup();
    let d = data(3 * B as usize + 5, 4);
    write_file(&v, &root, "big", &d);
    let p = cipher_path(&v, &root, "big");
    let before = snapshot(&p);
    let max = L.max_written_blocks();
    assert_eq!(max, veilfs_core::content::blockmap::MAX_WRITTEN_BLOCKS);
    assert!(max < L.max_blocks());
    let f = open_rw(&v, &root, "big");
    let size = d.len() as u64;
    let t0 = std::time::Instant::now();
    for new in [999_999_999_999_999, max * B + 1, u64::MAX / 2] {
        let e = f.truncate(new, size).unwrap_err();
        assert_eq!(e.errno(), libc::EFBIG, "truncate to {new}: {e}");
    }
    for off in [max * B, max * B - 1, 999_999_999_999_999, u64::MAX - 1] {
        let e = f.write_at(b"xy", off, size).unwrap_err();
        assert_eq!(e.errno(), libc::EFBIG, "write at {off}: {e}");
    }
    assert!(t0.elapsed() < std::time::Duration::from_secs(5), "refused at once: {:?}", t0.elapsed());
    // Up to the limit's last block a write is taken (here a block well inside it, sparse).
    let grown = f.write_at(b"far", 100_000 * B, size).unwrap();
    assert_eq!(grown, 100_000 * B + 3);
    f.truncate(size, grown).unwrap();
    drop(f);
    assert_eq!(read_fresh(t.path(), &root, "big").unwrap(), d);
    assert_eq!(snapshot(&p).len(), before.len());
}

#[test]
fn a_write_far_past_the_end_seals_only_the_blocks_it_writes() {
    // The old final block is re-sealed and the written block sealed; the 2^27 blocks between
    // are holes. Sizing the sealing buffer by the distance between them asked for 72 GB here
    // (the daemon died when a fallocate far past the end did this).
    let (t, v, root) = setup();
    let d = data(2 * B as usize + 7, 5);
    write_file(&v, &root, "far", &d);
    let f = open_rw(&v, &root, "far");
    let far = (1u64 << 27) * B;
    assert_eq!(f.write_at(b"far away", far, d.len() as u64).unwrap(), far + 8);
    // A growing truncate re-seals "far away"'s block and seals the new final one.
    let size = far + 3 * B;
    f.truncate(size, far + 8).unwrap();
    drop(f);
    let v2 = reopen(t.path());
    let e = v2.lookup(&root, b"far").unwrap().unwrap();
    let f = v2.open_file(&root, &e, libc::O_RDONLY).unwrap();
    assert_eq!(f.plain_size().unwrap(), size);
    let mut got = vec![1u8; 3 * B as usize];
    assert_eq!(f.read_at(&mut got, 0, size).unwrap(), got.len());
    assert_eq!(&got[..d.len()], &d[..]);
    assert!(got[d.len()..].iter().all(|&x| x == 0));
    let mut got = vec![1u8; 3 * B as usize + 5];
    assert_eq!(f.read_at(&mut got, far - 5, size).unwrap(), 3 * B as usize + 5);
    assert_eq!(&got[..13], b"\0\0\0\0\0far away");
    assert!(got[13..].iter().all(|&x| x == 0));
}

#[test]
fn a_hole_stays_a_hole_when_an_older_block_is_put_back_there() {
    let (t, v, root) = setup();
    let d = data(10 * B as usize, 1);
    write_file(&v, &root, "f", &d);
    let p = cipher_path(&v, &root, "f");
    let old = snapshot(&p);
    // Cut to 1 block, grow to 10 again: blocks 1–8 are holes now.
    let f = open_rw(&v, &root, "f");
    f.truncate(B, 10 * B).unwrap();
    f.truncate(10 * B, B).unwrap();
    drop(f);
    let (a, b) = (L.block_offset(4) as usize, (L.block_offset(4) + B + 28) as usize);
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(&old[a..b], a as u64).unwrap();
    let got = read_fresh(t.path(), &root, "f").unwrap();
    assert_eq!(&got[..B as usize], &d[..B as usize]);
    assert!(got[B as usize..].iter().all(|&x| x == 0), "the older block 4 does not come back");
}

#[test]
fn an_older_copy_of_a_block_put_back_is_an_integrity_error() {
    let (t, v, root) = setup();
    write_file(&v, &root, "f", &data(20 * B as usize, 1));
    let p = cipher_path(&v, &root, "f");
    let old = snapshot(&p);
    // Block 5 is rewritten (same size); its older copy, which still opens as block 5 of this
    // file (v1 would accept it), is put back.
    let f = open_rw(&v, &root, "f");
    f.write_at(b"new", 5 * B + 10, 20 * B).unwrap();
    drop(f);
    let (a, b) = (L.block_offset(5) as usize, (L.block_offset(5) + B + 28) as usize);
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(&old[a..b], a as u64).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "block 5 is not the version the header commits to");
    // The older copy together with its map block too: the root catches it.
    let g = veilfs_core::content::blockmap::group_of(5);
    let (ma, mb) = (L.map_offset(g) as usize, (L.map_offset(g) + 16 * (group_start(g + 1) - group_start(g))) as usize);
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(&old[ma..mb], ma as u64).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "root");
}

#[test]
fn an_older_header_with_the_newer_body_is_an_integrity_error() {
    let (t, v, root) = setup();
    write_file(&v, &root, "f", &data(20 * B as usize, 2));
    let p = cipher_path(&v, &root, "f");
    let old = snapshot(&p);
    let f = open_rw(&v, &root, "f");
    f.write_at(b"newer", 7 * B, 20 * B).unwrap();
    drop(f);
    let new = snapshot(&p);
    let h = HEADER_V2_LEN;
    // The older header on the newer body.
    let mut c = old[..h].to_vec();
    c.extend_from_slice(&new[h..]);
    std::fs::write(&p, &c).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "root");
    // And the reverse: the newer header on the older body.
    let mut c = new[..h].to_vec();
    c.extend_from_slice(&old[h..]);
    std::fs::write(&p, &c).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "root");
    // Both as they were read as they were.
    std::fs::write(&p, &new).unwrap();
    assert_eq!(&read_fresh(t.path(), &root, "f").unwrap()[7 * B as usize..7 * B as usize + 5], b"newer");
}

#[test]
fn the_newer_header_with_an_older_final_block_is_an_integrity_error() {
    let (t, v, root) = setup();
    let d = data(6 * B as usize + 300, 3);
    write_file(&v, &root, "f", &d);
    let p = cipher_path(&v, &root, "f");
    let old = snapshot(&p);
    // A truncate inside the final block: same block count, shorter final block.
    let f = open_rw(&v, &root, "f");
    f.truncate(6 * B + 100, 6 * B + 300).unwrap();
    drop(f);
    let new = snapshot(&p);
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), d[..6 * B as usize + 100]);
    // The older, longer final block (which opens as block 6, last, of this file) after the
    // newer header and map.
    let mut c = new[..L.block_offset(6) as usize].to_vec();
    c.extend_from_slice(&old[L.block_offset(6) as usize..]);
    std::fs::write(&p, &c).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "block 6 is not the version the header commits to");
    // A truncate to fewer blocks, then the older tail put back after the newer header.
    std::fs::write(&p, &new).unwrap();
    let f = open_rw(&v, &root, "f");
    f.truncate(2 * B + 5, 6 * B + 100).unwrap();
    drop(f);
    let mut c = snapshot(&p)[..HEADER_V2_LEN].to_vec();
    c.extend_from_slice(&old[HEADER_V2_LEN..]);
    std::fs::write(&p, &c).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "header commits to 3");
}

#[test]
fn a_cut_at_a_group_boundary_is_an_integrity_error() {
    let (t, v, root) = setup();
    // 300 blocks: groups 0–8 hold blocks 0–255, group 9 the rest.
    write_file(&v, &root, "f", &data(256 * B as usize, 4));
    let p = cipher_path(&v, &root, "f");
    let at_256 = snapshot(&p);
    let f = open_rw(&v, &root, "f");
    f.write_at(&data(44 * B as usize, 5), 256 * B, 256 * B).unwrap();
    drop(f);
    let full = snapshot(&p);
    // Cut where group 9's map block starts: a valid size for a file of 256 blocks.
    let cut = L.map_offset(9) as usize;
    assert_eq!(L.plain_size(cut as u64).unwrap(), (256 * B, 256));
    std::fs::write(&p, &full[..cut]).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "header commits to 300");
    // With the header of when the file had 256 blocks: block 255 has since been re-sealed
    // as an inner block, so its leaf is not the one that header's root commits to.
    let mut c = at_256[..HEADER_V2_LEN].to_vec();
    c.extend_from_slice(&full[HEADER_V2_LEN..cut]);
    std::fs::write(&p, &c).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "root");
    // The whole file as it was still reads whole (a whole-file rollback is layer 2's job).
    std::fs::write(&p, &full).unwrap();
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap().len() as u64, 300 * B);
}

#[test]
fn new_vaults_name_block_map_and_no_block_map_ones_keep_header_v1() {
    let t = tempfile::tempdir().unwrap();
    let v = new_vault(t.path());
    assert!(v.content().block_map);
    let root = v.root().unwrap();
    write_file(&v, &root, "f", b"hello");
    let c = snapshot(&cipher_path(&v, &root, "f"));
    // Header v2, the first group's map block (one leaf), the block.
    assert_eq!((&c[..2], c.len()), (&[0u8, 2][..], 92 + 16 + 5 + 28));
    let t = tempfile::tempdir().unwrap();
    let v = new_v1_vault(t.path());
    assert!(!v.content().block_map);
    let root = v.root().unwrap();
    write_file(&v, &root, "f", b"hello");
    let c = snapshot(&cipher_path(&v, &root, "f"));
    assert_eq!((&c[..2], c.len()), (&[0u8, 1][..], 36 + 5 + 28));
}

#[test]
fn a_first_write_cut_before_its_header_reads_as_an_empty_file_and_can_be_written_again() {
    // The writer puts a first write's blocks and map out before its header: a crash between
    // them leaves an all-zero header (FORMAT.md §5.10, "Reading" rule 1), an empty file.
    let (t, v, root) = setup();
    write_file(&v, &root, "f", &data(3 * B as usize, 6));
    let p = cipher_path(&v, &root, "f");
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(&[0u8; HEADER_V2_LEN], 0).unwrap();
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), b"");
    let f = open_rw(&v, &root, "f");
    assert_eq!(f.plain_size().unwrap(), 0);
    f.write_at(b"again", 0, 0).unwrap();
    drop(f);
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), b"again");
    assert_eq!(std::fs::metadata(&p).unwrap().len(), L.cipher_size(5), "the old blocks are gone");
    // A header of another file, or one byte of it changed, is no empty file.
    let mut c = snapshot(&p);
    c[HEADER_V2_LEN - 1] ^= 1;
    std::fs::write(&p, &c).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "header");
}

#[test]
fn a_lost_write_back_cuts_the_file_at_the_hole_it_left() {
    // As in tests/lost_write.rs: blocks 0-1 then 6-7 arrive, the write of 2-5 was refused
    // after the kernel acknowledged it. Here a hole is a zero leaf, which reads as zeros at
    // once, so the cut matters even before any settle.
    let (t, v, root) = setup();
    let a = data(8 * B as usize, 1);
    let (_, f) = v.create_file(&root, b"f", 0o644).unwrap();
    f.set_defer_sparse(true);
    let size = f.write_at(&a[..2 * B as usize], 0, 0).unwrap();
    assert_eq!(f.write_at(&a[6 * B as usize..], 6 * B, size).unwrap(), 8 * B);
    f.lost_write(2 * B);
    assert_eq!(f.drop_lost().unwrap(), Some(2 * B), "cut at the lost write's hole");
    drop(f);
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), a[..2 * B as usize]);
    // A hole a truncate made, or one filled since, is not cut.
    let (_, g) = v.create_file(&root, b"g", 0o644).unwrap();
    let size = g.write_at(&a[..B as usize], 0, 0).unwrap();
    g.truncate(6 * B, size).unwrap();
    let size = g.write_at(&a[8 * B as usize - 10..], 7 * B, 6 * B).unwrap();
    let size = g.write_at(&a[..B as usize], 6 * B, size).unwrap();
    g.lost_write(B);
    assert_eq!(g.drop_lost().unwrap(), Some(size), "nothing to cut");
}

// Write sessions (FORMAT.md §5.10, "Write sessions and their log"). A handle with
// `set_defer_sparse(true)` keeps its session open until `settle`; dropping it without one
// leaves the file as a writer killed at that point leaves it (the page cache survives).

/// The session log of the file whose ciphertext is `c`, in the vault at `dir`.
fn log_path(dir: &std::path::Path, c: &[u8]) -> PathBuf {
    dir.join(veilfs_core::stash::stash_name(&c[4..20].try_into().unwrap()))
}

fn put(p: &PathBuf, off: u64, bytes: &[u8]) {
    std::fs::OpenOptions::new().write(true).open(p).unwrap().write_all_at(bytes, off).unwrap();
}

/// Changes the byte at `off` (every bit of it: writing a fixed byte over a tag, which is
/// random, left it as it was once in 256 runs).
fn flip(p: &PathBuf, off: u64) {
    let c = snapshot(p);
    put(p, off, &[c[off as usize] ^ 0xff]);
}

fn block_bytes(c: &[u8], n: u64) -> Vec<u8> {
    c[L.block_offset(n) as usize..(L.block_offset(n) + B + 28) as usize].to_vec()
}

fn map_region(c: &[u8], g: u64, k: u64) -> (u64, Vec<u8>) {
    let off = L.map_offset(g);
    (off, c[off as usize..(off + L.map_len(g, k)) as usize].to_vec())
}

fn is_unsettled(c: &[u8]) -> bool {
    c[3] & 2 != 0
}

#[test]
fn a_session_cut_short_reads_as_written_and_settles_to_the_same() {
    let (t, v, root) = setup();
    let mut want = data(20 * B as usize, 1);
    write_file(&v, &root, "f", &want);
    let p = cipher_path(&v, &root, "f");
    let f = open_rw(&v, &root, "f");
    f.set_defer_sparse(true);
    let mut size = want.len() as u64;
    // An inner block, the final block rewritten, growth past a hole, an inner block again.
    for (off, what) in
        [(5 * B + 3, &b"inner"[..]), (20 * B - 2, b"end"), (30 * B + 7, b"grown"), (5 * B + 100, b"again")]
    {
        size = f.write_at(what, off, size).unwrap();
        let end = off as usize + what.len();
        if want.len() < end {
            want.resize(end, 0);
        }
        want[off as usize..end].copy_from_slice(what);
    }
    drop(f);
    let c = snapshot(&p);
    assert!(is_unsettled(&c), "the session did not end");
    assert!(log_path(t.path(), &c).exists());
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), want, "read by the session's log");
    // Settling (a writer's open, the crash sweep, fsck --repair) writes that state back.
    let f = open_rw(&v, &root, "f");
    assert!(f.recover_tail().unwrap().is_some());
    drop(f);
    let c = snapshot(&p);
    assert!(!is_unsettled(&c));
    assert!(!log_path(t.path(), &c).exists(), "the log goes once the file is settled");
    assert_eq!(c.len() as u64, L.cipher_size(want.len() as u64));
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), want);
    // Without its log the UNSETTLED file has no vouched size: damage, not an empty file.
    let f = open_rw(&v, &root, "f");
    f.set_defer_sparse(true);
    f.write_at(b"x", 3, want.len() as u64).unwrap();
    drop(f);
    let c = snapshot(&p);
    std::fs::remove_file(log_path(t.path(), &c)).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "no size");
}

/// Whole-block overwrites inside the file from several threads at once (what the kernel's
/// write-back sends for random writes, from several daemon threads) go out in place without
/// the map lock: a new reader meanwhile reads the UNSETTLED file as written so far by the
/// log (whose records the writes interleave in, each write's copies kept while another is in
/// flight), and a settle from another thread in the middle waits for the writes in flight,
/// so no commit misses a block that is already in place.
#[test]
fn writes_in_place_from_several_threads_read_back_and_settle_whenever_they_end() {
    const K: u64 = 96;
    const THREADS: u64 = 4;
    let (t, v, root) = setup();
    let want = std::sync::Mutex::new(data((K * B) as usize, 9));
    write_file(&v, &root, "f", &want.lock().unwrap());
    let p = cipher_path(&v, &root, "f");
    let f = open_rw(&v, &root, "f");
    f.set_defer_sparse(true);
    let size = K * B;
    for round in 0..6u8 {
        let settled = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for i in 0..THREADS {
                let (f, want, settled) = (&f, &want, &settled);
                s.spawn(move || {
                    // Runs of 1-3 blocks (across groups, the final block among them) in a
                    // part of the file of each thread's own: the caller orders overlapping
                    // writes, as the mount's range locks do.
                    let (lo, hi) = (i * K / THREADS, (i + 1) * K / THREADS);
                    let mut n = lo;
                    while n < hi {
                        let run = (1 + (n + u64::from(round)) % 3).min(hi - n);
                        let d = data((run * B) as usize, (n as u8).wrapping_mul(7).wrapping_add(round));
                        assert_eq!(f.write_at(&d, n * B, size).unwrap(), size);
                        want.lock().unwrap()[(n * B) as usize..((n + run) * B) as usize].copy_from_slice(&d);
                        n += run;
                        if i == 0 && round % 2 == 1 && !settled.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            f.settle().unwrap();
                        }
                    }
                });
            }
        });
        let want = want.lock().unwrap().clone();
        let c = snapshot(&p);
        assert!(is_unsettled(&c), "round {round}: the last writes started a session");
        assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), want, "round {round}: read by the session's log");
        if round % 3 == 2 {
            assert!(f.settle().unwrap());
            assert!(!log_path(t.path(), &snapshot(&p)).exists());
            assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), want, "round {round}: settled");
        }
    }
    f.settle().unwrap();
    drop(f);
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), *want.lock().unwrap());
}

#[test]
fn a_record_of_another_session_or_another_file_is_never_accepted() {
    let (t, v, root) = setup();
    let d = data(20 * B as usize, 2);
    write_file(&v, &root, "f", &d);
    write_file(&v, &root, "g", &d);
    let p = cipher_path(&v, &root, "f");
    let size = d.len() as u64;
    // Session 1 writes block 5 twice; its first version is vouched for by its log only.
    let f = open_rw(&v, &root, "f");
    f.set_defer_sparse(true);
    f.write_at(b"first", 5 * B, size).unwrap();
    let (c1, log1) = (snapshot(&p), std::fs::read(log_path(t.path(), &snapshot(&p))).unwrap());
    let first = block_bytes(&c1, 5);
    f.write_at(b"second", 5 * B, size).unwrap();
    f.settle().unwrap();
    drop(f);
    // Session 2 is cut short after a write elsewhere.
    let f = open_rw(&v, &root, "f");
    f.set_defer_sparse(true);
    f.write_at(b"third", 9 * B, size).unwrap();
    drop(f);
    let c2 = snapshot(&p);
    let log2_path = log_path(t.path(), &c2);
    let log2 = std::fs::read(&log2_path).unwrap();
    assert!(is_unsettled(&c2));
    assert_eq!(&read_fresh(t.path(), &root, "f").unwrap()[5 * B as usize..5 * B as usize + 6], b"second");
    // Session 1's version of block 5, with session 1's records added to the log.
    put(&p, L.block_offset(5), &first);
    std::fs::write(&log2_path, [log2.clone(), log1.clone()].concat()).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "block 5 is not a version");
    // Session 1's log alone (its records name another generation): no size of session 2.
    std::fs::write(&log2_path, &log1).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "no size");
    // Another file's log, of a session cut short with the same generation: its records
    // are bound to its own ID.
    std::fs::write(&p, &c2).unwrap();
    let g = open_rw(&v, &root, "g");
    g.write_at(b"a settled session", 0, size).unwrap();
    g.set_defer_sparse(true);
    g.write_at(b"other", 9 * B, size).unwrap();
    g.write_at(b"other", 5 * B, size).unwrap();
    drop(g);
    let gc = snapshot(&cipher_path(&v, &root, "g"));
    assert_eq!(&gc[20..28], &c2[20..28], "same generation");
    std::fs::write(&log2_path, std::fs::read(log_path(t.path(), &gc)).unwrap()).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "no size");
    // Its own log back: reads again.
    std::fs::write(&log2_path, &log2).unwrap();
    assert_eq!(&read_fresh(t.path(), &root, "f").unwrap()[9 * B as usize..9 * B as usize + 5], b"third");
}

#[test]
fn an_unsettled_header_replayed_after_its_session_settled_gives_at_most_that_sessions_versions() {
    let (t, v, root) = setup();
    let d = data(20 * B as usize, 3);
    write_file(&v, &root, "f", &d);
    let p = cipher_path(&v, &root, "f");
    let before = snapshot(&p);
    let size = d.len() as u64;
    let f = open_rw(&v, &root, "f");
    f.set_defer_sparse(true);
    f.write_at(b"during", 5 * B, size).unwrap();
    let during = snapshot(&p);
    let log = std::fs::read(log_path(t.path(), &during)).unwrap();
    f.write_at(b"at the end", 5 * B, size).unwrap();
    f.settle().unwrap();
    drop(f);
    let settled = snapshot(&p);
    assert!(!is_unsettled(&settled) && is_unsettled(&during));
    // The session's UNSETTLED header and its log put back on the settled file: the map on
    // disk is the session's end, which that header does not commit to, and the log has no
    // commit record.
    put(&p, 0, &during[..HEADER_V2_LEN]);
    std::fs::write(log_path(t.path(), &settled), &log).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "commit record");
    // With the map of before the session too: the file reads, block 5 as the session
    // first wrote it (a version of that session; the settled one is vouched for by nothing).
    let g = veilfs_core::content::blockmap::group_of(5);
    let (off, old_map) = map_region(&before, g, 20);
    put(&p, off, &old_map);
    let got = read_fresh(t.path(), &root, "f").unwrap();
    assert_eq!(&got[5 * B as usize..5 * B as usize + 6], b"during");
    assert_eq!(&got[..5 * B as usize], &d[..5 * B as usize]);
    // And block 5 as it was before the session is a version it accepts (the header's map):
    // the window is that one session's versions and the file it started from.
    put(&p, L.block_offset(5), &block_bytes(&before, 5));
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), d);
}

#[test]
fn a_commit_record_completes_a_map_cut_short_and_a_forged_one_is_damage() {
    use veilfs_core::maplog::{self, Kind, Log};
    let (t, v, root) = setup();
    let mut want = data(20 * B as usize, 4);
    write_file(&v, &root, "f", &want);
    let p = cipher_path(&v, &root, "f");
    let before = snapshot(&p);
    let f = open_rw(&v, &root, "f");
    f.set_defer_sparse(true);
    let size = f.write_at(b"inner", 5 * B, want.len() as u64).unwrap();
    want[5 * B as usize..5 * B as usize + 5].copy_from_slice(b"inner");
    f.write_at(b"grown", 40 * B, size).unwrap();
    want.resize(40 * B as usize, 0);
    want.extend_from_slice(b"grown");
    let during = snapshot(&p);
    let log_file = log_path(t.path(), &during);
    let log = std::fs::read(&log_file).unwrap();
    f.settle().unwrap();
    drop(f);
    let settled = snapshot(&p);
    // The state a crash after the commit record leaves: the session's header, the log with
    // map records and the commit record (written here with the vault's keys, as the writer
    // does), and of the map blocks in place one still old.
    let keys = &v.content().keys;
    let id: [u8; 16] = during[4..20].try_into().unwrap();
    let gen = u64::from_be_bytes(during[20..28].try_into().unwrap());
    let k = u64::from_be_bytes(settled[36..44].try_into().unwrap());
    let root_new: [u8; 32] = settled[44..76].try_into().unwrap();
    let mut seq = Log::parse(log.clone(), keys, &id, gen).next_seq;
    let mut with_commit = log.clone();
    for g in 0..veilfs_core::content::blockmap::group_count(k) {
        let (_, bytes) = map_region(&settled, g, k);
        maplog::push(&mut with_commit, keys, &id, gen, Kind::Map, seq, g, &bytes);
        seq += 1;
    }
    let commit_at = with_commit.len();
    maplog::push(
        &mut with_commit,
        keys,
        &id,
        gen,
        Kind::Commit,
        seq,
        0,
        &maplog::commit_payload(want.len() as u64, &root_new),
    );
    let mut c = settled.clone();
    c[..HEADER_V2_LEN].copy_from_slice(&during[..HEADER_V2_LEN]);
    let g5 = veilfs_core::content::blockmap::group_of(5);
    let (off, old_map) = map_region(&before, g5, 20);
    c[off as usize..off as usize + old_map.len()].copy_from_slice(&old_map);
    std::fs::write(&p, &c).unwrap();
    std::fs::write(&log_file, &with_commit).unwrap();
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), want, "read by the commit record's map");
    // One byte of the commit record's MAC changed: it does not count, and the map on disk
    // is neither the header's nor a commit's.
    let mut forged = with_commit.clone();
    forged[commit_at + 30] ^= 1;
    std::fs::write(&log_file, &forged).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "commit record");
    // A commit record MAC'd for another file, or for another session, neither.
    for (oid, ogen) in [([9u8; 16], gen), (id, gen + 1)] {
        let mut other = with_commit[..commit_at].to_vec();
        maplog::push(
            &mut other,
            keys,
            &oid,
            ogen,
            Kind::Commit,
            seq,
            0,
            &maplog::commit_payload(want.len() as u64, &root_new),
        );
        std::fs::write(&log_file, &other).unwrap();
        assert_auth(read_fresh(t.path(), &root, "f"), "commit record");
    }
    // A commit whose root its map records do not give (a root of another version).
    let mut wrong = with_commit[..commit_at].to_vec();
    maplog::push(
        &mut wrong,
        keys,
        &id,
        gen,
        Kind::Commit,
        seq,
        0,
        &maplog::commit_payload(want.len() as u64, &[7; 32]),
    );
    std::fs::write(&log_file, &wrong).unwrap();
    assert_auth(read_fresh(t.path(), &root, "f"), "commit record");
    // The real one back: settling finishes the map and the header.
    std::fs::write(&log_file, &with_commit).unwrap();
    let f = open_rw(&v, &root, "f");
    assert!(f.recover_tail().unwrap().is_some());
    drop(f);
    assert!(!is_unsettled(&snapshot(&p)));
    assert_eq!(read_fresh(t.path(), &root, "f").unwrap(), want);
}

/// A partial file (what `veilfs import` writes under `veilfs.part.*`) keeps one write session
/// for all its writes; a discarded one leaves neither the file nor its log behind, and a
/// committed one is settled before it has its name.
#[test]
fn a_partial_file_an_interrupted_import_left_goes_with_its_log() {
    let (t, v, root) = setup();
    let logs = || {
        (std::fs::read_dir(t.path()).unwrap().flatten())
            .filter(|e| e.file_name().to_string_lossy().starts_with(veilfs_core::stash::STASH_PREFIX))
            .count()
    };
    let p = v.create_partial(&root, b"p", 0o600).unwrap();
    let d = data(12 * B as usize, 5);
    p.file.write_at(&d[..6 * B as usize], 0, 0).unwrap();
    p.file.write_at(&d[6 * B as usize..], 6 * B, 6 * B).unwrap();
    let on_disk = p.entry.on_disk.clone();
    // The importing process is killed: nothing of the handle runs, its log stays.
    std::mem::forget(p);
    assert_eq!(logs(), 1, "the interrupted session's log");
    assert_eq!(v.remove_partials(&root).unwrap(), 1);
    assert!(!t.path().join(on_disk).exists(), "the partial file is removed");
    assert_eq!(logs(), 0, "and its log with it");
}

#[test]
fn a_partial_file_is_one_session_and_leaves_no_log_committed_or_discarded() {
    let (t, v, root) = setup();
    let logs = |dir: &std::path::Path| {
        (std::fs::read_dir(dir).unwrap().flatten())
            .filter(|e| e.file_name().to_string_lossy().starts_with(veilfs_core::stash::STASH_PREFIX))
            .count()
    };
    let d = data(40 * B as usize, 3);
    for commit in [false, true] {
        let p = v.create_partial(&root, b"p", 0o600).unwrap();
        let mut size = 0;
        for piece in d.chunks(5 * B as usize) {
            size = p.file.write_at(piece, size, size).unwrap();
        }
        let c = snapshot(&t.path().join(&p.entry.on_disk));
        assert!(is_unsettled(&c), "the session stays open across writes");
        assert_eq!(logs(t.path()), 1, "one log while it is written");
        if commit {
            let e = v.commit_partial(&root, p, None).unwrap();
            let c = snapshot(&cipher_path(&v, &root, "p"));
            assert!(!is_unsettled(&c), "settled under its name");
            assert_eq!(u64::from_be_bytes(c[20..28].try_into().unwrap()), 2, "its first write, then one session");
            assert_eq!(read_fresh(t.path(), &root, "p").unwrap(), d);
            assert_eq!(e.name, b"p");
        } else {
            let on_disk = p.entry.on_disk.clone();
            v.discard_partial(&root, p).unwrap();
            assert!(!t.path().join(on_disk).exists());
        }
        assert_eq!(logs(t.path()), 0, "no log left (commit {commit})");
    }
}

// Salvage by the map's rules (FORMAT.md §5.10, "Salvage"): what `fsck --repair` and
// `export --salvage` keep of a damaged file, each case named by the attack or damage.

/// What salvage keeps of `name` (through the opener `fsck` and `export --salvage` use), and
/// what it reports.
fn salvage(v: &Vault, dir: &CipherDir, name: &str) -> (Vec<u8>, veilfs_core::file::Salvaged) {
    let e = v.lookup(dir, name.as_bytes()).unwrap().unwrap();
    let f = v.open_for_salvage(dir, &e).unwrap();
    let mut got = Vec::new();
    let s = f
        .salvage(|piece| {
            got.extend_from_slice(piece);
            Ok(())
        })
        .unwrap();
    (got, s)
}

/// Byte range of blocks `a..b`.
fn blocks(a: u64, b: u64) -> (u64, u64) {
    (a * B, b * B)
}

#[test]
fn salvage_of_a_block_rolled_back_to_an_older_copy_keeps_every_other_block_and_loses_exactly_it() {
    let (_t, v, root) = setup();
    let mut d = data(20 * B as usize - 100, 1);
    write_file(&v, &root, "f", &d);
    let p = cipher_path(&v, &root, "f");
    let old = snapshot(&p);
    // Block 5 and the final block 19 are rewritten; their older copies (each still opens at
    // its place: v1 would keep them) are put back.
    let f = open_rw(&v, &root, "f");
    f.write_at(b"new", 5 * B + 10, d.len() as u64).unwrap();
    f.write_at(b"end", 19 * B + 1, d.len() as u64).unwrap();
    drop(f);
    d[5 * B as usize + 10..5 * B as usize + 13].copy_from_slice(b"new");
    d[19 * B as usize + 1..19 * B as usize + 4].copy_from_slice(b"end");
    let final_len = (d.len() as u64 - 19 * B + 28) as usize;
    put(&p, L.block_offset(5), &block_bytes(&old, 5));
    put(&p, L.block_offset(19), &old[L.block_offset(19) as usize..L.block_offset(19) as usize + final_len]);
    assert!(read_file(&v, &root, "f").is_err());
    let (got, s) = salvage(&v, &root, "f");
    let mut want = d[..19 * B as usize].to_vec();
    want[5 * B as usize..6 * B as usize].fill(0);
    assert!(got == want, "every other block kept, block 5 zeros, the final block cut off");
    assert_eq!(s.lost, [blocks(5, 6), (19 * B, d.len() as u64)]);
    assert_eq!(s.older, s.lost, "both are older versions put back");
    assert!(s.unverified.is_empty());
    assert_eq!(s.kept, 18 * B);
    assert!(s.notes().contains("rollback"), "{}", s.notes());
}

#[test]
fn salvage_of_a_corrupted_block_loses_it_alone_and_keeps_holes_as_zeros() {
    let (_t, v, root) = setup();
    let (_, f) = v.create_file(&root, b"f", 0o644).unwrap();
    let d = data(4 * B as usize, 2);
    let size = f.write_at(&d, 0, 0).unwrap();
    f.write_at(&d[..B as usize], 12 * B, size).unwrap();
    drop(f);
    let mut want = d.clone();
    want.resize(12 * B as usize, 0);
    want.extend_from_slice(&d[..B as usize]);
    let p = cipher_path(&v, &root, "f");
    put(&p, L.block_offset(2) + 40, &[0x5a]);
    let (got, s) = salvage(&v, &root, "f");
    want[2 * B as usize..3 * B as usize].fill(0);
    assert!(got == want);
    assert_eq!(s.lost, [blocks(2, 3)]);
    assert!(s.older.is_empty() && s.unverified.is_empty(), "{s:?}");
    assert_eq!(s.kept, 12 * B, "the holes (blocks 4-11) count as authenticated zeros");
}

#[test]
fn salvage_of_a_file_whose_map_block_is_damaged_keeps_what_opens_and_says_it_is_unchecked() {
    let (_t, v, root) = setup();
    let d = data(20 * B as usize, 3);
    write_file(&v, &root, "f", &d);
    let p = cipher_path(&v, &root, "f");
    // Map block 3 (blocks 4-7) of the last (only) span: the root, one hash over them all,
    // no longer verifies, so no block's version is checked.
    flip(&p, L.map_offset(3) + 7);
    assert_auth(read_file(&v, &root, "f"), "root");
    let (got, s) = salvage(&v, &root, "f");
    assert!(got == d);
    assert!(s.lost.is_empty() && s.older.is_empty());
    assert_eq!(s.unverified, [blocks(0, 20)]);
    assert!(s.notes().contains("not checked against the block map"), "{}", s.notes());
    // In a file of more than one span, a map block of an earlier span is checked against
    // its node: only its own group goes unchecked, and a rollback elsewhere is still found.
    let k = SPAN_BLOCKS + 300;
    let d = data((k * B) as usize, 4);
    let (_, f) = v.create_file(&root, b"big", 0o644).unwrap();
    let mut size = 0;
    for piece in d.chunks(1 << 20) {
        size = f.write_at(piece, size, size).unwrap();
    }
    drop(f);
    let p = cipher_path(&v, &root, "big");
    let old = snapshot(&p);
    let f = open_rw(&v, &root, "big");
    f.write_at(b"newer", 40 * B, size).unwrap();
    drop(f);
    put(&p, L.block_offset(40), &block_bytes(&old, 40));
    flip(&p, L.map_offset(10) + 3); // group 10: blocks 512-767
    let (got, s) = salvage(&v, &root, "big");
    assert_eq!(s.unverified, [(group_start(10) * B, group_start(11) * B)]);
    assert_eq!((s.lost.clone(), s.older.clone()), (vec![blocks(40, 41)], vec![blocks(40, 41)]));
    let mut want = d;
    want[40 * B as usize..41 * B as usize].fill(0);
    assert!(got == want);
}

#[test]
fn salvage_of_a_cut_file_keeps_the_blocks_before_the_cut() {
    let (_t, v, root) = setup();
    let d = data(20 * B as usize - 100, 5);
    write_file(&v, &root, "f", &d);
    let p = cipher_path(&v, &root, "f");
    let c = snapshot(&p);
    // Cut inside the final block: the map is whole and verifies, only the final block goes.
    std::fs::write(&p, &c[..c.len() - 10]).unwrap();
    let (got, s) = salvage(&v, &root, "f");
    assert!(got == d[..19 * B as usize]);
    assert_eq!(s.lost, [(19 * B, d.len() as u64 - 10)]);
    assert!(s.unverified.is_empty() && s.older.is_empty());
    // Cut inside block 12: map block 5 (blocks 16-19) is gone with it, so the root cannot be
    // checked; blocks 0-11 open at their places and are kept, unchecked.
    std::fs::write(&p, &c[..(L.block_offset(12) + 100) as usize]).unwrap();
    let (got, s) = salvage(&v, &root, "f");
    assert!(got == d[..12 * B as usize]);
    assert_eq!(s.lost, [blocks(12, 20)]);
    assert_eq!(s.unverified, [blocks(0, 12)]);
    // Bytes appended after a whole file: every block kept, checked, and the bytes counted.
    let mut longer = c.clone();
    longer.extend_from_slice(b"appended");
    std::fs::write(&p, &longer).unwrap();
    assert!(read_file(&v, &root, "f").is_err());
    let (got, s) = salvage(&v, &root, "f");
    assert!(got == d);
    assert!(s.lost.is_empty() && s.unverified.is_empty());
    assert_eq!(s.trailing, 8);
}

#[test]
fn salvage_of_an_unsettled_file_goes_by_its_sessions_log_and_without_it_says_what_is_unchecked() {
    let (t, v, root) = setup();
    let mut want = data(20 * B as usize, 6);
    write_file(&v, &root, "f", &want);
    let p = cipher_path(&v, &root, "f");
    let f = open_rw(&v, &root, "f");
    f.set_defer_sparse(true);
    let mut size = want.len() as u64;
    for (off, what) in [(5 * B + 3, &b"inner"[..]), (30 * B + 7, b"grown")] {
        size = f.write_at(what, off, size).unwrap();
        let end = off as usize + what.len();
        want.resize(want.len().max(end), 0);
        want[off as usize..end].copy_from_slice(what);
    }
    drop(f);
    let c = snapshot(&p);
    assert!(is_unsettled(&c));
    // Block 2, which the session did not touch, is corrupted.
    put(&p, L.block_offset(2) + 33, &[0x77]);
    assert!(read_fresh(t.path(), &root, "f").is_err());
    let (got, s) = salvage(&v, &root, "f");
    let mut expect = want.clone();
    expect[2 * B as usize..3 * B as usize].fill(0);
    assert!(got == expect, "read by the log: the session's writes and growth kept");
    assert_eq!(s.lost, [blocks(2, 3)]);
    assert!(s.unverified.is_empty() && s.older.is_empty());
    // Without its log: by the header's map. The block the session rewrote in place and its
    // growth are kept but unchecked; the holes it made cannot be told from zeroed data.
    std::fs::remove_file(log_path(t.path(), &c)).unwrap();
    let (got, s) = salvage(&v, &root, "f");
    assert!(got == expect);
    assert_eq!(s.lost, [blocks(2, 3), blocks(20, 30)]);
    assert_eq!(s.unverified, [blocks(5, 6), blocks(19, 20), (30 * B, want.len() as u64)]);
    assert!(is_unsettled(&snapshot(&p)), "salvage writes nothing");
}

#[test]
fn a_file_unlinked_while_open_keeps_no_session_log_and_fsck_repair_removes_a_leftover_one() {
    // A session keeps its log until it is settled; a file whose last name is gone while it
    // is open is settled only at its last close, so its log sat beside the other files
    // meanwhile (through sshfs, with the file kept as `.fuse_hidden*`, which fsck leaves
    // alone) and fsck reported it as a crash leftover.
    let (t, v, root) = setup();
    let logs = |dir: &std::path::Path| {
        (std::fs::read_dir(dir).unwrap().flatten())
            .filter(|e| e.file_name().to_string_lossy().starts_with(veilfs_core::stash::STASH_PREFIX))
            .map(|e| e.path())
            .collect::<Vec<_>>()
    };
    let d = data(5 * B as usize, 6);
    write_file(&v, &root, "f", &d);
    let f = open_rw(&v, &root, "f");
    f.set_session_until_settle(true);
    let mut want = d.clone();
    f.write_at(b"before the unlink", 10, want.len() as u64).unwrap();
    want[10..27].copy_from_slice(b"before the unlink");
    assert_eq!(logs(t.path()).len(), 1, "a session open across writes has its log");
    let leftover = std::fs::read(&logs(t.path())[0]).unwrap();
    let e = v.lookup(&root, b"f").unwrap().unwrap();
    std::fs::remove_file(root.path.join(&e.on_disk)).unwrap();
    assert!(f.set_unlinked().unwrap(), "the session ends: the header is written");
    assert!(logs(t.path()).is_empty(), "the log goes with the last name");
    let size = f.write_at(b"after", 5 * B - 2, want.len() as u64).unwrap();
    want.truncate(5 * B as usize - 2);
    want.extend_from_slice(b"after");
    assert!(logs(t.path()).is_empty(), "a write after it leaves no log");
    let mut got = vec![0u8; size as usize];
    assert_eq!(f.read_at(&mut got, 0, size).unwrap(), want.len());
    assert_eq!(got, want);
    assert!(!f.settle().unwrap(), "nothing left to settle at the last close");
    drop(f);
    // A log a crash left behind with its file gone: fsck names it, --repair removes it.
    let p = log_path(t.path(), &[&[0u8; 4][..], &e.identity[..]].concat());
    std::fs::write(&p, leftover).unwrap();
    let fsck = |repair| veilfs_core::fsck::Checker::new(&v, repair, &|_| {}).run().unwrap();
    let r = fsck(false);
    assert!(
        r.problems.iter().any(|x| x.cipher_path == p && x.detail.contains("write-session log")),
        "{:?}",
        r.problems
    );
    let r = fsck(true);
    assert!(r.problems.iter().any(|x| x.cipher_path == p && x.repaired.is_some()), "{:?}", r.problems);
    assert!(!p.exists(), "fsck --repair removes it");
    assert!(fsck(false).problems.is_empty());
}
