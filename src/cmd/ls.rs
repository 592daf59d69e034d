//! `veilfs ls`: decrypted listing of a vault directory.

use super::UnlockArgs;
use anyhow::Result;
use std::path::PathBuf;
use veilfs_core::EntryKind;

/// Arguments of `veilfs ls`.
#[derive(clap::Args, Debug)]
#[command(after_help = "The path after CIPHERDIR may be plaintext (docs/2024) or the ciphertext directory itself \
(as `find CIPHERDIR` shows it). Entries whose names fail authentication are listed on stderr with their \
ciphertext names.")]
pub struct Args {
    /// CIPHERDIR, optionally followed by a directory inside the vault.
    pub dir: PathBuf,
    /// Long format: type, mode, size, modification time.
    #[arg(short, long)]
    pub long: bool,
    /// Show each entry's ciphertext name too.
    #[arg(short = 'c', long)]
    pub cipher_names: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
}

/// Runs `veilfs ls`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.dir)?;
    let vault = a.unlock.open(&t.cipherdir)?;
    // A ciphertext path exists on disk as given; a plaintext one does not.
    let inner = if !t.inner.as_os_str().is_empty() && t.cipherdir.join(&t.inner).exists() {
        vault.decrypt_path(&t.inner)?
    } else {
        t.inner.clone()
    };
    let (parent, entry) = vault.resolve(&inner)?;
    let dir = match entry {
        Some(e) => vault.open_dir(&parent, &e)?,
        None if inner.as_os_str().is_empty() => parent,
        None => anyhow::bail!(veilfs_core::Error::io(
            inner.display().to_string(),
            std::io::Error::from_raw_os_error(libc::ENOENT)
        )),
    };
    let (mut entries, bad) = vault.list(&dir)?;
    entries.sort_by(|x, y| x.name.cmp(&y.name));
    let layout = vault.content().layout;
    for e in &entries {
        let name = String::from_utf8_lossy(&e.name);
        let mut line = String::new();
        if a.long {
            let ty = match e.kind {
                EntryKind::Dir => 'd',
                EntryKind::File => '-',
                EntryKind::Symlink => 'l',
                EntryKind::Special => 's',
            };
            let size = if e.kind == EntryKind::File {
                layout.plain_size_lenient(e.stat.st_size as u64)
            } else {
                e.stat.st_size as u64
            };
            line.push_str(&format!("{ty}{:04o} {:>12} {} ", e.stat.st_mode & 0o7777, size, e.stat.st_mtime));
        }
        line.push_str(&name);
        if a.long && e.kind == EntryKind::Symlink {
            if let Ok(t) = vault.readlink(&dir, e) {
                line.push_str(&format!(" -> {}", String::from_utf8_lossy(&t)));
            }
        }
        if a.cipher_names {
            line.push_str(&format!("\t{}", e.on_disk));
        }
        println!("{line}");
    }
    for b in &bad {
        eprintln!("veilfs: ls: {}: {}", String::from_utf8_lossy(&b.on_disk), b.error);
    }
    Ok(if bad.is_empty() { crate::exit::OK } else { crate::exit::INTEGRITY })
}
