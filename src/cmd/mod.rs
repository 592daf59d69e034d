//! One module per subcommand; shared helpers here.

pub mod cat;
pub mod export;
pub mod import;
pub mod info;
pub mod init;
pub mod ls;
pub mod mount;
pub mod passwd;
pub mod paths;
pub mod speed;

use crate::password::PasswordArgs;
use anyhow::{Context, Result};
use std::path::Path;
use veilfs_core::kdf::Argon2Params;
use veilfs_core::{RecoveryKey, Secret, Vault};

/// How to unlock an existing vault.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct UnlockArgs {
    #[command(flatten)]
    pub password: PasswordArgs,
    /// Unlock with the recovery key (shown at `veilfs init`) instead of a password.
    #[arg(long)]
    pub recovery_key: bool,
    /// Try only key slot N (see `veilfs info`).
    #[arg(long, value_name = "N")]
    pub slot: Option<u32>,
}

impl UnlockArgs {
    /// Reads the secret and opens the vault.
    pub fn open(&self, cipherdir: &Path) -> Result<Vault> {
        // Fail on a missing or damaged config before asking for a password.
        veilfs_core::VaultConfig::load(cipherdir)?;
        let secret = if self.recovery_key {
            let text = self.password.read("Recovery key")?;
            use secrecy::ExposeSecret;
            Secret::Recovery(RecoveryKey::parse(text.expose_secret())?)
        } else {
            Secret::Password(self.password.read("Password")?)
        };
        let vault = Vault::open(cipherdir, &secret, self.slot)
            .with_context(|| format!("cannot open the vault in {}", cipherdir.display()))?;
        Ok(vault)
    }
}

/// Argon2id cost options of a new password slot (`init`, `passwd`).
#[derive(clap::Args, Debug, Clone)]
pub struct KdfArgs {
    /// Argon2id memory in MiB.
    #[arg(long, default_value_t = Argon2Params::DEFAULT.memory_kib / 1024, value_name = "MiB")]
    pub kdf_memory: u32,
    /// Argon2id passes.
    #[arg(long, default_value_t = Argon2Params::DEFAULT.iterations)]
    pub kdf_iterations: u32,
    /// Argon2id lanes.
    #[arg(long, default_value_t = Argon2Params::DEFAULT.parallelism)]
    pub kdf_parallelism: u32,
}

impl KdfArgs {
    /// The parameters, validated.
    pub fn params(&self) -> Result<Argon2Params> {
        let p = Argon2Params {
            memory_kib: self.kdf_memory.saturating_mul(1024),
            iterations: self.kdf_iterations,
            parallelism: self.kdf_parallelism,
        };
        p.validate()?;
        if p.memory_kib < 64 * 1024 || p.iterations < 2 {
            eprintln!("veilfs: warning: weak key derivation settings; only use them for tests");
        }
        Ok(p)
    }
}

/// A progress bar on stderr when it is a terminal and not `--quiet`; hidden otherwise.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}
