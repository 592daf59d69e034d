//! `veilfs cat`.

use super::UnlockArgs;
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `veilfs cat`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// CIPHERDIR followed by the plaintext path of a file inside the vault.
    pub file: PathBuf,
    #[command(flatten)]
    pub unlock: UnlockArgs,
    #[command(flatten)]
    pub rollback: super::RollbackArgs,
}

/// Runs `veilfs cat`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.file)?;
    let vault = a.unlock.open_trusting(&t.cipherdir, a.rollback.trust())?;
    let mut out = std::io::stdout().lock();
    copy_out(&vault, &t.inner, &mut out).map_err(|e| match e {
        CatError::Vault(e) => super::plain_path_error(e, &a.file).into(),
        CatError::Out(e) => anyhow::Error::new(e).context("writing to standard output"),
    })?;
    Ok(crate::exit::OK)
}

enum CatError {
    Vault(veilfs_core::Error),
    Out(std::io::Error),
}

impl From<veilfs_core::Error> for CatError {
    fn from(e: veilfs_core::Error) -> Self {
        CatError::Vault(e)
    }
}

/// Decrypts the file at `inner` into `out`.
fn copy_out(vault: &veilfs_core::Vault, inner: &std::path::Path, out: &mut impl Write) -> Result<(), CatError> {
    let (dir, entry) = vault.resolve(inner)?;
    let entry = entry.ok_or_else(|| super::not_found(inner))?;
    let f = vault.open_file(&dir, &entry, libc::O_RDONLY)?;
    f.stream(|piece| out.write_all(piece).map_err(CatError::Out))?;
    out.flush().map_err(CatError::Out)
}
