//! `veilfs encrypt-path` and `veilfs decrypt-path`.

use super::UnlockArgs;
use anyhow::Result;
use std::path::PathBuf;

/// Arguments of `veilfs encrypt-path`.
#[derive(clap::Args, Debug)]
pub struct EncryptArgs {
    /// The vault.
    pub cipherdir: PathBuf,
    /// A plaintext path inside the vault (relative to its top).
    pub path: PathBuf,
    /// CIPHERDIR is the PLAINDIR of a reverse vault: print the path in its encrypted view.
    #[arg(long)]
    pub reverse: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
}

/// Arguments of `veilfs decrypt-path`.
#[derive(clap::Args, Debug)]
pub struct DecryptArgs {
    /// The vault.
    pub cipherdir: PathBuf,
    /// A ciphertext path: relative to the vault's top, or a full path inside CIPHERDIR.
    /// With --reverse: a path in the encrypted view, relative to its top.
    pub path: PathBuf,
    /// CIPHERDIR is the PLAINDIR of a reverse vault; print the plaintext path (relative to
    /// PLAINDIR) of a path of its encrypted view.
    #[arg(long)]
    pub reverse: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
}

/// Runs `veilfs encrypt-path`.
pub fn encrypt(a: EncryptArgs) -> Result<i32> {
    if a.reverse {
        let rv = a.unlock.open_reverse(&a.cipherdir)?;
        println!("{}", rv.encrypt_path(&a.path)?.display());
        return Ok(crate::exit::OK);
    }
    let vault = a.unlock.open(&a.cipherdir)?;
    println!("{}", vault.encrypt_path(&a.path)?.display());
    Ok(crate::exit::OK)
}

/// Runs `veilfs decrypt-path`.
pub fn decrypt(a: DecryptArgs) -> Result<i32> {
    if a.reverse {
        let rv = a.unlock.open_reverse(&a.cipherdir)?;
        println!("{}", rv.decrypt_path(&a.path)?.display());
        return Ok(crate::exit::OK);
    }
    let vault = a.unlock.open(&a.cipherdir)?;
    let rel = match a.path.strip_prefix(&a.cipherdir) {
        Ok(r) => r.to_path_buf(),
        Err(_) => a.path.clone(),
    };
    println!("{}", vault.decrypt_path(&rel)?.display());
    Ok(crate::exit::OK)
}
