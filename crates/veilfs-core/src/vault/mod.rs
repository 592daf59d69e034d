//! An unlocked vault: config plus keys, and the tree engine — every on-disk step of the
//! ciphertext tree, in one place, for every front end (the mount, the offline commands,
//! fsck): building and parsing entry names and bindings, long-name side files, directory IV
//! files, temporary names, duplicate resolution, creating, linking, renaming, exchanging and
//! removing entries, and opening content and attribute handles without following links.
//!
//! Operations work on [`CipherDir`]s (an open directory fd plus the directory's IV), so
//! nothing re-walks a path. Name-based calls (`create_file`, `mkdir`, `lookup`, …) list the
//! directory, because an entry's on-disk name ends with its identity binding, which only the
//! entry knows; the `*_at` calls take a key the caller resolved itself (the mount keeps a
//! per-directory index, so it lists each directory once).
//!
//! This file holds the vault itself (created, opened, its config and keys) and the helpers
//! its rooms share; the tree steps live by concern in `dirs.rs` (reading the tree),
//! `entries.rs` (making and removing entries), `rename.rs` (moving them), `fresh.rs` (a
//! version of a file that leaves its directory gets a file ID of its own) and `handles.rs`
//! (opening what an entry names).

mod deletions;
mod dirs;
mod entries;
mod fresh;
mod handles;
mod rename;

pub use deletions::EntryVerdicts;
pub use fresh::FileVersions;

use crate::config::{Secret, VaultConfig};
use crate::content::ContentCipher;
use crate::crash;
use crate::diriv::IvCopy;
use crate::error::{Error, IoContext, Result};
use crate::file::{ContentCtx, CryptFile};
use crate::kdf::Argon2Params;
use crate::keys::{MasterKey, SubKeys};
use crate::names::{DirIv, EntryKind, Identity, NameCipher, NameKey, ParsedEntry};
use crate::record::{ExchangeIntent, RecordError};
use crate::recovery::RecoveryKey;
use crate::sys::Stat;
use crate::sys::{self, MetaError};

/// Largest long-name side file: `base64url(D)` of a 255-byte name is 362 bytes.
const SIDE_FILE_MAX: usize = 512;
use secrecy::SecretString;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Options of `veilfs init`.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Content cipher.
    pub cipher: ContentCipher,
    /// Plaintext block size.
    pub block_size: u32,
    /// Argon2id parameters of the first password slot.
    pub kdf: Argon2Params,
    /// Whether to add a recovery key slot.
    pub recovery_key: bool,
    /// Whether files get a block map (feature `"block-map"`, docs/FORMAT.md §5.10): on by
    /// default; off makes a vault that veilfs versions without the feature can read, in which
    /// an older copy of a block put back is not detected. Ignored by deterministic vaults.
    pub block_map: bool,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            cipher: ContentCipher::Aes256Gcm,
            block_size: 4096,
            kdf: Argon2Params::DEFAULT,
            recovery_key: true,
            block_map: true,
        }
    }
}

/// An open ciphertext directory and its IV.
#[derive(Debug)]
pub struct CipherDir {
    fd: OwnedFd,
    /// The directory's IV.
    pub iv: DirIv,
    /// Its ciphertext path (for messages; the fd is what operations use).
    pub path: PathBuf,
}

impl CipherDir {
    /// Wraps an already verified directory fd and IV.
    pub fn from_parts(fd: OwnedFd, iv: DirIv, path: PathBuf) -> Self {
        CipherDir { fd, iv, path }
    }

    /// The directory fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `path/on_disk` as text, for messages.
    pub fn child_path(&self, on_disk: &str) -> String {
        self.path.join(on_disk).display().to_string()
    }
}

/// A user entry of a ciphertext directory, decrypted.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The plaintext name.
    pub name: Vec<u8>,
    /// The on-disk name (key "." binding).
    pub on_disk: String,
    /// How the name is stored (D, key, side file).
    pub key: NameKey,
    /// Object kind, from the backing `st_mode`.
    pub kind: EntryKind,
    /// The identity the name promises.
    pub identity: Identity,
    /// The backing `stat` of the entry.
    pub stat: Stat,
}

/// A regular file being written under an internal name until it is complete (see
/// [`Vault::create_partial`]).
#[derive(Debug)]
pub struct PartialFile {
    /// The entry it will become, naming the partial file on disk for now.
    pub entry: Entry,
    /// The file, open for writing.
    pub file: CryptFile,
}

/// A listing problem: an on-disk entry that is not a valid entry of this directory.
#[derive(Debug)]
pub struct BadEntry {
    /// The on-disk name.
    pub on_disk: Vec<u8>,
    /// Why it was skipped.
    pub error: Error,
}

/// An unlocked vault.
pub struct Vault {
    root_path: PathBuf,
    config: VaultConfig,
    ctx: ContentCtx,
    names: Arc<NameCipher>,
    master: MasterKey,
    iv_copy: IvCopy,
    /// The tombstone logs this client reads and appends to (`crate::tombstone`); its client
    /// ID is random until [`remember`](Self::remember) gives it the client state's.
    tombs: crate::tombstone::Tombstones,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault").field("root", &self.root_path).field("cipher", &self.ctx.cipher).finish_non_exhaustive()
    }
}

impl Vault {
    /// Creates a new vault in `cipherdir` (created if missing; must be empty) protected by
    /// `password`. Returns the vault and, if requested, the recovery key to show once.
    pub fn create(
        cipherdir: &Path,
        password: &SecretString,
        opts: &InitOptions,
    ) -> Result<(Vault, Option<RecoveryKey>)> {
        match std::fs::read_dir(cipherdir) {
            Ok(mut it) => {
                if it.next().is_some() {
                    return Err(Error::NotEmpty(cipherdir.to_path_buf()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(cipherdir).ctx(|| format!("creating {}", cipherdir.display()))?;
            }
            Err(e) => return Err(Error::io(format!("reading {}", cipherdir.display()), e)),
        }
        opts.kdf.validate()?;
        let master = MasterKey::generate();
        let root_iv: DirIv = crate::random::bytes();
        let mut cfg = VaultConfig::new(opts.cipher, opts.block_size, &root_iv)?;
        if !opts.block_map {
            cfg.features.retain(|f| f != crate::config::FEATURE_BLOCK_MAP);
        }
        cfg.add_password_slot(&master, password, opts.kdf)?;
        let rk = opts.recovery_key.then(RecoveryKey::generate);
        if let Some(rk) = &rk {
            cfg.add_recovery_slot(&master, rk)?;
        }
        cfg.seal(&master);
        let dirfd = sys::open_dir_path(cipherdir).ctx(|| format!("opening {}", cipherdir.display()))?;
        let iv_copy = IvCopy::of(&cfg);
        iv_copy.write(dirfd.as_fd(), &root_iv).ctx(|| cipherdir.join(iv_copy.name(&root_iv)).display().to_string())?;
        crate::lock::create_lock_file(dirfd.as_fd())
            .ctx(|| cipherdir.join(crate::names::LOCK_NAME).display().to_string())?;
        sys::fsync(dirfd.as_fd()).ctx(|| format!("syncing {}", cipherdir.display()))?;
        cfg.save(cipherdir)?;
        Ok((Vault::from_parts(cipherdir, cfg, master), rk))
    }

    /// Opens the vault in `cipherdir` with `secret` (optionally only slot `slot`).
    pub fn open(cipherdir: &Path, secret: &Secret, slot: Option<u32>) -> Result<Vault> {
        Self::open_with(cipherdir, secret, slot, &crate::kdf::KdfCeiling::DEFAULT)
    }

    /// [`open`](Self::open) with an explicit KDF cost ceiling for the slots tried.
    pub fn open_with(
        cipherdir: &Path,
        secret: &Secret,
        slot: Option<u32>,
        ceiling: &crate::kdf::KdfCeiling,
    ) -> Result<Vault> {
        let vault = Self::open_any(cipherdir, secret, slot, ceiling)?;
        if vault.config.has_feature(crate::config::FEATURE_BLOCK_MAP_UPGRADE) {
            return Err(Error::Config {
                path: VaultConfig::path_in(cipherdir),
                detail: format!(
                    "an upgrade to block maps was started and has not finished (its files are part old, part new): \
                     run veilfs upgrade {} to finish it",
                    cipherdir.display()
                ),
            });
        }
        Ok(vault)
    }

    /// [`open_with`](Self::open_with) that also opens a vault whose upgrade to block maps is
    /// under way (feature `"block-map-upgrade"`): for [`crate::upgrade`] alone, which reads
    /// each file by its header's version. Every other reader refuses such a vault.
    pub fn open_for_upgrade(
        cipherdir: &Path,
        secret: &Secret,
        slot: Option<u32>,
        ceiling: &crate::kdf::KdfCeiling,
    ) -> Result<Vault> {
        Self::open_any(cipherdir, secret, slot, ceiling)
    }

    fn open_any(
        cipherdir: &Path,
        secret: &Secret,
        slot: Option<u32>,
        ceiling: &crate::kdf::KdfCeiling,
    ) -> Result<Vault> {
        let cfg = VaultConfig::load(cipherdir)?;
        let path = VaultConfig::path_in(cipherdir);
        let master = match cfg.unlock_with(secret, slot, &path, ceiling) {
            Err(Error::WrongPassword) => Self::unlock_by_config_copies(cipherdir, &cfg, secret, slot, ceiling)?,
            r => r?,
        };
        Ok(Vault::from_parts(cipherdir, cfg, master))
    }

    /// A secret that opens no key slot of `veilfs.conf` may open one of a sync tool's
    /// conflict copy of it: a password added with `veilfs passwd` on one machine while
    /// another machine changed the config too, so that the sync kept the other side's config
    /// under the name. The vault still opens with `veilfs.conf`, never with a copy: a copy
    /// only lends its key slots, and only when the master key a slot yields authenticates
    /// `veilfs.conf` itself (so a copy planted from another vault, or forged, opens nothing).
    /// Copies are tried newest first, at most [`CONFIG_COPIES_TRIED`], each within the same
    /// key-derivation ceiling as the config. Says which copy it was and how to keep the
    /// password in `veilfs.conf`.
    fn unlock_by_config_copies(
        cipherdir: &Path,
        cfg: &VaultConfig,
        secret: &Secret,
        slot: Option<u32>,
        ceiling: &crate::kdf::KdfCeiling,
    ) -> Result<MasterKey> {
        let path = VaultConfig::path_in(cipherdir);
        for name in config_copies(cipherdir) {
            let copy = match VaultConfig::load_named(cipherdir, &name) {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!("{e}");
                    continue;
                }
            };
            let Ok(master) = copy.unlock_with(secret, slot, &cipherdir.join(&name), ceiling) else { continue };
            if cfg.verify(&master, &path).is_err() {
                tracing::warn!(
                    "{}: a key slot opened, but not for this vault's config (another vault's config, or forged): \
                     not used",
                    cipherdir.join(&name).display()
                );
                continue;
            }
            tracing::warn!(
                "{}: the password matched a key slot of its sync conflict copy {name}, not of the config itself; \
                 the vault opens with veilfs.conf. To keep this password, add it there: veilfs passwd {} --add",
                path.display(),
                cipherdir.display()
            );
            return Ok(master);
        }
        Err(Error::WrongPassword)
    }

    /// Builds a vault from a verified config and its master key.
    pub fn from_parts(cipherdir: &Path, config: VaultConfig, master: MasterKey) -> Vault {
        let keys: SubKeys = master.subkeys();
        let names = Arc::new(NameCipher::new(&keys, config.special_binding()));
        let unsettled = config.has_feature(crate::config::FEATURE_UNSETTLED_TAILS);
        let ordered = config.has_feature(crate::config::FEATURE_ORDERED_GROWTH);
        let mut ctx = ContentCtx::new(config.cipher, config.block_size, Arc::new(keys))
            .with_unsettled_tails(unsettled)
            .with_ordered_growth(ordered)
            .with_block_map(config.has_feature(crate::config::FEATURE_BLOCK_MAP));
        // Every writer of a vault with the feature keeps stashes: the writer of
        // "ordered-growth" cannot grow a file without its record (docs/FORMAT.md §5.7). A
        // file with a block map keeps its write session's log there (§5.10).
        if unsettled || config.has_feature(crate::config::FEATURE_BLOCK_MAP) {
            ctx = ctx.with_stashes(cipherdir);
        }
        let iv_copy = IvCopy::of(&config);
        let tombs = crate::tombstone::Tombstones::new(crate::random::bytes());
        Vault { root_path: cipherdir.to_path_buf(), config, ctx, names, master, iv_copy, tombs }
    }

    /// The ciphertext directory.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// The verified config.
    pub fn config(&self) -> &VaultConfig {
        &self.config
    }

    /// The master key (for `passwd`, which re-wraps it).
    pub fn master_key(&self) -> &MasterKey {
        &self.master
    }

    /// Content cipher, geometry and keys.
    pub fn content(&self) -> &ContentCtx {
        &self.ctx
    }

    /// The name cipher.
    pub fn names(&self) -> &Arc<NameCipher> {
        &self.names
    }

    /// How this vault keeps each directory's IV copy (feature `iv-in-name` or not).
    pub fn iv_copy(&self) -> IvCopy {
        self.iv_copy
    }

    /// Replaces the config (after a slot change) and writes it. With feature `"versions"`
    /// its generation goes one above the config this vault was opened with, and this client
    /// remembers it.
    pub fn save_config(&mut self, mut cfg: VaultConfig) -> Result<()> {
        if cfg.has_feature(crate::config::FEATURE_VERSIONS) {
            cfg.generation = self.config.generation.max(cfg.generation) + 1;
        }
        cfg.seal(&self.master);
        cfg.save(&self.root_path)?;
        if let Some(k) = &self.ctx.known {
            k.wrote_config(cfg.generation);
        }
        self.config = cfg;
        Ok(())
    }

    /// Opens this client's memory of the vault (`crate::known`) and checks the config's
    /// generation against it: an older config than this client saw is refused as a config
    /// rollback ([`Error::Rollback`]). From then on every file with a block map this vault
    /// opens is checked too, and every header it writes is remembered. A first use (no state
    /// for this vault on this machine) trusts the vault as it is, and says so once.
    pub fn remember(&mut self, opts: &crate::known::KnownOptions) -> Result<Arc<crate::known::Known>> {
        let iv = self.config.root_iv().expect("checked when the config was parsed");
        let known = Arc::new(crate::known::Known::open(opts, &iv, &self.master)?);
        if known.first_use() {
            tracing::warn!(
                "first use of this vault on this machine: its current state is trusted from now on (client state {})",
                known.dir().display()
            );
        }
        known.check_config(self.config.generation, &VaultConfig::path_in(&self.root_path))?;
        if known.trust() == crate::known::Trust::AllowRollback {
            tracing::warn!(
                "--allow-rollback: files older than this client saw are read anyway, and the client state ({}) is                  left as it is",
                known.dir().display()
            );
        }
        self.tombs = crate::tombstone::Tombstones::new(known.client_id());
        self.ctx.known = Some(known.clone());
        Ok(known)
    }

    /// This client's memory of the vault, if [`remember`](Self::remember) opened it.
    pub fn known(&self) -> Option<&Arc<crate::known::Known>> {
        self.ctx.known.as_ref()
    }
}

/// Most conflict copies of `veilfs.conf` an unlock tries (each costs a key derivation).
const CONFIG_COPIES_TRIED: usize = 4;

/// The names of sync tools' conflict copies of `veilfs.conf` in `cipherdir` (regular files),
/// newest first, at most [`CONFIG_COPIES_TRIED`].
fn config_copies(cipherdir: &Path) -> Vec<String> {
    let Ok(dir) = sys::open_dir_path(cipherdir) else { return Vec::new() };
    let Ok(raw) = sys::read_dir_fd(dir.as_fd()) else { return Vec::new() };
    let mut copies: Vec<(i64, String)> = raw
        .into_iter()
        .filter_map(|r| {
            let c = crate::conflict::parse(&r.name)?;
            (c.original == crate::names::CONFIG_NAME).then_some(())?;
            let name = String::from_utf8(r.name).ok()?;
            let (_, st) = sys::open_regular_at(dir.as_fd(), name.as_bytes(), libc::O_RDONLY).ok()?;
            Some((st.st_mtime, name))
        })
        .collect();
    copies.sort_by(|a, b| b.cmp(a));
    copies.into_iter().take(CONFIG_COPIES_TRIED).map(|(_, n)| n).collect()
}

/// Relabels an integrity error with the path of the entry it concerns.
fn relabel(e: Error, what: &str) -> Error {
    match e {
        Error::Auth { what: w, detail } => Error::auth(what, format!("{w} {detail}")),
        e => e,
    }
}

/// Names the object of an I/O error whose context is only the step ("xattr").
fn relabel_io(e: Error, what: &str) -> Error {
    match e {
        Error::Io { context, source } => Error::io(format!("{what}: {context}"), source),
        e => e,
    }
}

fn ctime(st: &Stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

fn not_found(path: &Path) -> Error {
    Error::io(path.display().to_string(), std::io::Error::from_raw_os_error(libc::ENOENT))
}

/// The components of a relative path as bytes (`.` skipped, `..` refused).
pub fn path_components(path: &Path) -> Result<Vec<&[u8]>> {
    use std::path::Component;
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(sys::os_bytes(s)),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                return Err(Error::Invalid(format!("{}: '..' is not allowed in vault paths", path.display())))
            }
            Component::Prefix(_) => return Err(Error::Invalid(format!("{}: unsupported path", path.display()))),
        }
    }
    Ok(out)
}

/// Runs `f` (a step on the directory `name` of `dir`) and, if the backing store refuses it
/// with EACCES because a directory's mode denies its owner, runs it once more with the
/// owner's `rwx` granted for the moment on `dir` and on `name` ([`sys::with_owner_rwx`]):
/// a user's own mount would otherwise show such a directory as missing after a remount and
/// refuse `rmdir` with EACCES where Linux says ENOTEMPTY.
fn owner_access<T>(dir: &CipherDir, name: &str, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    match f() {
        Err(e) if denied(&e) => {}
        r => return r,
    }
    sys::with_owner_rwx(dir.fd(), || match sys::open_path_at(dir.fd(), name.as_bytes()) {
        Ok((child, _)) => sys::with_owner_rwx(child.as_fd(), &mut f),
        Err(_) => f(),
    })
}

/// Runs `f` (a step on a name inside `dir`) and, if the backing store refuses it with EACCES,
/// runs it once more with the owner's `rwx` granted for the moment on `dir` alone
/// ([`sys::in_dir_as_owner`]).
fn in_dir<T>(dir: &CipherDir, f: impl FnMut() -> Result<T>) -> Result<T> {
    sys::in_dir_as_owner(dir.fd(), denied, f)
}

/// Whether `e` is the backing store's EACCES.
fn denied(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if sys::is_eacces(source))
}
