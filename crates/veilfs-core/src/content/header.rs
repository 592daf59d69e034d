//! The per-file header: format version, flags and the random file ID, under an HMAC.
//!
//! ```text
//! offset  len  field
//!      0    2  version, big-endian, = 1
//!      2    2  flags, big-endian (bit 0: SPARSE — the file may contain holes;
//!                 bit 1: UNSETTLED — a writer was changing the file's tail, FORMAT.md §5.8)
//!      4   16  file ID (random)
//!     20   16  HMAC-SHA256(header key, "veilfs v1 header" ‖ bytes 0..20), first 16 bytes
//! ```
//! The HMAC stops an attacker from setting the SPARSE flag (which would let all-zero blocks
//! read as zeros) or UNSETTLED (which lets a torn tail read as a prefix), or changing the version. The file ID is additionally bound by every block's
//! AAD and by the directory entry that names the file.

use crate::error::{Error, Result};
use crate::keys::{hmac16, SubKeys};
use subtle::ConstantTimeEq;

/// Header length on disk.
pub const HEADER_LEN: usize = 36;
/// The only header version of format v1.
pub const HEADER_VERSION: u16 = 1;
/// Flag: the file may contain holes (all-zero ciphertext blocks that read as zeros).
pub const FLAG_SPARSE: u16 = 1;
/// Flag: a writer was changing the file's tail in more than one step (feature
/// `"unsettled-tails"`); the tail is read by the rules of FORMAT.md §5.8.
pub const FLAG_UNSETTLED: u16 = 2;
const KNOWN_FLAGS: u16 = FLAG_SPARSE | FLAG_UNSETTLED;
const HEADER_LABEL: &[u8] = b"veilfs v1 header";

/// A file's random 128-bit identity.
pub type FileId = [u8; 16];

/// A decoded, verified file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// Flags (see [`FLAG_SPARSE`]).
    pub flags: u16,
    /// The file ID.
    pub id: FileId,
}

impl FileHeader {
    /// A header for a new file with ID `id` and no flags.
    pub fn new(id: FileId) -> Self {
        FileHeader { flags: 0, id }
    }

    /// True when the SPARSE flag is set.
    pub fn is_sparse(&self) -> bool {
        self.flags & FLAG_SPARSE != 0
    }

    /// True when the UNSETTLED flag is set.
    pub fn is_unsettled(&self) -> bool {
        self.flags & FLAG_UNSETTLED != 0
    }

    /// Serializes and authenticates the header.
    pub fn encode(&self, keys: &SubKeys) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..2].copy_from_slice(&HEADER_VERSION.to_be_bytes());
        out[2..4].copy_from_slice(&self.flags.to_be_bytes());
        out[4..20].copy_from_slice(&self.id);
        let tag = hmac16(keys.header.expose(), &[HEADER_LABEL, &out[..20]]);
        out[20..].copy_from_slice(&tag);
        out
    }

    /// Parses and verifies a header; `what` names the file in errors.
    pub fn decode(bytes: &[u8], keys: &SubKeys, what: &str) -> Result<Self> {
        if bytes.len() < HEADER_LEN {
            return Err(Error::auth(what, format!("file header truncated ({} of {HEADER_LEN} bytes)", bytes.len())));
        }
        let bytes = &bytes[..HEADER_LEN];
        let tag = hmac16(keys.header.expose(), &[HEADER_LABEL, &bytes[..20]]);
        if !bool::from(tag.ct_eq(&bytes[20..])) {
            return Err(Error::auth(what, "file header authentication failed"));
        }
        let version = u16::from_be_bytes([bytes[0], bytes[1]]);
        if version != HEADER_VERSION {
            return Err(Error::auth(what, format!("unsupported file header version {version}")));
        }
        let flags = u16::from_be_bytes([bytes[2], bytes[3]]);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(Error::auth(what, format!("unknown file header flags {flags:#x}")));
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&bytes[4..20]);
        Ok(FileHeader { flags, id })
    }
}
