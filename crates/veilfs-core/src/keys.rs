//! The master key and the subkeys derived from it.
//!
//! One random 256-bit master key per vault. Every purpose gets its own subkey through
//! HKDF-SHA256 with a distinct label, so no key is ever used by two algorithms (the
//! EncFS audit's finding 2.1 and the gocryptfs audit's 2.4). Per-file content keys are
//! derived from the content subkey and the file's random ID, so AEAD nonce limits apply per
//! file, not per vault. All key material is zeroized on drop and never printed.

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Length of the master key in bytes.
pub const MASTER_KEY_LEN: usize = 32;

/// The HKDF salt for every subkey of the master key (domain separation for format v1).
const HKDF_SALT: &[u8] = b"veilfs v1";

/// The vault's master key. Zeroized on drop; `Debug` does not print it.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct MasterKey([u8; MASTER_KEY_LEN]);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl MasterKey {
    /// A fresh random master key.
    pub fn generate() -> Self {
        MasterKey(crate::random::bytes())
    }

    /// Wraps existing key bytes (from a key slot or a test vector).
    pub fn from_bytes(bytes: [u8; MASTER_KEY_LEN]) -> Self {
        MasterKey(bytes)
    }

    /// The raw bytes, for key wrapping only.
    pub(crate) fn as_bytes(&self) -> &[u8; MASTER_KEY_LEN] {
        &self.0
    }

    /// The raw key bytes. Only for known-answer tests and an explicit, user-requested key
    /// export; never log them.
    pub fn expose_secret(&self) -> &[u8; MASTER_KEY_LEN] {
        &self.0
    }

    /// Derives `N` bytes for `label` (HKDF-SHA256, salt "veilfs v1", info = label).
    pub(crate) fn derive<const N: usize>(&self, label: &str) -> SecretBytes<N> {
        hkdf_expand(HKDF_SALT, &self.0, label.as_bytes())
    }

    /// Derives all subkeys used by the format.
    pub fn subkeys(&self) -> SubKeys {
        SubKeys {
            content: self.derive("content"),
            header: self.derive("header-mac"),
            names: self.derive("names"),
            binding: self.derive("name-binding"),
            config_mac: self.derive("config-mac"),
            xattr_names: self.derive("xattr-names"),
            record_mac: self.derive("record-mac"),
        }
    }
}

/// Fixed-size secret bytes, zeroized on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SecretBytes<const N: usize>(pub(crate) [u8; N]);

impl<const N: usize> SecretBytes<N> {
    /// Borrows the bytes.
    pub fn expose(&self) -> &[u8; N] {
        &self.0
    }
}

impl<const N: usize> std::fmt::Debug for SecretBytes<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes<{N}>(<redacted>)")
    }
}

/// HKDF-SHA256 extract-and-expand to `N` bytes.
pub(crate) fn hkdf_expand<const N: usize>(salt: &[u8], ikm: &[u8], info: &[u8]) -> SecretBytes<N> {
    let hk = Hkdf::<Sha256>::new(Some(salt), ikm);
    let mut out = [0u8; N];
    hk.expand(info, &mut out).expect("HKDF output length is valid");
    SecretBytes(out)
}

/// HMAC-SHA256 over the concatenation of `parts`, truncated to 16 bytes.
pub(crate) fn hmac16(key: &[u8], parts: &[&[u8]]) -> [u8; 16] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    let full = mac.finalize().into_bytes();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// HMAC-SHA256 over `parts`, each preceded by its length (u32 big-endian), so no two lists
/// of parts give one input. Full 32 bytes.
pub(crate) fn hmac_parts(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(&(p.len() as u32).to_be_bytes());
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// Every subkey of a vault, derived once when the vault is unlocked.
#[derive(Clone, Debug)]
pub struct SubKeys {
    /// Root of the per-file content keys.
    pub content: SecretBytes<32>,
    /// HMAC key for file headers.
    pub header: SecretBytes<32>,
    /// AES-256-SIV key (512 bits) for names.
    pub names: SecretBytes<64>,
    /// AES-256-SIV key for the identity binding of directory entries.
    pub binding: SecretBytes<64>,
    /// HMAC key authenticating the config file as a whole.
    pub config_mac: SecretBytes<32>,
    /// AES-256-SIV key for extended attribute names.
    pub xattr_names: SecretBytes<64>,
    /// HMAC key authenticating the vault's own records that a crash sweep or a repair acts
    /// on (an exchange's intent record, docs/FORMAT.md §10).
    pub record_mac: SecretBytes<32>,
}

impl SubKeys {
    /// The content key of one file (or symlink, or xattr value set), from its 16-byte ID.
    pub fn file_key(&self, file_id: &[u8; 16]) -> SecretBytes<32> {
        hkdf_expand(file_id, &self.content.0, b"file-content")
    }
}
