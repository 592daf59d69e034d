//! `veilfs init`.

use crate::exit::{Exit, BAD_PATH};
use crate::password::PasswordArgs;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::time::Instant;
use veilfs_core::content::ContentCipher;
use veilfs_core::{Error, InitOptions, Vault, VaultConfig};

/// Arguments of `veilfs init`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "The recovery key is printed once, on standard output. Write it down and keep it apart from the \
vault: with it, `veilfs passwd --recovery-key` sets a new password if yours is lost.\n\n\
Defaults: AES-256-GCM, 4 KiB blocks, Argon2id with 128 MiB, 3 passes, 4 lanes."
)]
pub struct Args {
    /// The directory to hold the vault (created if missing; must be empty). With --reverse:
    /// the plaintext directory to show encrypted (PLAINDIR).
    pub cipherdir: PathBuf,
    /// Reverse mode: keep PLAINDIR's data plaintext and write only the reverse config
    /// (`.veilfs.reverse.conf`) into it; `veilfs mount --reverse PLAINDIR MNT` then shows a
    /// deterministic, read-only encrypted view (a vault: AES-256-GCM-SIV) for backups.
    #[arg(long)]
    pub reverse: bool,
    #[command(flatten)]
    pub password: PasswordArgs,
    /// Content cipher: aes-256-gcm, or xchacha20-poly1305 for CPUs without AES instructions.
    #[arg(long, default_value = "aes-256-gcm", value_parser = parse_cipher)]
    pub cipher: ContentCipher,
    /// Plaintext bytes per encrypted block (power of two, 512..=1048576).
    #[arg(long, default_value_t = 4096, value_parser = parse_block_size)]
    pub block_size: u32,
    #[command(flatten)]
    pub kdf: super::KdfArgs,
    /// Do not create a recovery key.
    #[arg(long)]
    pub no_recovery_key: bool,
    /// Make files without a block map (feature "block-map"), for veilfs versions that cannot
    /// read it. Such a vault does not detect an older copy of a block, an older header or an
    /// older final block put back into a file (docs/SECURITY.md §4.1).
    #[arg(long)]
    pub no_block_map: bool,
    /// Allow a key derivation above the ceiling unlocking applies (1 GiB of memory,
    /// 4 GiB·passes); every unlock of such a vault then needs --allow-slow-kdf too.
    #[arg(long)]
    pub allow_slow_kdf: bool,
}

fn parse_cipher(s: &str) -> Result<ContentCipher, String> {
    match ContentCipher::parse(s) {
        Some(ContentCipher::Aes256GcmSiv) => {
            Err("aes-256-gcm-siv is the cipher of reverse vaults only (veilfs init --reverse)".into())
        }
        Some(c) => Ok(c),
        None => Err(format!("unknown cipher '{s}': use aes-256-gcm or xchacha20-poly1305")),
    }
}

fn parse_block_size(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|_| format!("'{s}' is not a number of bytes"))?;
    if !n.is_power_of_two() || !(512..=1 << 20).contains(&n) {
        return Err(format!("{n} is not a power of two in 512..=1048576 (e.g. 4096)"));
    }
    Ok(n)
}

/// Refuses a CIPHERDIR that cannot become a vault, before any password is asked for: a
/// non-directory, or a directory that is not empty. (A missing one is created later.)
fn check_cipherdir(dir: &Path) -> Result<()> {
    match std::fs::read_dir(dir).map(|mut it| it.next().is_some()) {
        Ok(true) if VaultConfig::path_in(dir).exists() => Err(Exit::new(
            BAD_PATH,
            anyhow::anyhow!(
                "{} is already a veilfs vault (`veilfs info {}` describes it); a new vault needs an empty directory",
                dir.display(),
                dir.display()
            ),
        )
        .into()),
        Ok(true) => Err(Error::NotEmpty(dir.to_path_buf()).into()),
        Ok(false) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(dir.display().to_string(), e).into()),
    }
}

/// Runs `veilfs init`.
pub fn run(a: Args) -> Result<i32> {
    let kdf = a.kdf.params(a.allow_slow_kdf)?;
    if a.reverse {
        return run_reverse(a, kdf);
    }
    check_cipherdir(&a.cipherdir)?;
    let password = a.password.read_new("Choose a password")?;
    super::kdf_notice(kdf.memory_kib);
    let opts = InitOptions {
        cipher: a.cipher,
        block_size: a.block_size,
        kdf,
        recovery_key: !a.no_recovery_key,
        block_map: !a.no_block_map,
    };
    let t = Instant::now();
    let (_vault, rk) = Vault::create(&a.cipherdir, &password, &opts)?;
    let secs = t.elapsed().as_secs_f64();
    let quiet = crate::logging::quiet();
    if !quiet {
        eprintln!(
        "veilfs: created a vault in {} ({}, {} B blocks, Argon2id {} MiB × {} passes: {secs:.2} s to derive the key)",
        a.cipherdir.display(),
        a.cipher.name(),
        a.block_size,
        kdf.memory_kib / 1024,
        kdf.iterations
    );
    }
    if let Some(rk) = rk {
        eprintln!("veilfs: your recovery key (shown only now; write it down and keep it apart from the vault):");
        println!("{}", rk.display());
    }
    if !quiet {
        eprintln!("veilfs: now mount it with: veilfs mount {} MOUNTPOINT", a.cipherdir.display());
    }
    Ok(crate::exit::OK)
}

/// `veilfs init --reverse PLAINDIR`.
fn run_reverse(a: Args, kdf: veilfs_core::kdf::Argon2Params) -> Result<i32> {
    if !a.cipherdir.is_dir() {
        return Err(Error::not_a_vault(&a.cipherdir).into());
    }
    let password = a.password.read_new("Choose a password")?;
    super::kdf_notice(kdf.memory_kib);
    let opts = InitOptions {
        cipher: ContentCipher::Aes256GcmSiv,
        block_size: a.block_size,
        kdf,
        recovery_key: !a.no_recovery_key,
        block_map: false,
    };
    let rk = veilfs_core::reverse::ReverseVault::create(&a.cipherdir, &password, &opts)?;
    if !crate::logging::quiet() {
        eprintln!(
            "veilfs: made {} a reverse vault (AES-256-GCM-SIV, deterministic, {} B blocks); its config is {}",
            a.cipherdir.display(),
            a.block_size,
            a.cipherdir.join(veilfs_core::reverse::REVERSE_CONFIG_NAME).display()
        );
    }
    if let Some(rk) = rk {
        eprintln!("veilfs: your recovery key (shown only now; write it down and keep it apart from the data):");
        println!("{}", rk.display());
    }
    if !crate::logging::quiet() {
        eprintln!("veilfs: show the encrypted view with: veilfs mount --reverse {} MOUNTPOINT", a.cipherdir.display());
    }
    Ok(crate::exit::OK)
}
