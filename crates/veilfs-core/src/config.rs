//! The vault config file `veilfs.conf`: versioned, authenticated as a whole, with key slots.
//!
//! JSON so a person can read it. Every field is covered by an HMAC-SHA256 (`mac`) under a
//! subkey of the master key, computed over the file's canonical form (the same struct
//! serialized with `mac` empty); unknown fields are rejected. Each key slot wraps the master
//! key and authenticates its own KDF parameters as the wrap's AAD. So: editing a slot makes
//! that slot refuse every password; editing anything else fails the MAC once a slot has been
//! opened. Nothing is written while unlocking.

use crate::content::ContentCipher;
use crate::error::{Error, Result};
use crate::kdf::{self, Argon2Params, KdfCeiling};
use crate::keys::{hmac16, MasterKey};
use crate::names::{b64_decode, b64_encode, DirIv, CONFIG_NAME};
use crate::recovery::RecoveryKey;
use crate::sys::MetaError;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The `format` field.
pub const FORMAT_NAME: &str = "veilfs";
/// The on-disk format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Feature flags of format v1 that every vault names. A config naming a feature this build
/// does not know was made by a newer veilfs and is refused.
pub const FEATURES_V1: &[&str] =
    &["header-mac", "last-block-flag", "long-names", "name-binding", "sparse-flag", "xattrs"];
/// Each special-file type bound as its own kind, a device's number in its identity
/// (docs/FORMAT.md §9). Every new vault names it; vaults made before it lack it and keep the
/// shared kind `0x04`.
pub const FEATURE_SPECIAL_KINDS: &str = "special-kinds";
/// Symlink targets up to 4095 bytes and xattr values up to 65536 bytes, Linux's limits: what
/// does not fit the backing symlink or attribute goes to an overflow piece beside it
/// (docs/FORMAT.md §8.1, §16.1). Every new forward vault names it; vaults made before it keep
/// the smaller limits (about 3000 and 65508 bytes).
pub const FEATURE_OVERFLOW: &str = "overflow";
/// A file's header may carry the UNSETTLED flag while a writer changes its tail, and its tail
/// is then read by the crash rules of docs/FORMAT.md §5.8 (a torn tail reads as a prefix).
/// Every new forward vault names it; a reader without it refuses the vault, and a vault
/// without it never carries the flag.
pub const FEATURE_UNSETTLED_TAILS: &str = "unsettled-tails";
/// A directory's IV copy is the name of an empty file, `veilfs.diriv.<base64url(iv)>`, not
/// the 16-byte file `veilfs.diriv` (docs/FORMAT.md §7.1): it takes no data block (a quarter
/// of veilfs's disk overhead on a source tree was those blocks) and checking it is one
/// `fstatat`. Every new forward vault names it; vaults made before it keep the file.
pub const FEATURE_IV_IN_NAME: &str = "iv-in-name";
/// With [`FEATURE_UNSETTLED_TAILS`]: an unsettled file ends only at a block sealed as last,
/// never at a full inner block, and a writer that grows a file logs the old final block's new
/// inner ciphertext in the inner-block stash and writes it in place only after the new blocks
/// (docs/FORMAT.md §5.7, §5.8). Without it a header copied while a file was UNSETTLED and put
/// back later lets the settled file be cut at any block boundary undetected. Every new forward
/// vault names it; vaults made before it keep the older, weaker crash rules.
pub const FEATURE_ORDERED_GROWTH: &str = "ordered-growth";
/// Files carry header v2 and a block map: the header commits to the exact ciphertext of
/// every block, so an older copy of a block, an older header with a newer body (or the
/// reverse) and an older final block after a truncate are integrity errors
/// (docs/FORMAT.md §5.10). Every new forward vault names it unless made with
/// `veilfs init --no-block-map` (for veilfs versions that cannot read it); vaults made before
/// it lack it and keep opening.
pub const FEATURE_BLOCK_MAP: &str = "block-map";
/// A `veilfs upgrade` to [`FEATURE_BLOCK_MAP`] is under way (docs/FORMAT.md §5.10,
/// "Upgrade"): the vault's files are a mix of v1 files and files with a block map, which only
/// the upgrade itself reads (telling them apart by their authenticated headers); every other
/// reader refuses the vault with "run veilfs upgrade to finish", so that the window in which
/// an old v1 copy of an upgraded file could be put back unnoticed lasts only as long as the
/// upgrade's run. Never together with [`FEATURE_BLOCK_MAP`] (which replaces it when every file
/// is converted) nor in a deterministic vault. A veilfs that does not know it refuses the
/// vault as made by a newer veilfs, which is what it should do.
pub const FEATURE_BLOCK_MAP_UPGRADE: &str = "block-map-upgrade";
/// The config carries a `generation`, +1 on every change (a key slot added or removed,
/// features), under its MAC, so that a client that remembers a newer one refuses an older
/// config put back (docs/FORMAT.md §3.1, `crate::known`). Every new forward vault names it;
/// a config without it has no generation (read as 0) and no config rollback detection.
pub const FEATURE_VERSIONS: &str = "versions";
/// Features a v1 vault may name besides [`FEATURES_V1`].
pub const OPTIONAL_FEATURES: &[&str] = &[
    FEATURE_VERSIONS,
    FEATURE_SPECIAL_KINDS,
    FEATURE_DETERMINISTIC,
    FEATURE_OVERFLOW,
    FEATURE_UNSETTLED_TAILS,
    FEATURE_IV_IN_NAME,
    FEATURE_ORDERED_GROWTH,
    FEATURE_BLOCK_MAP,
    FEATURE_BLOCK_MAP_UPGRADE,
];
/// The optional feature of deterministic vaults (made by `veilfs init --reverse`): their
/// identities and nonces are derived, not random, and their cipher is AES-256-GCM-SIV, which
/// this feature requires and which needs it (docs/FORMAT.md §17). Readers need nothing else.
pub const FEATURE_DETERMINISTIC: &str = "deterministic";
/// Largest config file we read (a config with many slots is still a few KiB).
pub const MAX_CONFIG_LEN: usize = 1 << 20;

/// The most key slots a config may hold (cryptsetup's LUKS1 keeps 8 too). With the unlock
/// order ([`VaultConfig::unlock_order`]) this bounds what a forged config can make an unlock
/// with the right secret derive: at most this many slots, none costlier than the right one.
pub const MAX_SLOTS: usize = 8;

/// What kind of secret opens a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotKind {
    /// A password (Argon2id).
    Password,
    /// The recovery key (HKDF).
    Recovery,
}

/// How a slot's key-encryption key is derived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "algorithm", deny_unknown_fields)]
pub enum SlotKdf {
    /// Argon2id over the password.
    #[serde(rename = "argon2id")]
    Argon2id {
        /// Memory in KiB.
        memory_kib: u32,
        /// Passes.
        iterations: u32,
        /// Lanes.
        parallelism: u32,
        /// 32-byte salt, base64url.
        salt: String,
    },
    /// HKDF-SHA256 over the 256-bit recovery key.
    #[serde(rename = "hkdf-sha256")]
    HkdfSha256 {
        /// 32-byte salt, base64url.
        salt: String,
    },
}

/// One key slot: the master key wrapped under a secret-derived key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySlot {
    /// Slot number, unique in the file.
    pub id: u32,
    /// Password or recovery.
    pub kind: SlotKind,
    /// KEK derivation.
    pub kdf: SlotKdf,
    /// base64url(nonce ‖ AES-256-GCM(master key) ‖ tag).
    pub wrapped_key: String,
}

impl KeySlot {
    /// What deriving this slot's key costs, in KiB × passes (0 for a recovery slot, whose
    /// key needs no slow derivation).
    pub fn kdf_cost(&self) -> u64 {
        match &self.kdf {
            SlotKdf::Argon2id { memory_kib, iterations, .. } => u64::from(*memory_kib) * u64::from(*iterations),
            SlotKdf::HkdfSha256 { .. } => 0,
        }
    }
}

/// The config file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VaultConfig {
    /// Always "veilfs".
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// Program that created the vault (informational, but authenticated).
    pub creator: String,
    /// Content cipher.
    pub cipher: ContentCipher,
    /// Plaintext bytes per content block.
    pub block_size: u32,
    /// Feature flags (see [`FEATURES_V1`]).
    pub features: Vec<String>,
    /// The top directory's IV, base64url (its `veilfs.diriv` must match).
    pub root_dir_iv: String,
    /// +1 on every change of the config (feature [`FEATURE_VERSIONS`]); absent, and 0, in a
    /// config without the feature (so such a config's canonical form, and MAC, are as before).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
    /// Key slots.
    pub slots: Vec<KeySlot>,
    /// base64url(HMAC-SHA256(config MAC key, canonical form with `mac` = "")).
    pub mac: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The secret a user presents to open a vault.
pub enum Secret {
    /// A password.
    Password(SecretString),
    /// The recovery key.
    Recovery(RecoveryKey),
}

/// The AAD of a slot's key wrap: the format identity and the slot's own parameters.
fn slot_aad(slot_id: u32, kind: SlotKind, kdf: &SlotKdf) -> Vec<u8> {
    let mut aad = b"veilfs v1 key slot\0".to_vec();
    aad.extend(serde_json::to_vec(&(FORMAT_NAME, FORMAT_VERSION, slot_id, kind, kdf)).expect("serializable"));
    aad
}

fn decode_salt(s: &str) -> Result<Vec<u8>> {
    b64_decode(s)
        .filter(|v| v.len() >= 16)
        .ok_or_else(|| Error::Invalid("slot salt is not base64url of ≥16 bytes".into()))
}

impl VaultConfig {
    /// A new config (without slots) for a fresh vault; with AES-256-GCM-SIV, a deterministic
    /// one (feature [`FEATURE_DETERMINISTIC`]).
    pub fn new(cipher: ContentCipher, block_size: u32, root_iv: &DirIv) -> Result<Self> {
        if !(512..=(1 << 20)).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(Error::Invalid(format!("block size {block_size} must be a power of two in 512..=1048576")));
        }
        Ok(VaultConfig {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            creator: format!("veilfs {}", env!("CARGO_PKG_VERSION")),
            cipher,
            block_size,
            // Deterministic (reverse) vaults keep the shared special-file kind, the inline
            // limits and the IV file for now: their identities are derived, and their view has no overflow
            // pieces (docs/FORMAT.md §17).
            features: FEATURES_V1
                .iter()
                .copied()
                .chain(if cipher == ContentCipher::Aes256GcmSiv {
                    vec![FEATURE_DETERMINISTIC]
                } else {
                    vec![
                        FEATURE_SPECIAL_KINDS,
                        FEATURE_OVERFLOW,
                        FEATURE_UNSETTLED_TAILS,
                        FEATURE_IV_IN_NAME,
                        FEATURE_ORDERED_GROWTH,
                        FEATURE_BLOCK_MAP,
                        FEATURE_VERSIONS,
                    ]
                })
                .map(String::from)
                .collect(),
            root_dir_iv: b64_encode(root_iv),
            generation: u64::from(cipher != ContentCipher::Aes256GcmSiv),
            slots: Vec::new(),
            mac: String::new(),
        })
    }

    /// Path of the config in `cipherdir`.
    pub fn path_in(cipherdir: &Path) -> PathBuf {
        cipherdir.join(CONFIG_NAME)
    }

    /// Reads and checks the structure of the config in `cipherdir` (not yet authenticated:
    /// that needs a key, see [`unlock`](Self::unlock)). The file is opened without following
    /// a symlink and without blocking (a FIFO planted as the config is refused, not waited
    /// on), must be a regular file, and at most [`MAX_CONFIG_LEN`] bytes are read.
    pub fn load(cipherdir: &Path) -> Result<Self> {
        Self::load_named(cipherdir, CONFIG_NAME)
    }

    /// [`load`](Self::load) of the config file `name` in `dir` (a reverse vault keeps its
    /// config under another name in the plaintext directory, see `crate::reverse`).
    pub fn load_named(dir: &Path, name: &str) -> Result<Self> {
        let cipherdir = dir;
        let path = dir.join(name);
        let cfg_err = |detail: String| Error::Config { path: path.clone(), detail };
        let bytes = match crate::sys::read_meta_path(&path, MAX_CONFIG_LEN) {
            Ok(b) => b,
            // CIPHERDIR missing, not a directory, or without a config: not a vault at all.
            Err(MetaError::Io(e)) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                return Err(match Error::not_a_vault(cipherdir) {
                    Error::NotAVault { path, .. } if name != CONFIG_NAME && cipherdir.is_dir() => Error::NotAVault {
                        path,
                        detail: format!(
                            "it holds no {name} (make it a reverse vault with `veilfs init --reverse DIR`)"
                        ),
                    },
                    e => e,
                })
            }
            Err(e @ (MetaError::NotRegular(_) | MetaError::TooLarge(_))) => {
                return Err(cfg_err(format!("{e}; it is not a veilfs config")))
            }
            // Unreadable (permissions, an I/O error): not damage, and said as it is.
            Err(MetaError::Io(e)) => return Err(Error::io(path.display().to_string(), e)),
        };
        Self::parse(&bytes, &path)
    }

    /// Parses and checks the structure of config bytes read from `path` (named in errors).
    /// Never panics, whatever the bytes (fuzzed: `fuzz/fuzz_targets/config.rs`).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let cfg_err = |detail: String| Error::Config { path: path.to_path_buf(), detail };
        if bytes.len() > MAX_CONFIG_LEN {
            return Err(cfg_err("is larger than 1 MiB; it is not a veilfs config".into()));
        }
        let cfg: VaultConfig = serde_json::from_slice(bytes)
            .map_err(|e| cfg_err(format!("is damaged or was edited ({e}); restore it from a backup")))?;
        cfg.check_structure().map_err(cfg_err)?;
        Ok(cfg)
    }

    fn check_structure(&self) -> std::result::Result<(), String> {
        if self.format != FORMAT_NAME {
            return Err(format!("format is {:?}, expected \"veilfs\"", self.format));
        }
        if self.version != FORMAT_VERSION {
            return Err(format!(
                "format version {} is not supported by this veilfs (it reads version {FORMAT_VERSION}); use a matching veilfs",
                self.version
            ));
        }
        for (i, f) in self.features.iter().enumerate() {
            if !FEATURES_V1.contains(&f.as_str()) && !OPTIONAL_FEATURES.contains(&f.as_str()) {
                return Err(format!("needs feature {f:?}, unknown to this veilfs; upgrade veilfs"));
            }
            if self.features[..i].contains(f) {
                return Err(format!("names feature {f:?} twice"));
            }
        }
        for f in FEATURES_V1 {
            if !self.features.iter().any(|x| x == f) {
                return Err(format!("lacks required feature {f:?}"));
            }
        }
        if self.features.iter().filter(|f| f.as_str() == FEATURE_DETERMINISTIC).count() > 1 {
            return Err(format!("names feature {FEATURE_DETERMINISTIC:?} twice"));
        }
        if self.is_deterministic() != (self.cipher == ContentCipher::Aes256GcmSiv) {
            return Err(format!(
                "cipher {} and feature {FEATURE_DETERMINISTIC:?} must go together (one without the other is not a \
                 vault veilfs makes)",
                self.cipher.name()
            ));
        }
        if self.has_feature(FEATURE_ORDERED_GROWTH) && !self.has_feature(FEATURE_UNSETTLED_TAILS) {
            return Err(format!("names feature {FEATURE_ORDERED_GROWTH:?} without {FEATURE_UNSETTLED_TAILS:?}"));
        }
        if self.has_feature(FEATURE_BLOCK_MAP) && self.is_deterministic() {
            return Err(format!("names feature {FEATURE_BLOCK_MAP:?} in a deterministic vault"));
        }
        if self.has_feature(FEATURE_BLOCK_MAP_UPGRADE)
            && (self.has_feature(FEATURE_BLOCK_MAP) || self.is_deterministic())
        {
            return Err(format!(
                "names feature {FEATURE_BLOCK_MAP_UPGRADE:?} together with {FEATURE_BLOCK_MAP:?} or in a deterministic \
                 vault"
            ));
        }
        if self.generation != 0 && !self.has_feature(FEATURE_VERSIONS) {
            return Err(format!("has a generation without feature {FEATURE_VERSIONS:?}"));
        }
        if !(512..=(1 << 20)).contains(&self.block_size) || !self.block_size.is_power_of_two() {
            return Err(format!("block size {} is invalid", self.block_size));
        }
        if self.root_iv().is_none() {
            return Err("root_dir_iv is not 16 bytes of base64url".into());
        }
        if self.slots.is_empty() {
            return Err("has no key slots".into());
        }
        if self.slots.len() > MAX_SLOTS {
            return Err(format!(
                "has {} key slots; veilfs makes at most {MAX_SLOTS} (the file was edited or damaged; restore it from a \
                 backup)",
                self.slots.len()
            ));
        }
        Ok(())
    }

    /// Whether the config names feature `f`.
    pub fn has_feature(&self, f: &str) -> bool {
        self.features.iter().any(|x| x == f)
    }

    /// How the vault binds special files: by type (feature `special-kinds`) or all as one kind.
    pub fn special_binding(&self) -> crate::names::SpecialBinding {
        if self.has_feature(FEATURE_SPECIAL_KINDS) {
            crate::names::SpecialBinding::ByType
        } else {
            crate::names::SpecialBinding::Shared
        }
    }

    /// Whether symlink targets and xattr values may overflow into a second piece (feature
    /// [`FEATURE_OVERFLOW`]), raising their limits to Linux's.
    pub fn has_overflow(&self) -> bool {
        self.has_feature(FEATURE_OVERFLOW)
    }

    /// Whether this is a deterministic (reverse-mode) vault: feature [`FEATURE_DETERMINISTIC`].
    pub fn is_deterministic(&self) -> bool {
        self.features.iter().any(|f| f == FEATURE_DETERMINISTIC)
    }

    /// The root directory IV.
    pub fn root_iv(&self) -> Option<DirIv> {
        b64_decode(&self.root_dir_iv).and_then(|v| v.try_into().ok())
    }

    fn compute_mac(&self, master: &MasterKey) -> String {
        let mut canon = self.clone();
        canon.mac = String::new();
        let body = serde_json::to_vec(&canon).expect("serializable");
        let key = master.subkeys().config_mac;
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.expose()).expect("any key length");
        mac.update(b"veilfs v1 config\0");
        mac.update(&body);
        b64_encode(&mac.finalize().into_bytes())
    }

    /// Recomputes the MAC after a change (needs the master key).
    pub fn seal(&mut self, master: &MasterKey) {
        self.mac = self.compute_mac(master);
    }

    /// Verifies the MAC with `master`.
    pub fn verify(&self, master: &MasterKey, path: &Path) -> Result<()> {
        let expect = self.compute_mac(master);
        // Compare MACs of the MACs so the comparison time does not depend on the data.
        let (a, b) = (hmac16(b"cmp", &[expect.as_bytes()]), hmac16(b"cmp", &[self.mac.as_bytes()]));
        if subtle::ConstantTimeEq::ct_eq(&a[..], &b[..]).into() {
            Ok(())
        } else {
            Err(Error::Config {
                path: path.to_path_buf(),
                detail: "failed authentication: a field was edited or damaged; restore the config from a backup".into(),
            })
        }
    }

    /// Finds the master key with `secret` (trying every slot of the matching kind, or only
    /// `only_slot`) and authenticates the whole config with it. Slots whose KDF costs more
    /// than [`KdfCeiling::DEFAULT`] are skipped; see [`unlock_with`](Self::unlock_with).
    pub fn unlock(&self, secret: &Secret, only_slot: Option<u32>, path: &Path) -> Result<MasterKey> {
        self.unlock_with(secret, only_slot, path, &KdfCeiling::DEFAULT)
    }

    /// [`unlock`](Self::unlock) with an explicit KDF cost ceiling. A slot that cannot be used
    /// (a salt or wrapped key that does not decode, a KDF cost above `ceiling`) is skipped with
    /// a warning before anything is derived, so the other slots still open the vault and a
    /// forged slot cannot make unlocking take minutes; a config edited that way still fails
    /// its MAC once a good slot has opened it.
    pub fn unlock_with(
        &self,
        secret: &Secret,
        only_slot: Option<u32>,
        path: &Path,
        ceiling: &KdfCeiling,
    ) -> Result<MasterKey> {
        let want = match secret {
            Secret::Password(_) => SlotKind::Password,
            Secret::Recovery(_) => SlotKind::Recovery,
        };
        let mut tried = 0;
        let mut too_costly = 0;
        let mut spent = 0u64;
        let order = self.unlock_order(want, only_slot);
        let candidates = order.len();
        for slot in order {
            tried += 1;
            let skip = |why: &str| tracing::warn!("{}: key slot {} skipped: {why}", path.display(), slot.id);
            let kek = match (&slot.kdf, secret) {
                (SlotKdf::Argon2id { memory_kib, iterations, parallelism, salt }, Secret::Password(pw)) => {
                    let p =
                        Argon2Params { memory_kib: *memory_kib, iterations: *iterations, parallelism: *parallelism };
                    if !p.within(ceiling) {
                        too_costly += 1;
                        skip(&format!(
                            "its key derivation costs {} MiB × {} passes, above the ceiling of {} MiB and {} MiB·passes \
                             (--allow-slow-kdf raises it for a vault made that way)",
                            memory_kib / 1024,
                            iterations,
                            ceiling.memory_kib / 1024,
                            ceiling.memory_passes_kib / 1024
                        ));
                        continue;
                    }
                    // The whole unlock has a budget too: slots that each stay under the
                    // ceiling still cannot add up to minutes of work.
                    spent += p.cost_kib();
                    if spent > ceiling.unlock_budget_kib() {
                        return Err(Error::Config {
                            path: path.to_path_buf(),
                            detail: format!(
                                "its key slots ask for more key derivation than a vault veilfs makes ({} of \
                                 {candidates} slots tried within the budget of {} MiB·passes); the file was edited or \
                                 damaged: restore it from a backup, or unlock with --allow-slow-kdf to try them all",
                                tried - 1,
                                ceiling.unlock_budget_kib() / 1024
                            ),
                        });
                    }
                    let Ok(salt) = decode_salt(salt) else {
                        skip("its salt is damaged");
                        continue;
                    };
                    match p.derive(pw.expose_secret().as_bytes(), &salt) {
                        Ok(k) => k,
                        Err(e) => {
                            skip(&e.to_string());
                            continue;
                        }
                    }
                }
                (SlotKdf::HkdfSha256 { salt }, Secret::Recovery(rk)) => {
                    let Ok(salt) = decode_salt(salt) else {
                        skip("its salt is damaged");
                        continue;
                    };
                    kdf::recovery_kek(rk.bytes(), &salt)
                }
                _ => continue,
            };
            let Some(wrapped) = b64_decode(&slot.wrapped_key) else {
                skip("its wrapped key is not base64url");
                continue;
            };
            if let Some(master) = kdf::unwrap(&kek, &wrapped, &slot_aad(slot.id, slot.kind, &slot.kdf)) {
                self.verify(&master, path)?;
                return Ok(master);
            }
        }
        if tried > 0 && too_costly == tried {
            return Err(Error::Config {
                path: path.to_path_buf(),
                detail: "every matching key slot asks for a key derivation above the ceiling; if you made the vault \
                         with such settings, unlock with --allow-slow-kdf"
                    .into(),
            });
        }
        if tried == 0 {
            return Err(Error::Config {
                path: path.to_path_buf(),
                detail: match only_slot {
                    Some(id) => format!("has no {want:?} slot {id}").to_lowercase(),
                    None => format!("has no {} slot", if want == SlotKind::Password { "password" } else { "recovery" }),
                },
            });
        }
        Err(Error::WrongPassword)
    }

    /// The slots an unlock tries for a secret of kind `want` (only `only_slot`, if given), in
    /// the order it tries them: cheapest key derivation first, file order among equals. So no
    /// slot order can make the slot that opens come after costlier ones: what an unlock
    /// derives before the right slot costs at most as much, each, as that slot does.
    pub fn unlock_order(&self, want: SlotKind, only_slot: Option<u32>) -> Vec<&KeySlot> {
        let mut v: Vec<&KeySlot> =
            self.slots.iter().filter(|s| s.kind == want && only_slot.is_none_or(|id| id == s.id)).collect();
        v.sort_by_key(|s| s.kdf_cost()); // stable: file order among equal costs
        v
    }

    /// Refuses a new slot when the config holds [`MAX_SLOTS`] already.
    fn room_for_slot(&self) -> Result<()> {
        if self.slots.len() >= MAX_SLOTS {
            return Err(Error::Invalid(format!(
                "the vault has {} key slots, the most veilfs keeps; remove one first (veilfs passwd --remove-slot)",
                self.slots.len()
            )));
        }
        Ok(())
    }

    /// The lowest id no slot has. Ids never change once given, so `--slot N` keeps naming
    /// the same slot; a password changed by removing its slot and then adding one keeps
    /// its number.
    fn next_slot_id(&self) -> u32 {
        (0..).find(|id| !self.slots.iter().any(|s| s.id == *id)).expect("fewer than 2^32 slots")
    }

    /// Adds a password slot; returns its id. Call [`seal`](Self::seal) afterwards.
    pub fn add_password_slot(
        &mut self,
        master: &MasterKey,
        password: &SecretString,
        params: Argon2Params,
    ) -> Result<u32> {
        self.room_for_slot()?;
        let salt: [u8; 32] = crate::random::bytes();
        let kek = params.derive(password.expose_secret().as_bytes(), &salt)?;
        let kdf = SlotKdf::Argon2id {
            memory_kib: params.memory_kib,
            iterations: params.iterations,
            parallelism: params.parallelism,
            salt: b64_encode(&salt),
        };
        Ok(self.push_slot(master, SlotKind::Password, kdf, &kek))
    }

    /// Adds a recovery slot for `rk`; returns its id. Call [`seal`](Self::seal) afterwards.
    pub fn add_recovery_slot(&mut self, master: &MasterKey, rk: &RecoveryKey) -> Result<u32> {
        self.room_for_slot()?;
        let salt: [u8; 32] = crate::random::bytes();
        let kek = kdf::recovery_kek(rk.bytes(), &salt);
        Ok(self.push_slot(master, SlotKind::Recovery, SlotKdf::HkdfSha256 { salt: b64_encode(&salt) }, &kek))
    }

    fn push_slot(
        &mut self,
        master: &MasterKey,
        kind: SlotKind,
        kdf: SlotKdf,
        kek: &crate::keys::SecretBytes<32>,
    ) -> u32 {
        let id = self.next_slot_id();
        let wrapped = kdf::wrap(kek, master, &slot_aad(id, kind, &kdf));
        self.slots.push(KeySlot { id, kind, kdf, wrapped_key: b64_encode(&wrapped) });
        id
    }

    /// Removes slot `id`. Refuses to remove the last password slot.
    pub fn remove_slot(&mut self, id: u32) -> Result<KeySlot> {
        let pos = self
            .slots
            .iter()
            .position(|s| s.id == id)
            .ok_or_else(|| Error::Invalid(format!("there is no slot {id}")))?;
        let s = &self.slots[pos];
        if s.kind == SlotKind::Password && self.slots.iter().filter(|x| x.kind == SlotKind::Password).count() == 1 {
            return Err(Error::Invalid(format!("slot {id} is the last password slot; add another password first")));
        }
        Ok(self.slots.remove(pos))
    }

    /// Writes the config atomically into `cipherdir` (temp file, fsync, rename, fsync dir).
    pub fn save(&self, cipherdir: &Path) -> Result<()> {
        self.save_named(cipherdir, CONFIG_NAME)
    }

    /// The bytes [`save`](Self::save) writes: pretty JSON and a final newline.
    pub fn to_file_bytes(&self) -> Vec<u8> {
        let mut body = serde_json::to_vec_pretty(self).expect("serializable");
        body.push(b'\n');
        body
    }

    /// [`save`](Self::save) under the file name `name` in `dir`.
    pub fn save_named(&self, dir: &Path, name: &str) -> Result<()> {
        let cipherdir = dir;
        let path = dir.join(name);
        let tmp = cipherdir.join(format!("{name}.tmp"));
        let body = self.to_file_bytes();
        let write = || -> std::io::Result<()> {
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o400).open(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            crate::crash::point!("config.rewrite");
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(cipherdir)?.sync_all()
        };
        write().map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const WEAK: Argon2Params = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };

    fn config_with_password(pw: &str) -> (VaultConfig, MasterKey) {
        let master = MasterKey::from_bytes([9; 32]);
        let mut cfg = VaultConfig::new(ContentCipher::Aes256Gcm, 4096, &[1; 16]).unwrap();
        cfg.add_password_slot(&master, &SecretString::from(pw.to_string()), WEAK).unwrap();
        (cfg, master)
    }

    fn forged_slot(id: u32, memory_kib: u32, iterations: u32) -> KeySlot {
        KeySlot {
            id,
            kind: SlotKind::Password,
            kdf: SlotKdf::Argon2id { memory_kib, iterations, parallelism: 4, salt: b64_encode(&[3; 32]) },
            wrapped_key: b64_encode(&[0; 60]),
        }
    }

    fn password(pw: &str) -> Secret {
        Secret::Password(SecretString::from(pw.to_string()))
    }

    #[test]
    fn forged_slots_with_huge_kdf_costs_are_skipped_before_deriving() {
        let (mut cfg, master) = config_with_password("right");
        // Three slots asking for 4 GiB × 100 passes each (minutes and gigabytes apiece).
        for id in [10, 11, 12] {
            cfg.slots.insert(0, forged_slot(id, 4 * 1024 * 1024, 100));
        }
        cfg.seal(&master);
        let t = Instant::now();
        assert!(cfg.unlock(&password("right"), None, Path::new("x")).is_ok());
        assert!(t.elapsed() < Duration::from_secs(20), "the forged slots were derived: {:?}", t.elapsed());
        // Only such slots: a clear error, not minutes of work.
        let err = cfg.unlock(&password("right"), Some(10), Path::new("x")).unwrap_err();
        assert!(matches!(&err, Error::Config { detail, .. } if detail.contains("--allow-slow-kdf")), "{err}");
        // The ceiling is a limit on work, not on the format: raised, the slot is tried.
        let ok = KdfCeiling { memory_kib: 4 * 1024 * 1024, memory_passes_kib: 1 << 40 };
        assert!(Argon2Params { memory_kib: 4 * 1024 * 1024, iterations: 100, parallelism: 4 }.within(&ok));
    }

    #[test]
    fn forged_slots_just_under_the_ceiling_placed_first_are_tried_after_the_real_one() {
        let (mut cfg, master) = config_with_password("right");
        // Seven slots of 1 GiB × 3 passes each (each under the ceiling; all derived before the
        // real one, they took 30–54 s and 1 GiB).
        for id in 10..17 {
            cfg.slots.insert(0, forged_slot(id, 1024 * 1024, 3));
        }
        cfg.seal(&master);
        let order: Vec<u32> = cfg.unlock_order(SlotKind::Password, None).iter().map(|s| s.id).collect();
        assert_eq!(order, [0, 16, 15, 14, 13, 12, 11, 10], "the cheapest slot first, file order among equals");
        let t = Instant::now();
        assert!(cfg.unlock(&password("right"), None, Path::new("x")).is_ok());
        assert!(t.elapsed() < Duration::from_secs(5), "forged slots were derived first: {:?}", t.elapsed());
    }

    #[test]
    fn a_wrong_password_against_forged_slots_derives_no_more_than_the_unlock_budget() {
        let (mut cfg, master) = config_with_password("right");
        for id in 10..17 {
            cfg.slots.push(forged_slot(id, 1024, 4));
        }
        cfg.seal(&master);
        // Each forged slot costs the whole (small) ceiling; the budget is twice that, so after
        // the real slot (64 KiB) two of them at most are derived.
        let ceiling = KdfCeiling { memory_kib: 1024, memory_passes_kib: 4096 };
        assert_eq!(ceiling.unlock_budget_kib(), 8192);
        let err = cfg.unlock_with(&password("wrong"), None, Path::new("x"), &ceiling).unwrap_err();
        assert!(matches!(&err, Error::Config { detail, .. } if detail.contains("(2 of 8 slots tried")), "{err}");
        // With the right password the real slot, the cheapest, opens before the budget matters.
        assert!(cfg.unlock_with(&password("right"), None, Path::new("x"), &ceiling).is_ok());
    }

    #[test]
    fn a_config_holds_at_most_eight_slots() {
        let (mut cfg, master) = config_with_password("right");
        for i in 1..MAX_SLOTS {
            cfg.add_password_slot(&master, &SecretString::from(format!("pw{i}")), WEAK).unwrap();
        }
        assert_eq!(cfg.slots.len(), MAX_SLOTS);
        let e = cfg.add_recovery_slot(&master, &RecoveryKey::from_bytes([5; 32])).unwrap_err();
        assert!(e.to_string().contains("remove one first"), "{e}");
        // A ninth slot edited into the file: the config is refused before any derivation.
        cfg.slots.push(forged_slot(99, 64, 1));
        cfg.seal(&master);
        let e = VaultConfig::parse(&cfg.to_file_bytes(), Path::new("veilfs.conf")).unwrap_err();
        assert!(matches!(&e, Error::Config { detail, .. } if detail.contains("has 9 key slots")), "{e}");
    }

    #[test]
    fn an_unsealed_forged_slot_is_skipped_and_the_mac_still_catches_the_edit() {
        let (mut cfg, master) = config_with_password("right");
        cfg.seal(&master);
        cfg.slots.insert(0, forged_slot(7, 4 * 1024 * 1024, 100));
        let err = cfg.unlock(&password("right"), None, Path::new("x")).unwrap_err();
        assert!(matches!(&err, Error::Config { detail, .. } if detail.contains("failed authentication")), "{err}");
    }

    #[test]
    fn slots_with_damaged_salts_or_keys_are_skipped_not_fatal() {
        let (mut cfg, master) = config_with_password("right");
        let rk = RecoveryKey::from_bytes([5; 32]);
        // A damaged recovery slot before the good one, and a password slot whose salt and
        // wrapped key do not decode.
        cfg.slots.push(KeySlot {
            id: 20,
            kind: SlotKind::Recovery,
            kdf: SlotKdf::HkdfSha256 { salt: "not base64 !!".into() },
            wrapped_key: "x".into(),
        });
        cfg.add_recovery_slot(&master, &rk).unwrap();
        let mut bad = forged_slot(21, 64, 1);
        bad.kdf = SlotKdf::Argon2id { memory_kib: 64, iterations: 1, parallelism: 1, salt: "%%".into() };
        cfg.slots.insert(0, bad);
        cfg.seal(&master);
        assert!(cfg.unlock(&Secret::Recovery(rk), None, Path::new("x")).is_ok());
        assert!(cfg.unlock(&password("right"), None, Path::new("x")).is_ok());
        assert!(matches!(cfg.unlock(&password("wrong"), None, Path::new("x")), Err(Error::WrongPassword)));
    }

    #[test]
    fn new_vaults_bind_specials_by_type_and_vaults_without_the_feature_still_parse() {
        let p = Path::new("veilfs.conf");
        let (mut cfg, master) = config_with_password("pw");
        assert!(cfg.has_feature(FEATURE_SPECIAL_KINDS));
        assert_eq!(cfg.special_binding(), crate::names::SpecialBinding::ByType);
        // A vault made before the feature: the six v1 features only.
        cfg.features.retain(|f| f != FEATURE_SPECIAL_KINDS);
        cfg.seal(&master);
        let old = VaultConfig::parse(&serde_json::to_vec(&cfg).unwrap(), p).unwrap();
        assert_eq!(old.special_binding(), crate::names::SpecialBinding::Shared);
        assert!(old.unlock(&password("pw"), None, p).is_ok());
        // Unknown, missing and repeated features are refused.
        let k = FEATURE_SPECIAL_KINDS;
        for features in [vec![k, "from-the-future"], vec![k, k], vec![]] {
            let mut c = cfg.clone();
            c.features.extend(features.iter().map(|f| f.to_string()));
            if features.is_empty() {
                c.features.retain(|x| x != "xattrs");
            }
            let r = VaultConfig::parse(&serde_json::to_vec(&c).unwrap(), p);
            assert!(matches!(r, Err(Error::Config { .. })), "{:?}", c.features);
        }
    }

    #[test]
    fn new_vaults_have_ordered_growth_and_it_needs_unsettled_tails() {
        let p = Path::new("veilfs.conf");
        let (mut cfg, master) = config_with_password("pw");
        assert!(cfg.has_feature(FEATURE_ORDERED_GROWTH) && cfg.has_feature(FEATURE_UNSETTLED_TAILS));
        // A vault made before it keeps opening.
        let mut old = cfg.clone();
        old.features.retain(|f| f != FEATURE_ORDERED_GROWTH);
        old.seal(&master);
        assert!(VaultConfig::parse(&serde_json::to_vec(&old).unwrap(), p).is_ok());
        // Without "unsettled-tails" it means nothing: refused.
        cfg.features.retain(|f| f != FEATURE_UNSETTLED_TAILS);
        cfg.seal(&master);
        assert!(matches!(VaultConfig::parse(&serde_json::to_vec(&cfg).unwrap(), p), Err(Error::Config { .. })));
    }

    #[test]
    fn block_map_is_named_by_new_vaults_and_refused_in_a_deterministic_one() {
        let p = Path::new("veilfs.conf");
        let (mut cfg, master) = config_with_password("pw");
        assert!(cfg.has_feature(FEATURE_BLOCK_MAP));
        cfg.seal(&master);
        assert!(VaultConfig::parse(&serde_json::to_vec(&cfg).unwrap(), p).is_ok());
        // A vault made before it, or with `init --no-block-map`, keeps opening.
        cfg.features.retain(|f| f != FEATURE_BLOCK_MAP);
        cfg.seal(&master);
        assert!(VaultConfig::parse(&serde_json::to_vec(&cfg).unwrap(), p).is_ok());
        let mut det = VaultConfig::new(ContentCipher::Aes256GcmSiv, 4096, &[1; 16]).unwrap();
        det.add_password_slot(&master, &SecretString::from("pw".to_string()), WEAK).unwrap();
        assert!(det.is_deterministic());
        det.features.push(FEATURE_BLOCK_MAP.into());
        det.seal(&master);
        assert!(matches!(VaultConfig::parse(&serde_json::to_vec(&det).unwrap(), p), Err(Error::Config { .. })));
    }

    #[test]
    fn the_upgrade_mark_goes_only_without_block_map_and_outside_deterministic_vaults() {
        let p = Path::new("veilfs.conf");
        let parse = |cfg: &mut VaultConfig, master: &MasterKey| {
            cfg.seal(master);
            VaultConfig::parse(&serde_json::to_vec(&cfg).unwrap(), p)
        };
        let (mut cfg, master) = config_with_password("pw");
        cfg.features.push(FEATURE_BLOCK_MAP_UPGRADE.into());
        assert!(matches!(parse(&mut cfg, &master), Err(Error::Config { .. })), "with block-map");
        cfg.features.retain(|f| f != FEATURE_BLOCK_MAP);
        assert!(parse(&mut cfg, &master).is_ok());
        let mut det = VaultConfig::new(ContentCipher::Aes256GcmSiv, 4096, &[1; 16]).unwrap();
        det.add_password_slot(&master, &SecretString::from("pw".to_string()), WEAK).unwrap();
        det.features.push(FEATURE_BLOCK_MAP_UPGRADE.into());
        assert!(matches!(parse(&mut det, &master), Err(Error::Config { .. })), "deterministic");
    }

    #[test]
    fn parse_refuses_oversized_and_malformed_configs() {
        let p = Path::new("veilfs.conf");
        assert!(matches!(VaultConfig::parse(&vec![b' '; MAX_CONFIG_LEN + 1], p), Err(Error::Config { .. })));
        assert!(matches!(VaultConfig::parse(b"{", p), Err(Error::Config { .. })));
        let (mut cfg, master) = config_with_password("pw");
        cfg.seal(&master);
        let text = serde_json::to_vec(&cfg).unwrap();
        assert_eq!(VaultConfig::parse(&text, p).unwrap(), cfg);
    }
}
