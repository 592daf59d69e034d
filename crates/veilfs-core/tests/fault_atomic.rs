//! Writes and truncates that the backing store refuses part-way leave the file as it was.
//!
//! `RLIMIT_FSIZE` stands in for a full disk, to the byte: a `pwrite` that crosses the limit
//! writes up to it and returns short, the next one fails (EFBIG, like ENOSPC on a full
//! disk), and so does an `ftruncate` or `fallocate` beyond it. For every way a file can
//! grow, the limit is put at every byte offset (or a dense sample) of the growth, and after
//! the failed call the file must read back whole and unchanged. Holes inside a
//! file, which a full disk also refuses, cannot be modelled by a size limit: tests/faults.rs
//! covers them on a real tmpfs. The limit is per process, so this file holds a single test,
//! which runs the matrix on v1 files and on files with a block map (docs/FORMAT.md §5.10).

mod common;
use common::*;
use veilfs_core::{CipherDir, CryptFile, Vault};

fn set_fsize_limit(limit: u64) {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let current = (limit != libc::RLIM_INFINITY).then_some(limit);
    setrlimit(Resource::Fsize, Rlimit { current, maximum: None }).unwrap();
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Write { off: u64, len: usize },
    Truncate(u64),
}

fn apply(f: &CryptFile, op: Op, size: u64, d: &[u8]) -> veilfs_core::Result<()> {
    match op {
        Op::Write { off, len } => f.write_at(&d[..len], off, size).map(drop),
        Op::Truncate(n) => f.truncate(n, size),
    }
}

fn expected(old: &[u8], op: Op, d: &[u8]) -> Vec<u8> {
    let mut v = old.to_vec();
    match op {
        Op::Write { off, len } => {
            let end = off as usize + len;
            if v.len() < end {
                v.resize(end, 0);
            }
            v[off as usize..end].copy_from_slice(&d[..len]);
        }
        Op::Truncate(n) => v.resize(n as usize, 0),
    }
    v
}

/// Runs `op` on a file holding `old` with the file size limited to `limit` bytes.
fn case(v: &Vault, root: &CipherDir, old: &[u8], op: Op, limit: u64, defer: bool, d: &[u8]) -> bool {
    let name = "f";
    let (e, f) = v.create_file(root, name.as_bytes(), 0o644).unwrap();
    f.set_defer_sparse(defer);
    f.write_at(old, 0, 0).unwrap();
    f.settle().unwrap();
    set_fsize_limit(limit);
    let r = apply(&f, op, old.len() as u64, d);
    set_fsize_limit(libc::RLIM_INFINITY);
    f.settle().unwrap();
    drop(f);
    let got = read_file(v, root, name);
    let ok = r.is_ok();
    let new = expected(old, op, d);
    let g = got.unwrap_or_else(|err| panic!("{op:?} on {} bytes, limit {limit}, {r:?}: unreadable: {err}", old.len()));
    if ok {
        assert!(g == new, "{op:?} on {} bytes, limit {limit}: content differs", old.len());
    } else {
        // Refused: the old size, and every block old — or, inside the old size, already new.
        assert_eq!(g.len(), old.len(), "{op:?} on {} bytes, limit {limit}, {r:?}: size changed", old.len());
        let bs = v.content().layout.block_size as usize;
        for (i, b) in g.chunks(bs).enumerate() {
            // A refused shrinking truncate (a block-map file logs its new final block, which
            // takes space) has no new content past the new size.
            let (o, n) = (&old[i * bs..i * bs + b.len()], new.get(i * bs..i * bs + b.len()));
            assert!(b == o || n == Some(b), "{op:?} on {} bytes, limit {limit}: block {i} is neither", old.len());
        }
    }
    v.remove(root, &e).unwrap();
    ok
}

#[test]
fn a_refused_grow_or_truncate_leaves_the_file_as_it_was() {
    // Ignoring SIGXFSZ (sent when a write crosses the limit) so the call fails instead.
    veilfs_core::sys::process::ignore_signal(libc::SIGXFSZ);
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("v1"), dir.path().join("map"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    refused_calls_leave_files_as_they_were(&new_vault(&a));
    // Files with a block map (docs/FORMAT.md §5.10), where a block written but not committed
    // in the map would be an integrity error.
    refused_calls_leave_files_as_they_were(&vault_with_block_map(&b, 4096));
}

fn refused_calls_leave_files_as_they_were(v: &Vault) {
    let root = v.root().unwrap();
    let l = v.content().layout;
    let map = veilfs_core::content::blockmap::MapLayout::from(l);
    let cipher_size = |p: u64| if v.content().block_map { map.cipher_size(p) } else { l.cipher_size(p) };
    let bs = l.block_size;
    let d = data(40_000, 9);
    let mut cases = 0;
    let mut refused = 0;
    for p0 in [0u64, 1, 100, bs - 1, bs, bs + 904, 2 * bs, 3 * bs + 17] {
        let old = data(p0 as usize, 3);
        let ops = [
            Op::Write { off: p0, len: 1 },
            Op::Write { off: p0, len: 100 },
            Op::Write { off: p0, len: bs as usize },
            Op::Write { off: p0, len: 10_000 },
            Op::Write { off: p0.saturating_sub(50), len: 8200 },
            Op::Write { off: p0 + 3 * bs + 5, len: 50 },
            Op::Truncate(p0 + 20_000),
            Op::Truncate(p0 / 2),
        ];
        for op in ops {
            let new = match op {
                Op::Write { off, len } => p0.max(off + len as u64),
                Op::Truncate(n) => n,
            };
            let (c0, c1) = (cipher_size(p0), cipher_size(new));
            // The disk fills beyond the file's current end (space the file holds is never
            // refused): every byte near the old and the new end, a sample in between.
            let mut limits: Vec<u64> = (c0..c1 + 2).step_by(61).collect();
            limits.extend(c0..c0 + l.overhead + 3);
            limits.extend(c1.saturating_sub(l.overhead + 3).max(c0)..c1 + 1);
            for limit in limits {
                for defer in [false, true] {
                    cases += 1;
                    if !case(v, &root, &old, op, limit, defer, &d) {
                        refused += 1;
                    }
                }
            }
        }
    }
    eprintln!(
        "{cases} cases, {refused} refused by the limit, every file intact (block map: {})",
        v.content().block_map
    );
    assert!(refused > cases / 3, "the limit must refuse many of the calls: {refused} of {cases}");
}
