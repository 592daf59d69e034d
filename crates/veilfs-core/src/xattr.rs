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

use crate::content::aead::TAG_LEN;
use crate::content::ContentCipher;
use crate::error::{Error, Result};
use crate::keys::{hkdf_expand, SecretBytes, SubKeys};
use crate::names::{b64_decode, b64_encode, Identity, SivPool};

/// Prefix of every attribute veilfs stores.
pub const STORED_PREFIX: &str = "user.veilfs.";
/// The only namespace offered.
pub const USER_PREFIX: &[u8] = b"user.";
/// Longest plaintext attribute name (so the stored name fits in 255 bytes).
pub const MAX_NAME: usize = 166;

/// Encrypts and decrypts attribute names and values.
pub struct XattrCipher {
    names: SivPool,
    content: SecretBytes<32>,
    cipher: ContentCipher,
}

impl std::fmt::Debug for XattrCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("XattrCipher(<redacted>)")
    }
}

impl XattrCipher {
    /// From the vault's subkeys and content cipher.
    pub fn new(keys: &SubKeys, cipher: ContentCipher) -> Self {
        XattrCipher { names: SivPool::new(&keys.xattr_names), content: keys.content.clone(), cipher }
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

    /// The plaintext name of a stored attribute name, `None` if it is not one of ours.
    pub fn decrypt_name(&self, id: &Identity, stored: &[u8]) -> Option<Result<Vec<u8>>> {
        let rest = stored.strip_prefix(STORED_PREFIX.as_bytes())?;
        let ct = std::str::from_utf8(rest).ok().and_then(b64_decode);
        Some(
            ct.and_then(|ct| self.names.with(|siv| siv.decrypt([id.as_slice()], ct.as_slice())).ok())
                .ok_or_else(|| Error::auth("xattr name", "failed authentication (moved from another object?)")),
        )
    }

    /// Encrypts `value` for the stored name `stored`.
    pub fn encrypt_value(&self, id: &Identity, stored: &str, value: &[u8]) -> Vec<u8> {
        let nl = self.cipher.nonce_len();
        let mut out = vec![0u8; nl + value.len() + TAG_LEN];
        crate::random::fill(&mut out[..nl]);
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

    /// Bytes a stored value adds to the plaintext value.
    pub fn value_overhead(&self) -> usize {
        self.cipher.nonce_len() + TAG_LEN
    }
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
