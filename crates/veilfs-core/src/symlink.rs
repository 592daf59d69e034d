//! Symbolic links: the encrypted target inline in the backing symlink, or — when it does not
//! fit the backing target's 4095 bytes (vault feature `overflow`, docs/FORMAT.md §8.1) — in a
//! side file `veilfs.T.<b64(ID)>` beside it, the backing symlink then holding only `b64(ID)`.
//!
//! Inline, a target blob is `ID ‖ nonce ‖ ciphertext ‖ tag` in base64url, so plaintext targets
//! stop at about 3000 bytes; Linux allows 4095. The side file holds the same blob raw, sealed
//! under the symlink's own key with its ID as prefix, so it opens for no other symlink. It is
//! named by the object (its ID), not by an entry, so hard links in one directory share it and
//! a rename within a directory leaves it alone; moving, linking or removing an entry across
//! directories carries it (linked into the target directory first, dropped from the source
//! once no symlink there points to it), so a crash leaves at worst an unused side file, which
//! `fsck --repair` removes, never a symlink without its target.

use crate::crash;
use crate::error::{Error, IoContext, Result};
use crate::names::{b64_decode, b64_encode, EntryKind, Identity, NameKey, ParsedEntry};
use crate::sys::{self, MetaError};
use crate::vault::{CipherDir, Entry, Vault};

/// Longest plaintext symlink target (Linux's `PATH_MAX` − 1).
pub const MAX_TARGET: usize = 4095;
/// Longest backing symlink target.
const MAX_STORED: usize = 4095;
/// Prefix of the side files that hold overflowing targets.
pub const TARGET_FILE_PREFIX: &str = "veilfs.T.";
/// Largest target side file a reader accepts (ID, the larger nonce, 4095 bytes, tag).
const TARGET_FILE_MAX: usize = 16 + 24 + MAX_TARGET + 16;

/// The side file of the symlink with identity `id`.
pub fn target_file_name(id: &Identity) -> String {
    format!("{TARGET_FILE_PREFIX}{}", b64_encode(id))
}

/// The identity a stored (backing) target of the overflow form names: `b64(ID)` alone.
fn overflow_id(stored: &[u8]) -> Option<Identity> {
    let s = std::str::from_utf8(stored).ok()?;
    (s.len() == 22).then(|| b64_decode(s)).flatten().and_then(|b| b.try_into().ok())
}

/// Whether `a` and `b` are one directory (by inode: a mount's directory paths can be stale).
fn same_dir(a: &CipherDir, b: &CipherDir) -> bool {
    match (sys::fstat(a.fd()), sys::fstat(b.fd())) {
        (Ok(x), Ok(y)) => (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino),
        _ => a.path == b.path,
    }
}

impl Vault {
    /// Seals `target` as the blob of symlink `id`: `ID ‖ nonce ‖ ciphertext ‖ tag`, the last
    /// block 0 of a "file" whose ID is the symlink's identity.
    fn seal_target(&self, id: &Identity, target: &[u8]) -> Vec<u8> {
        let ctx = self.content();
        let codec = crate::content::BlockCodec::new(ctx.cipher, &ctx.keys, *id);
        let mut blob = vec![0u8; 16 + target.len() + codec.overhead()];
        blob[..16].copy_from_slice(id);
        codec.seal_into(0, true, target, &mut blob[16..]);
        blob
    }

    /// Opens a target blob of symlink `id`; `what` names it in errors.
    fn open_target(&self, id: &Identity, blob: &[u8], what: &str) -> Result<Vec<u8>> {
        let ctx = self.content();
        if blob.len() <= 16 + ctx.cipher.overhead() || blob[..16] != id[..] {
            return Err(Error::auth(what, "symlink target does not belong to this entry"));
        }
        let codec = crate::content::BlockCodec::new(ctx.cipher, &ctx.keys, *id);
        let mut out = vec![0u8; blob.len() - 16 - codec.overhead()];
        codec.open_into(0, true, &blob[16..], &mut out, what)?;
        Ok(out)
    }

    /// Encrypts a target to its inline stored form `base64url(blob)`; ENAMETOOLONG if that
    /// does not fit a backing symlink.
    pub fn encrypt_target(&self, id: &Identity, target: &[u8]) -> Result<Vec<u8>> {
        let enc = b64_encode(&self.seal_target(id, target)).into_bytes();
        if enc.len() > MAX_STORED {
            return Err(Error::io("symlink", std::io::Error::from_raw_os_error(libc::ENAMETOOLONG)));
        }
        Ok(enc)
    }

    /// Longest target this vault stores: 4095 bytes with feature `overflow`, else what fits
    /// inline (3027 bytes with GCM, 3015 with XChaCha).
    pub fn max_target(&self) -> usize {
        if self.config().has_overflow() {
            MAX_TARGET
        } else {
            MAX_STORED * 3 / 4 - 16 - self.content().cipher.overhead()
        }
    }

    /// Creates a symlink → `target` under `key` in `dir` (the caller knows the name is free).
    /// A target whose inline form does not fit goes to its side file first, then the symlink
    /// naming it appears: a crash between leaves only an unused side file.
    pub fn symlink_at(&self, dir: &CipherDir, key: &NameKey, target: &[u8]) -> Result<(String, Identity)> {
        let max = self.max_target();
        if target.len() > max {
            let msg = format!(
                "a symlink target of {} bytes is longer than this vault allows ({max} bytes{})",
                target.len(),
                if self.config().has_overflow() { "" } else { "; vaults made before the feature \"overflow\"" }
            );
            tracing::warn!("{}: {msg}", dir.path.display());
            return Err(Error::io(msg, std::io::Error::from_raw_os_error(libc::ENAMETOOLONG)));
        }
        let id: Identity = crate::random::bytes();
        let blob = self.seal_target(&id, target);
        let on_disk = self.entry_name_for(dir, key, EntryKind::Symlink, &id)?;
        let inline = b64_encode(&blob);
        if inline.len() <= MAX_STORED {
            sys::symlinkat(inline.as_bytes(), dir.fd(), on_disk.as_bytes()).ctx(|| dir.child_path(&on_disk))?;
            return Ok((on_disk, id));
        }
        let side = target_file_name(&id);
        sys::write_new_file(dir.fd(), side.as_bytes(), &blob, 0o400).ctx(|| dir.child_path(&side))?;
        crash::point!("vault.symlink_side");
        if let Err(e) = sys::symlinkat(b64_encode(&id).as_bytes(), dir.fd(), on_disk.as_bytes()) {
            let _ = sys::unlinkat(dir.fd(), side.as_bytes(), false);
            return Err(Error::io(dir.child_path(&on_disk), e));
        }
        Ok((on_disk, id))
    }

    /// Creates symlink `name` → `target`.
    pub fn symlink(&self, dir: &CipherDir, name: &[u8], target: &[u8]) -> Result<Entry> {
        let key = self.absent_key(dir, name)?;
        let (on_disk, id) = self.symlink_at(dir, &key, target)?;
        self.entry_after_create(dir, name, key, on_disk, EntryKind::Symlink, id)
    }

    /// Reads the target of the symlink `entry`.
    pub fn readlink(&self, dir: &CipherDir, entry: &Entry) -> Result<Vec<u8>> {
        self.read_target(dir, &entry.on_disk, &entry.identity)
    }

    /// Reads the target of the symlink `on_disk` of `dir` whose entry promises identity `id`:
    /// inline, or from its side file (feature `overflow`).
    pub fn read_target(&self, dir: &CipherDir, on_disk: &str, id: &Identity) -> Result<Vec<u8>> {
        let what = dir.child_path(on_disk);
        let read = || sys::readlinkat(dir.fd(), on_disk.as_bytes());
        let stored = sys::in_dir_as_owner(dir.fd(), sys::is_eacces, read).ctx(|| what.clone())?;
        if self.config().has_overflow() {
            if let Some(named) = overflow_id(&stored) {
                if named != *id {
                    return Err(Error::auth(what, "symlink target does not belong to this entry"));
                }
                let blob = self.read_target_file(dir, id, &what)?;
                return self.open_target(id, &blob, &what);
            }
        }
        self.decrypt_target(id, &stored, &what)
    }

    /// The side file of symlink `id` in `dir`; missing, oversized or not a regular file is an
    /// integrity error of the symlink `what`.
    fn read_target_file(&self, dir: &CipherDir, id: &Identity, what: &str) -> Result<Vec<u8>> {
        let side = target_file_name(id);
        match sys::read_meta_at(dir.fd(), side.as_bytes(), TARGET_FILE_MAX) {
            Ok(b) => Ok(b),
            Err(e) if e.is_not_found() => Err(Error::auth(what, format!("symlink target file {side} is missing"))),
            Err(MetaError::Io(e)) => Err(Error::io(dir.child_path(&side), e)),
            Err(e) => Err(Error::auth(what, format!("symlink target file {side} {e}"))),
        }
    }

    /// Decrypts an inline stored target of symlink `id`; `what` names it in errors.
    pub fn decrypt_target(&self, id: &Identity, stored: &[u8], what: &str) -> Result<Vec<u8>> {
        let blob = std::str::from_utf8(stored)
            .ok()
            .and_then(b64_decode)
            .ok_or_else(|| Error::auth(what, "symlink target is not base64url"))?;
        self.open_target(id, &blob, what)
    }

    /// The side file the symlink `on_disk` of `dir` keeps its target in, if it has one.
    pub fn target_side(&self, dir: &CipherDir, on_disk: &str) -> Option<String> {
        if !self.config().has_overflow() {
            return None;
        }
        let stored = sys::readlinkat(dir.fd(), on_disk.as_bytes()).ok()?;
        overflow_id(&stored).map(|id| target_file_name(&id))
    }

    /// Before the symlink `on_disk` of `from` (of `kind`) gets a name in another directory
    /// `to`: links its side file there (one already there is the same object's). Returns the
    /// side file to [`drop_target_side`](Self::drop_target_side) from `from` (after the move)
    /// or from `to` (if the move fails).
    pub fn carry_target_side(
        &self,
        from: &CipherDir,
        on_disk: &str,
        kind: EntryKind,
        to: &CipherDir,
    ) -> Result<Option<String>> {
        if kind != EntryKind::Symlink || same_dir(from, to) {
            return Ok(None);
        }
        let Some(side) = self.target_side(from, on_disk) else { return Ok(None) };
        match sys::linkat(from.fd(), side.as_bytes(), to.fd(), side.as_bytes()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(to.child_path(&side), e)),
        }
        crash::point!("vault.carry_side");
        Ok(Some(side))
    }

    /// Removes the target side file `side` of `dir` unless a symlink there still points to it
    /// (a hard link, or an object under a temporary name). Best effort: an unused side file is
    /// harmless and `fsck --repair` removes it.
    pub fn drop_target_side(&self, dir: &CipherDir, side: &str) {
        if self.target_side_used(dir, side).unwrap_or(true) {
            return;
        }
        crash::point!("vault.drop_side");
        let _ = sys::unlinkat(dir.fd(), side.as_bytes(), false);
    }

    /// Whether a symlink of `dir` (an entry or an object under a temporary name) keeps its
    /// target in side file `side`.
    pub fn target_side_used(&self, dir: &CipherDir, side: &str) -> Result<bool> {
        let marker = &side.as_bytes()[TARGET_FILE_PREFIX.len()..];
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        Ok(raw.iter().any(|r| {
            let candidate = matches!(r.d_type, libc::DT_LNK | libc::DT_UNKNOWN)
                && (ParsedEntry::parse(&r.name).key().is_some()
                    || r.name.starts_with(crate::names::TEMP_PREFIX.as_bytes()));
            candidate && sys::readlinkat(dir.fd(), &r.name).is_ok_and(|t| t == marker)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_marker_is_exactly_an_id() {
        let id = [7u8; 16];
        assert_eq!(overflow_id(b64_encode(&id).as_bytes()), Some(id));
        assert_eq!(overflow_id(b64_encode(&[7u8; 17]).as_bytes()), None);
        assert_eq!(overflow_id(b"not base64 at all!!!!!"), None);
        assert_eq!(target_file_name(&id).len(), 31);
    }
}
