//! Name encryption, the identity binding of directory entries, and the long-name scheme.
//!
//! A plaintext name `n` in a directory with IV `iv` (16 random bytes, stored in the
//! directory's `veilfs.diriv` file) is stored as the on-disk entry
//!
//! ```text
//! base64url(D) "." base64url(S)
//! D = AES-256-SIV(names key,   AD = [iv],            plaintext = n)         (16 + len(n) bytes)
//! S = AES-256-SIV(binding key, AD = [iv, D, kind],   plaintext = identity)  (32 bytes)
//! ```
//!
//! `D` is deterministic, so a lookup can compute it from the plaintext name. `S` seals the
//! *identity* of what the entry names — the file ID from a file's header, a directory's own
//! IV, a symlink's ID — to this directory, this name and this kind of object. Opening the
//! object checks that the identity it carries equals the one its name promises, which
//! detects swapped contents, entries moved between directories and copied `veilfs.diriv`
//! files (open findings 2.1 and 2.3 of the 2017 gocryptfs audit). Renames and hard links
//! stay cheap: only the name (`D` and `S`) is recomputed; the identity is read from `S`.
//!
//! Special files (FIFOs, sockets, devices) carry no identity of their own. In a vault with
//! the config feature `special-kinds` each type has its own kind byte and a device's identity
//! starts with its device number, checked against the backing `st_rdev` whenever the entry is
//! used ([`NameCipher::check_device`]), so a FIFO cannot become a socket or a device and a
//! device cannot change its number. Older vaults bind every special file as kind `0x04` with
//! a random identity ([`SpecialBinding::Shared`], docs/FORMAT.md §9).
//!
//! Cost: `S` takes 44 of the 255 characters of a Linux name, so plaintext names up to 142
//! bytes are stored directly; longer ones (up to 255) use the long-name scheme:
//! `veilfs.L.<base64url(SHA-256(D))>.<base64url(S)>` plus a side file
//! `veilfs.N.<base64url(SHA-256(D))>` holding `base64url(D)`.

use crate::error::{Error, Result};
use crate::keys::{SecretBytes, SubKeys};
use aes_siv::siv::Aes256Siv;
use aes_siv::KeyInit;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use sha2::{Digest, Sha256};
use std::sync::{Mutex, PoisonError};

/// The per-directory IV file of a vault without the feature `iv-in-name`: 16 raw bytes.
pub const DIRIV_NAME: &str = "veilfs.diriv";
/// With the feature `iv-in-name`, a directory's IV copy is the empty file
/// `veilfs.diriv.<base64url(iv)>` ([`diriv_name`]): it takes no data block (docs/FORMAT.md §7.1).
pub const DIRIV_NAME_PREFIX: &str = "veilfs.diriv.";
/// The vault config, in the top directory.
pub const CONFIG_NAME: &str = "veilfs.conf";
/// Names starting with this prefix belong to the vault itself (never user entries).
pub const RESERVED_PREFIX: &str = "veilfs.";
/// Prefix of a long-name entry.
pub const LONG_PREFIX: &str = "veilfs.L.";
/// Prefix of a long-name side file.
pub const LONG_NAME_FILE_PREFIX: &str = "veilfs.N.";
/// Length of a directory IV.
pub const DIRIV_LEN: usize = 16;
/// Longest plaintext name Linux allows.
pub const NAME_MAX: usize = 255;
/// Length of base64url(S).
const S_B64_LEN: usize = 43;
/// Length of base64url(SHA-256).
const HASH_B64_LEN: usize = 43;

/// A directory's IV.
pub type DirIv = [u8; DIRIV_LEN];
/// The identity an entry binds (file ID, directory IV or symlink/special ID).
pub type Identity = [u8; 16];

/// What kind of object an entry names; part of the binding so a file cannot be replaced by
/// a directory or a symlink under the same name. The discriminant is the kind byte bound in
/// `S` ([`binding_byte`](Self::binding_byte); docs/FORMAT.md §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EntryKind {
    /// Regular file (identity = file ID).
    File = 1,
    /// Directory (identity = its directory IV).
    Dir = 2,
    /// Symbolic link (identity = the ID inside its encrypted target).
    Symlink = 3,
    /// FIFO (identity = random).
    Fifo = 4,
    /// Unix domain socket (identity = random).
    Socket = 5,
    /// Character device (identity = its device number and random bytes, see
    /// [`NameCipher::new_identity`]).
    CharDevice = 6,
    /// Block device (identity as for [`CharDevice`](Self::CharDevice)).
    BlockDevice = 7,
}

impl EntryKind {
    /// The kind of a `st_mode`. A zero file type is a regular file, as for mknod(2); the
    /// kernel refuses every other value outside the seven types, so `stat` never shows one.
    pub fn from_mode(mode: u32) -> Self {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => EntryKind::Dir,
            libc::S_IFLNK => EntryKind::Symlink,
            libc::S_IFIFO => EntryKind::Fifo,
            libc::S_IFSOCK => EntryKind::Socket,
            libc::S_IFCHR => EntryKind::CharDevice,
            libc::S_IFBLK => EntryKind::BlockDevice,
            _ => EntryKind::File,
        }
    }

    /// A FIFO, socket or device node: an object with no content of its own.
    pub fn is_special(self) -> bool {
        matches!(self, EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice)
    }

    /// A character or block device.
    pub fn is_device(self) -> bool {
        matches!(self, EntryKind::CharDevice | EntryKind::BlockDevice)
    }

    /// The byte bound in `S` for this kind under `specials`: its own discriminant, except
    /// that a vault without `special-kinds` binds every special file as `0x04`.
    pub fn binding_byte(self, specials: SpecialBinding) -> u8 {
        match specials {
            SpecialBinding::Shared if self.is_special() => LEGACY_SPECIAL,
            _ => self as u8,
        }
    }
}

/// The one kind byte of every special file in a vault without `special-kinds`.
pub const LEGACY_SPECIAL: u8 = 0x04;

/// How a vault binds special files (the config feature `special-kinds`, docs/FORMAT.md §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecialBinding {
    /// Vaults made without the feature: every special file is kind `0x04` with a random
    /// identity, so its type and device number are not authenticated.
    Shared,
    /// Feature `special-kinds`: each type has its own kind byte, and a device's identity is
    /// `u64le(st_rdev) ‖ 8 random bytes`, checked against the backing object on every use.
    ByType,
}

/// Checks that `name` is a name Linux allows in a directory (not `.`/`..`).
pub fn validate_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(Error::BadName(format!("length {} is outside 1..=255 bytes", name.len())));
    }
    if name == b"." || name == b".." {
        return Err(Error::BadName("'.' and '..' are not entries".into()));
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Error::BadName("contains '/' or NUL".into()));
    }
    Ok(())
}

/// How a plaintext name is found on disk: the entry's key (the part before its binding)
/// and, for long names, the side file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameKey {
    /// `D`, the deterministic encrypted name.
    pub d: Vec<u8>,
    /// `base64url(D)` for short names, `veilfs.L.<hash>` for long names.
    pub key: String,
    /// For long names: the side file name `veilfs.N.<hash>`.
    pub side_file: Option<String>,
}

impl NameKey {
    /// The full on-disk entry name with binding `s`.
    pub fn entry_name(&self, s: &[u8; 32]) -> String {
        let mut out = String::with_capacity(self.key.len() + 1 + S_B64_LEN);
        out.push_str(&self.key);
        out.push('.');
        B64.encode_string(s, &mut out);
        out
    }

    /// Contents of the long-name side file (`base64url(D)`), if this is a long name.
    pub fn side_file_contents(&self) -> Option<String> {
        self.side_file.as_ref().map(|_| B64.encode(&self.d))
    }
}

/// An on-disk directory entry name, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedEntry<'a> {
    /// `.`, `..`, the config, the directory IV, a long-name side file or another reserved name.
    Internal,
    /// A short name: `key` = base64url(D), `s` = base64url(S).
    Short {
        /// base64url(D).
        key: &'a str,
        /// base64url(S).
        s: &'a str,
    },
    /// A long name: `key` = `veilfs.L.<hash>`, `hash` its hash part.
    Long {
        /// `veilfs.L.<hash>`.
        key: &'a str,
        /// base64url(SHA-256(D)).
        hash: &'a str,
        /// base64url(S).
        s: &'a str,
    },
    /// Not a name this format produces.
    Foreign,
    /// A sync tool's conflict copy of a name this format produces: the name with the tool's
    /// part (`.sync-conflict-…`, ` (1)`, ...) inserted ([`crate::conflict`]). Not an entry by
    /// itself: shown under its own name only once its original entry's binding verifies.
    Conflict(crate::conflict::ConflictName),
    /// A file a sync tool or desktop leaves in folders (`.stfolder`, a Syncthing temporary
    /// file, `.DS_Store`; [`crate::foreign`]): not an entry, not damage, never touched.
    SyncTool(&'static str),
}

impl<'a> ParsedEntry<'a> {
    /// Classifies an on-disk name. Called for every entry of every listing, so it works on
    /// bytes and checks each byte once against a table. A name veilfs cannot have written is
    /// looked up as a conflict copy ([`crate::conflict`]) and then in the list of sync tools'
    /// files ([`crate::foreign`]), so neither can hide an entry.
    pub fn parse(name: &'a [u8]) -> Self {
        match Self::parse_format(name) {
            // A copy of the lock is by the lock's own rule ignored everywhere, as what sync
            // tools leave (never a lock, no data), not a conflict copy for the user to settle.
            ParsedEntry::Foreign if crate::lock::is_conflict_copy(name) => {
                ParsedEntry::SyncTool(crate::foreign::LOCK_COPY_TOOL)
            }
            ParsedEntry::Foreign => match crate::conflict::parse(name) {
                Some(c) => ParsedEntry::Conflict(c),
                None => crate::foreign::sync_tool(name).map_or(ParsedEntry::Foreign, ParsedEntry::SyncTool),
            },
            p => p,
        }
    }

    /// The names the format itself produces; anything else is [`ParsedEntry::Foreign`].
    pub(crate) fn parse_format(name: &'a [u8]) -> Self {
        if name == b"." || name == b".." {
            return ParsedEntry::Internal;
        }
        if let Some(rest) = name.strip_prefix(LONG_PREFIX.as_bytes()) {
            return match split_dot(rest) {
                Some((hash, s)) if hash.len() == HASH_B64_LEN && s.len() == S_B64_LEN && is_b64(hash) && is_b64(s) => {
                    ParsedEntry::Long {
                        key: ascii(&name[..LONG_PREFIX.len() + HASH_B64_LEN]),
                        hash: ascii(hash),
                        s: ascii(s),
                    }
                }
                _ => ParsedEntry::Foreign,
            };
        }
        if name.starts_with(RESERVED_PREFIX.as_bytes()) {
            // Reserved names are ours only if they are text; anything else is foreign.
            return if std::str::from_utf8(name).is_ok() { ParsedEntry::Internal } else { ParsedEntry::Foreign };
        }
        match split_dot(name) {
            Some((key, s)) if key.len() >= 23 && s.len() == S_B64_LEN && is_b64(key) && is_b64(s) => {
                ParsedEntry::Short { key: ascii(key), s: ascii(s) }
            }
            _ => ParsedEntry::Foreign,
        }
    }

    /// The lookup key (everything before the binding), for user entries.
    pub fn key(&self) -> Option<&'a str> {
        match self {
            ParsedEntry::Short { key, .. } | ParsedEntry::Long { key, .. } => Some(key),
            _ => None,
        }
    }

    /// base64url(S), for user entries.
    pub fn binding(&self) -> Option<&'a str> {
        match self {
            ParsedEntry::Short { s, .. } | ParsedEntry::Long { s, .. } => Some(s),
            _ => None,
        }
    }
}

/// Which bytes base64url uses.
const B64_ALPHABET: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
        b += 1;
    }
    t
};

fn is_b64(s: &[u8]) -> bool {
    s.iter().all(|&b| B64_ALPHABET[b as usize])
}

/// Splits at the first `.`.
fn split_dot(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|&b| b == b'.')?;
    Some((&s[..i], &s[i + 1..]))
}

/// A slice already checked to be base64url (or a reserved ASCII prefix) as `str`.
fn ascii(s: &[u8]) -> &str {
    std::str::from_utf8(s).expect("checked to be ASCII")
}

/// Prefix of the temporary names the tree engine uses while it creates or removes a
/// directory or exchanges two entries (and that `fsck --repair` cleans up after a crash).
pub const TEMP_PREFIX: &str = "veilfs.tmp.";

/// Prefix of a regular file that `veilfs import` is still writing (see
/// [`Vault::create_partial`](crate::Vault::create_partial)): renamed to its entry name once
/// complete; a leftover after an interrupted import holds no user data yet.
pub const PART_PREFIX: &str = "veilfs.part.";

/// Prefix of the files `veilfs upgrade` writes (crate::upgrade): `veilfs.upgrade.<random>`
/// while a file's block-map form is written, removed by the next run (or `fsck --repair`)
/// after a crash.
pub const UPGRADE_PREFIX: &str = "veilfs.upgrade.";

/// Prefix of a converted file with several names (`veilfs.upgrade.link.<base64url(file
/// ID)>.<original inode>`) while its names are pointed at it; a crash leaves it for the next
/// run to finish.
pub const UPGRADE_LINK_PREFIX: &str = "veilfs.upgrade.link.";

/// The vault lock (top directory only; see [`crate::lock`]).
pub const LOCK_NAME: &str = "veilfs.lock";

/// The plaintext name of the directory in the vault's top directory that receives damaged
/// and stray objects (`fsck --repair`).
pub const LOST_FOUND: &[u8] = b"lost+found";

/// Prefix of an exchange's intent record (F§10): `veilfs.xchg.<r>` next to the object it
/// moved aside as `veilfs.tmp.<r>`, read by the crash sweep to finish the exchange.
pub const XCHG_PREFIX: &str = "veilfs.xchg.";

/// The name that carries `iv` in a vault with `iv-in-name`: `veilfs.diriv.<base64url(iv)>`.
pub fn diriv_name(iv: &DirIv) -> String {
    let mut out = String::with_capacity(DIRIV_NAME_PREFIX.len() + 22);
    out.push_str(DIRIV_NAME_PREFIX);
    B64.encode_string(iv, &mut out);
    out
}

/// The IV a name `veilfs.diriv.<base64url(iv)>` carries: `None` for any other name, and for
/// one whose suffix is not the one canonical spelling of 16 bytes.
pub fn parse_diriv_name(name: &[u8]) -> Option<DirIv> {
    let rest = name.strip_prefix(DIRIV_NAME_PREFIX.as_bytes())?;
    if rest.len() != 22 || !is_b64(rest) {
        return None;
    }
    B64.decode(rest).ok()?.try_into().ok()
}

/// A fresh temporary name (`veilfs.tmp.` and 96 random bits).
pub fn temp_name() -> String {
    format!("{TEMP_PREFIX}{}", b64_encode(&crate::random::bytes::<12>()))
}

/// A fresh name for a partial file (`veilfs.part.` and 96 random bits).
pub fn part_name() -> String {
    format!("{PART_PREFIX}{}", b64_encode(&crate::random::bytes::<12>()))
}

/// Decodes base64url without padding.
pub fn b64_decode(s: &str) -> Option<Vec<u8>> {
    B64.decode(s).ok()
}

/// Encodes base64url without padding.
pub fn b64_encode(b: &[u8]) -> String {
    B64.encode(b)
}

/// Encrypts, decrypts and binds names. Cheap to share between threads (`&self` methods).
pub struct NameCipher {
    names: SivPool,
    binding: SivPool,
    specials: SpecialBinding,
    memo: Memo,
}

/// What the two SIV steps of every lookup gave for exactly these inputs: `D` of a plaintext
/// name ([`NameCipher::name_key`]) and the identity a binding verified to
/// ([`NameCipher::unbind`]). Both are deterministic functions of their inputs under this
/// cipher's keys, so an answer from here is the answer the SIV would give: a changed entry
/// name, directory, kind or binding is a different key and goes through the SIV again. Only
/// successes are kept (a failure is checked anew each time, and logged each time). Bounded
/// (`quick_cache`'s CLOCK-Pro eviction, so one cold walk over a big tree does not push out
/// what is used again). It pays where the kernel forgot a node and asks again (after memory
/// pressure or `drop_caches`): an answer from here takes about 0.2 µs where the SIV step takes
/// 0.7–0.9 µs, and a first question pays about 0.3 µs more for the insert
/// (`examples/siv_cost.rs`; docs/PERFORMANCE.md, "The name cipher's memo").
struct Memo {
    /// `iv ‖ name` → `D`.
    d: quick_cache::sync::Cache<Vec<u8>, Vec<u8>>,
    /// `iv ‖ kind byte ‖ u16be(len D) ‖ D ‖ S (base64url)` → identity.
    identity: quick_cache::sync::Cache<Vec<u8>, Identity>,
}

/// Entries each memo keeps: about 150 bytes each, so about 5 MiB for both at most.
const MEMO_ENTRIES: usize = 16_384;

impl Memo {
    fn new() -> Self {
        Memo { d: quick_cache::sync::Cache::new(MEMO_ENTRIES), identity: quick_cache::sync::Cache::new(MEMO_ENTRIES) }
    }

    fn d_key(iv: &DirIv, name: &[u8]) -> Vec<u8> {
        [iv.as_slice(), name].concat()
    }

    fn identity_key(iv: &DirIv, kind_byte: u8, d: &[u8], s_b64: &[u8]) -> Vec<u8> {
        let len = u16::try_from(d.len()).expect("D of a name of at most 255 bytes").to_be_bytes();
        [iv.as_slice(), &[kind_byte], &len, d, s_b64].concat()
    }
}

/// AES-SIV instances for one key, kept for reuse. Setting one up (two AES-256 key
/// expansions and the CMAC subkeys) costs about half as much as sealing a short name, and
/// a listing opens two SIVs per entry. Each instance is used by one thread at a time
/// (`encrypt`/`decrypt` take `&mut`); the key schedules are zeroized when an instance is
/// dropped (the `aes` and `cmac` crates' `zeroize` features).
pub(crate) struct SivPool {
    key: SecretBytes<64>,
    free: Mutex<Vec<Aes256Siv>>,
}

/// More idle instances than threads that name things at once would only hold memory.
const SIV_POOL_MAX: usize = 16;

impl SivPool {
    pub(crate) fn new(key: &SecretBytes<64>) -> Self {
        SivPool { key: key.clone(), free: Mutex::new(Vec::new()) }
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Aes256Siv) -> R) -> R {
        let spare = self.free.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut siv = spare.unwrap_or_else(|| Aes256Siv::new(self.key.expose().into()));
        let r = f(&mut siv);
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < SIV_POOL_MAX {
            free.push(siv);
        }
        r
    }
}

impl std::fmt::Debug for NameCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NameCipher(<redacted>)")
    }
}

impl NameCipher {
    /// A name cipher from the vault's subkeys, binding special files as `specials` says
    /// (from the vault's config: [`VaultConfig::special_binding`](crate::VaultConfig::special_binding)).
    pub fn new(keys: &SubKeys, specials: SpecialBinding) -> Self {
        NameCipher {
            names: SivPool::new(&keys.names),
            binding: SivPool::new(&keys.binding),
            specials,
            memo: Memo::new(),
        }
    }

    /// How this vault binds special files.
    pub fn specials(&self) -> SpecialBinding {
        self.specials
    }

    /// A fresh identity for a new object of `kind`: 16 random bytes, except that with
    /// [`SpecialBinding::ByType`] a device's identity is `u64le(rdev) ‖ 8 random bytes`.
    pub fn new_identity(&self, kind: EntryKind, rdev: libc::dev_t) -> Identity {
        let mut id: Identity = crate::random::bytes();
        if kind.is_device() && self.specials == SpecialBinding::ByType {
            id[..8].copy_from_slice(&rdev.to_le_bytes());
        }
        id
    }

    /// Checks that a device whose entry promises `identity` still has the device number it
    /// was made with (`rdev` = the backing `st_rdev`). With [`SpecialBinding::Shared`], and for
    /// anything but a device, there is nothing to check.
    pub fn check_device(&self, kind: EntryKind, identity: &Identity, rdev: libc::dev_t) -> Result<()> {
        if !kind.is_device() || self.specials != SpecialBinding::ByType || identity[..8] == rdev.to_le_bytes() {
            return Ok(());
        }
        let promised = u64::from_le_bytes(identity[..8].try_into().expect("8 bytes"));
        Err(Error::auth(
            "device",
            format!(
                "number {}:{} differs from the {}:{} its entry promises (device node replaced)",
                libc::major(rdev),
                libc::minor(rdev),
                libc::major(promised),
                libc::minor(promised)
            ),
        ))
    }

    /// `D` for `name` in the directory with IV `iv`.
    pub fn encrypt_name(&self, iv: &DirIv, name: &[u8]) -> Result<Vec<u8>> {
        validate_name(name)?;
        Ok(self.names.with(|siv| siv.encrypt([iv.as_slice()], name)).expect("SIV encryption of a short name"))
    }

    /// The plaintext name for `D`, or an integrity error if `D` was not made in this directory.
    pub fn decrypt_name(&self, iv: &DirIv, d: &[u8]) -> Result<Vec<u8>> {
        let name = self
            .names
            .with(|siv| siv.decrypt([iv.as_slice()], d))
            .map_err(|_| Error::auth("name", "does not decrypt in this directory (moved, renamed or damaged)"))?;
        validate_name(&name).map_err(|e| Error::auth("name", format!("decrypts to an invalid name: {e}")))?;
        // SIV is a bijection here: encrypting `name` gives `d` again (a listing, then a lookup).
        self.memo.d.insert(Memo::d_key(iv, &name), d.to_vec());
        Ok(name)
    }

    /// The on-disk key of `name` in the directory with IV `iv`.
    pub fn name_key(&self, iv: &DirIv, name: &[u8]) -> Result<NameKey> {
        let memo_key = Memo::d_key(iv, name);
        if let Some(d) = self.memo.d.get(&memo_key) {
            return Ok(Self::key_for_d(d));
        }
        let d = self.encrypt_name(iv, name)?;
        self.memo.d.insert(memo_key, d.clone());
        Ok(Self::key_for_d(d))
    }

    /// The on-disk key for an already computed `D`.
    pub fn key_for_d(d: Vec<u8>) -> NameKey {
        let short = B64.encode(&d);
        if short.len() + 1 + S_B64_LEN <= NAME_MAX {
            NameKey { d, key: short, side_file: None }
        } else {
            let hash = B64.encode(Sha256::digest(&d));
            NameKey {
                d,
                key: format!("{LONG_PREFIX}{hash}"),
                side_file: Some(format!("{LONG_NAME_FILE_PREFIX}{hash}")),
            }
        }
    }

    /// `D` of a parsed entry: decoded from a short name, or read through `read_side_file`
    /// (called with the side file's name) for a long one and checked against the hash. An
    /// entry must be in canonical form (short exactly when `D` fits), so every plaintext name
    /// has one on-disk key and a listing never shows a name that a lookup cannot find.
    pub fn entry_d(
        &self,
        parsed: &ParsedEntry<'_>,
        read_side_file: impl FnOnce(&str) -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let d = match parsed {
            ParsedEntry::Short { key, .. } => {
                b64_decode(key).ok_or_else(|| Error::auth("name", "is not valid base64url"))?
            }
            ParsedEntry::Long { hash, .. } => {
                let side = format!("{LONG_NAME_FILE_PREFIX}{hash}");
                let content = read_side_file(&side)?;
                let text = std::str::from_utf8(&content).map_err(|_| Error::auth(side.clone(), "is not text"))?;
                let d = b64_decode(text.trim_end()).ok_or_else(|| Error::auth(side.clone(), "is not base64url"))?;
                if B64.encode(Sha256::digest(&d)) != *hash {
                    return Err(Error::auth(side, "does not match the hash in its entry name"));
                }
                d
            }
            _ => return Err(Error::Invalid("not a user entry".into())),
        };
        let canonical = Self::key_for_d(d);
        if Some(canonical.key.as_str()) != parsed.key() {
            return Err(Error::auth("name", "is not in canonical form (short/long encoding swapped)"));
        }
        Ok(canonical.d)
    }

    /// `S`: binds `identity` of an object of `kind` to entry `D` in directory `iv`.
    pub fn bind(&self, iv: &DirIv, d: &[u8], kind: EntryKind, identity: &Identity) -> [u8; 32] {
        let kind_byte = kind.binding_byte(self.specials);
        let v = self
            .binding
            .with(|siv| siv.encrypt([iv.as_slice(), d, &[kind_byte]], identity))
            .expect("SIV encryption of 16 bytes");
        let s: [u8; 32] = v.try_into().expect("SIV of 16 bytes is 32 bytes");
        // The entry made from `s` verifies to `identity` (a create, then a lookup).
        self.memo.identity.insert(Memo::identity_key(iv, kind_byte, d, B64.encode(s).as_bytes()), *identity);
        s
    }

    /// Recovers the identity promised by binding `s` (base64url) of entry `D` in `iv`, or an
    /// integrity error if the entry was moved, renamed by someone else or changed kind.
    pub fn unbind(&self, iv: &DirIv, d: &[u8], kind: EntryKind, s_b64: &str) -> Result<Identity> {
        let kind_byte = kind.binding_byte(self.specials);
        let memo_key = Memo::identity_key(iv, kind_byte, d, s_b64.as_bytes());
        if let Some(id) = self.memo.identity.get(&memo_key) {
            return Ok(id);
        }
        let s = b64_decode(s_b64).ok_or_else(|| Error::auth("name binding", "is not base64url"))?;
        let id = self
            .binding
            .with(|siv| siv.decrypt([iv.as_slice(), d, &[kind_byte]], s.as_slice()))
            .map_err(|_| Error::auth("name binding", "does not verify (entry moved, swapped or changed type)"))?;
        let id: Identity = id.try_into().map_err(|_| Error::auth("name binding", "has the wrong length"))?;
        self.memo.identity.insert(memo_key, id);
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MasterKey;
    use proptest::prelude::*;

    fn cipher() -> NameCipher {
        NameCipher::new(&MasterKey::from_bytes([7; 32]).subkeys(), SpecialBinding::ByType)
    }

    #[test]
    fn short_and_long_threshold() {
        let c = cipher();
        let iv = [1u8; 16];
        let k142 = c.name_key(&iv, &[b'a'; 142]).unwrap();
        assert!(k142.side_file.is_none());
        assert!(k142.entry_name(&[0; 32]).len() <= 255);
        let k143 = c.name_key(&iv, &[b'a'; 143]).unwrap();
        assert!(k143.side_file.is_some());
        assert_eq!(k143.entry_name(&[0; 32]).len(), 96);
    }

    #[test]
    fn reserved_and_foreign_names() {
        assert_eq!(ParsedEntry::parse(b"veilfs.diriv"), ParsedEntry::Internal);
        assert_eq!(ParsedEntry::parse(b"veilfs.conf"), ParsedEntry::Internal);
        assert_eq!(ParsedEntry::parse(b"."), ParsedEntry::Internal);
        assert_eq!(ParsedEntry::parse(b"hello.txt"), ParsedEntry::Foreign);
        assert_eq!(ParsedEntry::parse(b"x.sync-conflict-2024"), ParsedEntry::Foreign);
        // Not text: foreign, even behind a reserved prefix.
        assert_eq!(ParsedEntry::parse(b"veilfs.\xff"), ParsedEntry::Foreign);
        let good = format!("{}.{}", "A".repeat(23), "B".repeat(S_B64_LEN));
        assert!(matches!(ParsedEntry::parse(good.as_bytes()), ParsedEntry::Short { .. }));
        for bad in [b'=', b'+', b'/', 0xc3, b' '] {
            let mut name = good.clone().into_bytes();
            name[5] = bad;
            assert_eq!(ParsedEntry::parse(&name), ParsedEntry::Foreign, "byte {bad:#x}");
        }
    }

    #[test]
    fn reused_ciphers_give_the_same_answers_after_failures() {
        let c = cipher();
        let iv = [6u8; 16];
        let k = c.name_key(&iv, b"a.txt").unwrap();
        let s64 = b64_encode(&c.bind(&iv, &k.d, EntryKind::File, &[1; 16]));
        for _ in 0..3 {
            // A failed open must leave the pooled instance as good as a fresh one.
            assert!(c.decrypt_name(&[7u8; 16], &k.d).is_err());
            assert!(c.unbind(&iv, &k.d, EntryKind::Dir, &s64).is_err());
            assert_eq!(c.decrypt_name(&iv, &k.d).unwrap(), b"a.txt");
            assert_eq!(c.unbind(&iv, &k.d, EntryKind::File, &s64).unwrap(), [1; 16]);
            assert_eq!(c.name_key(&iv, b"a.txt").unwrap(), k);
        }
        // Threads share the pool.
        std::thread::scope(|t| {
            for i in 0..4u8 {
                let c = &c;
                t.spawn(move || {
                    for j in 0..200u8 {
                        let j = if j == b'/' { 1 } else { j };
                        let name = [b'n', b'0' + i, j.max(1)];
                        let k = c.name_key(&iv, &name).unwrap();
                        assert_eq!(c.decrypt_name(&iv, &k.d).unwrap(), name);
                    }
                });
            }
        });
    }

    #[test]
    fn binding_detects_moves_and_kind_changes() {
        let c = cipher();
        let (iv1, iv2) = ([1u8; 16], [2u8; 16]);
        let k = c.name_key(&iv1, b"report.pdf").unwrap();
        let s = c.bind(&iv1, &k.d, EntryKind::File, &[9; 16]);
        let s64 = b64_encode(&s);
        assert_eq!(c.unbind(&iv1, &k.d, EntryKind::File, &s64).unwrap(), [9; 16]);
        assert!(c.unbind(&iv2, &k.d, EntryKind::File, &s64).is_err());
        assert!(c.unbind(&iv1, &k.d, EntryKind::Dir, &s64).is_err());
        let other = c.name_key(&iv1, b"other.pdf").unwrap();
        assert!(c.unbind(&iv1, &other.d, EntryKind::File, &s64).is_err());
        assert!(c.decrypt_name(&iv2, &k.d).is_err());
    }

    /// The memo of [`NameCipher`] only ever repeats what the SIV said for exactly the same
    /// inputs: after a success is kept, a binding changed in any part (moved to another
    /// directory or name, another kind, one character of `S`) is refused as before, and a
    /// name's `D` is the one a fresh cipher computes. Attack: an entry swapped or edited in
    /// the ciphertext after the mount verified it once.
    #[test]
    fn the_memo_answers_exactly_what_the_siv_answers_and_never_a_changed_binding() {
        let (c, fresh) = (cipher(), cipher());
        let (iv, iv2) = ([3u8; 16], [4u8; 16]);
        let k = c.name_key(&iv, b"kept.txt").unwrap();
        let s64 = b64_encode(&fresh.bind(&iv, &k.d, EntryKind::File, &[8; 16]));
        for _ in 0..2 {
            // First from the SIV, then from the memo.
            assert_eq!(c.name_key(&iv, b"kept.txt").unwrap(), fresh.name_key(&iv, b"kept.txt").unwrap());
            assert_eq!(c.unbind(&iv, &k.d, EntryKind::File, &s64).unwrap(), [8; 16]);
            assert!(c.unbind(&iv2, &k.d, EntryKind::File, &s64).is_err(), "moved to another directory");
            assert!(c.unbind(&iv, &k.d, EntryKind::Symlink, &s64).is_err(), "another kind");
            let other = c.name_key(&iv, b"other.txt").unwrap();
            assert!(c.unbind(&iv, &other.d, EntryKind::File, &s64).is_err(), "another name");
            let mut edited = s64.clone().into_bytes();
            edited[5] = if edited[5] == b'A' { b'B' } else { b'A' };
            assert!(c.unbind(&iv, &k.d, EntryKind::File, std::str::from_utf8(&edited).unwrap()).is_err());
        }
        // A listing's decryption fills the memo with the same `D`.
        let listed = cipher();
        assert_eq!(listed.decrypt_name(&iv, &k.d).unwrap(), b"kept.txt");
        assert_eq!(listed.name_key(&iv, b"kept.txt").unwrap(), k);
        assert!(listed.name_key(&iv, b"a/b").is_err(), "an invalid name is refused every time");
        assert!(listed.name_key(&iv, b"a/b").is_err());
    }

    /// Memory stays bounded whatever a tree holds.
    #[test]
    fn the_memo_keeps_a_bounded_number_of_entries() {
        let c = cipher();
        let iv = [9u8; 16];
        for i in 0..3 * MEMO_ENTRIES {
            let k = c.name_key(&iv, format!("f{i}").as_bytes()).unwrap();
            c.bind(&iv, &k.d, EntryKind::File, &[1; 16]);
        }
        assert!(c.memo.d.len() <= MEMO_ENTRIES, "{}", c.memo.d.len());
        assert!(c.memo.identity.len() <= MEMO_ENTRIES, "{}", c.memo.identity.len());
        assert!(c.memo.d.len() > MEMO_ENTRIES / 2, "and it does keep: {}", c.memo.d.len());
    }

    proptest! {
        /// Whatever the name, directory and kind: the same answers from a cipher that has
        /// seen them (memo) as from one that has not, and a binding checked under any other
        /// kind is refused even once the right one is kept.
        #[test]
        fn memo_and_siv_agree(name in prop::collection::vec(1u8..=255, 1..=255), iv in any::<[u8; 16]>(), k in 0usize..7, id in any::<[u8; 16]>()) {
            prop_assume!(!name.contains(&b'/') && name != b"." && name != b"..");
            let kinds = [EntryKind::File, EntryKind::Dir, EntryKind::Symlink, EntryKind::Fifo, EntryKind::Socket, EntryKind::CharDevice, EntryKind::BlockDevice];
            let (seen, fresh) = (cipher(), cipher());
            let key = seen.name_key(&iv, &name).unwrap();
            let s64 = b64_encode(&seen.bind(&iv, &key.d, kinds[k], &id));
            prop_assert_eq!(&seen.name_key(&iv, &name).unwrap(), &fresh.name_key(&iv, &name).unwrap());
            prop_assert_eq!(seen.unbind(&iv, &key.d, kinds[k], &s64).unwrap(), id);
            prop_assert_eq!(fresh.unbind(&iv, &key.d, kinds[k], &s64).unwrap(), id);
            for (j, other) in kinds.iter().enumerate().filter(|(j, _)| *j != k) {
                prop_assert!(seen.unbind(&iv, &key.d, *other, &s64).is_err(), "kind {j}");
            }
        }
    }

    const SPECIALS: [EntryKind; 4] =
        [EntryKind::Fifo, EntryKind::Socket, EntryKind::CharDevice, EntryKind::BlockDevice];

    #[test]
    fn special_kinds_bind_each_type_and_device_number_only_with_the_feature() {
        let keys = MasterKey::from_bytes([7; 32]).subkeys();
        let (by_type, shared) =
            (NameCipher::new(&keys, SpecialBinding::ByType), NameCipher::new(&keys, SpecialBinding::Shared));
        let iv = [5u8; 16];
        let k = by_type.name_key(&iv, b"node").unwrap();
        for kind in SPECIALS {
            assert_eq!(EntryKind::from_mode(kind_mode(kind)), kind);
            let s64 = b64_encode(&by_type.bind(&iv, &k.d, kind, &[3; 16]));
            for other in SPECIALS {
                assert_eq!(by_type.unbind(&iv, &k.d, other, &s64).is_ok(), other == kind, "{kind:?} as {other:?}");
                // Without the feature every special file is one kind (0x04): the legacy gap.
                let legacy = b64_encode(&shared.bind(&iv, &k.d, kind, &[3; 16]));
                assert_eq!(shared.unbind(&iv, &k.d, other, &legacy).unwrap(), [3; 16]);
            }
            assert_eq!(kind.binding_byte(SpecialBinding::Shared), LEGACY_SPECIAL);
        }
        assert_eq!(EntryKind::Fifo.binding_byte(SpecialBinding::ByType), 0x04);
        assert_eq!(EntryKind::BlockDevice.binding_byte(SpecialBinding::ByType), 0x07);
        // A device's identity carries its number; another number is an integrity error.
        let disk = libc::makedev(8, 0);
        let id = by_type.new_identity(EntryKind::BlockDevice, disk);
        assert_eq!(id[..8], disk.to_le_bytes());
        assert_ne!(id, by_type.new_identity(EntryKind::BlockDevice, disk), "8 random bytes follow");
        by_type.check_device(EntryKind::BlockDevice, &id, disk).unwrap();
        let err = by_type.check_device(EntryKind::BlockDevice, &id, libc::makedev(1, 3)).unwrap_err();
        assert!(
            matches!(&err, Error::Auth { detail, .. } if detail.contains("1:3") && detail.contains("8:0")),
            "{err}"
        );
        // Not checked for FIFOs, nor in a vault without the feature.
        by_type.check_device(EntryKind::Fifo, &id, libc::makedev(1, 3)).unwrap();
        let legacy_id = shared.new_identity(EntryKind::BlockDevice, disk);
        shared.check_device(EntryKind::BlockDevice, &legacy_id, libc::makedev(1, 3)).unwrap();
    }

    fn kind_mode(kind: EntryKind) -> u32 {
        match kind {
            EntryKind::Fifo => libc::S_IFIFO,
            EntryKind::Socket => libc::S_IFSOCK,
            EntryKind::CharDevice => libc::S_IFCHR,
            EntryKind::BlockDevice => libc::S_IFBLK,
            EntryKind::File => libc::S_IFREG,
            EntryKind::Dir => libc::S_IFDIR,
            EntryKind::Symlink => libc::S_IFLNK,
        }
    }

    #[test]
    fn every_name_length_round_trips() {
        let c = cipher();
        let iv = [4u8; 16];
        for len in 1..=NAME_MAX {
            // Every byte value but '/' and NUL appears across the lengths.
            let name: Vec<u8> = (0..len)
                .map(|i| [1u8, b'a', 0xff, b' ', 0x80, b'.'][i % 6].wrapping_add((len % 7) as u8))
                .map(|b| if b == b'/' || b == 0 { b'x' } else { b })
                .collect();
            let k = c.name_key(&iv, &name).unwrap();
            let s = c.bind(&iv, &k.d, EntryKind::Dir, &[len as u8; 16]);
            let entry = k.entry_name(&s);
            assert!(entry.len() <= NAME_MAX, "length {len}: entry of {} bytes", entry.len());
            assert_eq!(k.side_file.is_some(), len > 142, "length {len}: long-name threshold");
            let parsed = ParsedEntry::parse(entry.as_bytes());
            let side = k.side_file_contents();
            let d = c.entry_d(&parsed, |_| Ok(side.clone().unwrap().into_bytes())).unwrap();
            assert_eq!(c.decrypt_name(&iv, &d).unwrap(), name, "length {len}");
        }
    }

    proptest! {
        #[test]
        fn parse_splits_user_entries_exactly(name in prop::collection::vec(any::<u8>(), 0..=255)) {
            match ParsedEntry::parse(&name) {
                ParsedEntry::Short { key, s } => {
                    let joined = format!("{key}.{s}");
                    prop_assert_eq!(joined.as_bytes(), &name[..]);
                }
                ParsedEntry::Long { key, hash, s } => {
                    let joined = format!("{key}.{s}");
                    prop_assert_eq!(joined.as_bytes(), &name[..]);
                    prop_assert_eq!(key, format!("{LONG_PREFIX}{hash}"));
                }
                ParsedEntry::Internal => prop_assert!(name.starts_with(b"veilfs.") || name == b"." || name == b".."),
                ParsedEntry::Foreign => prop_assert!(crate::foreign::sync_tool(&name).is_none() && crate::conflict::parse(&name).is_none()),
                ParsedEntry::Conflict(c) => prop_assert_eq!(Some(c), crate::conflict::parse(&name)),
                ParsedEntry::SyncTool(_) => prop_assert!(crate::foreign::sync_tool(&name).is_some()),
            }
        }

        #[test]
        fn every_name_round_trips(name in prop::collection::vec(1u8..=255, 1..=255)) {
            prop_assume!(!name.contains(&b'/') && name != b"." && name != b"..");
            let c = cipher();
            let iv = [3u8; 16];
            let k = c.name_key(&iv, &name).unwrap();
            let s = c.bind(&iv, &k.d, EntryKind::File, &[5; 16]);
            let entry = k.entry_name(&s);
            prop_assert!(entry.len() <= 255);
            let parsed = ParsedEntry::parse(entry.as_bytes());
            prop_assert_eq!(parsed.key(), Some(k.key.as_str()));
            let side = k.side_file_contents();
            let d = c.entry_d(&parsed, |_| Ok(side.clone().unwrap().into_bytes())).unwrap();
            prop_assert_eq!(c.decrypt_name(&iv, &d).unwrap(), name);
            prop_assert_eq!(c.unbind(&iv, &d, EntryKind::File, parsed.binding().unwrap()).unwrap(), [5; 16]);
        }
    }
}
