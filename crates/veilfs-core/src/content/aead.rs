//! The two content AEADs and a key type that hides which one is in use.
//!
//! AES-256-GCM (aws-lc-rs; ~8 GB/s per core with AES-NI) is the default; XChaCha20-Poly1305
//! (RustCrypto) is for machines without AES instructions. Both use random nonces: 96 bits for
//! GCM under a per-file key, 192 bits for XChaCha. AES-256-GCM-SIV (RFC 8452, aws-lc-rs) is
//! the cipher of deterministic (reverse-mode) vaults, whose nonces are derived, not drawn
//! (`crate::reverse`); a forward writer uses random nonces with it as with GCM.

use crate::error::{Error, Result};
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::XChaCha20Poly1305;
use serde::{Deserialize, Serialize};

/// AEAD tag length in bytes (both ciphers).
pub const TAG_LEN: usize = 16;

/// Which AEAD encrypts file content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContentCipher {
    /// AES-256-GCM with 96-bit random nonces.
    #[serde(rename = "AES-256-GCM")]
    Aes256Gcm,
    /// XChaCha20-Poly1305 with 192-bit random nonces.
    #[serde(rename = "XChaCha20-Poly1305")]
    XChaCha20Poly1305,
    /// AES-256-GCM-SIV (nonce-misuse resistant), 96-bit nonces: the cipher of deterministic
    /// vaults (feature `"deterministic"`, made by `veilfs init --reverse`).
    #[serde(rename = "AES-256-GCM-SIV")]
    Aes256GcmSiv,
}

impl ContentCipher {
    /// Nonce length in bytes.
    pub const fn nonce_len(self) -> usize {
        match self {
            ContentCipher::Aes256Gcm | ContentCipher::Aes256GcmSiv => 12,
            ContentCipher::XChaCha20Poly1305 => 24,
        }
    }

    /// Bytes added to every block (nonce + tag).
    pub const fn overhead(self) -> usize {
        self.nonce_len() + TAG_LEN
    }

    /// The name used in the config file and in `veilfs info`.
    pub fn name(self) -> &'static str {
        match self {
            ContentCipher::Aes256Gcm => "AES-256-GCM",
            ContentCipher::XChaCha20Poly1305 => "XChaCha20-Poly1305",
            ContentCipher::Aes256GcmSiv => "AES-256-GCM-SIV",
        }
    }

    /// Parses a cipher name as accepted on the command line.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "aes-256-gcm" | "aes256gcm" | "aes" | "gcm" => Some(ContentCipher::Aes256Gcm),
            "xchacha20-poly1305" | "xchacha" | "xchacha20" => Some(ContentCipher::XChaCha20Poly1305),
            "aes-256-gcm-siv" | "gcm-siv" => Some(ContentCipher::Aes256GcmSiv),
            _ => None,
        }
    }

    /// Builds a key for this cipher.
    pub fn key(self, key: &[u8; 32]) -> BlockKey {
        match self {
            ContentCipher::Aes256Gcm => {
                let unbound =
                    aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM, key).expect("32-byte AES key");
                BlockKey::Gcm(aws_lc_rs::aead::LessSafeKey::new(unbound))
            }
            ContentCipher::XChaCha20Poly1305 => BlockKey::XChaCha(Box::new(XChaCha20Poly1305::new(key.into()))),
            ContentCipher::Aes256GcmSiv => {
                let unbound =
                    aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM_SIV, key).expect("32-byte AES key");
                BlockKey::Gcm(aws_lc_rs::aead::LessSafeKey::new(unbound))
            }
        }
    }
}

/// A ready-to-use content key (key schedule computed once per file).
pub enum BlockKey {
    /// AES-256-GCM or AES-256-GCM-SIV (the same aws-lc-rs interface).
    Gcm(aws_lc_rs::aead::LessSafeKey),
    /// XChaCha20-Poly1305.
    XChaCha(Box<XChaCha20Poly1305>),
}

impl std::fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BlockKey(<redacted>)")
    }
}

impl BlockKey {
    /// Encrypts `buf` in place and returns the tag. `nonce` must have the cipher's length.
    pub fn seal(&self, nonce: &[u8], aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
        match self {
            BlockKey::Gcm(k) => {
                let n = aws_lc_rs::aead::Nonce::try_assume_unique_for_key(nonce).expect("12-byte nonce");
                let tag = k
                    .seal_in_place_separate_tag(n, aws_lc_rs::aead::Aad::from(aad), buf)
                    .expect("AES-GCM seal cannot fail for block-sized input");
                let mut out = [0u8; TAG_LEN];
                out.copy_from_slice(tag.as_ref());
                out
            }
            BlockKey::XChaCha(k) => {
                let tag = k
                    .encrypt_in_place_detached(nonce.into(), aad, buf)
                    .expect("XChaCha seal cannot fail for block-sized input");
                tag.into()
            }
        }
    }

    /// Decrypts `buf` in place, verifying `tag`. On failure `buf` holds no plaintext.
    pub fn open(&self, nonce: &[u8], aad: &[u8], buf: &mut [u8], tag: &[u8]) -> Result<()> {
        let ok = match self {
            BlockKey::Gcm(k) => {
                let n = aws_lc_rs::aead::Nonce::try_assume_unique_for_key(nonce).expect("12-byte nonce");
                k.open_in_place_separate_tag(n, aws_lc_rs::aead::Aad::from(aad), tag, buf).is_ok()
            }
            BlockKey::XChaCha(k) => {
                tag.len() == TAG_LEN && k.decrypt_in_place_detached(nonce.into(), aad, buf, tag.into()).is_ok()
            }
        };
        if ok {
            Ok(())
        } else {
            buf.fill(0);
            Err(Error::auth("block", "authentication tag mismatch"))
        }
    }
}
