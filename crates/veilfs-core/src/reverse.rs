//! Reverse mode: a read-only, deterministic ciphertext view of a plaintext directory.
//!
//! The data stays plaintext in PLAINDIR; a reverse mount shows, computed on demand, the vault
//! that a forward writer *could* have made of it, so that rsync, restic or rclone copy
//! ciphertext to untrusted storage. A copy of the view is an ordinary vault (feature
//! `"deterministic"`, docs/FORMAT.md §17): `veilfs mount`, `export` and `fsck` read it.
//!
//! Everything the view shows is a function of (the reverse config, the plaintext path, the
//! plaintext bytes), so the same tree gives byte-identical ciphertext across remounts and
//! machines, and an incremental rsync sends only what changed:
//!
//! * identities (file IDs, directory IVs, symlink and special IDs) are
//!   `HMAC16(ids key, label ‖ kind ‖ parent IV ‖ name)`: chained from the root IV in the
//!   config, so they depend on the relative plaintext path, not on inode numbers (a copy of
//!   PLAINDIR, `cp -a`, gives the same view), and nothing is written into PLAINDIR per file;
//! * block nonces are `u64be(n) ‖ u8(last) ‖ 0 0 0` under AES-256-GCM-SIV, whose synthetic
//!   tag makes a repeated nonce reveal only whether two plaintexts were equal;
//! * names, bindings, long names, headers and symlink blobs are the forward format's own
//!   code ([`NameCipher`], [`FileHeader`], [`BlockCodec`]) fed with those values.
//!
//! Reading block `n` reads only plaintext block `n`: `stat` maps the plaintext size with
//! [`Layout::cipher_size`] and a read at any offset encrypts only the blocks it covers.

use crate::config::{Secret, VaultConfig, FEATURE_DETERMINISTIC};
use crate::content::{BlockCodec, ContentCipher, FileHeader, FileId, Layout, HEADER_LEN};
use crate::error::{Error, IoContext, Result};
use crate::kdf::KdfCeiling;
use crate::keys::{hmac16, MasterKey, SecretBytes};
use crate::names::{DirIv, EntryKind, Identity, NameKey, ParsedEntry, CONFIG_NAME, DIRIV_NAME};
use crate::recovery::RecoveryKey;
use crate::sys;
use crate::sys::Stat;
use crate::vault::{path_components, InitOptions, Vault};
use secrecy::SecretString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The reverse config in PLAINDIR (shown in the view as `veilfs.conf`, never as itself).
pub const REVERSE_CONFIG_NAME: &str = ".veilfs.reverse.conf";
/// HKDF label of the identity key (docs/FORMAT.md §17.2).
const IDS_LABEL: &str = "deterministic-ids";
/// HMAC prefix of an identity derivation.
const ID_PREFIX: &[u8] = b"veilfs v1 reverse id\0";
/// Longest stored symlink target (Linux's PATH_MAX minus the NUL).
const SYMLINK_MAX: usize = 4095;

/// The nonce of block `n` of a deterministic vault (docs/FORMAT.md §17.3).
pub fn derived_nonce(n: u64, last: bool) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&n.to_be_bytes());
    out[8] = last as u8;
    out
}

/// Encodes `blob` in base64url: its length without building it.
const fn b64_len(n: usize) -> usize {
    n / 3 * 4 + [0, 2, 3][n % 3]
}

/// gitignore-style exclude patterns, matched against plaintext paths relative to PLAINDIR.
#[derive(Default)]
pub struct Excludes {
    set: Option<ignore::gitignore::Gitignore>,
}

impl std::fmt::Debug for Excludes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Excludes({} patterns)", self.set.as_ref().map_or(0, |s| s.num_ignores()))
    }
}

impl Excludes {
    /// Patterns given one by one (`--exclude`) and read from files (`--exclude-from`, one
    /// pattern a line, `#` comments and blank lines skipped as in `.gitignore`).
    pub fn new(root: &Path, patterns: &[String], files: &[PathBuf]) -> Result<Excludes> {
        if patterns.is_empty() && files.is_empty() {
            return Ok(Excludes::default());
        }
        let mut b = ignore::gitignore::GitignoreBuilder::new(root);
        for f in files {
            if let Some(e) = b.add(f) {
                return Err(Error::Invalid(format!("--exclude-from {}: {e}", f.display())));
            }
        }
        for p in patterns {
            b.add_line(None, p).map_err(|e| Error::Invalid(format!("--exclude {p:?}: {e}")))?;
        }
        let set = b.build().map_err(|e| Error::Invalid(format!("exclude patterns: {e}")))?;
        Ok(Excludes { set: Some(set) })
    }

    /// Whether the plaintext path `rel` (relative to PLAINDIR) is excluded.
    pub fn excluded(&self, rel: &Path, is_dir: bool) -> bool {
        self.set.as_ref().is_some_and(|s| s.matched(rel, is_dir).is_ignore())
    }

    /// Whether any pattern excludes anything (`!` patterns alone exclude nothing).
    pub fn active(&self) -> bool {
        self.set.as_ref().is_some_and(|s| s.num_ignores() > 0)
    }
}

/// `st_size` of every directory of the view (and `st_blocks` to match): a constant, so that
/// a directory's size tells nothing of the excluded entries it holds, nor of its entries at
/// all (the names are there to count).
pub const VIEW_DIR_SIZE: i64 = 4096;

/// Inodes left out for their links and named in the log; past this many, no more are named.
const LINKED_LOG_MAX: usize = 4096;

/// An open plaintext directory and the IV its view has.
#[derive(Debug)]
pub struct PlainDir {
    fd: OwnedFd,
    /// The directory's view IV (the root IV from the config, else derived).
    pub iv: DirIv,
    /// Its path relative to PLAINDIR (empty for the top).
    pub rel: PathBuf,
}

impl PlainDir {
    /// The directory fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn is_top(&self) -> bool {
        self.rel.as_os_str().is_empty()
    }
}

/// A user entry of the view: a plaintext object and the entry that names it.
#[derive(Clone, Debug)]
pub struct ViewEntry {
    /// The plaintext name.
    pub name: Vec<u8>,
    /// Object kind (from the plaintext `lstat`).
    pub kind: EntryKind,
    /// The derived identity.
    pub identity: Identity,
    /// How the name is stored (D, key, side file).
    pub key: NameKey,
    /// The plaintext `lstat`.
    pub stat: Stat,
}

/// What a name in a view directory is.
#[derive(Clone, Debug)]
pub enum ViewKind {
    /// A user entry.
    Entry(Box<ViewEntry>),
    /// `veilfs.diriv`: the directory's IV.
    DirIv,
    /// `veilfs.conf` at the top: the reverse config's bytes.
    Config,
    /// A long-name side file `veilfs.N.<h>` with its contents.
    SideFile(Vec<u8>),
}

/// One name of a view directory.
#[derive(Clone, Debug)]
pub struct ViewItem {
    /// The ciphertext name shown.
    pub on_disk: String,
    /// What it is.
    pub kind: ViewKind,
}

/// The reverse config as the view shows it (`veilfs.conf`).
#[derive(Clone)]
struct ShownConfig {
    bytes: Vec<u8>,
    stat: Stat,
    /// (inode, size, mtime, ctime) of the last version of the file looked at, accepted or not.
    seen: (u64, i64, i64, i64, i64, i64),
}

fn version_of(st: &Stat) -> (u64, i64, i64, i64, i64, i64) {
    (st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec)
}

/// An unlocked reverse vault over PLAINDIR.
pub struct ReverseVault {
    vault: Vault,
    ids: SecretBytes<32>,
    /// The config shown as `veilfs.conf`: followed when `veilfs passwd` rewrites it.
    shown: std::sync::Mutex<ShownConfig>,
    /// Owner and times of the vault's own files (IVs, side files): the config's at open, so
    /// they stay the same for rsync while the mount lives.
    base_stat: Stat,
    excludes: Excludes,
    /// (device, inode) of the multiply linked objects already named in the log as left out.
    linked_logged: std::sync::Mutex<std::collections::HashSet<(u64, u64)>>,
}

impl std::fmt::Debug for ReverseVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReverseVault").field("root", &self.vault.root_path()).finish_non_exhaustive()
    }
}

impl ReverseVault {
    /// Makes PLAINDIR (an existing directory) a reverse vault: writes
    /// [`REVERSE_CONFIG_NAME`] into it and nothing else. `opts.cipher` is ignored (the cipher
    /// is AES-256-GCM-SIV). Returns the recovery key to show once, if asked for.
    pub fn create(plaindir: &Path, password: &SecretString, opts: &InitOptions) -> Result<Option<RecoveryKey>> {
        if !plaindir.is_dir() {
            return Err(Error::io(
                plaindir.display().to_string(),
                std::io::Error::new(std::io::ErrorKind::NotFound, "not an existing directory"),
            ));
        }
        if plaindir.join(REVERSE_CONFIG_NAME).symlink_metadata().is_ok() {
            return Err(Error::Invalid(format!(
                "{} already holds {REVERSE_CONFIG_NAME}: it is a reverse vault already",
                plaindir.display()
            )));
        }
        opts.kdf.validate()?;
        let master = MasterKey::generate();
        let root_iv: DirIv = crate::random::bytes();
        let mut cfg = VaultConfig::new(ContentCipher::Aes256GcmSiv, opts.block_size, &root_iv)?;
        cfg.add_password_slot(&master, password, opts.kdf)?;
        let rk = opts.recovery_key.then(RecoveryKey::generate);
        if let Some(rk) = &rk {
            cfg.add_recovery_slot(&master, rk)?;
        }
        cfg.seal(&master);
        cfg.save_named(plaindir, REVERSE_CONFIG_NAME)?;
        Ok(rk)
    }

    /// Opens the reverse vault of PLAINDIR with `secret`.
    pub fn open_with(plaindir: &Path, secret: &Secret, slot: Option<u32>, ceiling: &KdfCeiling) -> Result<Self> {
        let path = plaindir.join(REVERSE_CONFIG_NAME);
        let cfg = VaultConfig::load_named(plaindir, REVERSE_CONFIG_NAME)?;
        // The view shows these very bytes; parse them again so what is shown is what was checked.
        let bytes = sys::read_meta_path(&path, crate::config::MAX_CONFIG_LEN)
            .map_err(|e| Error::Config { path: path.clone(), detail: format!("cannot be read: {e}") })?;
        if VaultConfig::parse(&bytes, &path)? != cfg {
            return Err(Error::Config { path, detail: "changed while it was being read; try again".into() });
        }
        if !cfg.is_deterministic() {
            return Err(Error::Config {
                path,
                detail: format!("lacks feature {FEATURE_DETERMINISTIC:?}: it is not a reverse config"),
            });
        }
        let master = cfg.unlock_with(secret, slot, &path, ceiling)?;
        let dirfd = sys::open_dir_path(plaindir).ctx(|| plaindir.display().to_string())?;
        let config_stat =
            sys::fstatat(dirfd.as_fd(), REVERSE_CONFIG_NAME.as_bytes()).ctx(|| path.display().to_string())?;
        Ok(Self::from_parts(plaindir, cfg, master, bytes, config_stat))
    }

    /// Builds a reverse vault from a verified deterministic config, its master key, the
    /// config's bytes and `stat` (shown as `veilfs.conf`).
    pub fn from_parts(
        plaindir: &Path,
        config: VaultConfig,
        master: MasterKey,
        config_bytes: Vec<u8>,
        config_stat: Stat,
    ) -> Self {
        let ids = master.derive(IDS_LABEL);
        let shown = ShownConfig { bytes: config_bytes, stat: config_stat, seen: version_of(&config_stat) };
        ReverseVault {
            vault: Vault::from_parts(plaindir, config, master),
            ids,
            shown: std::sync::Mutex::new(shown),
            base_stat: config_stat,
            excludes: Excludes::default(),
            linked_logged: Default::default(),
        }
    }

    /// Seals `cfg` (slots changed by `veilfs passwd`) with the vault's master key and writes
    /// it as the reverse config in PLAINDIR (atomically, as a forward vault's). The keys do
    /// not change, so the view shows the same ciphertext with the new `veilfs.conf`.
    pub fn save_config(&mut self, mut cfg: VaultConfig) -> Result<()> {
        cfg.seal(self.vault.master_key());
        cfg.save_named(self.plain_root(), REVERSE_CONFIG_NAME)?;
        let (root, master) = (self.plain_root().to_path_buf(), self.vault.master_key().clone());
        self.vault = Vault::from_parts(&root, cfg, master);
        Ok(())
    }

    /// The config the view shows, re-read first if the file changed since (a `veilfs passwd`
    /// while mounted: the next backup then carries the new key slots). A rewritten config is
    /// shown only if it authenticates under this vault's master key and keeps its cipher,
    /// block size and root IV; otherwise the one shown before stays, with a warning.
    fn shown_config(&self) -> ShownConfig {
        let mut g = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.plain_root().join(REVERSE_CONFIG_NAME);
        let Ok(st) =
            sys::open_dir_path(self.plain_root()).and_then(|d| sys::fstatat(d.as_fd(), REVERSE_CONFIG_NAME.as_bytes()))
        else {
            return g.clone();
        };
        if version_of(&st) == g.seen {
            return g.clone();
        }
        g.seen = version_of(&st);
        match sys::read_meta_path(&path, crate::config::MAX_CONFIG_LEN)
            .map_err(|e| Error::Config { path: path.clone(), detail: format!("cannot be read: {e}") })
            .and_then(|bytes| self.check_rewritten(&bytes, &path).map(|()| bytes))
        {
            Ok(bytes) => {
                let mut stat = st;
                stat.st_size = bytes.len() as i64;
                stat.st_blocks = (bytes.len() as u64).div_ceil(512) as i64;
                g.bytes = bytes;
                g.stat = stat;
            }
            Err(e) => tracing::warn!("{}: changed, still showing the config read before: {e}", path.display()),
        }
        g.clone()
    }

    /// Checks a rewritten reverse config: authentic under the master key, same geometry.
    fn check_rewritten(&self, bytes: &[u8], path: &Path) -> Result<()> {
        let cfg = VaultConfig::parse(bytes, path)?;
        cfg.verify(self.vault.master_key(), path)?;
        let now = self.vault.config();
        if !cfg.is_deterministic()
            || cfg.cipher != now.cipher
            || cfg.block_size != now.block_size
            || cfg.root_iv() != now.root_iv()
        {
            return Err(Error::Config { path: path.to_path_buf(), detail: "is not this view's vault any more".into() });
        }
        Ok(())
    }

    /// Sets the exclude patterns.
    pub fn set_excludes(&mut self, excludes: Excludes) {
        self.excludes = excludes;
    }

    /// The vault's keys, config and name cipher (its root path is PLAINDIR).
    pub fn vault(&self) -> &Vault {
        &self.vault
    }

    /// PLAINDIR.
    pub fn plain_root(&self) -> &Path {
        self.vault.root_path()
    }

    /// Block geometry of the view.
    pub fn layout(&self) -> Layout {
        self.vault.content().layout
    }

    /// The identity of the object `name` of `kind` in the view directory with IV `parent_iv`
    /// (docs/FORMAT.md §17.2).
    pub fn identity(&self, parent_iv: &DirIv, name: &[u8], kind: EntryKind) -> Identity {
        // Reverse vaults bind every special file as the shared kind `0x04` (no `special-kinds`).
        let byte = kind.binding_byte(crate::names::SpecialBinding::Shared);
        hmac16(self.ids.expose(), &[ID_PREFIX, &[byte], parent_iv, name])
    }

    /// Opens the top of PLAINDIR.
    pub fn root(&self) -> Result<PlainDir> {
        let root = self.plain_root();
        let fd = sys::open_dir_path(root).ctx(|| format!("opening {}", root.display()))?;
        let iv = self.vault.config().root_iv().expect("checked at load");
        Ok(PlainDir { fd, iv, rel: PathBuf::new() })
    }

    fn hidden(&self, dir: &PlainDir, name: &[u8], is_dir: bool) -> bool {
        if dir.is_top() && name.starts_with(REVERSE_CONFIG_NAME.as_bytes()) {
            // The config itself and its temporary file while `passwd` rewrites it.
            let rest = &name[REVERSE_CONFIG_NAME.len()..];
            if rest.is_empty() || rest == b".tmp" {
                return true;
            }
        }
        self.excludes.excluded(&dir.rel.join(std::ffi::OsStr::from_bytes(name)), is_dir)
    }

    /// Whether the object `st` (a name of `dir`) is left out for its links. Excludes go by
    /// path, and a hard link gives the same content a second path: a file excluded as
    /// `secret.key` would show in full as `innocent.txt`, a link its owner (or, without
    /// `fs.protected_hardlinks`, anyone) made before or after the mount. Which other names an
    /// inode has cannot be found without walking the file system, so while any exclude
    /// pattern is active every non-directory with more than one link is left out of the
    /// view, and named once in the log. Checked on each `lstat` the view takes (LOOKUP,
    /// listing, GETATTR, OPEN), on the opened fd and at every read of it, so a link made while
    /// the view is mounted takes the file out at once.
    fn linked(&self, dir: &PlainDir, name: &[u8], st: &Stat) -> bool {
        if !self.excludes.active() || st.st_nlink <= 1 || st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return false;
        }
        let mut seen = self.linked_logged.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() < LINKED_LOG_MAX && seen.insert((st.st_dev, st.st_ino)) {
            tracing::warn!(
                "{}: left out of the view: it has {} hard links and excludes are active (another name may be excluded){}",
                self.plain_path(dir, name),
                st.st_nlink,
                if seen.len() == LINKED_LOG_MAX { "; further such files are not named" } else { "" }
            );
        }
        true
    }

    /// The view entry of the plaintext object `name` in `dir`, `None` if it does not exist or
    /// is excluded.
    pub fn entry(&self, dir: &PlainDir, name: &[u8]) -> Result<Option<ViewEntry>> {
        let st = match sys::fstatat(dir.fd(), name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(Error::io(self.plain_path(dir, name), e)),
        };
        let kind = EntryKind::from_mode(st.st_mode);
        if self.hidden(dir, name, kind == EntryKind::Dir) || self.linked(dir, name, &st) {
            return Ok(None);
        }
        let identity = self.identity(&dir.iv, name, kind);
        let key = self.vault.names().name_key(&dir.iv, name)?;
        Ok(Some(ViewEntry { name: name.to_vec(), kind, identity, key, stat: st }))
    }

    /// `item` of `dir` as it is now: an entry with a new `lstat` (name, identity and stored
    /// name kept: they depend only on the name and kind), `None` if it is gone or is now
    /// another kind of object; the vault's own files as they were. No name is encrypted.
    pub fn refreshed(&self, dir: &PlainDir, item: &ViewItem) -> Result<Option<ViewItem>> {
        let ViewKind::Entry(e) = &item.kind else { return Ok(Some(item.clone())) };
        let st = match sys::fstatat(dir.fd(), &e.name) {
            Ok(st) => st,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(err) => return Err(Error::io(self.plain_path(dir, &e.name), err)),
        };
        if EntryKind::from_mode(st.st_mode) != e.kind || self.linked(dir, &e.name, &st) {
            return Ok(None);
        }
        let mut now = e.clone();
        now.stat = st;
        Ok(Some(ViewItem { on_disk: item.on_disk.clone(), kind: ViewKind::Entry(now) }))
    }

    /// Whether looking up the view name `on_disk` needs the whole directory listed (a long
    /// name or a side file is found by its hash).
    pub fn lookup_lists(on_disk: &[u8]) -> bool {
        matches!(ParsedEntry::parse(on_disk), ParsedEntry::Long { .. } | ParsedEntry::Internal)
            && on_disk != DIRIV_NAME.as_bytes()
            && on_disk != CONFIG_NAME.as_bytes()
    }

    /// The ciphertext name of `e` in `dir`.
    pub fn on_disk(&self, dir: &PlainDir, e: &ViewEntry) -> String {
        e.key.entry_name(&self.vault.names().bind(&dir.iv, &e.key.d, e.kind, &e.identity))
    }

    fn plain_path(&self, dir: &PlainDir, name: &[u8]) -> String {
        self.plain_root().join(&dir.rel).join(std::ffi::OsStr::from_bytes(name)).display().to_string()
    }

    /// Every name of the view of `dir`: `veilfs.diriv`, `veilfs.conf` at the top, the user
    /// entries and their long-name side files. Entries that vanish meanwhile are left out.
    pub fn list(&self, dir: &PlainDir) -> Result<Vec<ViewItem>> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", self.plain_path(dir, b"")))?;
        let mut out = Vec::with_capacity(raw.len() + 2);
        out.push(ViewItem { on_disk: DIRIV_NAME.into(), kind: ViewKind::DirIv });
        if dir.is_top() {
            out.push(ViewItem { on_disk: CONFIG_NAME.into(), kind: ViewKind::Config });
        }
        for r in raw {
            if r.name == b"." || r.name == b".." {
                continue;
            }
            let Some(e) = self.entry(dir, &r.name)? else { continue };
            let on_disk = self.on_disk(dir, &e);
            if let (Some(side), Some(contents)) = (e.key.side_file.clone(), e.key.side_file_contents()) {
                out.push(ViewItem { on_disk: side, kind: ViewKind::SideFile(contents.into_bytes()) });
            }
            out.push(ViewItem { on_disk, kind: ViewKind::Entry(Box::new(e)) });
        }
        Ok(out)
    }

    /// The view item called `on_disk` in `dir`, if there is one.
    pub fn lookup(&self, dir: &PlainDir, on_disk: &[u8]) -> Result<Option<ViewItem>> {
        if on_disk == DIRIV_NAME.as_bytes() {
            return Ok(Some(ViewItem { on_disk: DIRIV_NAME.into(), kind: ViewKind::DirIv }));
        }
        if dir.is_top() && on_disk == CONFIG_NAME.as_bytes() {
            return Ok(Some(ViewItem { on_disk: CONFIG_NAME.into(), kind: ViewKind::Config }));
        }
        match ParsedEntry::parse(on_disk) {
            ParsedEntry::Short { key, .. } => {
                let Some(d) = crate::names::b64_decode(key) else { return Ok(None) };
                let Ok(name) = self.vault.names().decrypt_name(&dir.iv, &d) else { return Ok(None) };
                let Some(e) = self.entry(dir, &name)? else { return Ok(None) };
                let shown = self.on_disk(dir, &e);
                Ok((shown.as_bytes() == on_disk)
                    .then_some(ViewItem { on_disk: shown, kind: ViewKind::Entry(Box::new(e)) }))
            }
            // Long names and their side files are found by hash: list the directory.
            ParsedEntry::Long { .. } | ParsedEntry::Internal => {
                Ok(self.list(dir)?.into_iter().find(|i| i.on_disk.as_bytes() == on_disk))
            }
            ParsedEntry::Foreign | ParsedEntry::SyncTool(_) | ParsedEntry::Conflict(_) => Ok(None),
        }
    }

    /// Opens the plaintext subdirectory of entry `e` of `dir`.
    pub fn open_subdir(&self, dir: &PlainDir, e: &ViewEntry) -> Result<PlainDir> {
        let fd = sys::open_dir_at(dir.fd(), &e.name).ctx(|| self.plain_path(dir, &e.name))?;
        Ok(PlainDir { fd, iv: e.identity, rel: dir.rel.join(std::ffi::OsStr::from_bytes(&e.name)) })
    }

    /// Opens the ciphertext view of the regular file `e` of `dir` (`e.stat` is the `lstat`
    /// the caller just checked). The owner of PLAINDIR's files can swap the file for a FIFO,
    /// device or another file between that `lstat` and the open: the open never follows a
    /// link, never blocks and never opens anything but a regular file for I/O (a device's
    /// driver does not run, a FIFO's blocked writer is not woken: the object is type-checked
    /// through an `O_PATH` handle first), and the fd must be the very regular file `e.stat`
    /// describes. Anything else
    /// is ENOENT (the name is now another kind of object, as [`Self::refreshed`] answers) or
    /// ESTALE (another regular file: the kernel looks the name up again and retries once).
    /// `O_NONBLOCK` stays on the fd: it changes nothing for a regular file.
    pub fn open_file(&self, dir: &PlainDir, e: &ViewEntry) -> Result<ViewFile> {
        let what = self.plain_path(dir, &e.name);
        let (fd, st) = match sys::open_regular_untouched_at(dir.fd(), &e.name, libc::O_RDONLY) {
            Ok(opened) => opened,
            Err(Ok(_other_type)) => return Err(Error::io(what, std::io::Error::from_raw_os_error(libc::ENOENT))),
            Err(Err(err)) => return Err(Error::io(what, err)),
        };
        if (st.st_dev, st.st_ino) != (e.stat.st_dev, e.stat.st_ino) {
            return Err(Error::io(what, std::io::Error::from_raw_os_error(libc::ESTALE)));
        }
        if self.linked(dir, &e.name, &st) {
            return Err(Error::io(what, std::io::Error::from_raw_os_error(libc::ENOENT)));
        }
        let ctx = self.vault.content();
        Ok(ViewFile {
            file: sys::into_file(fd),
            codec: BlockCodec::new(ctx.cipher, &ctx.keys, e.identity),
            header: FileHeader::new(e.identity).encode(&ctx.keys),
            plain_size: st.st_size as u64,
            layout: ctx.layout,
            what,
            single_link: self.excludes.active(),
        })
    }

    /// The stored (encrypted) target of the symlink `e` of `dir`.
    pub fn readlink(&self, dir: &PlainDir, e: &ViewEntry) -> Result<Vec<u8>> {
        let target = sys::readlinkat(dir.fd(), &e.name).ctx(|| self.plain_path(dir, &e.name))?;
        self.seal_target(&e.identity, &target)
    }

    /// `b64(ID ‖ block 0 (last) of target)` with the derived nonce (docs/FORMAT.md §8, §17).
    pub fn seal_target(&self, id: &Identity, target: &[u8]) -> Result<Vec<u8>> {
        let ctx = self.vault.content();
        let codec = BlockCodec::new(ctx.cipher, &ctx.keys, *id);
        let mut blob = vec![0u8; 16 + target.len() + codec.overhead()];
        blob[..16].copy_from_slice(id);
        blob[16..16 + codec.nonce_len()].copy_from_slice(&derived_nonce(0, true));
        codec.seal_into_prefilled(0, true, target, &mut blob[16..]);
        let enc = crate::names::b64_encode(&blob).into_bytes();
        if enc.len() > SYMLINK_MAX {
            return Err(Error::io("symlink", std::io::Error::from_raw_os_error(libc::ENAMETOOLONG)));
        }
        Ok(enc)
    }

    /// The `stat` the view shows for `item` of `dir`: the plaintext's metadata with the
    /// ciphertext size; the vault's own files (IV, config, side files) carry the reverse
    /// config's owner and times, so they look unchanged to rsync as long as it is.
    pub fn view_stat(&self, dir: &PlainDir, item: &ViewItem) -> Result<Stat> {
        let synthetic = |len: usize| {
            let mut st = self.base_stat;
            st.st_mode = libc::S_IFREG | 0o400;
            st.st_nlink = 1;
            st.st_size = len as i64;
            st.st_blocks = (len as u64).div_ceil(512) as i64;
            st
        };
        Ok(match &item.kind {
            ViewKind::DirIv => synthetic(dir.iv.len()),
            ViewKind::Config => {
                let mut st = self.shown_config().stat;
                st.st_mode = libc::S_IFREG | 0o400;
                st.st_nlink = 1;
                st
            }
            ViewKind::SideFile(c) => synthetic(c.len()),
            ViewKind::Entry(e) if e.kind == EntryKind::Dir && self.excludes.active() => {
                let sub = self.open_subdir(dir, e)?;
                let mut st = self.entry_stat(e);
                st.st_nlink = self.view_dir_links(&sub)?;
                st
            }
            ViewKind::Entry(e) => self.entry_stat(e),
        })
    }

    /// The view `stat` of the directory `dir` itself (the top of the view).
    pub fn dir_stat(&self, dir: &PlainDir) -> Result<Stat> {
        let mut st = sys::fstat(dir.fd()).ctx(|| self.plain_path(dir, b""))?;
        view_dir_size(&mut st);
        if self.excludes.active() {
            st.st_nlink = self.view_dir_links(dir)?;
        }
        Ok(st)
    }

    /// The link count of view directory `dir`: 2 and one for each subdirectory the view
    /// shows, so that an excluded subdirectory is not counted. Without excludes the
    /// plaintext's own count is shown (no entry that counts is hidden then: the reverse
    /// config is a file). The count lists the directory at each `stat` of it: measured with
    /// `ls -lR` of 4,000 files in 160 directories (tmpfs, `--attr-timeout 0`, 2 vCPUs under
    /// a load of 5 builds), the daemon's CPU per run with an exclude that matches nothing
    /// went from 170–490 ms to 580–940 ms (7 runs each, twice); without excludes it is
    /// unchanged. A listing kept by the front end could serve the count (not done yet).
    fn view_dir_links(&self, dir: &PlainDir) -> Result<u64> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", self.plain_path(dir, b"")))?;
        let mut n = 2;
        for r in raw {
            if r.name == b"." || r.name == b".." {
                continue;
            }
            let is_dir = match r.d_type {
                libc::DT_DIR => true,
                libc::DT_UNKNOWN => {
                    sys::fstatat(dir.fd(), &r.name).is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR)
                }
                _ => false,
            };
            if is_dir && !self.hidden(dir, &r.name, true) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// The view `stat` of a user entry, from its plaintext `lstat`.
    pub fn entry_stat(&self, e: &ViewEntry) -> Stat {
        let mut st = e.stat;
        match e.kind {
            EntryKind::File => {
                let c = self.layout().cipher_size(st.st_size as u64);
                st.st_size = c as i64;
                st.st_blocks = c.div_ceil(512) as i64;
                // Hard links are separate files of the view (each path its own identity).
                st.st_nlink = 1;
            }
            EntryKind::Symlink => {
                let o = self.vault.content().cipher.overhead();
                st.st_size = b64_len(16 + st.st_size as usize + o) as i64;
            }
            EntryKind::Dir => view_dir_size(&mut st),
            EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice => {}
        }
        st
    }

    /// The contents of a synthetic item (IV file, config, side file); `None` for entries.
    pub fn synthetic_contents(&self, dir: &PlainDir, item: &ViewItem) -> Option<Vec<u8>> {
        match &item.kind {
            ViewKind::DirIv => Some(dir.iv.to_vec()),
            ViewKind::Config => Some(self.shown_config().bytes),
            ViewKind::SideFile(c) => Some(c.clone()),
            ViewKind::Entry(_) => None,
        }
    }

    /// The view path (relative to the view's top) of a plaintext path relative to PLAINDIR.
    pub fn encrypt_path(&self, path: &Path) -> Result<PathBuf> {
        let mut dir = self.root()?;
        let mut out = PathBuf::new();
        let comps = path_components(path)?;
        for (i, c) in comps.iter().enumerate() {
            let e = self.entry(&dir, c)?.ok_or_else(|| not_found(path))?;
            out.push(self.on_disk(&dir, &e));
            if i + 1 < comps.len() {
                dir = self.open_subdir(&dir, &e)?;
            }
        }
        Ok(out)
    }

    /// The plaintext path (relative to PLAINDIR) of a view path.
    pub fn decrypt_path(&self, view_path: &Path) -> Result<PathBuf> {
        let mut dir = self.root()?;
        let mut out = PathBuf::new();
        let comps = path_components(view_path)?;
        for (i, c) in comps.iter().enumerate() {
            let item = self.lookup(&dir, c)?.ok_or_else(|| not_found(view_path))?;
            let ViewKind::Entry(e) = item.kind else {
                return Err(Error::Invalid(format!("{} is a file of the vault itself", String::from_utf8_lossy(c))));
            };
            out.push(std::ffi::OsStr::from_bytes(&e.name));
            if i + 1 < comps.len() {
                dir = self.open_subdir(&dir, &e)?;
            }
        }
        Ok(out)
    }
}

/// The derivations of a deterministic vault without a directory behind them: for the
/// known-answer vectors (`tests/vectors.rs`).
#[doc(hidden)]
pub fn vector_parts(master: &MasterKey) -> ReverseVault {
    let mut cfg = VaultConfig::new(ContentCipher::Aes256GcmSiv, 4096, &[0; 16]).expect("valid block size");
    cfg.seal(master);
    let st = Stat::default();
    ReverseVault::from_parts(Path::new("/nonexistent"), cfg, master.clone(), Vec::new(), st)
}

impl ReverseVault {
    /// The identity key (known-answer vectors only).
    #[doc(hidden)]
    pub fn ids_key(&self) -> &[u8; 32] {
        self.ids.expose()
    }
}

/// Sets a view directory's size ([`VIEW_DIR_SIZE`]).
fn view_dir_size(st: &mut Stat) {
    st.st_size = VIEW_DIR_SIZE;
    st.st_blocks = VIEW_DIR_SIZE / 512;
}

fn not_found(path: &Path) -> Error {
    Error::io(path.display().to_string(), std::io::Error::from_raw_os_error(libc::ENOENT))
}

/// The ciphertext of one plaintext file, computed block by block on read.
#[derive(Debug)]
pub struct ViewFile {
    file: File,
    codec: BlockCodec,
    header: [u8; HEADER_LEN],
    plain_size: u64,
    layout: Layout,
    what: String,
    /// Excludes are active: every read first checks on the fd that the file still has one
    /// link (a link made under an excluded name after the open takes it out of the view).
    single_link: bool,
}

impl ViewFile {
    /// The file ID.
    pub fn id(&self) -> &FileId {
        self.codec.file_id()
    }

    /// Plaintext size when the file was opened.
    pub fn plain_size(&self) -> u64 {
        self.plain_size
    }

    /// Ciphertext size.
    pub fn cipher_size(&self) -> u64 {
        self.layout.cipher_size(self.plain_size)
    }

    /// Fills `buf` with the ciphertext at `off`; returns the bytes written (0 at the end).
    /// Reads and encrypts only the plaintext blocks the range covers. A file that shrank
    /// since it was opened is an I/O error (its ciphertext would not be that of any version).
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        let csize = self.cipher_size();
        if off >= csize || buf.is_empty() {
            return Ok(0);
        }
        let end = csize.min(off + buf.len() as u64);
        if self.single_link && sys::fstat(self.file.as_fd()).ctx(|| self.what.clone())?.st_nlink > 1 {
            return Err(Error::io(self.what.clone(), std::io::Error::from_raw_os_error(libc::ENOENT)));
        }
        let h = HEADER_LEN as u64;
        if off < h {
            let stop = end.min(h);
            buf[..(stop - off) as usize].copy_from_slice(&self.header[off as usize..stop as usize]);
        }
        if end > h {
            self.blocks_into(off.max(h), end, &mut buf[(off.max(h) - off) as usize..(end - off) as usize])?;
        }
        Ok((end - off) as usize)
    }

    /// Ciphertext bytes `[from, to)` (both after the header) into `out`.
    fn blocks_into(&self, from: u64, to: u64, out: &mut [u8]) -> Result<()> {
        let (h, cb, bs) = (self.layout.header(), self.layout.cipher_block(), self.layout.block_size);
        let (first, last) = ((from - h) / cb, (to - 1 - h) / cb);
        let count = self.layout.block_count(self.plain_size);
        let pstart = first * bs;
        let pend = ((last + 1) * bs).min(self.plain_size);
        let mut plain = vec![0u8; (pend - pstart) as usize];
        let got = sys::pread_full(self.file.as_fd(), &mut plain, pstart).ctx(|| self.what.clone())?;
        if got != plain.len() {
            return Err(Error::io(
                self.what.clone(),
                std::io::Error::other("the file shrank while it was being read; read it again"),
            ));
        }
        let o = self.layout.overhead as usize;
        let mut sealed = vec![0u8; bs as usize + o];
        for n in first..=last {
            let p = &plain[((n - first) * bs) as usize..];
            let len = self.layout.block_len(n, self.plain_size) as usize;
            let blk = &mut sealed[..len + o];
            let is_last = n + 1 == count;
            blk[..self.codec.nonce_len()].copy_from_slice(&derived_nonce(n, is_last));
            self.codec.seal_into_prefilled(n, is_last, &p[..len], blk);
            // Copy the part of this block inside [from, to).
            let boff = self.layout.block_offset(n);
            let (a, b) = (from.max(boff), to.min(boff + blk.len() as u64));
            out[(a - from) as usize..(b - from) as usize]
                .copy_from_slice(&blk[(a - boff) as usize..(b - boff) as usize]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kdf::Argon2Params;

    const WEAK: Argon2Params = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };

    fn reverse(dir: &Path) -> ReverseVault {
        let pw = SecretString::from("pw".to_string());
        let opts = InitOptions { kdf: WEAK, recovery_key: false, ..Default::default() };
        ReverseVault::create(dir, &pw, &opts).unwrap();
        ReverseVault::open_with(dir, &Secret::Password(pw), None, &KdfCeiling::DEFAULT).unwrap()
    }

    fn read_all(f: &ViewFile) -> Vec<u8> {
        let mut out = vec![0u8; f.cipher_size() as usize];
        assert_eq!(f.read_at(0, &mut out).unwrap(), out.len());
        out
    }

    #[test]
    fn reads_at_any_offset_agree_with_a_whole_read() {
        let t = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3 * 4096 + 777).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(t.path().join("f"), &data).unwrap();
        let rv = reverse(t.path());
        let root = rv.root().unwrap();
        let e = rv.entry(&root, b"f").unwrap().unwrap();
        let f = rv.open_file(&root, &e).unwrap();
        let whole = read_all(&f);
        assert_eq!(whole.len() as u64, rv.layout().cipher_size(data.len() as u64));
        for (off, len) in [(0, 1), (5, 40), (35, 2), (36, 4124), (4100, 9000), (12000, 10_000), (0, 1 << 20)] {
            let mut part = vec![0u8; len];
            let n = f.read_at(off, &mut part).unwrap();
            let stop = (off as usize + len).min(whole.len());
            assert_eq!(&part[..n], &whole[off as usize..stop], "offset {off} length {len}");
        }
        // Deterministic: a second open gives the same bytes.
        assert_eq!(read_all(&rv.open_file(&root, &e).unwrap()), whole);
    }

    #[test]
    fn identities_depend_on_path_not_inode() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/x"), b"x").unwrap();
        let rv = reverse(t.path());
        let root = rv.root().unwrap();
        let d = rv.entry(&root, b"d").unwrap().unwrap();
        let sub = rv.open_subdir(&root, &d).unwrap();
        let x1 = rv.entry(&sub, b"x").unwrap().unwrap();
        std::fs::remove_file(t.path().join("d/x")).unwrap();
        std::fs::write(t.path().join("d/x"), b"y").unwrap();
        let x2 = rv.entry(&sub, b"x").unwrap().unwrap();
        assert_eq!(x1.identity, x2.identity);
        assert_eq!(rv.on_disk(&sub, &x1), rv.on_disk(&sub, &x2));
        assert_ne!(rv.identity(&sub.iv, b"x", EntryKind::File), rv.identity(&sub.iv, b"x", EntryKind::Dir));
        // Paths round-trip through the view.
        let view = rv.encrypt_path(Path::new("d/x")).unwrap();
        assert_eq!(rv.decrypt_path(&view).unwrap(), Path::new("d/x"));
    }

    #[test]
    fn the_config_is_shown_as_veilfs_conf_and_excludes_hide_entries() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("keep"), b"k").unwrap();
        std::fs::write(t.path().join("skip.tmp"), b"s").unwrap();
        let mut rv = reverse(t.path());
        rv.set_excludes(Excludes::new(t.path(), &["*.tmp".into()], &[]).unwrap());
        let root = rv.root().unwrap();
        let names: Vec<String> = rv.list(&root).unwrap().into_iter().map(|i| i.on_disk).collect();
        assert!(names.contains(&"veilfs.conf".to_string()) && names.contains(&"veilfs.diriv".to_string()));
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(!names.iter().any(|n| n.starts_with(".veilfs")));
    }

    #[test]
    fn with_excludes_a_file_with_several_links_is_left_out_at_lookup_open_and_read() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), vec![1u8; 10_000]).unwrap();
        std::fs::write(t.path().join("secret.key"), b"secret").unwrap();
        std::fs::hard_link(t.path().join("secret.key"), t.path().join("linked")).unwrap();
        let mut rv = reverse(t.path());
        let root = rv.root().unwrap();
        // Without excludes nothing is left out.
        assert!(rv.entry(&root, b"linked").unwrap().is_some());
        rv.set_excludes(Excludes::new(t.path(), &["*.key".into()], &[]).unwrap());
        assert!(rv.entry(&root, b"linked").unwrap().is_none(), "a link to an excluded file is shown");
        // A file opened with one link stops reading once it has a second one.
        let e = rv.entry(&root, b"f").unwrap().unwrap();
        let f = rv.open_file(&root, &e).unwrap();
        assert!(f.read_at(0, &mut [0u8; 100]).is_ok());
        std::fs::hard_link(t.path().join("f"), t.path().join("g.key")).unwrap();
        let err = f.read_at(0, &mut [0u8; 100]).unwrap_err();
        assert!(matches!(&err, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT)), "{err}");
        assert!(rv
            .refreshed(&root, &ViewItem { on_disk: String::new(), kind: ViewKind::Entry(Box::new(e.clone())) })
            .unwrap()
            .is_none());
        let err = rv.open_file(&root, &e).unwrap_err();
        assert!(matches!(&err, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT)), "{err}");
    }

    #[test]
    fn a_file_swapped_for_a_fifo_or_another_file_after_its_lstat_is_refused_at_open() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"data").unwrap();
        let rv = reverse(t.path());
        let root = rv.root().unwrap();
        let e = rv.entry(&root, b"f").unwrap().unwrap();
        // Another regular file under the name: ESTALE. (Made before the old one goes, so the
        // file system cannot hand it the freed inode number.)
        std::fs::write(t.path().join("g"), b"other").unwrap();
        std::fs::rename(t.path().join("g"), t.path().join("f")).unwrap();
        let err = rv.open_file(&root, &e).unwrap_err();
        assert!(matches!(&err, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ESTALE)), "{err}");
        // A FIFO: refused at once (the open does not wait for a writer).
        std::fs::remove_file(t.path().join("f")).unwrap();
        let o = std::process::Command::new("mkfifo").arg(t.path().join("f")).status().unwrap();
        assert!(o.success());
        let err = rv.open_file(&root, &e).unwrap_err();
        assert!(matches!(&err, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT)), "{err}");
    }

    /// A swapped-in special file is type-checked through an `O_PATH` handle, never opened for
    /// I/O: opening a device would run its driver. A FIFO makes that visible without a device:
    /// a writer blocked in `open(O_WRONLY)` is woken by any reader's open, so it must stay
    /// blocked while the view refuses the name.
    #[test]
    fn a_special_file_swapped_in_is_never_opened_for_io() {
        use std::os::unix::fs::OpenOptionsExt;
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"data").unwrap();
        let rv = reverse(t.path());
        let root = rv.root().unwrap();
        let e = rv.entry(&root, b"f").unwrap().unwrap();
        std::fs::remove_file(t.path().join("f")).unwrap();
        let fifo = t.path().join("f");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let (tx, rx) = std::sync::mpsc::channel();
        let writer_path = fifo.clone();
        let writer = std::thread::spawn(move || {
            let opened = std::fs::OpenOptions::new().write(true).open(&writer_path);
            tx.send(()).unwrap();
            opened
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        let err = rv.open_file(&root, &e).unwrap_err();
        assert!(matches!(&err, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT)), "{err}");
        let woken = rx.recv_timeout(std::time::Duration::from_millis(300)).is_ok();
        // Release the writer (a reader of our own) before asserting, so the thread ends.
        let _reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
        writer.join().unwrap().unwrap();
        assert!(!woken, "the view opened the FIFO for reading: its blocked writer was woken");
    }
}
