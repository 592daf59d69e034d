//! What `"ordered-growth"` costs a growing write (docs/FORMAT.md §5.7): a 256 MiB file
//! written front to back through [`veilfs_core::CryptFile`] as the mount writes it (one
//! writer, UNSETTLED, a settle at the end), in a vault with the feature and in one without,
//! in writes of 1 MiB (the mount's write-back size), 128 KiB, 4 KiB and 1000 bytes (the last
//! over a sixteenth of the size: most of those rewrite the final block in place, which the
//! feature always stashes first), on a tmpfs
//! (`/dev/shm`), so that the extra system calls show rather than a disk: with the feature each
//! growing write also puts a record of the old final block in the stash and writes that
//! block in its own `pwrite`.
//!
//! `cargo run --release -p veilfs-core --example growth_cost [MiB]` (default 256). A
//! measurement, not a test; prints the best of three runs per row.

use secrecy::SecretString;
use std::time::Instant;
use veilfs_core::config::FEATURE_ORDERED_GROWTH;
use veilfs_core::kdf::Argon2Params;
use veilfs_core::{InitOptions, Secret, Vault};

fn vault(dir: &std::path::Path, ordered: bool) -> Vault {
    let pw = SecretString::from("growth cost".to_string());
    let kdf = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };
    let mut v = Vault::create(dir, &pw, &InitOptions { kdf, ..InitOptions::default() }).expect("vault").0;
    if !ordered {
        let mut cfg = v.config().clone();
        cfg.features.retain(|f| f != FEATURE_ORDERED_GROWTH);
        v.save_config(cfg).expect("config");
        v = Vault::open(dir, &Secret::Password(pw), None).expect("reopen");
    }
    v
}

/// Seconds to write `total` bytes in `chunk`-byte writes, then settle.
fn run(v: &Vault, name: &str, total: usize, chunk: usize) -> f64 {
    let root = v.root().expect("root");
    let (_e, f) = v.create_file(&root, name.as_bytes(), 0o644).expect("create");
    f.set_defer_sparse(true);
    let data = vec![0x5au8; chunk];
    let t = Instant::now();
    let mut size = 0u64;
    while (size as usize) < total {
        size = f.write_at(&data, size, size).expect("write");
    }
    f.settle().expect("settle");
    t.elapsed().as_secs_f64()
}

fn main() {
    let mib: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    println!("{mib} MiB written front to back (1000-byte writes: {} MiB), then settled; best of 3 (s, MB/s)", mib / 16);
    println!("{:>8} {:>22} {:>22} {:>8}", "write", "without ordered-growth", "with ordered-growth", "ratio");
    for (chunk, total) in [(1 << 20, mib << 20), (128 << 10, mib << 20), (4 << 10, mib << 20), (1000, mib << 16)] {
        let mut best = [f64::MAX; 2];
        for _ in 0..3 {
            for (i, ordered) in [false, true].into_iter().enumerate() {
                let d = tempfile::tempdir_in(base).expect("tempdir");
                let v = vault(d.path(), ordered);
                best[i] = best[i].min(run(&v, "f", total, chunk));
            }
        }
        let mbs = |s: f64| total as f64 / s / 1e6;
        println!(
            "{:>8} {:>12.3} {:>9.0} {:>12.3} {:>9.0} {:>8.3}",
            chunk,
            best[0],
            mbs(best[0]),
            best[1],
            mbs(best[1]),
            best[1] / best[0]
        );
    }
}
