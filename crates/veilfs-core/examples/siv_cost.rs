//! What the two SIV steps of a LOOKUP cost on one core: `D` of a plaintext name
//! (`NameCipher::name_key`) and the check of an entry's binding (`NameCipher::unbind`), the
//! first time (the SIV runs) and again (the name cipher's memo answers).
//!
//! `cargo run --release -p veilfs-core --example siv_cost`

use std::time::Instant;
use veilfs_core::keys::MasterKey;
use veilfs_core::names::{b64_encode, EntryKind, NameCipher, SpecialBinding};

const N: usize = 100_000;

fn per_op(f: impl FnMut(usize)) -> f64 {
    let t = Instant::now();
    (0..N).for_each(f);
    t.elapsed().as_secs_f64() * 1e6 / N as f64
}

fn main() {
    let keys = MasterKey::from_bytes([7; 32]).subkeys();
    let iv = [1u8; 16];
    let names: Vec<Vec<u8>> = (0..N).map(|i| format!("md.{i:06}").into_bytes()).collect();
    // Bindings made by one cipher and checked by another of the same keys: the checker has
    // not seen them (`bind` fills the memo of the cipher that made them).
    let maker = NameCipher::new(&keys, SpecialBinding::ByType);
    let entries: Vec<(Vec<u8>, String)> = names
        .iter()
        .map(|n| {
            let d = maker.name_key(&iv, n).unwrap().d;
            let s = b64_encode(&maker.bind(&iv, &d, EntryKind::File, &[3; 16]));
            (d, s)
        })
        .collect();
    for round in 1..=3 {
        let c = NameCipher::new(&keys, SpecialBinding::ByType);
        let key_first = per_op(|i| drop(std::hint::black_box(c.name_key(&iv, &names[i]).unwrap())));
        let bind_first =
            per_op(|i| drop(std::hint::black_box(c.unbind(&iv, &entries[i].0, EntryKind::File, &entries[i].1))));
        // Again, over the last 1,000 (well inside the memo).
        let key_again = per_op(|i| drop(std::hint::black_box(c.name_key(&iv, &names[N - 1 - i % 1000]).unwrap())));
        let bind_again = per_op(|i| {
            let (d, s) = &entries[N - 1 - i % 1000];
            drop(std::hint::black_box(c.unbind(&iv, d, EntryKind::File, s)))
        });
        println!(
            "round {round}: name_key {key_first:.2} µs first, {key_again:.2} µs again; \
             unbind {bind_first:.2} µs first, {bind_again:.2} µs again"
        );
    }
}
