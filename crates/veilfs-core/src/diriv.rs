//! The copy of a directory's IV that the directory itself holds (docs/FORMAT.md §7.1), in
//! either of its two forms, for the tree engine ([`Vault`](crate::Vault)) and fsck.
//!
//! The copy is never the source of the IV (the directory's entry binding `S` is): it exists
//! for recovery, so that `fsck --repair` can rebind a directory whose entry fails (a sync
//! tool renamed the backing directory) under its own IV and keep its subtree readable.
//!
//! * [`IvCopy::File`], vaults without the feature `iv-in-name`: `veilfs.diriv`, 16 raw bytes.
//!   Checking it is `openat` + `fstat` + `read` + `close` per directory opened, and it takes
//!   one data block (4 KiB on ext4 and tmpfs): 2,445 directories of a kernel tree made 9.8 of
//!   the 12.9 MiB veilfs added to a 430 MiB tree.
//! * [`IvCopy::Name`], feature `iv-in-name`: the empty file `veilfs.diriv.<base64url(iv)>`,
//!   mode 0400. It takes no data block, copy and sync tools carry empty files and names as
//!   they are, and checking it is one `fstatat` of the name the IV predicts. Only when that
//!   name is missing is the directory listed: another `veilfs.diriv.*` name there is an IV
//!   copied from another directory (an integrity error), none is a crash right after mkdir
//!   (restored from the entry).
//!
//! Nothing planted under these names is followed or opened blocking: a symlink, FIFO, device
//! or directory there is an integrity error naming it.

use crate::config::{VaultConfig, FEATURE_IV_IN_NAME};
use crate::error::{Error, IoContext, Result};
use crate::names::{diriv_name, parse_diriv_name, DirIv, DIRIV_LEN, DIRIV_NAME, DIRIV_NAME_PREFIX};
use crate::sys::{self, MetaError};
use std::os::fd::BorrowedFd;
use std::path::Path;

/// How a vault keeps each directory's IV copy (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IvCopy {
    /// `veilfs.diriv`: 16 raw bytes (vaults without `iv-in-name`).
    File,
    /// The empty file `veilfs.diriv.<base64url(iv)>` (feature `iv-in-name`).
    Name,
}

impl IvCopy {
    /// The form `config` names.
    pub fn of(config: &VaultConfig) -> Self {
        if config.has_feature(FEATURE_IV_IN_NAME) {
            IvCopy::Name
        } else {
            IvCopy::File
        }
    }

    /// The on-disk name of the copy of `iv`.
    pub fn name(self, iv: &DirIv) -> String {
        match self {
            IvCopy::File => DIRIV_NAME.to_string(),
            IvCopy::Name => diriv_name(iv),
        }
    }

    /// Whether `name` is a name this form keeps an IV copy under (the right one or not).
    pub fn is_copy_name(self, name: &[u8]) -> bool {
        match self {
            IvCopy::File => name == DIRIV_NAME.as_bytes(),
            IvCopy::Name => name.starts_with(DIRIV_NAME_PREFIX.as_bytes()),
        }
    }

    /// Creates the copy of `iv` in `dir` (exclusively; mode 0400).
    pub fn write(self, dir: BorrowedFd<'_>, iv: &DirIv) -> std::io::Result<()> {
        match self {
            IvCopy::File => sys::write_new_file(dir, DIRIV_NAME.as_bytes(), iv, 0o400),
            IvCopy::Name => sys::write_new_file(dir, diriv_name(iv).as_bytes(), &[], 0o400),
        }
    }

    /// Removes the copy of `iv` from `dir` (before the directory goes).
    pub fn remove(self, dir: BorrowedFd<'_>, iv: &DirIv) -> std::io::Result<()> {
        sys::unlinkat(dir, self.name(iv).as_bytes(), false)
    }

    /// Whether `dir` (ciphertext `path`) holds the copy of `iv`: `Ok(false)` when it has none
    /// (a crash right after mkdir; the old form also when it is empty). A copy of another IV,
    /// a damaged one and anything but a regular file there is an integrity error naming it.
    /// Never writes.
    pub fn verify(self, dir: BorrowedFd<'_>, iv: &DirIv, path: &Path) -> Result<bool> {
        match self {
            IvCopy::File => verify_file(dir, iv, path),
            IvCopy::Name => verify_name(dir, iv, path),
        }
    }

    /// The IVs `dir`'s copy names, whatever its entry says (fsck rebinding a directory whose
    /// entry fails): the old form's 16 bytes, or every well-formed IV name.
    pub fn carried(self, dir: BorrowedFd<'_>) -> Vec<DirIv> {
        match self {
            IvCopy::File => sys::read_meta_at(dir, DIRIV_NAME.as_bytes(), DIRIV_LEN)
                .ok()
                .and_then(|b| b.try_into().ok())
                .into_iter()
                .collect(),
            IvCopy::Name => sys::read_dir_fd(dir)
                .map(|raw| raw.iter().filter_map(|r| parse_diriv_name(&r.name)).collect())
                .unwrap_or_default(),
        }
    }

    /// Replaces whatever stands where `dir`'s copy of `iv` belongs with the right copy: every
    /// other IV copy goes (a directory planted there is moved aside under a temporary name,
    /// never deleted), then the copy of `iv` is written if it is not already right.
    pub fn rewrite(self, dir: BorrowedFd<'_>, iv: &DirIv, path: &Path) -> Result<()> {
        let keep = self.name(iv);
        let raw = sys::read_dir_fd(dir).ctx(|| format!("listing {}", path.display()))?;
        let mut have = false;
        for r in raw.iter().filter(|r| self.is_copy_name(&r.name)) {
            let what = || path.join(String::from_utf8_lossy(&r.name).as_ref()).display().to_string();
            let st = sys::fstatat(dir, &r.name).ctx(what)?;
            let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
            if r.name == keep.as_bytes() && regular && self.verify(dir, iv, path).unwrap_or(false) {
                have = true;
            } else if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                let tmp = crate::names::temp_name();
                sys::rename_noreplace(dir, &r.name, dir, tmp.as_bytes()).ctx(what)?;
            } else {
                sys::unlinkat(dir, &r.name, false).ctx(what)?;
            }
        }
        if have {
            return Ok(());
        }
        self.write(dir, iv).ctx(|| path.join(&keep).display().to_string())
    }
}

/// [`IvCopy::verify`] of the old form.
fn verify_file(dir: BorrowedFd<'_>, iv: &DirIv, path: &Path) -> Result<bool> {
    let what = || path.join(DIRIV_NAME).display().to_string();
    match sys::read_meta_at(dir, DIRIV_NAME.as_bytes(), DIRIV_LEN) {
        Ok(b) if b.as_slice() == iv => Ok(true),
        Ok(b) if b.is_empty() => Ok(false),
        Ok(b) if b.len() != DIRIV_LEN => Err(Error::auth(what(), format!("is {} bytes long, not 16", b.len()))),
        Ok(_) => Err(Error::auth(
            what(),
            "does not match the IV its directory entry promises (copied from another directory?)",
        )),
        Err(e) if e.is_not_found() => Ok(false),
        Err(MetaError::Io(e)) => Err(Error::io(format!("reading {}", what()), e)),
        Err(e) => Err(Error::auth(what(), e.to_string())),
    }
}

/// [`IvCopy::verify`] with `iv-in-name`: one `fstatat` of the name `iv` predicts; the
/// directory is listed only when that name is missing.
fn verify_name(dir: BorrowedFd<'_>, iv: &DirIv, path: &Path) -> Result<bool> {
    let name = diriv_name(iv);
    let what = |n: &[u8]| path.join(String::from_utf8_lossy(n).as_ref()).display().to_string();
    match sys::fstatat(dir, name.as_bytes()) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size == 0 => Ok(true),
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
            Err(Error::auth(what(name.as_bytes()), format!("is {} bytes long, not empty", st.st_size)))
        }
        Ok(st) => Err(Error::auth(
            what(name.as_bytes()),
            format!("is {}, not an empty regular file", sys::type_name(st.st_mode)),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let raw = sys::read_dir_fd(dir).ctx(|| format!("listing {}", path.display()))?;
            match raw.iter().find(|r| IvCopy::Name.is_copy_name(&r.name)) {
                Some(other) => Err(Error::auth(
                    what(&other.name),
                    "does not name the IV its directory entry promises (copied from another directory?)",
                )),
                None => Ok(false),
            }
        }
        Err(e) => Err(Error::io(format!("checking {}", what(name.as_bytes())), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn iv_names_round_trip_and_refuse_other_spellings() {
        let iv: DirIv = crate::random::bytes();
        let name = diriv_name(&iv);
        assert_eq!(name.len(), DIRIV_NAME_PREFIX.len() + 22);
        assert_eq!(parse_diriv_name(name.as_bytes()), Some(iv));
        assert_eq!(parse_diriv_name(DIRIV_NAME.as_bytes()), None);
        assert_eq!(parse_diriv_name(b"veilfs.diriv.AAAAAAAAAAAAAAAAAAAAAA="), None);
        // Non-zero unused bits: not the canonical spelling of any 16 bytes.
        assert_eq!(parse_diriv_name(b"veilfs.diriv.AAAAAAAAAAAAAAAAAAAAAB"), None);
        assert!(IvCopy::Name.is_copy_name(b"veilfs.diriv.x") && !IvCopy::Name.is_copy_name(DIRIV_NAME.as_bytes()));
    }

    #[test]
    fn name_form_verifies_restores_and_rewrites() {
        let tmp = tempfile::tempdir().unwrap();
        let fd = sys::open_dir_path(tmp.path()).unwrap();
        let (iv, other): (DirIv, DirIv) = (crate::random::bytes(), crate::random::bytes());
        assert!(!IvCopy::Name.verify(fd.as_fd(), &iv, tmp.path()).unwrap(), "none: a crash leftover");
        IvCopy::Name.write(fd.as_fd(), &other).unwrap();
        let e = IvCopy::Name.verify(fd.as_fd(), &iv, tmp.path()).unwrap_err();
        assert!(matches!(e, Error::Auth { .. }) && e.to_string().contains(&diriv_name(&other)), "{e}");
        assert_eq!(IvCopy::Name.carried(fd.as_fd()), vec![other]);
        IvCopy::Name.rewrite(fd.as_fd(), &iv, tmp.path()).unwrap();
        assert!(IvCopy::Name.verify(fd.as_fd(), &iv, tmp.path()).unwrap());
        assert_eq!(IvCopy::Name.carried(fd.as_fd()), vec![iv]);
        assert_eq!(std::fs::metadata(tmp.path().join(diriv_name(&iv))).unwrap().len(), 0);
    }
}
