//! The sweep a mount runs after a crash: settles every file a dead writer left UNSETTLED
//! (docs/FORMAT.md §5.8) and finishes interrupted exchanges (F§10) before the mount serves
//! anything.
//!
//! It may run as root over directories that belong to other users, who can plant files in
//! them. So it acts only on what authenticates: the UNSETTLED flag is under the header's
//! HMAC, and an exchange record is finished only if its MAC verifies for its name and both
//! directories, with the rights of the directories' owner ([`Vault::finish_exchange`]); any
//! other record is logged once, naming its ciphertext file, and left alone
//! (docs/SECURITY.md, "The vault's own records").
//!
//! Why: the kernel takes a file's size from its first LOOKUP, and with the write-back cache
//! it never takes it from the filesystem again while it keeps the inode; a file that the
//! crash rules read shorter than its ciphertext size says would then read with zeros at its
//! end. Only a crashed writer leaves the flag, and a crashed mount leaves its vault lock
//! behind, so the mount that takes over a stale lock sweeps once: one walk of the ciphertext
//! tree and a 36-byte read per regular file, no name decryption. A file is opened under the
//! ID its authenticated header names; whether that is the ID its entry promises is checked
//! as always when the file is next opened by name.

use crate::content::blockmap::{HeaderV2, HEADER_V2_LEN};
use crate::content::header::{FileHeader, HEADER_LEN};
use crate::error::{IoContext, Result};
use crate::file::CryptFile;
use crate::names::{ParsedEntry, XCHG_PREFIX};
use crate::sys;
use crate::vault::Vault;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

/// What the crash sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// UNSETTLED files settled.
    pub files: usize,
    /// Interrupted exchanges finished.
    pub exchanges: usize,
}

/// Settles every UNSETTLED file of `vault` and finishes every interrupted exchange. Errors
/// on single objects are logged and skipped (fsck reports them); only an unreadable root
/// fails.
pub fn crash_sweep(vault: &Vault) -> Result<Swept> {
    let root = sys::open_dir_path(vault.root_path()).ctx(|| vault.root_path().display().to_string())?;
    let mut n = Swept::default();
    sweep(vault, root.as_fd(), root.as_fd(), vault.root_path(), &mut n);
    Ok(n)
}

fn sweep(vault: &Vault, root: BorrowedFd<'_>, dir: BorrowedFd<'_>, path: &Path, n: &mut Swept) {
    let entries = match sys::read_dir_fd(dir) {
        Ok(e) => e,
        Err(e) => return tracing::warn!("{}: cannot list for the crash sweep: {e}", path.display()),
    };
    for e in entries {
        let name = String::from_utf8_lossy(&e.name);
        if name.starts_with(XCHG_PREFIX) {
            match vault.finish_exchange(root, dir, path, &name) {
                Ok(true) => n.exchanges += 1,
                Ok(false) => {}
                Err(err) => tracing::warn!("{err}"),
            }
            continue;
        }
        // Never into a sync tool's own files: Syncthing's version store holds old ciphertext.
        if matches!(ParsedEntry::parse(&e.name), ParsedEntry::Internal | ParsedEntry::SyncTool(_)) {
            continue;
        }
        let Ok(st) = sys::fstatat(dir, &e.name) else { continue };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                if let Ok(sub) = sys::open_dir_at(dir, &e.name) {
                    sweep(vault, root, sub.as_fd(), &path.join(&*name), n);
                }
            }
            libc::S_IFREG
                if (vault.content().unsettled_tails || vault.content().block_map)
                    && st.st_size as usize >= HEADER_LEN =>
            {
                match settle_one(vault, dir, &e.name, path) {
                    Ok(true) => n.files += 1,
                    Ok(false) => {}
                    Err(err) => tracing::warn!("{}: {err}", path.join(&*name).display()),
                }
            }
            _ => {}
        }
    }
}

/// Settles the file `name` of `dir` if its header carries UNSETTLED.
fn settle_one(vault: &Vault, dir: BorrowedFd<'_>, name: &[u8], path: &Path) -> Result<bool> {
    let what = path.join(&*String::from_utf8_lossy(name)).display().to_string();
    let (fd, _) = match sys::open_regular_at(dir, name, libc::O_RDWR) {
        Ok(x) => x,
        Err(_) => return Ok(false),
    };
    if vault.content().block_map {
        // A header v2 with UNSETTLED: a write session cut short (docs/FORMAT.md §5.10).
        let mut buf = [0u8; HEADER_V2_LEN];
        let got = sys::pread_full(fd.as_fd(), &mut buf, 0).ctx(|| what.clone())?;
        let Ok(h) = HeaderV2::decode(&buf[..got], &vault.content().keys) else { return Ok(false) };
        if !h.is_unsettled() {
            return Ok(false);
        }
        let f = CryptFile::open(sys::into_file(fd), vault.content().clone(), h.id, what)?;
        return Ok(f.recover_tail()?.is_some());
    }
    let mut buf = [0u8; HEADER_LEN];
    let got = sys::pread_full(fd.as_fd(), &mut buf, 0).ctx(|| what.clone())?;
    if got == HEADER_LEN && vault.content().ordered() && buf.iter().all(|&b| b == 0) {
        // A first write cut before its header (docs/FORMAT.md §5.8 rule 4): an empty file.
        tracing::warn!("{what}: recovered crash state (a first write cut before its header): emptied");
        sys::ftruncate(fd.as_fd(), 0).ctx(|| format!("truncating {what}"))?;
        return Ok(true);
    }
    let Ok(h) = FileHeader::decode(&buf[..got], &vault.content().keys, &what) else { return Ok(false) };
    if !h.is_unsettled() {
        return Ok(false);
    }
    let f = CryptFile::open(sys::into_file(fd), vault.content().clone(), h.id, what)?;
    Ok(f.recover_tail()?.is_some())
}
