//! What remembering a directory's entries (`veilfs_core::known`, deletion detection with
//! `veilfs_core::tombstone`) costs on a listing: one directory of many entries on a tmpfs
//! (`/dev/shm`), listed with `Vault::list` with no client state, with a state that knows every
//! entry already (the usual case: one HMAC per entry and a set lookup), and with an empty state
//! (the first listing: every entry remembered, a record appended per entry, batched); then
//! the size of the state that remembers them.
//!
//! `cargo run --profile quick -p veilfs-core --example entries_cost [entries]` (default
//! 10000). A measurement, not a test; prints the best of five runs per row.

use secrecy::SecretString;
use std::time::Instant;
use veilfs_core::kdf::Argon2Params;
use veilfs_core::known::{KnownOptions, Trust};
use veilfs_core::{InitOptions, Secret, Vault};

fn main() {
    let n: usize = std::env::args().nth(1).map_or(10_000, |s| s.parse().expect("a number of entries"));
    let t = tempfile::Builder::new().prefix("entries-cost").tempdir_in("/dev/shm").expect("tmpdir");
    let c = t.path().join("c");
    let pw = SecretString::from("entries cost".to_string());
    let kdf = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };
    Vault::create(&c, &pw, &InitOptions { kdf, ..InitOptions::default() }).expect("vault");
    let open = || Vault::open(&c, &Secret::Password(pw.clone()), None).expect("reopen");
    let v = open();
    let root = v.root().expect("root");
    for i in 0..n {
        v.create_file(&root, format!("entry number {i}").as_bytes(), 0o644).expect("create");
    }
    drop(v);
    let state = t.path().join("state");
    let pass = |v: &Vault| {
        let root = v.root().expect("root");
        let t = Instant::now();
        let (entries, bad) = v.list(&root).expect("list");
        let s = t.elapsed().as_secs_f64();
        assert_eq!((entries.len(), bad.len()), (n, 0));
        s
    };
    let best = |f: &dyn Fn() -> f64| (0..5).map(|_| f()).fold(f64::INFINITY, f64::min);
    // Every row lists through a vault that has listed once already (the name cipher's memo
    // warm), so that only the client state differs between them.
    let none = {
        let v = open();
        pass(&v);
        best(&|| pass(&v))
    };
    let known = {
        let mut v = open();
        v.remember(&KnownOptions { root: Some(state.clone()), trust: Trust::Check }).expect("state");
        pass(&v);
        best(&|| pass(&v))
    };
    let first = best(&|| {
        let _ = std::fs::remove_dir_all(&state);
        let mut v = open();
        pass(&v);
        v.remember(&KnownOptions { root: Some(state.clone()), trust: Trust::Check }).expect("state");
        let s = pass(&v);
        let t = Instant::now();
        v.known().expect("state").flush().expect("flush");
        s + t.elapsed().as_secs_f64()
    });
    let size = |name: &str| {
        std::fs::read_dir(&state)
            .expect("state")
            .flatten()
            .map(|d| std::fs::metadata(d.path().join(name)).map_or(0, |m| m.len()))
            .sum::<u64>()
    };
    let log = size("known.log");
    {
        let mut v = open();
        v.remember(&KnownOptions { root: Some(state.clone()), trust: Trust::Check }).expect("state");
        v.known().expect("state").compact().expect("compact");
    }
    let snap = size("known");
    let per = |s: f64| s * 1e6 / n as f64;
    println!("{n} entries in one directory, Vault::list, best of 5");
    println!("no client state:          {:8.2} ms ({:.2} µs/entry)", none * 1e3, per(none));
    println!("state knows every entry:  {:8.2} ms ({:.2} µs/entry, {:.2}x)", known * 1e3, per(known), known / none);
    println!("first listing (new state):{:8.2} ms ({:.2} µs/entry, {:.2}x)", first * 1e3, per(first), first / none);
    println!("state: log {log} bytes after the first listing, snapshot {snap} bytes once compacted");
}
