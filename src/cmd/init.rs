//! `veilfs init`.

use crate::password::PasswordArgs;
use anyhow::Result;
use std::path::PathBuf;
use std::time::Instant;
use veilfs_core::content::ContentCipher;
use veilfs_core::{InitOptions, Vault};

/// Arguments of `veilfs init`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "The recovery key is printed once, on standard output. Write it down and keep it apart from the \
vault: with it, `veilfs passwd --recovery-key` sets a new password if yours is lost.\n\n\
Defaults: AES-256-GCM, 4 KiB blocks, Argon2id with 128 MiB, 3 passes, 4 lanes."
)]
pub struct Args {
    /// The directory to hold the vault (created if missing; must be empty).
    pub cipherdir: PathBuf,
    #[command(flatten)]
    pub password: PasswordArgs,
    /// Content cipher: aes-256-gcm, or xchacha20-poly1305 for CPUs without AES instructions.
    #[arg(long, default_value = "aes-256-gcm", value_parser = parse_cipher)]
    pub cipher: ContentCipher,
    /// Plaintext bytes per encrypted block (power of two, 512..1048576).
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    #[command(flatten)]
    pub kdf: super::KdfArgs,
    /// Do not create a recovery key.
    #[arg(long)]
    pub no_recovery_key: bool,
}

fn parse_cipher(s: &str) -> Result<ContentCipher, String> {
    ContentCipher::parse(s).ok_or_else(|| format!("unknown cipher {s:?}: use aes-256-gcm or xchacha20-poly1305"))
}

/// Runs `veilfs init`.
pub fn run(a: Args) -> Result<i32> {
    let kdf = a.kdf.params()?;
    let password = a.password.read_new("Choose a password")?;
    let opts = InitOptions { cipher: a.cipher, block_size: a.block_size, kdf, recovery_key: !a.no_recovery_key };
    let t = Instant::now();
    let (_vault, rk) = Vault::create(&a.cipherdir, &password, &opts)?;
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "veilfs: created a vault in {} ({}, {} B blocks, Argon2id {} MiB × {} passes: {secs:.2} s to derive the key)",
        a.cipherdir.display(),
        a.cipher.name(),
        a.block_size,
        kdf.memory_kib / 1024,
        kdf.iterations
    );
    if let Some(rk) = rk {
        eprintln!("veilfs: your recovery key (shown only now; write it down and keep it apart from the vault):");
        println!("{}", rk.display());
    }
    Ok(crate::exit::OK)
}
