//! What the content block size would trade (docs/PERFORMANCE.md "Block size"):
//! AES-256-GCM through veilfs's own [`BlockCodec`] (fresh nonce, in-place, the copies the
//! mount makes) at 4, 16 and 32 KiB plaintext blocks, on one core:
//! - streaming: MB/s sealed and opened, and the on-disk overhead per block;
//! - one 4 KiB random read: the whole block that holds it is opened;
//! - one 4 KiB random overwrite: the block is opened, changed and sealed again (a 4 KiB
//!   block is only sealed).
//!
//! `cargo run --release -p veilfs-core --example block_sizes [SECONDS]` (default 2 per
//! figure). A measurement, not a test: format v1 has 4 KiB blocks.

use std::hint::black_box;
use std::time::{Duration, Instant};
use veilfs_core::content::{BlockCodec, ContentCipher};
use veilfs_core::keys::MasterKey;

/// Runs `f` for about `secs` seconds; returns calls per second.
fn rate(secs: f64, mut f: impl FnMut()) -> f64 {
    let budget = Duration::from_secs_f64(secs);
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < budget {
        for _ in 0..16 {
            f();
        }
        n += 16;
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let keys = MasterKey::generate().subkeys();
    let cipher = ContentCipher::Aes256Gcm;
    let codec = BlockCodec::new(cipher, &keys, [7; 16]);
    println!("AES-256-GCM via BlockCodec, one core, {secs} s per figure");
    println!(
        "{:>6} {:>10} {:>10} {:>9} {:>16} {:>20}",
        "block", "seal MB/s", "open MB/s", "overhead", "4 KiB read (µs)", "4 KiB overwrite (µs)"
    );
    for bs in [4096usize, 16384, 32768] {
        let plain = vec![0x5au8; bs];
        let mut ct = vec![0u8; bs + codec.overhead()];
        let seals = rate(secs, || codec.seal_into(1, false, black_box(&plain), &mut ct));
        let mut out = vec![0u8; bs];
        let opens = rate(secs, || {
            codec.open_into(1, false, black_box(&ct), &mut out, "block_sizes").expect("own ciphertext");
        });
        // A 4 KiB overwrite inside a larger block: open it, change 4 KiB, seal it again.
        let mut work = vec![0u8; bs];
        let overwrites = if bs == 4096 {
            seals
        } else {
            rate(secs, || {
                codec.open_into(1, false, &ct, &mut work, "block_sizes").expect("own ciphertext");
                work[..4096].fill(0xa5);
                codec.seal_into(1, false, black_box(&work), &mut ct);
                work[..4096].fill(0x5a);
            })
        };
        println!(
            "{:>5}K {:>10.0} {:>10.0} {:>8.2}% {:>16.2} {:>20.2}",
            bs / 1024,
            seals * bs as f64 / 1e6,
            opens * bs as f64 / 1e6,
            100.0 * codec.overhead() as f64 / bs as f64,
            1e6 / opens,
            1e6 / overwrites,
        );
    }
}
