//! Extended attributes: names and values encrypted, bound to the object that carries them.
//!
//! Only the `user.` namespace is offered to users. A plaintext attribute `user.x` of an object
//! with identity `id` (file ID, directory IV, ...) is stored on the backing object as
//!
//! ```text
//! name  = "user.veilfs." ‖ base64url(AES-256-SIV(xattr-names key, AD = [id], "user.x"))
//! value = nonce ‖ AEAD(xattr key of id, nonce, value, AAD = "veilfs v1 xattr" ‖ name) ‖ tag
//! ```
//!
//! so attributes cannot be read under another name or copied to another object unnoticed.
//! Plaintext names up to 166 bytes fit Linux's 255-byte attribute-name limit.
//!
//! A backing value holds at most 65536 bytes, so the nonce and tag leave 65508 (GCM) for the
//! plaintext. With the vault feature `overflow` (docs/FORMAT.md §16.1) a sealed value longer
//! than that is split: its first 65536 bytes under the name, the rest under a continuation
//! name `user.veilfs.+` ‖ base64url(SHA-256(first part)). One AEAD covers both parts, so a
//! continuation removed, cut, or taken from another attribute or object makes the value fail
//! authentication; and as the continuation's name follows the first part's bytes, a stale
//! continuation left by a crash never joins a newer value. The writer stores the continuation
//! first and removes the old one last, so a crash leaves at worst an unused continuation,
//! which `fsck --repair` removes.
//!
//! This module does every on-disk step of attributes for every front end (the mount, import
//! and export, fsck), on an [`XattrTarget`] the caller has verified.

use crate::content::aead::TAG_LEN;
use crate::content::ContentCipher;
use crate::error::{Error, Result};
use crate::keys::{hkdf_expand, SecretBytes, SubKeys};
use crate::names::{b64_decode, b64_encode, Identity, SivPool};
use crate::sys::XattrTarget;
use sha2::{Digest, Sha256};
use std::io;

/// The stored attribute names on `t`, NUL-separated. A backing file system without
/// extended attributes (sshfs, some NFS and SMB mounts: the listing is EOPNOTSUPP) holds none,
/// which is what a vault there has: no attributes, never damage (fsck and export read every
/// object's; tests/sync.rs `fsck_and_export_through_sshfs_agree_with_the_vaults_machine`).
fn stored_names(t: XattrTarget<'_>) -> Result<Vec<u8>> {
    match t.list_all() {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(Vec::new()),
        r => r.map_err(|e| Error::io("xattr", e)),
    }
}

/// Prefix of every attribute veilfs stores.
pub const STORED_PREFIX: &str = "user.veilfs.";
/// The only namespace offered.
pub const USER_PREFIX: &[u8] = b"user.";
/// Longest plaintext attribute name (so the stored name fits in 255 bytes).
pub const MAX_NAME: usize = 166;
/// Prefix of the continuation of a value that overflows its backing attribute.
pub const MORE_PREFIX: &str = "user.veilfs.+";
/// Linux's largest attribute value (`XATTR_SIZE_MAX`), backing or plaintext.
pub const SIZE_MAX: usize = 65536;
/// Linux's largest attribute-name list of one object (`XATTR_LIST_MAX`).
pub const LIST_MAX: usize = 65536;

/// The continuation name of a value whose first part is `head`.
pub fn more_name(head: &[u8]) -> String {
    format!("{MORE_PREFIX}{}", b64_encode(&Sha256::digest(head)))
}

fn errno(n: i32) -> Error {
    Error::io("xattr", io::Error::from_raw_os_error(n))
}

/// Encrypts and decrypts attribute names and values.
pub struct XattrCipher {
    names: SivPool,
    content: SecretBytes<32>,
    cipher: ContentCipher,
    overflow: bool,
}

impl std::fmt::Debug for XattrCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("XattrCipher(<redacted>)")
    }
}

impl XattrCipher {
    /// From the vault's subkeys and content cipher.
    pub fn new(keys: &SubKeys, cipher: ContentCipher) -> Self {
        XattrCipher { names: SivPool::new(&keys.xattr_names), content: keys.content.clone(), cipher, overflow: false }
    }

    /// With continuations for values that do not fit one backing attribute (vault feature
    /// `overflow`).
    pub fn with_overflow(mut self, overflow: bool) -> Self {
        self.overflow = overflow;
        self
    }

    /// Longest plaintext value: 65536 bytes with continuations, else what fits one backing
    /// attribute with the nonce and tag.
    pub fn max_value(&self) -> usize {
        if self.overflow {
            SIZE_MAX
        } else {
            SIZE_MAX - self.value_overhead()
        }
    }

    fn value_key(&self, id: &Identity) -> crate::content::BlockKey {
        let k: SecretBytes<32> = hkdf_expand(id, self.content.expose(), b"xattr-value");
        self.cipher.key(k.expose())
    }

    /// The stored name of plaintext attribute `name` on object `id`. Errors: a name outside
    /// `user.` (`EOPNOTSUPP`) or too long (`ERANGE`).
    pub fn encrypt_name(&self, id: &Identity, name: &[u8]) -> Result<String> {
        if !name.starts_with(USER_PREFIX) {
            return Err(Error::io("xattr", std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
        }
        if name.len() > MAX_NAME {
            return Err(Error::io("xattr", std::io::Error::from_raw_os_error(libc::ERANGE)));
        }
        let ct = self.names.with(|siv| siv.encrypt([id.as_slice()], name)).expect("SIV of a short name");
        Ok(format!("{STORED_PREFIX}{}", b64_encode(&ct)))
    }

    /// The plaintext name of a stored attribute name, `None` if it is not one of ours (or is
    /// a continuation).
    pub fn decrypt_name(&self, id: &Identity, stored: &[u8]) -> Option<Result<Vec<u8>>> {
        if stored.starts_with(MORE_PREFIX.as_bytes()) {
            return None;
        }
        let rest = stored.strip_prefix(STORED_PREFIX.as_bytes())?;
        let ct = std::str::from_utf8(rest).ok().and_then(b64_decode);
        Some(
            ct.and_then(|ct| self.names.with(|siv| siv.decrypt([id.as_slice()], ct.as_slice())).ok())
                .ok_or_else(|| Error::auth("xattr name", "failed authentication (moved from another object?)")),
        )
    }

    /// Encrypts `value` for the stored name `stored`.
    pub fn encrypt_value(&self, id: &Identity, stored: &str, value: &[u8]) -> Vec<u8> {
        let mut nonce = vec![0u8; self.cipher.nonce_len()];
        crate::random::fill(&mut nonce);
        self.encrypt_value_with_nonce(id, stored, value, &nonce)
    }

    /// [`encrypt_value`](Self::encrypt_value) with a given nonce (known-answer vectors only:
    /// a nonce must never repeat under one key).
    pub fn encrypt_value_with_nonce(&self, id: &Identity, stored: &str, value: &[u8], nonce: &[u8]) -> Vec<u8> {
        let nl = self.cipher.nonce_len();
        let mut out = vec![0u8; nl + value.len() + TAG_LEN];
        out[..nl].copy_from_slice(nonce);
        out[nl..nl + value.len()].copy_from_slice(value);
        let (nonce, rest) = out.split_at_mut(nl);
        let tag = self.value_key(id).seal(nonce, &aad(stored), &mut rest[..value.len()]);
        out[nl + value.len()..].copy_from_slice(&tag);
        out
    }

    /// Decrypts a stored value.
    pub fn decrypt_value(&self, id: &Identity, stored: &str, blob: &[u8]) -> Result<Vec<u8>> {
        let nl = self.cipher.nonce_len();
        if blob.len() < nl + TAG_LEN {
            return Err(Error::auth("xattr value", "is truncated"));
        }
        let mut body = blob[nl..blob.len() - TAG_LEN].to_vec();
        self.value_key(id)
            .open(&blob[..nl], &aad(stored), &mut body, &blob[blob.len() - TAG_LEN..])
            .map_err(|_| Error::auth("xattr value", "failed authentication"))?;
        Ok(body)
    }

    /// The plaintext value of attribute `name` of object `id` on `t`. Errors: ENODATA (no
    /// such attribute, or a name outside `user.`), an integrity error (naming "xattr value";
    /// the caller relabels it with the object).
    pub fn get(&self, t: XattrTarget<'_>, id: &Identity, name: &[u8]) -> Result<Vec<u8>> {
        let stored = self.encrypt_name(id, name).map_err(|_| errno(libc::ENODATA))?;
        let blob = self.read_sealed(t, &stored)?;
        self.decrypt_value(id, &stored, &blob)
    }

    /// The sealed value stored under `stored`, joined with its continuation if it has one.
    fn read_sealed(&self, t: XattrTarget<'_>, stored: &str) -> Result<Vec<u8>> {
        let mut blob = read_raw(t, stored.as_bytes())?;
        if self.overflow && blob.len() == SIZE_MAX {
            match read_raw(t, more_name(&blob).as_bytes()) {
                Ok(more) => blob.extend_from_slice(&more),
                Err(e) if e.errno() == libc::ENODATA => {}
                Err(e) => return Err(e),
            }
        }
        Ok(blob)
    }

    /// The continuation name of the value stored under `stored` now, if it may have one.
    fn current_more(&self, t: XattrTarget<'_>, stored: &str) -> Option<String> {
        if !self.overflow || t.get(stored.as_bytes(), &mut []).ok()? != SIZE_MAX {
            return None;
        }
        read_raw(t, stored.as_bytes()).ok().map(|head| more_name(&head))
    }

    /// Sets attribute `name` of object `id` on `t` to `value` (`flags`: `XATTR_CREATE`,
    /// `XATTR_REPLACE`). A value over [`max_value`](Self::max_value) is E2BIG; a new name
    /// that would push the object's stored name list past the kernel's 64 KiB is ENOSPC
    /// (else every later listxattr of the object would fail).
    pub fn set(&self, t: XattrTarget<'_>, id: &Identity, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        let stored = self.encrypt_name(id, name)?;
        if value.len() > self.max_value() {
            let msg = format!(
                "an xattr value of {} bytes is longer than this vault allows ({} bytes{})",
                value.len(),
                self.max_value(),
                if self.overflow { "" } else { "; vaults made before the feature \"overflow\"" }
            );
            tracing::warn!("{msg}");
            return Err(Error::io(msg, io::Error::from_raw_os_error(libc::E2BIG)));
        }
        let exists = t.get(stored.as_bytes(), &mut []).is_ok();
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(errno(libc::EEXIST));
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(errno(libc::ENODATA));
        }
        let old_more = self.current_more(t, &stored);
        let mut blob = self.encrypt_value(id, &stored, value);
        let tail = (blob.len() > SIZE_MAX).then(|| blob.split_off(SIZE_MAX));
        let more = tail.as_ref().map(|_| more_name(&blob));
        let extra = if exists { 0 } else { stored.len() + 1 } + more.as_ref().map_or(0, |m| m.len() + 1);
        if extra > 0 && t.list(&mut []).map_err(|e| Error::io("xattr", e))? + extra > LIST_MAX {
            return Err(errno(libc::ENOSPC));
        }
        if let (Some(more), Some(tail)) = (&more, &tail) {
            t.set(more.as_bytes(), tail, 0).map_err(|e| Error::io("xattr", e))?;
            crate::crash::point!("vault.xattr_more");
        }
        if let Err(e) = t.set(stored.as_bytes(), &blob, flags) {
            if let Some(more) = &more {
                let _ = t.remove(more.as_bytes());
            }
            return Err(Error::io("xattr", e));
        }
        crate::crash::point!("vault.xattr");
        if let Some(old) = old_more.filter(|o| Some(o) != more.as_ref()) {
            crate::crash::point!("vault.xattr_drop_more");
            let _ = t.remove(old.as_bytes());
        }
        Ok(())
    }

    /// Removes attribute `name` of object `id` on `t`, then its continuation if it had one.
    pub fn remove(&self, t: XattrTarget<'_>, id: &Identity, name: &[u8]) -> Result<()> {
        let stored = self.encrypt_name(id, name).map_err(|_| errno(libc::ENODATA))?;
        let more = self.current_more(t, &stored);
        t.remove(stored.as_bytes()).map_err(|e| Error::io("xattr", e))?;
        if let Some(more) = more {
            crate::crash::point!("vault.xattr_drop_more");
            let _ = t.remove(more.as_bytes());
        }
        Ok(())
    }

    /// The plaintext names on `t` (of object `id`), and the integrity errors of names that
    /// do not open.
    pub fn list(&self, t: XattrTarget<'_>, id: &Identity) -> Result<(Vec<Vec<u8>>, Vec<Error>)> {
        let raw = stored_names(t)?;
        let (mut names, mut bad) = (Vec::new(), Vec::new());
        for stored in raw.split(|&b| b == 0).filter(|s| !s.is_empty()) {
            match self.decrypt_name(id, stored) {
                Some(Ok(n)) => names.push(n),
                Some(Err(e)) => bad.push(e),
                None => {}
            }
        }
        Ok((names, bad))
    }

    /// Every plaintext attribute on `t` (of object `id`), each authenticated; the first
    /// integrity error fails the whole.
    pub fn all(&self, t: XattrTarget<'_>, id: &Identity) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let raw = stored_names(t)?;
        let mut out = Vec::new();
        for stored in raw.split(|&b| b == 0).filter(|s| !s.is_empty()) {
            let Some(name) = self.decrypt_name(id, stored) else { continue };
            let name = name?;
            let stored = String::from_utf8_lossy(stored);
            let blob = self.read_sealed(t, &stored)?;
            out.push((name, self.decrypt_value(id, &stored, &blob)?));
        }
        Ok(out)
    }

    /// Continuations on `t` that no stored value uses (crash leftovers).
    pub fn unused_continuations(&self, t: XattrTarget<'_>) -> Result<Vec<String>> {
        let raw = stored_names(t)?;
        let names: Vec<&[u8]> = raw.split(|&b| b == 0).filter(|s| !s.is_empty()).collect();
        let mut used = std::collections::HashSet::new();
        for n in
            names.iter().filter(|n| n.starts_with(STORED_PREFIX.as_bytes()) && !n.starts_with(MORE_PREFIX.as_bytes()))
        {
            if t.get(n, &mut []).ok() == Some(SIZE_MAX) {
                if let Ok(head) = read_raw(t, n) {
                    used.insert(more_name(&head));
                }
            }
        }
        Ok(names
            .iter()
            .filter(|n| n.starts_with(MORE_PREFIX.as_bytes()))
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .filter(|n| !used.contains(n))
            .collect())
    }

    /// Bytes a stored value adds to the plaintext value.
    pub fn value_overhead(&self) -> usize {
        self.cipher.nonce_len() + TAG_LEN
    }
}

/// One backing attribute's raw value (at most [`SIZE_MAX`] bytes).
fn read_raw(t: XattrTarget<'_>, name: &[u8]) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; SIZE_MAX];
    let n = t.get(name, &mut buf).map_err(|e| Error::io("xattr", e))?;
    buf.truncate(n);
    Ok(buf)
}

fn aad(stored: &str) -> Vec<u8> {
    let mut a = b"veilfs v1 xattr".to_vec();
    a.extend_from_slice(stored.as_bytes());
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MasterKey;

    #[test]
    fn round_trip_and_binding() {
        let x = XattrCipher::new(&MasterKey::from_bytes([1; 32]).subkeys(), ContentCipher::Aes256Gcm);
        let (a, b) = ([1u8; 16], [2u8; 16]);
        let n = x.encrypt_name(&a, b"user.comment").unwrap();
        assert!(n.len() <= 255);
        assert_eq!(x.decrypt_name(&a, n.as_bytes()).unwrap().unwrap(), b"user.comment");
        assert!(x.decrypt_name(&b, n.as_bytes()).unwrap().is_err(), "moved to another object");
        assert!(x.decrypt_name(&a, b"security.selinux").is_none());
        let v = x.encrypt_value(&a, &n, b"hello");
        assert_eq!(x.decrypt_value(&a, &n, &v).unwrap(), b"hello");
        assert!(x.decrypt_value(&b, &n, &v).is_err());
        let other = x.encrypt_name(&a, b"user.other").unwrap();
        assert!(x.decrypt_value(&a, &other, &v).is_err(), "value under another name");
        assert!(x.encrypt_name(&a, b"trusted.x").is_err());
        assert!(x.encrypt_name(&a, &[b'u'; 167]).is_err());
        let long = [b"user.".as_slice(), &[b'x'; MAX_NAME - 5]].concat();
        assert!(x.encrypt_name(&a, &long).unwrap().len() <= 255);
    }
}
