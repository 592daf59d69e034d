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
}

/// Runs `veilfs cat`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.file)?;
    let vault = a.unlock.open(&t.cipherdir)?;
    let (dir, entry) = vault.resolve(&t.inner)?;
    let entry = entry.ok_or_else(|| {
        veilfs_core::Error::io(t.inner.display().to_string(), std::io::Error::from_raw_os_error(libc::ENOENT))
    })?;
    let f = vault.open_file(&dir, &entry, libc::O_RDONLY)?;
    let size = f.plain_size()?;
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < size {
        let n = f.read_at(&mut buf, off, size)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        off += n as u64;
    }
    out.flush()?;
    Ok(crate::exit::OK)
}
