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
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            cipher: ContentCipher::Aes256Gcm,
            block_size: 4096,
            kdf: Argon2Params::DEFAULT,
            recovery_key: true,
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
        let cfg = VaultConfig::load(cipherdir)?;
        let master = cfg.unlock_with(secret, slot, &VaultConfig::path_in(cipherdir), ceiling)?;
        Ok(Vault::from_parts(cipherdir, cfg, master))
    }

    /// Builds a vault from a verified config and its master key.
    pub fn from_parts(cipherdir: &Path, config: VaultConfig, master: MasterKey) -> Vault {
        let keys: SubKeys = master.subkeys();
        let names = Arc::new(NameCipher::new(&keys, config.special_binding()));
        let unsettled = config.has_feature(crate::config::FEATURE_UNSETTLED_TAILS);
        let ordered = config.has_feature(crate::config::FEATURE_ORDERED_GROWTH);
        let mut ctx = ContentCtx::new(config.cipher, config.block_size, Arc::new(keys))
            .with_unsettled_tails(unsettled)
            .with_ordered_growth(ordered);
        // Every writer of a vault with the feature keeps stashes: the writer of
        // "ordered-growth" cannot grow a file without its record (docs/FORMAT.md §5.7).
        if unsettled {
            ctx = ctx.with_stashes(cipherdir);
        }
        let iv_copy = IvCopy::of(&config);
        Vault { root_path: cipherdir.to_path_buf(), config, ctx, names, master, iv_copy }
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

    /// Replaces the config (after a slot change) and writes it.
    pub fn save_config(&mut self, mut cfg: VaultConfig) -> Result<()> {
        cfg.seal(&self.master);
        cfg.save(&self.root_path)?;
        self.config = cfg;
        Ok(())
    }

    /// Opens the top directory and checks its IV copy against the config.
    pub fn root(&self) -> Result<CipherDir> {
        let dir = self.root_dir()?;
        self.check_diriv(&dir)?;
        Ok(dir)
    }

    /// Opens the top directory without checking its IV copy (fsck checks it itself).
    pub fn root_dir(&self) -> Result<CipherDir> {
        let fd = sys::open_dir_path(&self.root_path).ctx(|| format!("opening {}", self.root_path.display()))?;
        let iv = self.config.root_iv().expect("checked at load");
        Ok(CipherDir { fd, iv, path: self.root_path.clone() })
    }

    /// Checks that `dir`'s IV copy (F§7.1) names the IV its entry promises. A missing (or, in
    /// the old form, empty) copy is not an error and is not written here: the IV comes from
    /// the authenticated entry, and opening a directory is a read. In a synced folder the copy
    /// may simply not have arrived yet, and a reader that wrote it would race the sync tool
    /// delivering it (the tool then sees a file it did not write, and the folder a change
    /// nobody made). `mkdir` writes the copy before the directory gets its name, so no crash
    /// leaves one missing; `fsck --repair` restores it.
    pub fn check_diriv(&self, dir: &CipherDir) -> Result<()> {
        if !self.verify_diriv(dir)? {
            tracing::debug!("{}: no IV copy (yet); using the IV of its entry", dir.path.display());
        }
        Ok(())
    }

    /// Whether `dir`'s IV copy names the IV its entry promises (`Ok(false)`: missing, or an
    /// empty `veilfs.diriv`). A copy of another directory's IV, a damaged one and anything but
    /// a regular file there (a planted FIFO, directory or symlink) is an integrity error
    /// naming it. Never writes.
    pub fn verify_diriv(&self, dir: &CipherDir) -> Result<bool> {
        self.iv_copy.verify(dir.fd(), &dir.iv, &dir.path)
    }

    /// Writes `dir`'s missing IV copy from the IV its authenticated entry promises.
    pub fn restore_diriv(&self, dir: &CipherDir) -> Result<()> {
        let name = self.iv_copy.name(&dir.iv);
        tracing::warn!("{} is missing; restoring it from the directory's entry", dir.child_path(&name));
        if self.iv_copy == IvCopy::File {
            // An empty one (a crash between creating and writing it).
            let _ = sys::unlinkat(dir.fd(), name.as_bytes(), false);
        }
        self.iv_copy.write(dir.fd(), &dir.iv).ctx(|| format!("writing {}", dir.child_path(&name)))
    }

    /// Replaces a damaged or copied IV copy of `dir` (of a subdirectory: the top one's IV is
    /// in the config) with the IV its authenticated entry promises; a directory planted there
    /// is moved aside under a temporary name, never deleted.
    pub fn rewrite_diriv(&self, dir: &CipherDir) -> Result<()> {
        self.iv_copy.rewrite(dir.fd(), &dir.iv, &dir.path)
    }

    /// The vault's `lost+found` directory (made on first use).
    pub fn lost_found(&self) -> Result<CipherDir> {
        let root = self.root()?;
        match self.lookup(&root, crate::names::LOST_FOUND)? {
            Some(e) => self.open_dir(&root, &e),
            None => Ok(self.mkdir_unchecked(&root, crate::names::LOST_FOUND, 0o700)?.1),
        }
    }

    /// Reads the long-name side file `side` of `dir`. Missing, oversized or not a regular
    /// file: an integrity error naming it (the entry that needs it cannot be decoded).
    pub fn read_side_file(dir: &CipherDir, side: &str) -> Result<Vec<u8>> {
        match sys::read_meta_at(dir.fd(), side.as_bytes(), SIDE_FILE_MAX) {
            Ok(b) => Ok(b),
            Err(e) if e.is_not_found() => {
                Err(Error::auth(dir.child_path(side), "is missing (the long name of an entry cannot be read)"))
            }
            Err(MetaError::Io(e)) => Err(Error::io(dir.child_path(side), e)),
            Err(e) => Err(Error::auth(dir.child_path(side), e.to_string())),
        }
    }

    /// Decodes one raw on-disk entry of `dir` (`st` = its backing stat).
    pub fn decode_entry(&self, dir: &CipherDir, on_disk: &[u8], st: Stat) -> Result<Option<Entry>> {
        let parsed = ParsedEntry::parse(on_disk);
        let what = || dir.child_path(&String::from_utf8_lossy(on_disk));
        match parsed {
            // A conflict copy is decoded with the directory's other copies
            // ([`list_conflicts`](Self::list_conflicts)), which give it its shown name.
            ParsedEntry::Internal | ParsedEntry::SyncTool(_) | ParsedEntry::Conflict(_) => return Ok(None),
            ParsedEntry::Foreign => return Err(Error::auth(what(), "is not a veilfs entry name")),
            _ => {}
        }
        let d = self.names.entry_d(&parsed, |side| Self::read_side_file(dir, side)).map_err(|e| relabel(e, &what()))?;
        let name = self.names.decrypt_name(&dir.iv, &d).map_err(|e| relabel(e, &what()))?;
        let (kind, identity) = self
            .verified_identity(&dir.iv, &d, parsed.binding().expect("user entry"), &st)
            .map_err(|e| relabel(e, &what()))?;
        let key = NameCipher::key_for_d(d);
        Ok(Some(Entry { name, on_disk: String::from_utf8_lossy(on_disk).into_owned(), key, kind, identity, stat: st }))
    }

    /// The user entries of `dir` by lookup key, without decrypting anything: (key, on-disk
    /// name, `d_type`) for each, in listing order. Names that are not veilfs entries (a sync
    /// tool's conflict copy) are left out with a warning naming them; a sync tool's own files
    /// ([`crate::foreign`]) silently. For callers that keep their own index (the mount).
    pub fn keyed_entries(dir: &CipherDir) -> Result<Vec<(String, String, u8)>> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        Ok(Self::keyed_from(dir, raw))
    }

    /// [`keyed_entries`](Self::keyed_entries) of an already read listing `raw` of `dir`.
    pub fn keyed_from(dir: &CipherDir, raw: Vec<sys::RawDirEntry>) -> Vec<(String, String, u8)> {
        let mut out = Vec::with_capacity(raw.len());
        for r in raw {
            let parsed = ParsedEntry::parse(&r.name);
            let Some(key) = parsed.key() else {
                if matches!(parsed, ParsedEntry::Foreign) {
                    tracing::warn!(
                        "{}: ignoring {:?}, which is not a veilfs entry (a sync conflict copy?)",
                        dir.path.display(),
                        String::from_utf8_lossy(&r.name)
                    );
                }
                continue;
            };
            let key = key.to_string();
            // Entry names parse only as UTF-8, so this moves the bytes without a copy.
            let on_disk =
                String::from_utf8(r.name).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            out.push((key, on_disk, r.d_type));
        }
        out
    }

    /// Opens the subdirectory `on_disk` of `parent` whose entry promises IV `iv`, checking its
    /// IV copy (see [`check_diriv`](Self::check_diriv)).
    pub fn open_subdir(&self, parent: &CipherDir, on_disk: &str, iv: DirIv) -> Result<CipherDir> {
        owner_access(parent, on_disk, || {
            let fd = sys::open_dir_at(parent.fd(), on_disk.as_bytes()).ctx(|| parent.child_path(on_disk))?;
            let dir = CipherDir { fd, iv, path: parent.path.join(on_disk) };
            self.check_diriv(&dir)?;
            Ok(dir)
        })
    }

    /// Lists `dir`: its decrypted entries, and the on-disk entries that failed to decrypt
    /// (logged; never shown as garbage names). Conflict copies that verify are entries under
    /// their shown names ([`crate::conflict`]).
    pub fn list(&self, dir: &CipherDir) -> Result<(Vec<Entry>, Vec<BadEntry>)> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        let (mut good, mut bad): (Vec<Entry>, Vec<BadEntry>) = (Vec::new(), Vec::new());
        let mut seen: HashMap<String, usize> = HashMap::new();
        for r in &raw {
            if matches!(ParsedEntry::parse(&r.name), ParsedEntry::Internal | ParsedEntry::SyncTool(_)) {
                continue;
            }
            let st = match Self::stat_entry(dir, &r.name) {
                Ok(st) => st,
                Err(error) => {
                    bad.push(BadEntry { on_disk: r.name.clone(), error });
                    continue;
                }
            };
            match self.decode_entry(dir, &r.name, st) {
                Ok(Some(e)) => match seen.get(&e.key.key) {
                    // Two entries for one name: made on two machines of a synced vault, or
                    // left by a crash in the middle of a rename over an existing name. The
                    // newer one (ctime) is the entry; the other is shown as a conflict copy.
                    Some(&i) => {
                        if ctime(&e.stat) > ctime(&good[i].stat) {
                            good[i] = e;
                        }
                    }
                    None => {
                        seen.insert(e.key.key.clone(), good.len());
                        good.push(e);
                    }
                },
                Ok(None) => {}
                Err(error) => {
                    tracing::error!("{error}");
                    bad.push(BadEntry { on_disk: r.name.clone(), error });
                }
            }
        }
        let (copies, bad_copies) = self.conflicts_in(dir, raw.iter().map(|r| r.name.as_slice()));
        good.extend(copies.into_iter().map(|c| c.entry));
        bad.extend(bad_copies);
        Ok((good, bad))
    }

    /// Finds the entry for plaintext `name` in `dir` (lists the directory). `D` is computed
    /// from the name, so a long name's side file is not needed (only listings read it), and
    /// the entry's binding is verified against that `D`: a forged entry cannot hide the real
    /// one, and among entries that verify, the newer (ctime) wins.
    pub fn lookup(&self, dir: &CipherDir, name: &[u8]) -> Result<Option<Entry>> {
        let key = self.names.name_key(&dir.iv, name)?;
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        let mut found: Option<Entry> = None;
        let mut forged: Option<Error> = None;
        for r in &raw {
            let parsed = ParsedEntry::parse(&r.name);
            if parsed.key() != Some(key.key.as_str()) {
                continue;
            }
            let on_disk = String::from_utf8_lossy(&r.name).into_owned();
            let st = Self::stat_entry(dir, &r.name)?;
            let binding = parsed.binding().expect("user entry");
            let (kind, identity) = match self.verified_identity(&dir.iv, &key.d, binding, &st) {
                Ok(found) => found,
                Err(e) => {
                    forged = Some(relabel(e, &dir.child_path(&on_disk)));
                    continue;
                }
            };
            if found.as_ref().is_none_or(|f| ctime(&st) > ctime(&f.stat)) {
                found = Some(Entry { name: name.to_vec(), on_disk, key: key.clone(), kind, identity, stat: st });
            }
        }
        match (found, forged) {
            (Some(e), _) => Ok(Some(e)),
            (None, Some(e)) => Err(e),
            // Perhaps the name a conflict copy is shown under.
            (None, None) => self.lookup_conflict(dir, name, raw.iter().map(|r| r.name.as_slice())),
        }
    }

    /// Opens the subdirectory named by `entry` in `parent`, verifying its IV.
    pub fn open_dir(&self, parent: &CipherDir, entry: &Entry) -> Result<CipherDir> {
        if entry.kind != EntryKind::Dir {
            return Err(Error::io(parent.child_path(&entry.on_disk), std::io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        self.open_subdir(parent, &entry.on_disk, entry.identity)
    }

    /// Opens the regular file named by `entry` with `flags` (`O_RDONLY`, `O_RDWR`, ...).
    pub fn open_file(&self, parent: &CipherDir, entry: &Entry, flags: libc::c_int) -> Result<CryptFile> {
        let what = parent.child_path(&entry.on_disk);
        if entry.kind != EntryKind::File {
            return Err(Error::io(what, std::io::Error::from_raw_os_error(libc::EISDIR)));
        }
        // Writes need to read too (read-modify-write of partial blocks).
        let flags =
            if flags & libc::O_ACCMODE == libc::O_WRONLY { (flags & !libc::O_ACCMODE) | libc::O_RDWR } else { flags };
        let flags = flags & !(libc::O_APPEND | libc::O_TRUNC | libc::O_CREAT);
        let fd = Self::open_content(parent, &entry.on_disk, flags, entry.stat.st_ino)?;
        CryptFile::open(sys::into_file(fd), self.ctx.clone(), entry.identity, what)
    }

    /// Opens the content of the regular file `on_disk` in `dir` with `flags`: never through a
    /// symlink, never blocking on a planted FIFO, and only if it is a regular file and (when
    /// `ino` is given) still the inode that was looked up. Anything else is an integrity error
    /// naming the ciphertext file: something was put where the entry's file belongs.
    ///
    /// A mode that denies the owner (a file of mode 0444 opened for writing by a writer that
    /// opened it before the chmod, 0200 opened for reading: the mount opens every file for
    /// reading and writing, since writes read partial blocks), or a directory that denies its
    /// owner search, is no reason to fail: the owner's rights are granted on both for the
    /// moment of the open (`owner_access`, docs/SECURITY.md §7a). The plaintext modes are the
    /// backing modes, and the kernel checked them before it asked.
    pub fn open_content(dir: &CipherDir, on_disk: &str, flags: libc::c_int, ino: u64) -> Result<OwnedFd> {
        owner_access(dir, on_disk, || Self::open_content_once(dir, on_disk, flags, ino))
    }

    /// One attempt of [`open_content`](Self::open_content), without granting anything.
    fn open_content_once(dir: &CipherDir, on_disk: &str, flags: libc::c_int, ino: u64) -> Result<OwnedFd> {
        match sys::open_regular_at(dir.fd(), on_disk.as_bytes(), flags) {
            Ok((fd, st)) if ino == 0 || st.st_ino == ino => Ok(fd),
            Ok(_) => Err(Error::auth(dir.child_path(on_disk), "was replaced by another file while in use")),
            Err(Ok(mode)) => Err(Error::auth(
                dir.child_path(on_disk),
                format!("is {} where its entry names a regular file", sys::type_name(mode)),
            )),
            Err(Err(e)) => Err(Error::io(dir.child_path(on_disk), e)),
        }
    }

    /// The backing `stat` of the object `on_disk` in `dir` (never following a link), also in a
    /// directory whose mode denies its owner search: the kernel reaches such an object through
    /// another hard link or an open fd, where the daemon has only names (see `in_dir`).
    pub fn stat_entry(dir: &CipherDir, on_disk: &[u8]) -> Result<Stat> {
        in_dir(dir, || sys::fstatat(dir.fd(), on_disk).ctx(|| dir.child_path(&String::from_utf8_lossy(on_disk))))
    }

    /// A verified `O_PATH` handle on the object of `entry` in `dir`: of the entry's kind and
    /// the inode the entry was listed with. Attribute changes act on this handle, so a link
    /// planted under the entry's name is never followed (docs/SECURITY.md §8).
    pub fn entry_handle(dir: &CipherDir, on_disk: &str, kind: EntryKind, ino: u64) -> Result<(OwnedFd, Stat)> {
        let what = || dir.child_path(on_disk);
        let (fd, st) = in_dir(dir, || sys::open_path_at(dir.fd(), on_disk.as_bytes()).ctx(what))?;
        if EntryKind::from_mode(st.st_mode) != kind {
            return Err(Error::auth(
                what(),
                format!("is {} where its entry names another kind", sys::type_name(st.st_mode)),
            ));
        }
        if ino != 0 && st.st_ino != ino {
            return Err(Error::auth(what(), "was replaced by another object while in use"));
        }
        Ok((fd, st))
    }

    /// Sets mode (not for symlinks), owner (`u32::MAX` keeps one) and times of `entry` in
    /// `dir` through a verified handle (see [`entry_handle`](Self::entry_handle)).
    pub fn set_attrs(
        &self,
        dir: &CipherDir,
        entry: &Entry,
        mode: Option<u32>,
        owner: Option<(u32, u32)>,
        times: Option<&[libc::timespec; 2]>,
    ) -> Result<()> {
        let what = || dir.child_path(&entry.on_disk);
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        if let Some((uid, gid)) = owner {
            sys::chown_fd(fd.as_fd(), uid, gid).ctx(what)?;
        }
        if let Some(m) = mode.filter(|_| entry.kind != EntryKind::Symlink) {
            sys::chmod_fd(fd.as_fd(), m & 0o7777).ctx(what)?;
        }
        if let Some(t) = times {
            sys::utimens_fd(fd.as_fd(), t).ctx(what)?;
        }
        Ok(())
    }

    /// The attribute cipher of this vault (with continuations if it has feature `overflow`).
    pub fn xattr_cipher(&self) -> crate::xattr::XattrCipher {
        crate::xattr::XattrCipher::new(&self.ctx.keys, self.ctx.cipher).with_overflow(self.config.has_overflow())
    }

    /// The plaintext `user.*` attributes of `entry` (none for a symlink), read through a
    /// verified handle. An attribute that fails authentication is an integrity error.
    pub fn xattrs(&self, dir: &CipherDir, entry: &Entry) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if entry.kind == EntryKind::Symlink {
            return Ok(Vec::new());
        }
        let what = || dir.child_path(&entry.on_disk);
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        let t = sys::XattrTarget::Handle(fd.as_fd());
        self.xattr_cipher().all(t, &entry.identity).map_err(|e| relabel_io(relabel(e, &what()), &what()))
    }

    /// Sets the plaintext `user.*` attribute `name` of `entry` (not a symlink) through a
    /// verified handle.
    pub fn set_xattr(&self, dir: &CipherDir, entry: &Entry, name: &[u8], value: &[u8]) -> Result<()> {
        let what = || dir.child_path(&entry.on_disk);
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        let t = sys::XattrTarget::Handle(fd.as_fd());
        self.xattr_cipher().set(t, &entry.identity, name, value, 0).map_err(|e| relabel_io(e, &what()))
    }

    /// Attribute continuations of `entry` that no value uses (crash leftovers, F§16.1).
    pub fn xattr_leftovers(&self, dir: &CipherDir, entry: &Entry) -> Result<Vec<String>> {
        if entry.kind == EntryKind::Symlink || !self.config.has_overflow() {
            return Ok(Vec::new());
        }
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        self.xattr_cipher()
            .unused_continuations(sys::XattrTarget::Handle(fd.as_fd()))
            .map_err(|e| relabel_io(e, &dir.child_path(&entry.on_disk)))
    }

    /// Removes the unused attribute continuation `name` of `entry` (see
    /// [`xattr_leftovers`](Self::xattr_leftovers)).
    pub fn remove_xattr_leftover(&self, dir: &CipherDir, entry: &Entry, name: &str) -> Result<()> {
        let what = || dir.child_path(&entry.on_disk);
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        sys::XattrTarget::Handle(fd.as_fd()).remove(name.as_bytes()).ctx(what)
    }

    /// Computes the on-disk name of a new entry `name` of `kind` with `identity` in `dir`,
    /// writing the long-name side file if needed.
    pub fn new_entry_name(
        &self,
        dir: &CipherDir,
        name: &[u8],
        kind: EntryKind,
        identity: &Identity,
    ) -> Result<(NameKey, String)> {
        let key = self.names.name_key(&dir.iv, name)?;
        let on_disk = self.entry_name_for(dir, &key, kind, identity)?;
        Ok((key, on_disk))
    }

    /// The on-disk name for an already computed `key`, writing its side file if it is long.
    pub fn entry_name_for(
        &self,
        dir: &CipherDir,
        key: &NameKey,
        kind: EntryKind,
        identity: &Identity,
    ) -> Result<String> {
        let s = self.names.bind(&dir.iv, &key.d, kind, identity);
        if let (Some(side), Some(contents)) = (&key.side_file, key.side_file_contents()) {
            match sys::write_new_file(dir.fd(), side.as_bytes(), contents.as_bytes(), 0o400) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io(dir.child_path(side), e)),
            }
            crash::point!("vault.side_file");
        }
        Ok(key.entry_name(&s))
    }

    /// Removes the on-disk entry `on_disk` of `dir`. A directory must hold nothing but its IV
    /// file; it is moved aside before its IV copy goes, so a crash never leaves a live
    /// directory without one. A symlink's target side file goes after it, once no other
    /// symlink of `dir` uses it. Does not touch long-name side files.
    pub fn remove_entry(&self, dir: &CipherDir, on_disk: &str, kind: EntryKind, identity: &Identity) -> Result<()> {
        // The path is only formatted for an error: removing is on the hot path of rm -rf.
        let what = || dir.child_path(on_disk);
        if kind == EntryKind::Symlink {
            let side = self.target_side(dir, on_disk);
            sys::unlinkat(dir.fd(), on_disk.as_bytes(), false).ctx(what)?;
            if let Some(side) = side {
                self.drop_target_side(dir, &side);
            }
            return Ok(());
        }
        if kind != EntryKind::Dir {
            return sys::unlinkat(dir.fd(), on_disk.as_bytes(), false).ctx(what);
        }
        owner_access(dir, on_disk, || self.remove_dir_entry(dir, on_disk, identity))
    }

    /// [`remove_entry`](Self::remove_entry) of a directory.
    fn remove_dir_entry(&self, dir: &CipherDir, on_disk: &str, identity: &Identity) -> Result<()> {
        let what = || dir.child_path(on_disk);
        let sub = self.empty_dir(dir, on_disk, identity)?;
        let tmp = crate::names::temp_name();
        sys::rename_noreplace(dir.fd(), on_disk.as_bytes(), dir.fd(), tmp.as_bytes()).ctx(what)?;
        crash::point!("vault.remove_temp");
        // The IV copy goes with the daemon's own rights: the caller's right to remove the
        // directory covers it, but a directory without write permission would refuse it.
        if let Err(e) = sys::privileged(|| self.iv_copy.remove(sub.as_fd(), identity)) {
            // A directory whose mode denies its owner write access (see `owner_access`).
            if e.raw_os_error() == Some(libc::EACCES) {
                let _ = sys::rename_noreplace(dir.fd(), tmp.as_bytes(), dir.fd(), on_disk.as_bytes());
                return Err(Error::io(what(), e));
            }
        }
        if let Err(e) = sys::unlinkat(dir.fd(), tmp.as_bytes(), true) {
            // Something appeared inside meanwhile: put it back as it was.
            let _ = sys::privileged(|| self.iv_copy.write(sub.as_fd(), identity));
            let _ = sys::rename_noreplace(dir.fd(), tmp.as_bytes(), dir.fd(), on_disk.as_bytes());
            return Err(Error::io(what(), e));
        }
        Ok(())
    }

    /// Removes the long-name side file of `key` if no entry uses it any more (lists `dir`).
    pub fn drop_side_file(&self, dir: &CipherDir, key: &NameKey) {
        if key.side_file.is_some() {
            let still_used = sys::read_dir_fd(dir.fd())
                .map(|raw| {
                    // A conflict copy of a long name reads its original's side file too.
                    raw.iter().any(|r| match ParsedEntry::parse(&r.name) {
                        ParsedEntry::Conflict(c) => c.entry().key() == Some(key.key.as_str()),
                        p => p.key() == Some(key.key.as_str()),
                    })
                })
                .unwrap_or(true);
            if !still_used {
                Self::unlink_side_file(dir, key);
            }
        }
    }

    /// Removes the long-name side file of `key`, if it has one, for a caller that knows no
    /// other entry uses it (the mount, from its index). Best effort: an orphaned side file is
    /// harmless and `fsck --repair` removes it.
    pub fn unlink_side_file(dir: &CipherDir, key: &NameKey) {
        if let Some(side) = &key.side_file {
            crash::point!("vault.remove_side");
            let _ = sys::unlinkat(dir.fd(), side.as_bytes(), false);
        }
    }

    /// The [`Entry`] of an object just made as `on_disk` in `dir` (one `fstatat`).
    pub(crate) fn entry_after_create(
        &self,
        dir: &CipherDir,
        name: &[u8],
        key: NameKey,
        on_disk: String,
        kind: EntryKind,
        identity: Identity,
    ) -> Result<Entry> {
        let stat = sys::fstatat(dir.fd(), on_disk.as_bytes()).ctx(|| dir.child_path(&on_disk))?;
        Ok(Entry { name: name.to_vec(), on_disk, key, kind, identity, stat })
    }

    /// Creates an empty regular file `name` (fails if the name exists) and opens it.
    pub fn create_file(&self, dir: &CipherDir, name: &[u8], mode: u32) -> Result<(Entry, CryptFile)> {
        let key = self.absent_key(dir, name)?;
        let (on_disk, id, file) = self.create_file_at(dir, &key, mode)?;
        Ok((self.entry_after_create(dir, name, key, on_disk, EntryKind::File, id)?, file))
    }

    /// Creates an empty regular file under `key` in `dir` (the caller knows the name is free:
    /// the mount holds the directory's lock and index) and opens it. Returns its on-disk name,
    /// identity and open file.
    pub fn create_file_at(&self, dir: &CipherDir, key: &NameKey, mode: u32) -> Result<(String, Identity, CryptFile)> {
        let id: Identity = crate::random::bytes();
        let on_disk = self.entry_name_for(dir, key, EntryKind::File, &id)?;
        let what = dir.child_path(&on_disk);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let fd = sys::openat(dir.fd(), on_disk.as_bytes(), flags, mode & 0o7777).ctx(|| what.clone())?;
        crash::point!("vault.create");
        let file = CryptFile::open(sys::into_file(fd), self.ctx.clone(), id, what)?;
        Ok((on_disk, id, file))
    }

    /// Starts a regular file that becomes entry `name` of `dir` only once complete: it is
    /// written under an internal name (`veilfs.part.<random>`, F§7.2), which no listing
    /// shows, and [`commit_partial`](Self::commit_partial) renames it into place. So an
    /// interrupted writer (`veilfs import`) never leaves a cut-off file under its final name,
    /// where it would look complete. The returned entry names the partial file but has `name`'s
    /// key, so its attributes can be set ([`set_attrs`](Self::set_attrs),
    /// [`set_xattr`](Self::set_xattr)) before it appears.
    pub fn create_partial(&self, dir: &CipherDir, name: &[u8], mode: u32) -> Result<PartialFile> {
        let key = self.names.name_key(&dir.iv, name)?;
        let id: Identity = crate::random::bytes();
        let on_disk = crate::names::part_name();
        let what = dir.child_path(&on_disk);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let fd = sys::openat(dir.fd(), on_disk.as_bytes(), flags, mode & 0o7777).ctx(|| what.clone())?;
        let stat = sys::fstat(fd.as_fd()).ctx(|| what.clone())?;
        let file = CryptFile::open(sys::into_file(fd), self.ctx.clone(), id, what)?;
        let entry = Entry { name: name.to_vec(), on_disk, key, kind: EntryKind::File, identity: id, stat };
        Ok(PartialFile { entry, file })
    }

    /// Puts a complete partial file in place under its name, replacing `replaced` (the
    /// existing entry of that name, found by the caller) if given; fails with EEXIST if
    /// another entry has taken the name meanwhile. See [`rename_at`](Self::rename_at).
    pub fn commit_partial(&self, dir: &CipherDir, p: PartialFile, replaced: Option<&Entry>) -> Result<Entry> {
        let PartialFile { entry, file } = p;
        drop(file);
        let on_disk = self.rename_at(dir, &entry, dir, &entry.key, replaced)?;
        let stat = sys::fstatat(dir.fd(), on_disk.as_bytes()).ctx(|| dir.child_path(&on_disk))?;
        Ok(Entry { on_disk, stat, ..entry })
    }

    /// Removes a partial file that will not be completed.
    pub fn discard_partial(&self, dir: &CipherDir, p: PartialFile) -> Result<()> {
        drop(p.file);
        sys::unlinkat(dir.fd(), p.entry.on_disk.as_bytes(), false).ctx(|| dir.child_path(&p.entry.on_disk))
    }

    /// Removes the partial files an interrupted writer left in `dir` (only under the vault
    /// lock, where no other writer can be making one); returns how many.
    pub fn remove_partials(&self, dir: &CipherDir) -> Result<usize> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        let mut n = 0;
        for r in raw.iter().filter(|r| r.name.starts_with(crate::names::PART_PREFIX.as_bytes())) {
            let what = || dir.child_path(&String::from_utf8_lossy(&r.name));
            let st = sys::fstatat(dir.fd(), &r.name).ctx(what)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                sys::unlinkat(dir.fd(), &r.name, false).ctx(what)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// The key of `name` in `dir`, or EEXIST if an entry has that name (lists the directory).
    pub(crate) fn absent_key(&self, dir: &CipherDir, name: &[u8]) -> Result<NameKey> {
        if self.lookup(dir, name)?.is_some() {
            return Err(Error::io(
                format!("{}/{}", dir.path.display(), String::from_utf8_lossy(name)),
                std::io::Error::from_raw_os_error(libc::EEXIST),
            ));
        }
        self.names.name_key(&dir.iv, name)
    }

    /// Opens the directory `on_disk` of `dir`, whose entry promises IV `iv`, and checks it
    /// holds nothing but its IV copy (ENOTEMPTY otherwise): before it is removed or replaced.
    pub fn empty_dir(&self, dir: &CipherDir, on_disk: &str, iv: &DirIv) -> Result<OwnedFd> {
        let what = || dir.child_path(on_disk);
        let sub = sys::open_dir_at(dir.fd(), on_disk.as_bytes()).ctx(what)?;
        let raw = sys::read_dir_fd(sub.as_fd()).ctx(what)?;
        let copy = self.iv_copy.name(iv);
        if raw.iter().any(|r| r.name != b"." && r.name != b".." && r.name != copy.as_bytes()) {
            return Err(Error::io(what(), std::io::Error::from_raw_os_error(libc::ENOTEMPTY)));
        }
        Ok(sub)
    }

    /// The kind and identity the entry `on_disk` of `dir` (with `D` = `d`, backing `st`)
    /// promises: its binding, verified against the backing object (see
    /// [`verified_identity`](Self::verified_identity)). An integrity error names the entry.
    pub fn unbind_entry(&self, dir: &CipherDir, d: &[u8], on_disk: &str, st: &Stat) -> Result<(EntryKind, Identity)> {
        let what = || dir.child_path(on_disk);
        let parsed = ParsedEntry::parse(on_disk.as_bytes());
        // A conflict copy promises what its original entry promised (`d`: that name's `D`).
        let binding = match &parsed {
            ParsedEntry::Conflict(c) => c.binding(),
            p => p.binding(),
        };
        let binding = binding.ok_or_else(|| Error::auth(what(), "is not a veilfs entry name"))?;
        self.verified_identity(&dir.iv, d, binding, st).map_err(|e| relabel(e, &what()))
    }

    /// The one check of an entry's binding against its backing object, for every front end
    /// (listing, lookup, the mount, fsck): the kind comes from the backing `st_mode`, the
    /// binding `s_b64` must open for it, and a device must still have the device number its
    /// identity carries (vaults with `special-kinds`, docs/FORMAT.md §9).
    pub fn verified_identity(&self, iv: &DirIv, d: &[u8], s_b64: &str, st: &Stat) -> Result<(EntryKind, Identity)> {
        let kind = EntryKind::from_mode(st.st_mode);
        let identity = self.names.unbind(iv, d, kind, s_b64)?;
        self.names.check_device(kind, &identity, st.st_rdev)?;
        Ok((kind, identity))
    }

    /// Checks that the backing object `st`, met again by a handle that holds `kind` and
    /// `identity` from an earlier verification, is still of that kind and, for a device, that
    /// number. `what` names it in the integrity error.
    pub fn check_object(&self, kind: EntryKind, identity: &Identity, st: &Stat, what: &str) -> Result<()> {
        if EntryKind::from_mode(st.st_mode) != kind {
            return Err(Error::auth(
                what,
                format!("is {} where its entry names another kind", sys::type_name(st.st_mode)),
            ));
        }
        self.names.check_device(kind, identity, st.st_rdev).map_err(|e| relabel(e, what))
    }

    /// `D` of the entry `on_disk` of `dir`, read from its name or, for a long name, its side
    /// file (checked against the name's hash and for canonical form). For listings.
    pub fn entry_d(&self, dir: &CipherDir, on_disk: &str) -> Result<Vec<u8>> {
        let parsed = ParsedEntry::parse(on_disk.as_bytes());
        // A conflict copy's `D` is its original name's.
        let parsed = match &parsed {
            ParsedEntry::Conflict(c) => c.entry(),
            p => p.clone(),
        };
        self.names
            .entry_d(&parsed, |side| Self::read_side_file(dir, side))
            .map_err(|e| relabel(e, &dir.child_path(on_disk)))
    }

    /// Creates directory `name` with its IV copy, atomically: it appears under its final
    /// name only once its IV copy exists.
    pub fn mkdir(&self, dir: &CipherDir, name: &[u8], mode: u32) -> Result<(Entry, CipherDir)> {
        let key = self.absent_key(dir, name)?;
        let (on_disk, sub) = self.mkdir_at(dir, &key, mode)?;
        Ok((self.entry_after_create(dir, name, key, on_disk, EntryKind::Dir, sub.iv)?, sub))
    }

    /// [`mkdir`](Self::mkdir) without the existence check (the caller knows the name is free).
    pub fn mkdir_unchecked(&self, dir: &CipherDir, name: &[u8], mode: u32) -> Result<(Entry, CipherDir)> {
        let key = self.names.name_key(&dir.iv, name)?;
        let (on_disk, sub) = self.mkdir_at(dir, &key, mode)?;
        Ok((self.entry_after_create(dir, name, key, on_disk, EntryKind::Dir, sub.iv)?, sub))
    }

    /// Creates a directory under `key` in `dir` (the caller knows the name is free), made
    /// under a temporary name and renamed into place once its IV copy is written.
    pub fn mkdir_at(&self, dir: &CipherDir, key: &NameKey, mode: u32) -> Result<(String, CipherDir)> {
        let iv: DirIv = crate::random::bytes();
        let on_disk = self.entry_name_for(dir, key, EntryKind::Dir, &iv)?;
        let tmp = crate::names::temp_name();
        // Made with its final mode when that lets its owner write the IV copy into it (the
        // usual case; a set-group-id parent's group and bit are inherited as usual); else
        // made private and given its mode through its own fd once the IV copy is in.
        let mode = mode & 0o7777;
        let direct = mode & 0o700 == 0o700;
        sys::mkdirat(dir.fd(), tmp.as_bytes(), if direct { mode } else { 0o700 }).ctx(|| dir.child_path(&tmp))?;
        crash::point!("vault.mkdir_temp");
        let result = (|| {
            let fd = sys::open_dir_at(dir.fd(), tmp.as_bytes()).ctx(|| dir.child_path(&tmp))?;
            self.iv_copy.write(fd.as_fd(), &iv).ctx(|| dir.child_path(&tmp))?;
            crash::point!("vault.mkdir_diriv");
            if !direct {
                sys::chmod_fd(fd.as_fd(), mode).ctx(|| dir.child_path(&tmp))?;
            }
            sys::rename_noreplace(dir.fd(), tmp.as_bytes(), dir.fd(), on_disk.as_bytes())
                .ctx(|| dir.child_path(&on_disk))?;
            Ok(fd)
        })();
        match result {
            Ok(fd) => {
                let path = dir.path.join(&on_disk);
                Ok((on_disk, CipherDir { fd, iv, path }))
            }
            Err(e) => {
                let _ = sys::unlinkat(dir.fd(), format!("{tmp}/{}", self.iv_copy.name(&iv)).as_bytes(), false);
                let _ = sys::unlinkat(dir.fd(), tmp.as_bytes(), true);
                Err(e)
            }
        }
    }

    /// Creates a FIFO, socket or device node.
    pub fn mknod(&self, dir: &CipherDir, name: &[u8], mode: u32, rdev: libc::dev_t) -> Result<Entry> {
        let key = self.absent_key(dir, name)?;
        let (on_disk, id) = self.mknod_at(dir, &key, mode, rdev)?;
        self.entry_after_create(dir, name, key, on_disk, EntryKind::from_mode(mode), id)
    }

    /// Creates a FIFO, socket or device node under `key` in `dir` (the caller knows the name
    /// is free). A device's identity carries `rdev` ([`NameCipher::new_identity`]); a number
    /// that mknod(2) would cut to 32 bits is refused (EINVAL), as the node would not be the
    /// device asked for.
    pub fn mknod_at(&self, dir: &CipherDir, key: &NameKey, mode: u32, rdev: libc::dev_t) -> Result<(String, Identity)> {
        let kind = EntryKind::from_mode(mode);
        if !kind.is_special() || (kind.is_device() && u32::try_from(rdev).is_err()) {
            return Err(Error::io(dir.child_path(&key.key), std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let id = self.names.new_identity(kind, rdev);
        let on_disk = self.entry_name_for(dir, key, kind, &id)?;
        sys::mknodat(dir.fd(), on_disk.as_bytes(), mode, rdev).ctx(|| dir.child_path(&on_disk))?;
        Ok((on_disk, id))
    }

    /// Removes `entry` (a directory must be empty but for its IV copy).
    pub fn remove(&self, dir: &CipherDir, entry: &Entry) -> Result<()> {
        self.remove_entry(dir, &entry.on_disk, entry.kind, &entry.identity)?;
        self.drop_side_file(dir, &entry.key);
        Ok(())
    }

    /// The on-disk name `entry` gets as `new_name` in `to` (same identity, new binding).
    pub fn rebind(&self, to: &CipherDir, new_name: &[u8], entry: &Entry) -> Result<(NameKey, String)> {
        self.new_entry_name(to, new_name, entry.kind, &entry.identity)
    }

    /// Renames `entry` of `from` to `new_name` in `to`, replacing `replaced` (the entry of
    /// `new_name`, found by the caller) if given. See [`rename_at`](Self::rename_at).
    pub fn rename(
        &self,
        from: &CipherDir,
        entry: &Entry,
        to: &CipherDir,
        new_name: &[u8],
        replaced: Option<&Entry>,
    ) -> Result<Entry> {
        let key = self.names.name_key(&to.iv, new_name)?;
        let on_disk = self.rename_at(from, entry, to, &key, replaced)?;
        let stat = sys::fstatat(to.fd(), on_disk.as_bytes()).ctx(|| to.child_path(&on_disk))?;
        Ok(Entry { name: new_name.to_vec(), on_disk, key, kind: entry.kind, identity: entry.identity, stat })
    }

    /// Renames `entry` of `from` to the name of `key` in `to`, replacing `replaced` (the entry
    /// of that name, found by the caller) if given; returns the new on-disk name. A directory
    /// replaces only an empty directory, a non-directory only a non-directory. The backing
    /// rename moves the object atomically under its new binding; the replaced entry is removed
    /// right after (a crash between leaves two entries for one name; the newer, verified one
    /// wins, F§10), and a long name's side file goes once no entry uses it. A symlink moving
    /// to another directory takes its target side file along (F§8.1).
    pub fn rename_at(
        &self,
        from: &CipherDir,
        entry: &Entry,
        to: &CipherDir,
        key: &NameKey,
        replaced: Option<&Entry>,
    ) -> Result<String> {
        if let Some(r) = replaced {
            let errno = |n| Err(Error::io(to.child_path(&r.on_disk), std::io::Error::from_raw_os_error(n)));
            match (entry.kind == EntryKind::Dir, r.kind == EntryKind::Dir) {
                (false, true) => return errno(libc::EISDIR),
                (true, false) => return errno(libc::ENOTDIR),
                (true, true) => drop(owner_access(to, &r.on_disk, || self.empty_dir(to, &r.on_disk, &r.identity))?),
                (false, false) => {}
            }
        }
        let on_disk = self.entry_name_for(to, key, entry.kind, &entry.identity)?;
        let side = self.carry_target_side(from, &entry.on_disk, entry.kind, to)?;
        if let Err(e) = sys::rename_noreplace(from.fd(), entry.on_disk.as_bytes(), to.fd(), on_disk.as_bytes()) {
            if let Some(side) = &side {
                self.drop_target_side(to, side);
            }
            return Err(Error::io(to.child_path(&on_disk), e));
        }
        crash::point!("vault.rename");
        if let Some(side) = &side {
            self.drop_target_side(from, side);
        }
        if let Some(r) = replaced {
            if let Err(e) = self.remove_entry(to, &r.on_disk, r.kind, &r.identity) {
                tracing::error!("rename: could not remove the replaced entry {}: {e}", to.child_path(&r.on_disk));
            }
        }
        if !(from.path == to.path && entry.key.key == key.key) {
            self.drop_side_file(from, &entry.key);
        }
        Ok(on_disk)
    }

    /// Exchanges entries `a` of `a_dir` and `b` of `b_dir` (RENAME_EXCHANGE): each object
    /// takes the other's name, under a new binding. Returns the new on-disk names of `a`'s
    /// object (now in `b_dir`) and `b`'s (now in `a_dir`). Three renames on disk: `b`'s object
    /// waits under a temporary name `veilfs.tmp.<r>` while `a`'s takes its name. An intent
    /// record `veilfs.xchg.<r>` next to it, written first and removed last, names the
    /// steps, so the crash sweep finishes an interrupted exchange
    /// ([`finish_exchange`](Self::finish_exchange)): a crash leaves the old pair or, once the
    /// first rename is done, the new one (F§10). The record carries a MAC binding it to its
    /// name and both directories' IVs ([`crate::record`]).
    pub fn exchange_at(&self, a_dir: &CipherDir, a: &Entry, b_dir: &CipherDir, b: &Entry) -> Result<(String, String)> {
        let a_new = self.entry_name_for(b_dir, &b.key, a.kind, &a.identity)?;
        let b_new = self.entry_name_for(a_dir, &a.key, b.kind, &b.identity)?;
        let tmp = crate::names::temp_name();
        let journal = format!("{}{}", crate::names::XCHG_PREFIX, &tmp[crate::names::TEMP_PREFIX.len()..]);
        let rel = a_dir.path.strip_prefix(&self.root_path).unwrap_or(Path::new("")).to_string_lossy().into_owned();
        let intent = ExchangeIntent {
            a_dir: rel,
            a: a.on_disk.clone(),
            a_new: a_new.clone(),
            b_new: b_new.clone(),
            mac: [0; crate::record::RECORD_MAC_LEN],
        }
        .sealed(&self.ctx.keys, &journal, &b_dir.iv, &a_dir.iv);
        write_record(b_dir, &journal, &intent)?;
        let mv = |fd: &CipherDir, old: &str, td: &CipherDir, new: &str| {
            sys::rename_noreplace(fd.fd(), old.as_bytes(), td.fd(), new.as_bytes()).ctx(|| fd.child_path(old))
        };
        let undo_intent = |e| {
            let _ = sys::unlinkat(b_dir.fd(), journal.as_bytes(), false);
            e
        };
        let a_side = self.carry_target_side(a_dir, &a.on_disk, a.kind, b_dir).map_err(undo_intent)?;
        let b_side = self.carry_target_side(b_dir, &b.on_disk, b.kind, a_dir).map_err(undo_intent)?;
        mv(b_dir, &b.on_disk, b_dir, &tmp).map_err(undo_intent)?;
        crash::point!("vault.exchange");
        mv(a_dir, &a.on_disk, b_dir, &a_new)?;
        mv(b_dir, &tmp, a_dir, &b_new)?;
        sys::unlinkat(b_dir.fd(), journal.as_bytes(), false).ctx(|| b_dir.child_path(&journal))?;
        for (dir, side) in [(a_dir, a_side), (b_dir, b_side)] {
            if let Some(side) = side {
                self.drop_target_side(dir, &side);
            }
        }
        Ok((a_new, b_new))
    }

    /// Reads and verifies the exchange record `journal` of the directory `dir` (ciphertext
    /// path `dir_path`, below the vault root `root`): its form, then its MAC for its name, the
    /// IV of `dir` and the IV of the directory it names. Returns the record and that
    /// directory (opened below `root` one name at a time, never following a link). A record
    /// that fails is an integrity error naming its ciphertext file: damage, never an
    /// instruction.
    pub fn verified_exchange(
        &self,
        root: BorrowedFd<'_>,
        dir: BorrowedFd<'_>,
        dir_path: &Path,
        journal: &str,
    ) -> Result<(ExchangeIntent, OwnedFd)> {
        let what = dir_path.join(journal).display().to_string();
        let r = read_record(dir, journal).map_err(|d| Error::auth(&what, d))?;
        let a_dir = sys::open_dir_below(root, &r.a_dir).map_err(|e| {
            Error::auth(&what, format!("names the directory {:?}, which cannot be opened ({e})", r.a_dir))
        })?;
        let (dir_ivs, a_ivs) = (self.record_ivs(root, dir), self.record_ivs(root, a_dir.as_fd()));
        let verifies = dir_ivs.iter().any(|d| a_ivs.iter().any(|a| r.verify(&self.ctx.keys, journal, d, a).is_ok()));
        if !verifies {
            return Err(Error::auth(what, RecordError::BadMac.to_string()));
        }
        Ok((r, a_dir))
    }

    /// The IVs a record lying in or naming the directory `dir` may have been written under:
    /// the top directory's from the config (authenticated), any other's from its IV copy
    /// (F§7.1; with `iv-in-name`, every IV name it holds). The copy is not authenticated by
    /// itself, but a wrong one only makes the MAC fail: a record verifies only under the IVs
    /// it was written for, and the MAC cannot be made without the vault key.
    fn record_ivs(&self, root: BorrowedFd<'_>, dir: BorrowedFd<'_>) -> Vec<DirIv> {
        let same = |a: BorrowedFd<'_>, b: BorrowedFd<'_>| match (sys::fstat(a), sys::fstat(b)) {
            (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
            _ => false,
        };
        if same(root, dir) {
            return vec![self.config.root_iv().expect("checked at load")];
        }
        self.iv_copy.carried(dir)
    }

    /// Finishes the exchange whose intent record `journal` lies in directory `dir` (ciphertext
    /// path `dir_path`, opened below the vault root `root`), after a crash: if its first
    /// rename was done, makes the other two; then removes the record. Returns whether renames
    /// were made. Each step is a no-op when already done, so a crash during this too is
    /// finished by the next sweep.
    ///
    /// Nothing is done unless the record verifies ([`verified_exchange`](Self::verified_exchange)).
    /// The steps run with the rights of the two directories' owner ([`sys::as_owner_of`]):
    /// a privileged sweep acts as that user, and refuses (an error naming the record, which
    /// is left for `fsck`) when the directories belong to different users.
    pub fn finish_exchange(
        &self,
        root: BorrowedFd<'_>,
        dir: BorrowedFd<'_>,
        dir_path: &Path,
        journal: &str,
    ) -> Result<bool> {
        let (intent, a_dir) = self.verified_exchange(root, dir, dir_path, journal)?;
        let r = &journal[crate::names::XCHG_PREFIX.len()..];
        let tmp = format!("{}{r}", crate::names::TEMP_PREFIX);
        let what = || dir_path.join(journal).display().to_string();
        let exists = |d: BorrowedFd<'_>, n: &str| sys::fstatat(d, n.as_bytes()).is_ok();
        sys::as_owner_of(&[dir, a_dir.as_fd()], || {
            let moved = exists(dir, &tmp);
            if moved {
                if exists(a_dir.as_fd(), &intent.a) && !exists(dir, &intent.a_new) {
                    sys::rename_noreplace(a_dir.as_fd(), intent.a.as_bytes(), dir, intent.a_new.as_bytes())?;
                }
                sys::rename_noreplace(dir, tmp.as_bytes(), a_dir.as_fd(), intent.b_new.as_bytes())?;
            }
            sys::unlinkat(dir, journal.as_bytes(), false)?;
            Ok(moved)
        })
        .ctx(what)
    }

    /// Creates a hard link named by `key` in `to` to the object `src_on_disk` of `from` (of
    /// `kind`, with `identity`); the caller knows the name is free. Returns the new on-disk
    /// name.
    pub fn link_at(
        &self,
        from: &CipherDir,
        src_on_disk: &str,
        kind: EntryKind,
        identity: &Identity,
        to: &CipherDir,
        key: &NameKey,
    ) -> Result<String> {
        let on_disk = self.entry_name_for(to, key, kind, identity)?;
        let side = self.carry_target_side(from, src_on_disk, kind, to)?;
        let link = || sys::linkat(from.fd(), src_on_disk.as_bytes(), to.fd(), on_disk.as_bytes());
        if let Err(e) = sys::in_dir_as_owner(from.fd(), sys::is_eacces, link) {
            if let Some(side) = &side {
                self.drop_target_side(to, side);
            }
            return Err(Error::io(to.child_path(&on_disk), e));
        }
        crash::point!("vault.link");
        Ok(on_disk)
    }

    /// Creates a hard link `new_name` in `to` to the file `entry` of `from`.
    pub fn link(&self, from: &CipherDir, entry: &Entry, to: &CipherDir, new_name: &[u8]) -> Result<Entry> {
        if entry.kind == EntryKind::Dir {
            return Err(Error::io(from.child_path(&entry.on_disk), std::io::Error::from_raw_os_error(libc::EPERM)));
        }
        let key = self.absent_key(to, new_name)?;
        let on_disk = self.link_at(from, &entry.on_disk, entry.kind, &entry.identity, to, &key)?;
        self.entry_after_create(to, new_name, key, on_disk, entry.kind, entry.identity)
    }

    /// Resolves a plaintext path relative to the vault root to its parent directory and
    /// entry (`None` entry = the root itself, or a missing last component).
    pub fn resolve(&self, path: &Path) -> Result<(CipherDir, Option<Entry>)> {
        let mut dir = self.root()?;
        let comps: Vec<&[u8]> = path_components(path)?;
        let Some((last, parents)) = comps.split_last() else {
            return Ok((dir, None));
        };
        for c in parents {
            let e = self.lookup(&dir, c)?.ok_or_else(|| not_found(path))?;
            dir = self.open_dir(&dir, &e)?;
        }
        let e = self.lookup(&dir, last)?;
        Ok((dir, e))
    }

    /// The ciphertext path (relative to the vault) of an existing plaintext path.
    pub fn encrypt_path(&self, path: &Path) -> Result<PathBuf> {
        let (dir, entry) = self.resolve(path)?;
        let rel = dir.path.strip_prefix(&self.root_path).unwrap_or(Path::new("")).to_path_buf();
        match entry {
            Some(e) => Ok(rel.join(e.on_disk)),
            None if path_components(path)?.is_empty() => Ok(rel),
            None => Err(not_found(path)),
        }
    }

    /// The plaintext path of a ciphertext path relative to the vault.
    pub fn decrypt_path(&self, cipher_path: &Path) -> Result<PathBuf> {
        let mut dir = self.root()?;
        let mut out = PathBuf::new();
        let comps = path_components(cipher_path)?;
        for (i, c) in comps.iter().enumerate() {
            let st = sys::fstatat(dir.fd(), c).ctx(|| dir.child_path(&String::from_utf8_lossy(c)))?;
            let e = self.decode_entry(&dir, c, st)?.ok_or_else(|| {
                Error::Invalid(format!("{} is a file of the vault itself", String::from_utf8_lossy(c)))
            })?;
            out.push(std::ffi::OsStr::from_bytes(&e.name));
            if i + 1 < comps.len() {
                dir = self.open_dir(&dir, &e)?;
            }
        }
        Ok(out)
    }
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

/// Writes an exchange's intent record `name` (F§10) into `dir`, new, not following links.
fn write_record(dir: &CipherDir, name: &str, r: &ExchangeIntent) -> Result<()> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    let fd = sys::openat(dir.fd(), name.as_bytes(), flags, 0o600).ctx(|| dir.child_path(name))?;
    sys::pwrite_all(fd.as_fd(), r.encode().as_bytes(), 0).ctx(|| dir.child_path(name))
}

/// Reads the record `name` of `dir`: a regular file (never a link, FIFO or device) of at most
/// [`MAX_RECORD_LEN`](crate::record::MAX_RECORD_LEN) bytes, parsed (not yet verified).
fn read_record(dir: BorrowedFd<'_>, name: &str) -> std::result::Result<ExchangeIntent, String> {
    let (fd, st) = sys::open_regular_at(dir, name.as_bytes(), libc::O_RDONLY).map_err(|e| match e.err() {
        Some(e) => format!("cannot be read: {e}"),
        None => "is not a regular file".to_string(),
    })?;
    if st.st_size as usize > crate::record::MAX_RECORD_LEN {
        return Err(RecordError::Malformed("too long".into()).to_string());
    }
    let mut buf = vec![0u8; st.st_size as usize];
    let n = sys::pread_full(fd.as_fd(), &mut buf, 0).map_err(|e| format!("cannot be read: {e}"))?;
    ExchangeIntent::parse(&buf[..n]).map_err(|e| e.to_string())
}
