//! What the block map (feature `"block-map"`, docs/FORMAT.md §5.10) costs against today's
//! files, through [`veilfs_core::CryptFile`] on a tmpfs (`/dev/shm`), so that the extra work
//! shows rather than a disk: a file written front to back in 1 MiB and 128 KiB writes, 4 KiB
//! overwrites at random places in it, a whole read in 1 MiB pieces, and opening it (the
//! block-map reader reads one node per 128 MiB and the last span's map blocks at open).
//!
//! Both writers run as the mount runs them (`set_defer_sparse(true)`: one process owns the
//! file and settles at `settle`): the v1 writer with its inner-block stash, the block-map
//! writer in one write session per step (its log, map and header written at the `settle`).
//! With `per-call` as the second argument neither defers (as with `--shared-storage` and
//! `veilfs import`): the v1 writer writes its header per call, the block-map writer keeps its
//! session until the `settle` (`set_session_until_settle`, as those writers set it). With
//! `no-owner` the block-map writer has no caller that settles either: every write is then a
//! session of its own (a library user that never calls `settle`).
//!
//! `cargo run --profile quick -p veilfs-core --example block_map_cost [MiB] [per-call|no-owner]`
//! (default 256). A measurement, not a test; prints the best of three runs per row.

use secrecy::SecretString;
use std::time::Instant;
use veilfs_core::config::FEATURE_BLOCK_MAP;
use veilfs_core::kdf::Argon2Params;
use veilfs_core::{InitOptions, Secret, Vault};

fn vault(dir: &std::path::Path, block_map: bool) -> Vault {
    let pw = SecretString::from("block map cost".to_string());
    let kdf = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };
    let mut v = Vault::create(dir, &pw, &InitOptions { kdf, ..InitOptions::default() }).expect("vault").0;
    if block_map {
        let mut cfg = v.config().clone();
        cfg.features.push(FEATURE_BLOCK_MAP.into());
        v.save_config(cfg).expect("config");
        v = Vault::open(dir, &Secret::Password(pw), None).expect("reopen");
    }
    v
}

/// Seconds of each step: write in `chunk`-byte pieces, 4 KiB random overwrites, open, read.
fn run(v: &Vault, total: usize, chunk: usize, overwrites: usize, defer: bool, owner: bool) -> [f64; 4] {
    let root = v.root().expect("root");
    let (e, f) = v.create_file(&root, b"f", 0o644).expect("create");
    f.set_defer_sparse(defer);
    f.set_session_until_settle(owner);
    let data = vec![0x5au8; chunk];
    let t = Instant::now();
    let mut size = 0u64;
    while (size as usize) < total {
        size = f.write_at(&data, size, size).expect("write");
    }
    f.settle().expect("settle");
    let write = t.elapsed().as_secs_f64();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let t = Instant::now();
    for _ in 0..overwrites {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % (size / 4096)) * 4096;
        f.write_at(&[0xa5; 4096], off, size).expect("overwrite");
    }
    f.settle().expect("settle");
    let random = t.elapsed().as_secs_f64();
    drop(f);
    let t = Instant::now();
    let f = v.open_file(&root, &e, libc::O_RDONLY).expect("open");
    let open = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let read = f.stream(|_| Ok::<(), veilfs_core::Error>(())).expect("read");
    assert_eq!(read, size);
    [write, random, open, t.elapsed().as_secs_f64()]
}

fn main() {
    let mib: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    let overwrites = 4096;
    let arg = std::env::args().nth(2);
    let (defer, owner) = match arg.as_deref() {
        Some("per-call") => (false, true),
        Some("no-owner") => (false, false),
        _ => (true, true),
    };
    let mode = match (defer, owner) {
        (true, _) => "one owner, settled per step",
        (false, true) => "not the only user (shared storage, import), settled per step",
        (false, false) => "no settling caller: every call on its own",
    };
    println!("{mib} MiB file; {overwrites} random 4 KiB overwrites; {mode}; best of 3 (seconds, ratio block-map / v1)");
    println!("{:>10} {:>26} {:>26} {:>26} {:>26}", "write", "write", "overwrites", "open", "read");
    for chunk in [1 << 20, 128 << 10] {
        let mut best = [[f64::MAX; 4]; 2];
        for _ in 0..3 {
            for (i, block_map) in [false, true].into_iter().enumerate() {
                let d = tempfile::tempdir_in(base).expect("tempdir");
                let v = vault(d.path(), block_map);
                let r = run(&v, mib << 20, chunk, overwrites, defer, owner);
                for s in 0..4 {
                    best[i][s] = best[i][s].min(r[s]);
                }
            }
        }
        let cell = |s: usize| format!("{:.4} / {:.4} = {:.2}", best[1][s], best[0][s], best[1][s] / best[0][s]);
        println!("{:>10} {:>26} {:>26} {:>26} {:>26}", chunk, cell(0), cell(1), cell(2), cell(3));
    }
}
