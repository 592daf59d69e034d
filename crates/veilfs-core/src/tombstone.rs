//! Tombstones: what a client leaves in a directory when it removes an entry (feature
//! `"versions"`, docs/design/rollback.md "Layer 2", docs/FORMAT.md §19), so that another
//! client that remembers the entry (`crate::known`) can tell a deletion by a client (a valid
//! tombstone: forget it) from a deletion by whoever holds only the storage (no tombstone: an
//! alarm), and an entry put back after a client deleted it (entry and valid tombstone both
//! present: "resurrected").
//!
//! A tombstone is about one on-disk entry name in one directory: the name carries the entry's
//! plaintext name, kind and identity under the directory's IV (its binding is deterministic
//! SIV, docs/FORMAT.md §6), so the same object under another name (a rename, a hard link) or
//! in another directory is another entry with a tombstone of its own, and a rename never
//! makes the renamed entry look resurrected. The tombstone's file name is
//! `veilfs.D.<base64url(T)>` with `T = HMAC-SHA256(record-mac, "veilfs v1 tombstone name" ‖
//! dir IV ‖ on-disk name)[..16]`: only a client can name one, and the client's memory keeps
//! exactly `T` per entry it saw, so a listing needs one HMAC per entry and no decryption.
//!
//! The record inside is 58 bytes: version 1, the entry's kind byte, the deleting client's ID
//! (16 bytes), the time (u64be Unix seconds) and `HMAC-SHA256(record-mac, "veilfs v1
//! tombstone" ‖ file name ‖ dir IV ‖ the 26 bytes before)` (length-prefixed parts, as the
//! exchange record of `crate::record`). A tombstone planted, edited, renamed or moved to
//! another directory does not verify and never makes a deletion look legitimate. One file per
//! deletion, so two clients deleting in one directory never edit one file (no sync conflict
//! copies of tombstones).
//!
//! Tombstones older than [`HORIZON_SECS`] (180 days) are removed by `fsck --repair`. A client
//! away longer than that finds the entries deleted meanwhile missing without a tombstone and
//! reports them as deleted by a non-client: a false alarm it cannot avoid (docs/SECURITY.md
//! §4.2a).

use crate::keys::{hmac_parts, SubKeys};
use crate::names::{b64_decode, b64_encode, DirIv};
use crate::sys;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::os::fd::{AsFd, BorrowedFd};

/// Prefix of a tombstone's file name.
pub const TOMBSTONE_PREFIX: &str = "veilfs.D.";
/// How long a tombstone is kept: 180 days.
pub const HORIZON_SECS: u64 = 180 * 86_400;
/// A tombstone's length.
pub const TOMBSTONE_LEN: usize = 1 + 1 + 16 + 8 + 32;
const VERSION: u8 = 1;
const NAME_LABEL: &[u8] = b"veilfs v1 tombstone name";
const RECORD_LABEL: &[u8] = b"veilfs v1 tombstone";

/// What identifies an entry in a client's memory and names its tombstone: the first 16 bytes
/// of `HMAC-SHA256(record-mac, "veilfs v1 tombstone name" ‖ dir IV ‖ on-disk name)`.
pub type Token = [u8; 16];

/// The token of the on-disk entry `on_disk` of the directory of IV `dir_iv`.
pub fn token(keys: &SubKeys, dir_iv: &DirIv, on_disk: &[u8]) -> Token {
    let m = hmac_parts(keys.record_mac.expose(), &[NAME_LABEL, dir_iv, on_disk]);
    m[..16].try_into().expect("32 bytes")
}

/// The tombstone file name of `t`.
pub fn name(t: &Token) -> String {
    format!("{TOMBSTONE_PREFIX}{}", b64_encode(t))
}

/// The token a tombstone file name carries (`None`: not a tombstone's name).
pub fn token_of_name(name: &[u8]) -> Option<Token> {
    let rest = std::str::from_utf8(name.strip_prefix(TOMBSTONE_PREFIX.as_bytes())?).ok()?;
    b64_decode(rest)?.try_into().ok()
}

/// A verified tombstone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tombstone {
    /// The removed entry's kind byte (`EntryKind::binding_byte`).
    pub kind: u8,
    /// The ID of the client that removed it (zero: a command that keeps no client state).
    pub client: [u8; 16],
    /// When, in Unix seconds.
    pub time: u64,
}

impl Tombstone {
    fn body(&self) -> [u8; 26] {
        let mut b = [0u8; 26];
        b[0] = VERSION;
        b[1] = self.kind;
        b[2..18].copy_from_slice(&self.client);
        b[18..26].copy_from_slice(&self.time.to_be_bytes());
        b
    }

    /// The record's bytes for the tombstone file `file_name` in the directory of IV `dir_iv`.
    pub fn encode(&self, keys: &SubKeys, file_name: &str, dir_iv: &DirIv) -> [u8; TOMBSTONE_LEN] {
        let body = self.body();
        let mac = hmac_parts(keys.record_mac.expose(), &[RECORD_LABEL, file_name.as_bytes(), dir_iv, &body]);
        let mut out = [0u8; TOMBSTONE_LEN];
        out[..26].copy_from_slice(&body);
        out[26..].copy_from_slice(&mac);
        out
    }

    /// Parses and verifies (constant time) the bytes of the tombstone file `file_name` in the
    /// directory of IV `dir_iv`. The error says why it is refused.
    pub fn decode(keys: &SubKeys, file_name: &str, dir_iv: &DirIv, bytes: &[u8]) -> Result<Tombstone, String> {
        if bytes.len() != TOMBSTONE_LEN {
            return Err(format!("is not a tombstone ({} bytes, not {TOMBSTONE_LEN})", bytes.len()));
        }
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(keys.record_mac.expose()).expect("any key length");
        for p in [RECORD_LABEL, file_name.as_bytes(), dir_iv, &bytes[..26]] {
            mac.update(&(p.len() as u32).to_be_bytes());
            mac.update(p);
        }
        if mac.verify_slice(&bytes[26..]).is_err() {
            return Err("a tombstone whose MAC does not verify for this directory and name (planted, edited or moved)"
                .to_string());
        }
        if bytes[0] != VERSION {
            return Err(format!("a tombstone of unknown version {}", bytes[0]));
        }
        Ok(Tombstone {
            kind: bytes[1],
            client: bytes[2..18].try_into().expect("16"),
            time: u64::from_be_bytes(bytes[18..26].try_into().expect("8")),
        })
    }

    /// Whether it is older than [`HORIZON_SECS`] at `now`.
    pub fn expired(&self, now: u64) -> bool {
        now.saturating_sub(self.time) > HORIZON_SECS
    }
}

/// Writes tombstone `t` as `file_name` into `dir` (IV `dir_iv`), replacing an older one of
/// that name (the same entry removed before, then put back by a client), never following a
/// link.
pub fn write(
    dir: BorrowedFd<'_>,
    keys: &SubKeys,
    file_name: &str,
    dir_iv: &DirIv,
    t: &Tombstone,
) -> std::io::Result<()> {
    let bytes = t.encode(keys, file_name, dir_iv);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    let fd = match sys::openat(dir, file_name.as_bytes(), flags, 0o600) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            sys::unlinkat(dir, file_name.as_bytes(), false)?;
            sys::openat(dir, file_name.as_bytes(), flags, 0o600)?
        }
        r => r?,
    };
    sys::pwrite_all(fd.as_fd(), &bytes, 0)
}

/// Reads and verifies the tombstone `file_name` of `dir` (IV `dir_iv`): a regular file
/// (never a link, FIFO or device) of exactly [`TOMBSTONE_LEN`] bytes.
pub fn read(dir: BorrowedFd<'_>, keys: &SubKeys, file_name: &str, dir_iv: &DirIv) -> Result<Tombstone, String> {
    let (fd, st) = sys::open_regular_at(dir, file_name.as_bytes(), libc::O_RDONLY).map_err(|e| match e.err() {
        Some(e) => format!("cannot be read: {e}"),
        None => "is not a regular file".to_string(),
    })?;
    if st.st_size as usize != TOMBSTONE_LEN {
        return Err(format!("is not a tombstone ({} bytes, not {TOMBSTONE_LEN})", st.st_size));
    }
    let mut buf = [0u8; TOMBSTONE_LEN];
    let n = sys::pread_full(fd.as_fd(), &mut buf, 0).map_err(|e| format!("cannot be read: {e}"))?;
    Tombstone::decode(keys, file_name, dir_iv, &buf[..n])
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MasterKey;

    /// A tombstone verifies only under its own name and directory, and not once edited.
    #[test]
    fn a_tombstone_verifies_only_for_its_name_and_directory() {
        let keys = MasterKey::from_bytes([9; 32]).subkeys();
        let iv = [1u8; 16];
        let t = Tombstone { kind: 1, client: [7; 16], time: 1_700_000_000 };
        let n = name(&token(&keys, &iv, b"abc.def"));
        assert_eq!(token_of_name(n.as_bytes()), Some(token(&keys, &iv, b"abc.def")));
        let b = t.encode(&keys, &n, &iv);
        assert_eq!(Tombstone::decode(&keys, &n, &iv, &b), Ok(t));
        assert!(Tombstone::decode(&keys, &n, &[2; 16], &b).is_err());
        let other = name(&token(&keys, &iv, b"abc.xyz"));
        assert!(Tombstone::decode(&keys, &other, &iv, &b).is_err());
        let mut edited = b;
        edited[20] ^= 1;
        assert!(Tombstone::decode(&keys, &n, &iv, &edited).is_err());
        assert!(t.expired(t.time + HORIZON_SECS + 1) && !t.expired(t.time + HORIZON_SECS));
    }
}
