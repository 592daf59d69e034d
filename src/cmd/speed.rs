//! `veilfs speed`: how fast this machine runs veilfs's cryptography (like `gocryptfs -speed`),
//! to choose a cipher at `init` and to check the KDF cost. A measurement, not a test.

use anyhow::Result;
use std::time::{Duration, Instant};
use veilfs_core::content::{BlockCodec, ContentCipher};
use veilfs_core::kdf::Argon2Params;
use veilfs_core::keys::MasterKey;
use veilfs_core::NameCipher;

/// Arguments of `veilfs speed`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds to spend per measurement.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Also time Argon2id with the default parameters (takes about a second).
    #[arg(long)]
    pub kdf: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `f` repeatedly for about `secs` seconds; returns iterations per second.
fn rate(secs: f64, mut f: impl FnMut()) -> f64 {
    let budget = Duration::from_secs_f64(secs);
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < budget {
        for _ in 0..64 {
            f();
        }
        n += 64;
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn max_rss_kib() -> i64 {
    veilfs_core::sys::process::max_rss_kib()
}

/// Runs `veilfs speed`.
pub fn run(a: Args) -> Result<i32> {
    let keys = MasterKey::generate().subkeys();
    let mut results = serde_json::Map::new();
    let bs = 4096usize;
    for cipher in [ContentCipher::Aes256Gcm, ContentCipher::XChaCha20Poly1305] {
        let codec = BlockCodec::new(cipher, &keys, [7; 16]);
        let plain = vec![0x5au8; bs];
        let mut ct = vec![0u8; bs + cipher.overhead()];
        let enc = rate(a.seconds, || codec.seal_into(1, false, &plain, &mut ct)) * bs as f64 / 1e6;
        let mut out = vec![0u8; bs];
        let dec = rate(a.seconds, || {
            codec.open_into(1, false, &ct, &mut out, "speed").expect("own ciphertext");
        }) * bs as f64
            / 1e6;
        if !a.json {
            println!(
                "{:<20} encrypt {enc:>8.0} MB/s   decrypt {dec:>8.0} MB/s   (4 KiB blocks, one core)",
                cipher.name()
            );
        }
        results.insert(cipher.name().into(), serde_json::json!({"encrypt_mb_s": enc, "decrypt_mb_s": dec}));
    }
    let nc = NameCipher::new(&keys, veilfs_core::names::SpecialBinding::ByType);
    let iv = [3u8; 16];
    let names = rate(a.seconds, || {
        let k = nc.name_key(&iv, b"a-typical-file-name.txt").expect("valid name");
        std::hint::black_box(nc.bind(&iv, &k.d, veilfs_core::EntryKind::File, &[1; 16]));
    });
    if !a.json {
        println!("{:<20} {names:>8.0} names/s encrypted and bound (AES-256-SIV, one core)", "names");
    }
    results.insert("names_per_s".into(), names.into());
    if a.kdf {
        let p = Argon2Params::DEFAULT;
        let before = max_rss_kib();
        let t = Instant::now();
        p.derive(b"password", &[0u8; 32])?;
        let secs = t.elapsed().as_secs_f64();
        let grew = (max_rss_kib() - before).max(0) / 1024;
        if !a.json {
            println!(
                "{:<20} {secs:.2} s, {} MiB (Argon2id m={} MiB t={} p={}; peak RSS grew {grew} MiB)",
                "key derivation",
                p.memory_kib / 1024,
                p.memory_kib / 1024,
                p.iterations,
                p.parallelism
            );
        }
        results.insert("argon2id_default_s".into(), secs.into());
        results.insert("argon2id_default_rss_growth_mib".into(), grew.into());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(crate::exit::OK)
}
