//! What the client state (`veilfs_core::known`, rollback detection) costs on open: many small
//! files of a vault with `"block-map"` on a tmpfs (`/dev/shm`), each opened and read whole
//! through [`veilfs_core::CryptFile`], with no client state, with a state that knows every file
//! already (the usual case: one lookup under a mutex per open), and with an empty state (the
//! first use: every file is remembered, a record appended per file, batched).
//!
//! `cargo run --profile quick -p veilfs-core --example known_cost [files]` (default 5000 files
//! of 3000 bytes). A measurement, not a test; prints the best of five runs per row.

use secrecy::SecretString;
use std::time::Instant;
use veilfs_core::config::FEATURE_BLOCK_MAP;
use veilfs_core::kdf::Argon2Params;
use veilfs_core::known::{KnownOptions, Trust};
use veilfs_core::{InitOptions, Secret, Vault};

fn main() {
    let n: usize = std::env::args().nth(1).map_or(5000, |s| s.parse().expect("a number of files"));
    let t = tempfile::Builder::new().prefix("known-cost").tempdir_in("/dev/shm").expect("tmpdir");
    let c = t.path().join("c");
    let pw = SecretString::from("known cost".to_string());
    let kdf = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };
    let mut v = Vault::create(&c, &pw, &InitOptions { kdf, ..InitOptions::default() }).expect("vault").0;
    let mut cfg = v.config().clone();
    cfg.features.push(FEATURE_BLOCK_MAP.into());
    v.save_config(cfg).expect("config");
    let open = || Vault::open(&c, &Secret::Password(pw.clone()), None).expect("reopen");
    let v = open();
    let root = v.root().expect("root");
    let data = vec![0x5au8; 3000];
    for i in 0..n {
        let (_, f) = v.create_file(&root, format!("f{i}").as_bytes(), 0o644).expect("create");
        f.write_at(&data, 0, 0).expect("write");
    }
    drop(v);
    let state = t.path().join("state");
    // One pass: open and read every file (the listing is not timed).
    let pass = |v: &Vault| {
        let root = v.root().expect("root");
        let (entries, _) = v.list(&root).expect("list");
        let mut buf = vec![0u8; 4096];
        let t = Instant::now();
        for e in &entries {
            let f = v.open_file(&root, e, libc::O_RDONLY).expect("open");
            let size = f.plain_size().expect("size");
            assert_eq!(f.read_at(&mut buf[..size as usize], 0, size).expect("read"), 3000);
        }
        t.elapsed().as_secs_f64()
    };
    let best = |f: &dyn Fn() -> f64| (0..5).map(|_| f()).fold(f64::INFINITY, f64::min);
    let none = best(&|| pass(&open()));
    let known = {
        let mut v = open();
        v.remember(&KnownOptions { root: Some(state.clone()), trust: Trust::Check }).expect("state");
        pass(&v);
        best(&|| pass(&v))
    };
    let first = best(&|| {
        let _ = std::fs::remove_dir_all(&state);
        let mut v = open();
        v.remember(&KnownOptions { root: Some(state.clone()), trust: Trust::Check }).expect("state");
        let s = pass(&v);
        let t = Instant::now();
        v.known().expect("state").flush().expect("flush");
        s + t.elapsed().as_secs_f64()
    });
    let per = |s: f64| s * 1e6 / n as f64;
    println!("{n} files of 3000 bytes, open + read each (best of 5), /dev/shm:");
    println!("  no client state:           {:8.2} µs/file", per(none));
    println!("  state knows every file:    {:8.2} µs/file ({:.3}x)", per(known), known / none);
    println!("  first use (all new, flush):{:8.2} µs/file ({:.3}x)", per(first), first / none);
}
