//! Checking a whole vault: every directory IV, entry name and binding, long-name side file,
//! symlink, extended attribute and content block, through the same [`Vault`] steps the mount
//! and the offline tools use; and repairing what a crash can leave behind.
//!
//! A check never writes. A repair fixes crash leftovers — temporary names, orphaned
//! long-name and symlink-target side files and xattr continuations, a missing directory IV
//! copy — rewrites a wrong IV copy, renames conflict copies (a sync tool's, and the older of
//! two valid entries for one name) to the names they are shown as, and moves every damaged
//! or stray object into a `lost+found` directory at the top of the vault, bound there under a
//! new name with the identity it carries (a file's header ID, a directory's IV, a symlink's
//! ID), so whatever still authenticates can be read again. It deletes no user data: the only
//! things it removes are orphaned side files and xattr continuations (an encrypted name, a
//! removed symlink's target, the tail of a value replaced or never set), sync tools' copies of
//! the lock, of IV copies and of side files (they hold no user data),
//! the config's own temporary copy, the partial copies an interrupted import left, and the
//! stashes and write-session logs (docs/FORMAT.md §5.9, §5.10) that no file's crash state uses.
//! A damaged file is salvaged by its format's rules (`file/salvage.rs`): with a block map,
//! only the versions the map commits to, and what could not be checked against it is named.

use crate::content::blockmap::{HeaderV2, HEADER_V2_LEN};
use crate::content::header::{FileHeader, FileId, HEADER_LEN};
use crate::diriv::IvCopy;
use crate::error::{Error, IoContext, Result};
use crate::names::{
    b64_decode, EntryKind, Identity, ParsedEntry, CONFIG_NAME, DIRIV_NAME, LONG_NAME_FILE_PREFIX, RESERVED_PREFIX,
    XCHG_PREFIX,
};
use crate::symlink::TARGET_FILE_PREFIX;
use crate::sys;
use crate::sys::{RawDirEntry, Stat};
use crate::vault::{CipherDir, Entry, Vault};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub use crate::names::LOST_FOUND;
pub use crate::names::TEMP_PREFIX;

/// What kind of problem was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProblemKind {
    /// Something failed authentication: tampered or damaged (a name, a binding, a block, a
    /// directory IV, a side file, a symlink, an xattr), or an object of the wrong type.
    Damaged,
    /// A name the format does not produce (a sync tool's conflict copy, a stray file).
    Foreign,
    /// An object under a temporary name: an interrupted mkdir, rmdir or exchange.
    TempName,
    /// Two verified entries for one name. Not reported any more: such entries are conflict
    /// copies ([`Report::conflicts`]), shown by every tool; kept for the JSON report's form.
    Duplicate,
    /// A long-name side file that no entry uses, a symlink target's side file that no
    /// symlink uses, or an inner-block stash of a file that is not UNSETTLED (FORMAT.md §5.9:
    /// a crash after the file was settled, before its stash was removed).
    OrphanSideFile,
    /// An xattr value's continuation that no value uses (an interrupted setxattr).
    OrphanXattrPiece,
    /// A directory without its IV copy (a crash right after mkdir); restorable from the
    /// directory's authenticated entry.
    MissingDirIv,
    /// A file whose header carries UNSETTLED: a writer died while changing its tail; it reads
    /// by the crash rules of docs/FORMAT.md §5.8 ("recovered crash state"), or, with a block
    /// map, by its write session's log (§5.10). `--repair` settles it as it reads.
    Unsettled,
    /// The write-session log of a file with a block map whose header carries UNSETTLED, none
    /// of whose records authenticate for that file's session (another file's log, an older
    /// session's, or forged: docs/FORMAT.md §5.10). No crash leaves one (a session's log
    /// holds its first record before its header says UNSETTLED); no reader uses it.
    /// `--repair` removes it: it holds nothing a reader accepts.
    StrayLog,
    /// A file older than this client remembers having seen it (`crate::known`): put back to
    /// an older version. Left alone (it is valid ciphertext of that older version);
    /// `veilfs fsck --accept` adopts it into the client's memory.
    RolledBack,
    /// Entries this client saw in a directory (`crate::known`) that are gone without a valid
    /// tombstone (`crate::tombstone`): deleted by someone who is not a client. Reported on the
    /// directory (the entries are not there to name); `veilfs fsck --accept` forgets them.
    Deleted,
    /// An entry present while its valid tombstone says a client deleted it: put back.
    /// `veilfs fsck --accept` keeps it (and removes the tombstone).
    Resurrected,
}

impl ProblemKind {
    /// True for what a crash can leave behind (as opposed to damage or tampering).
    pub fn is_crash_leftover(self) -> bool {
        !matches!(
            self,
            ProblemKind::Damaged
                | ProblemKind::Foreign
                | ProblemKind::StrayLog
                | ProblemKind::RolledBack
                | ProblemKind::Deleted
                | ProblemKind::Resurrected
        )
    }
}

/// One problem.
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    /// What kind.
    pub kind: ProblemKind,
    /// The ciphertext path it concerns.
    pub cipher_path: PathBuf,
    /// The plaintext path, where known.
    pub plain_path: Option<PathBuf>,
    /// What exactly.
    pub detail: String,
    /// What `--repair` did about it (`None`: nothing, or not repairing).
    pub repaired: Option<String>,
}

/// The outcome of a check.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Directories checked.
    pub dirs: u64,
    /// Regular files checked (each inode once).
    pub files: u64,
    /// Symlinks checked.
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes.
    pub specials: u64,
    /// Plaintext bytes read and authenticated.
    pub bytes: u64,
    /// Everything found.
    pub problems: Vec<Problem>,
    /// Files a sync tool or desktop left ([`crate::foreign`]): named, never a problem, never
    /// touched by `--repair`.
    pub sync_files: Vec<SyncFile>,
    /// Conflict copies ([`crate::conflict`]): a sync tool's copies that verify and the older
    /// of two valid entries for one name (shown by every tool, so not a problem; `--repair`
    /// makes them ordinary entries under the names they are shown as), and copies of
    /// veilfs's own files that hold nothing else than the original.
    pub conflicts: Vec<ConflictFound>,
    /// Tombstone records older than the horizon (`crate::tombstone::HORIZON_SECS`) that
    /// `--repair` dropped.
    pub expired_tombstones: u64,
}

/// A conflict copy found by fsck.
#[derive(Clone, Debug, Serialize)]
pub struct ConflictFound {
    /// Its ciphertext path.
    pub cipher_path: PathBuf,
    /// The plaintext path it is shown under (`None`: a copy of one of veilfs's own files).
    pub plain_path: Option<PathBuf>,
    /// The plaintext path of the entry it copies, or the veilfs file's name.
    pub copy_of: PathBuf,
    /// The tool that made it ("veilfs": the older of two entries for one name).
    pub tool: &'static str,
    /// What it is, for a copy of one of veilfs's own files.
    pub detail: String,
    /// What `--repair` did about it.
    pub repaired: Option<String>,
}

/// A file a sync tool or desktop left in the vault's folder.
#[derive(Clone, Debug, Serialize)]
pub struct SyncFile {
    /// Its ciphertext path.
    pub cipher_path: PathBuf,
    /// The tool that leaves such files.
    pub tool: &'static str,
}

impl Report {
    /// True when nothing is wrong, or everything found was repaired.
    pub fn is_clean(&self) -> bool {
        self.problems.iter().all(|p| p.repaired.is_some())
    }
}

/// Walks a vault. `progress` is called after each regular file with its plaintext size.
pub struct Checker<'a> {
    vault: &'a Vault,
    repair: bool,
    progress: &'a dyn Fn(u64),
    report: Report,
    /// Regular-file inodes already read: (dev, ino) → identity their first name promised.
    inodes: HashMap<(u64, u64), Identity>,
    lost_found: Option<CipherDir>,
    moved: u64,
    /// The directory being checked is /lost+found or below: what is found there was put
    /// there by an earlier repair and stays for the user to look at.
    in_lost_found: bool,
    /// Inner-block stashes in the top directory (docs/FORMAT.md §5.9).
    stashes: Vec<String>,
    /// IDs of the files found UNSETTLED (their stashes and logs are part of their crash
    /// state), with the generation of a block-map file's header (whose log must hold a record
    /// of that session). A block-map file counts when its header says UNSETTLED even if it
    /// does not read: its log stays with it (in lost+found after a repair).
    unsettled: HashMap<FileId, Option<u64>>,
}

impl<'a> Checker<'a> {
    /// A checker of `vault`; with `repair`, crash leftovers are fixed and damaged objects
    /// moved into `lost+found`.
    pub fn new(vault: &'a Vault, repair: bool, progress: &'a dyn Fn(u64)) -> Self {
        Checker {
            vault,
            repair,
            progress,
            report: Report::default(),
            inodes: HashMap::new(),
            lost_found: None,
            moved: 0,
            in_lost_found: false,
            stashes: Vec::new(),
            unsettled: HashMap::new(),
        }
    }

    /// Checks the whole vault (the config was verified when it was unlocked).
    pub fn run(mut self) -> Result<Report> {
        let root = self.vault.root_dir()?;
        self.check_dir(root, PathBuf::new());
        self.check_stashes()?;
        Ok(self.report)
    }

    /// Reports the stashes no UNSETTLED file needs (removed with `--repair`); a stash of an
    /// UNSETTLED file goes when that file is settled.
    fn check_stashes(&mut self) -> Result<()> {
        let root = self.vault.root_dir()?;
        let block_map = self.vault.content().block_map;
        for name in std::mem::take(&mut self.stashes) {
            let id = crate::stash::stash_id(name.as_bytes());
            let needed = id.and_then(|id| self.unsettled.get(&id).map(|g| (id, *g)));
            if sys::fstatat(root.fd(), name.as_bytes()).is_err() {
                continue;
            }
            let (kind, detail) = match needed {
                Some((id, Some(g))) if !self.log_of_session(&id, g) => (
                    ProblemKind::StrayLog,
                    "the write-session log of an UNSETTLED file holds no record of its session (another file's or \
                     session's log): never read"
                        .to_string(),
                ),
                Some(_) => continue,
                None if block_map => (
                    ProblemKind::OrphanSideFile,
                    "a write-session log no UNSETTLED file uses (a crash after its file was settled, before the log \
                     was removed, or its file is gone)"
                        .to_string(),
                ),
                None => (
                    ProblemKind::OrphanSideFile,
                    "an inner-block stash no unsettled file uses (a crash after its file was settled)".to_string(),
                ),
            };
            let i = self.problem(kind, root.path.join(&name), None, detail);
            self.remove_leftover(i, &root, &name, "removed");
        }
        Ok(())
    }

    /// Whether the write-session log of file `id` holds a record that authenticates for its
    /// session `g` (an unreadable log counts as holding one: it is not removed).
    fn log_of_session(&self, id: &FileId, g: u64) -> bool {
        let ctx = self.vault.content();
        let Some(dir) = &ctx.stashes else { return true };
        match dir.read(id) {
            Ok(Some(bytes)) => !crate::maplog::Log::parse(bytes, &ctx.keys, id, g).records.is_empty(),
            Ok(None) => true,
            Err(_) => true,
        }
    }

    fn problem(&mut self, kind: ProblemKind, cipher_path: PathBuf, plain: Option<&Path>, detail: String) -> usize {
        let repaired = self.in_lost_found.then(|| "kept in /lost+found".to_string());
        self.report.problems.push(Problem {
            kind,
            cipher_path,
            plain_path: plain.map(Path::to_path_buf),
            detail,
            repaired,
        });
        self.report.problems.len() - 1
    }

    /// With `--repair`: unlinks the leftover file `name` of `dir` (problem `i`), saying `done`.
    fn remove_leftover(&mut self, i: usize, dir: &CipherDir, name: &str, done: &str) {
        if self.repair {
            let r = sys::as_owner_of(&[dir.fd()], || sys::unlinkat(dir.fd(), name.as_bytes(), false))
                .ctx(|| dir.child_path(name))
                .map(|()| done.into());
            self.repaired(i, r);
        }
    }

    fn repaired(&mut self, i: usize, r: Result<String>) {
        match r {
            Ok(what) => self.report.problems[i].repaired = Some(what),
            Err(e) => self.report.problems[i].detail.push_str(&format!(" (repair failed: {e})")),
        }
    }

    fn damaged(&mut self, dir: &CipherDir, on_disk: &str, plain: Option<&Path>, e: &Error) -> usize {
        let detail = match e {
            Error::Auth { detail, .. } => detail.clone(),
            e => e.to_string(),
        };
        self.problem(ProblemKind::Damaged, dir.path.join(on_disk), plain, detail)
    }

    fn check_dir(&mut self, dir: CipherDir, plain: PathBuf) {
        self.report.dirs += 1;
        self.in_lost_found = plain.starts_with(std::ffi::OsStr::from_bytes(LOST_FOUND));
        let iv_ok = self.check_iv_copy(&dir, &plain);
        let raw = match sys::read_dir_fd(dir.fd()) {
            Ok(r) => self.exchange_records(&dir, &plain, r),
            Err(e) => {
                self.problem(ProblemKind::Damaged, dir.path.clone(), Some(&plain), format!("cannot be listed: {e}"));
                return;
            }
        };
        let top = plain.as_os_str().is_empty();
        let mut groups: HashMap<String, Vec<(String, Stat)>> = HashMap::new();
        let mut side_files: Vec<String> = Vec::new();
        let mut target_files: Vec<String> = Vec::new();
        let mut strays: Vec<(String, ProblemKind, String)> = Vec::new();
        let (mut copy_names, mut copy_keys): (Vec<String>, HashSet<String>) = (Vec::new(), HashSet::new());
        let copy = self.vault.iv_copy();
        let copy_name = copy.name(&dir.iv);
        let listed: Vec<Vec<u8>> = raw.iter().map(|r| r.name.clone()).collect();
        for r in raw {
            let name = String::from_utf8_lossy(&r.name).into_owned();
            if r.name == b"." || r.name == b".." || r.name == copy_name.as_bytes() {
                continue;
            }
            // A tombstone log, or a sync tool's copy of one (read as one more log).
            if crate::tombstone::is_log_name(&r.name) {
                self.check_tombstone_log(&dir, &name, &plain);
                continue;
            }
            // A sync tool's copy of one of veilfs's own files: by that file's rule.
            if let ParsedEntry::Internal | ParsedEntry::Conflict(_) = ParsedEntry::parse(&r.name) {
                if let Some(c) = crate::conflict::parse(&r.name).filter(|c| !c.is_of_entry()) {
                    self.internal_copy(&dir, &name, &c);
                    continue;
                }
            }
            if copy == IvCopy::Name && r.name.starts_with(DIRIV_NAME.as_bytes()) {
                // Another IV name, or the old form's file: part of the IV problem reported
                // above when the right name is missing, else one of its own.
                if iv_ok {
                    self.extra_iv_copy(&dir, &name, &plain);
                }
                continue;
            }
            if top && (r.name == CONFIG_NAME.as_bytes() || is_lock_file(&name)) {
                continue;
            }
            // A sync tool's copy of the lock file: means nothing (the lock is an flock on the
            // original), named and left alone.
            if top && crate::lock::is_conflict_copy(&r.name) {
                let tool = crate::foreign::LOCK_COPY_TOOL;
                self.report.sync_files.push(SyncFile { cipher_path: dir.path.join(&name), tool });
                continue;
            }
            // A sync tool's file is named and left alone (and its directories, such as
            // Syncthing's version store, are not walked).
            if let ParsedEntry::SyncTool(tool) = ParsedEntry::parse(&r.name) {
                self.report.sync_files.push(SyncFile { cipher_path: dir.path.join(&name), tool });
                continue;
            }
            if top && name.starts_with(crate::stash::STASH_PREFIX) {
                self.stashes.push(name);
                continue;
            }
            if top && name == format!("{CONFIG_NAME}.tmp") {
                let i = self.problem(
                    ProblemKind::TempName,
                    dir.path.join(&name),
                    None,
                    "a config update was interrupted (the config itself is intact)".into(),
                );
                self.remove_leftover(i, &dir, &name, "removed");
                continue;
            }
            if name.starts_with(crate::names::PART_PREFIX) {
                // A file `veilfs import` was still writing: a partial copy of a file that is
                // outside the vault, not vault data (import removes these itself on a re-run).
                let i = self.problem(
                    ProblemKind::TempName,
                    dir.path.join(&name),
                    Some(&plain),
                    "an interrupted import left a partial copy".into(),
                );
                self.remove_leftover(i, &dir, &name, "removed (an unfinished copy; import it again)");
                continue;
            }
            if crate::upgrade::is_temp_name(&r.name) {
                // A file `veilfs upgrade` was converting: the original still has its name (a
                // vault in the middle of an upgrade opens for nothing but the upgrade, which
                // removes these itself; one found here outlived a run that was finished).
                let i = self.problem(
                    ProblemKind::TempName,
                    dir.path.join(&name),
                    Some(&plain),
                    "an interrupted upgrade left a temporary copy".into(),
                );
                self.remove_leftover(i, &dir, &name, "removed (the file it copied keeps its name)");
                continue;
            }
            if r.name.starts_with(XCHG_PREFIX.as_bytes()) {
                // Reported by `exchange_records` above.
                continue;
            }
            if name.starts_with(TEMP_PREFIX) {
                strays.push((name, ProblemKind::TempName, "an interrupted mkdir, rmdir or exchange left it".into()));
                continue;
            }
            if name.starts_with(LONG_NAME_FILE_PREFIX) {
                side_files.push(name);
                continue;
            }
            if name.starts_with(TARGET_FILE_PREFIX) {
                target_files.push(name);
                continue;
            }
            let parsed = ParsedEntry::parse(&r.name);
            if let ParsedEntry::Conflict(c) = &parsed {
                // Decoded below with the other copies; a long name's copy reads the side file.
                if let ParsedEntry::Long { key, .. } = c.entry() {
                    copy_keys.insert(key.to_string());
                }
                copy_names.push(name);
                continue;
            }
            match parsed.key() {
                Some(key) => {
                    let key = key.to_string();
                    match sys::fstatat(dir.fd(), &r.name) {
                        Ok(st) => groups.entry(key).or_default().push((name, st)),
                        Err(e) => {
                            self.problem(
                                ProblemKind::Damaged,
                                dir.path.join(&name),
                                None,
                                format!("cannot be read: {e}"),
                            );
                        }
                    }
                }
                None if matches!(parsed, ParsedEntry::Foreign) || !name.starts_with(RESERVED_PREFIX) => strays.push((
                    name,
                    ProblemKind::Foreign,
                    "is not a veilfs entry name (a sync conflict copy?)".into(),
                )),
                None => {
                    // A reserved name this version does not use: left alone, reported.
                    self.problem(ProblemKind::Foreign, dir.path.join(&name), None, "unknown vault file".into());
                }
            }
        }
        // Entries: decode each; among verified entries for one name, the newer wins.
        let mut used_keys: HashSet<String> = HashSet::new();
        let mut keep: Vec<Entry> = Vec::new();
        let mut keys: Vec<String> = groups.keys().cloned().collect();
        keys.sort();
        // Entries that did not decode, reported once the copies' pass had them: a short one
        // whose name does not decrypt may be a copy with a base64url tool's part (OneDrive's).
        let mut failed: Vec<(String, sys::Stat, Error)> = Vec::new();
        for key in keys {
            let mut good: Vec<Entry> = Vec::new();
            for (on_disk, st) in groups.remove(&key).unwrap_or_default() {
                match self.vault.decode_entry(&dir, on_disk.as_bytes(), st) {
                    Ok(Some(e)) => good.push(e),
                    Ok(None) => {}
                    Err(e) => failed.push((on_disk, st, e)),
                }
            }
            used_keys.insert(key);
            good.sort_by_key(|e| std::cmp::Reverse((e.stat.st_ctime, e.stat.st_ctime_nsec)));
            if good.len() > 1 {
                // Two valid entries for one name (two machines, or an interrupted rename over
                // an existing name): the newer is the entry, the others conflict copies.
                copy_names.extend(good.iter().map(|e| e.on_disk.clone()));
            }
            keep.extend(good.into_iter().next());
        }
        used_keys.extend(copy_keys);
        let undecryptable: Vec<String> = failed
            .iter()
            .filter(|(on_disk, ..)| matches!(ParsedEntry::parse(on_disk.as_bytes()), ParsedEntry::Short { .. }))
            .map(|(on_disk, ..)| on_disk.clone())
            .collect();
        let mut copied: HashSet<String> = HashSet::new();
        if !copy_names.is_empty() || !undecryptable.is_empty() {
            let (copies, bad) =
                self.vault.conflict_copies(&dir, &copy_names, &undecryptable, |k| used_keys.contains(k));
            for b in bad {
                let on_disk = String::from_utf8_lossy(&b.on_disk).into_owned();
                let i = self.damaged(&dir, &on_disk, None, &b.error);
                if let Ok(st) = sys::fstatat(dir.fd(), on_disk.as_bytes()) {
                    self.move_to_lost_found(i, &dir, &on_disk, &st);
                }
            }
            for c in copies {
                copied.insert(c.entry.on_disk.clone());
                keep.push(self.entry_copy(&dir, &plain, c));
            }
        }
        for (on_disk, st, e) in failed.into_iter().filter(|(on_disk, ..)| !copied.contains(on_disk)) {
            let i = self.damaged(&dir, &on_disk, None, &e);
            self.move_to_lost_found(i, &dir, &on_disk, &st);
        }
        for (name, kind, detail) in strays {
            let i = self.problem(kind, dir.path.join(&name), None, detail);
            if let Ok(st) = sys::fstatat(dir.fd(), name.as_bytes()) {
                self.move_to_lost_found(i, &dir, &name, &st);
            }
        }
        // Side files nobody uses.
        for side in side_files {
            let hash = &side[LONG_NAME_FILE_PREFIX.len()..];
            if used_keys.contains(&format!("{}{hash}", crate::names::LONG_PREFIX)) {
                continue;
            }
            let i = self.problem(
                ProblemKind::OrphanSideFile,
                dir.path.join(&side),
                Some(&plain),
                "no entry uses this long-name side file".into(),
            );
            if self.repair {
                let r = sys::as_owner_of(&[dir.fd()], || sys::unlinkat(dir.fd(), side.as_bytes(), false))
                    .ctx(|| dir.child_path(&side));
                self.repaired(i, r.map(|()| "removed (it held only an encrypted name)".into()));
            }
        }
        self.check_target_files(&dir, &plain, target_files);
        // What this client remembers of the directory (tombstones that do not verify were
        // reported above, one by one).
        if !self.in_lost_found {
            let v = self.vault.check_entries(&dir, listed.iter().map(Vec::as_slice));
            if v.missing > 0 {
                self.problem(
                    ProblemKind::Deleted,
                    dir.path.clone(),
                    Some(&plain),
                    format!(
                        "{} entr{} this client saw {} missing without a tombstone: deleted by someone who is not a \
                         client; `veilfs fsck --accept` forgets {}",
                        v.missing,
                        if v.missing == 1 { "y" } else { "ies" },
                        if v.missing == 1 { "is" } else { "are" },
                        if v.missing == 1 { "it" } else { "them" },
                    ),
                );
            }
            for on_disk in v.resurrected {
                let p = keep
                    .iter()
                    .find(|e| e.on_disk == on_disk)
                    .map(|e| plain.join(std::ffi::OsStr::from_bytes(&e.name)));
                let detail = match Vault::resurrected_error(&dir, &on_disk) {
                    Error::Rollback { detail, .. } => detail,
                    e => e.to_string(),
                };
                self.problem(ProblemKind::Resurrected, dir.path.join(&on_disk), p.as_deref(), detail);
            }
        }
        keep.sort_by(|a, b| a.name.cmp(&b.name));
        for e in keep {
            let p = plain.join(std::ffi::OsStr::from_bytes(&e.name));
            self.check_entry(&dir, e, p);
        }
    }

    /// Checks the tombstone log `name` of `dir` (a sync tool's copy of one too): a log or part
    /// of one that does not verify is damage (planted, edited or moved; it vouches for
    /// nothing), which `--repair` cuts off (a log with no valid record is removed: it holds no
    /// user data); records older than the horizon are dropped by `--repair` (not a problem).
    fn check_tombstone_log(&mut self, dir: &CipherDir, name: &str, plain: &Path) {
        use crate::tombstone;
        let keys = &self.vault.content().keys;
        let log = tombstone::read_log(dir.fd(), keys, &dir.iv, name.as_bytes());
        let now = tombstone::now();
        let expired = log.records.iter().filter(|(_, e)| e.expired(now)).count();
        let mut repair = expired > 0 && log.bad.is_none();
        if let Some(why) = &log.bad {
            let i = self.problem(ProblemKind::Damaged, dir.path.join(name), Some(plain), why.clone());
            if log.records.is_empty() {
                self.remove_leftover(
                    i,
                    dir,
                    name,
                    "removed (a tombstone log that does not verify vouches for nothing)",
                );
                return;
            }
            repair = true;
            if self.repair {
                self.report.problems[i].repaired = Some("cut after its last record that verifies".into());
            }
        }
        if !(repair && self.repair) {
            return;
        }
        let r = sys::as_owner_of(&[dir.fd()], || {
            tombstone::rewrite(dir.fd(), keys, &dir.iv, name.as_bytes(), |e| !e.expired(now))
        });
        match r {
            Ok(n) => self.report.expired_tombstones += n as u64,
            Err(e) => tracing::warn!("{}: the tombstone log could not be rewritten: {e}", dir.child_path(name)),
        }
    }

    /// Reports the conflict copy `c` of a user entry of `dir` (plaintext path `plain`); with
    /// `--repair` renames it to the name it is shown as, an ordinary entry from then on.
    /// Returns the entry to check further.
    fn entry_copy(&mut self, dir: &CipherDir, plain: &Path, c: crate::conflict::ConflictCopy) -> Entry {
        let shown = plain.join(std::ffi::OsStr::from_bytes(&c.entry.name));
        let mut found = ConflictFound {
            cipher_path: dir.path.join(&c.entry.on_disk),
            plain_path: Some(shown.clone()),
            copy_of: plain.join(std::ffi::OsStr::from_bytes(&c.original)),
            tool: c.tool,
            detail: String::new(),
            repaired: None,
        };
        let original = c.original.clone();
        let mut entry = c.entry;
        if self.repair {
            // Bound under the shown name (same identity), then one rename in the directory,
            // with the rights of its owner as every repair.
            let renamed =
                self.vault.new_entry_name(dir, &entry.name, entry.kind, &entry.identity).and_then(|(key, on)| {
                    let (old, new) = (entry.on_disk.as_bytes(), on.as_bytes());
                    // A copy whose name reads as an entry's (OneDrive's `-HOST`, ownCloud's
                    // older form) may be remembered by clients under that name: a client's
                    // rename, with its tombstone.
                    let _ = self.vault.tombstone_before_remove(dir, &entry.on_disk, entry.kind);
                    sys::as_owner_of(&[dir.fd()], || {
                        sys::renameat2(dir.fd(), old, dir.fd(), new, libc::RENAME_NOREPLACE)
                    })
                    .ctx(|| dir.child_path(&entry.on_disk))?;
                    let stat = sys::fstatat(dir.fd(), new).ctx(|| dir.child_path(&on))?;
                    Ok(Entry {
                        name: entry.name.clone(),
                        on_disk: on,
                        key,
                        kind: entry.kind,
                        identity: entry.identity,
                        stat,
                    })
                });
            match renamed {
                Ok(e) => {
                    found.repaired = Some(format!("renamed to /{}", shown.display()));
                    self.tombstone_for_original(dir, &original, &e);
                    entry = e;
                }
                Err(e) => found.detail = format!("repair failed: {e}"),
            }
        }
        self.report.conflicts.push(found);
        entry
    }

    /// After a conflict copy of `original` became the ordinary entry `e`: if no entry of the
    /// original's on-disk name is there (the sync tool renamed it to the copy), a tombstone
    /// for that name, so that clients that remember it see a client's change, not a
    /// deletion. Best effort.
    fn tombstone_for_original(&self, dir: &CipherDir, original: &[u8], e: &Entry) {
        let names = self.vault.names();
        let Ok(key) = names.name_key(&dir.iv, original) else { return };
        let on_disk = key.entry_name(&names.bind(&dir.iv, &key.d, e.kind, &e.identity));
        if sys::fstatat(dir.fd(), on_disk.as_bytes()).is_err() {
            let _ = self.vault.tombstone_before_remove(dir, &on_disk, e.kind);
        }
    }

    /// Reports the conflict copy `c` (named `name` in `dir`) of one of veilfs's own files, by
    /// that file's rule ([`crate::conflict::internal_copy`]); with `--repair` removes one that
    /// holds nothing the vault needs (an IV copy or side file saying what the original says).
    /// One that says something else is damage, removed on repair (never used: the original is
    /// what the vault reads). The config's copy and the lock's copies are left alone (a lock
    /// copy is a sync tool's file, like every other form of it the foreign list names).
    fn internal_copy(&mut self, dir: &CipherDir, name: &str, c: &crate::conflict::ConflictName) {
        use crate::conflict::InternalCopy;
        let rule = crate::conflict::internal_copy(self.vault, dir, name, c);
        let detail = match &rule {
            InternalCopy::Lock => "a copy of the vault lock (never a lock; holds no data; left alone)".to_string(),
            InternalCopy::Config => {
                "a copy of the config (never the config: the vault opens with veilfs.conf; a password only its key slots know still unlocks; left alone)".to_string()
            }
            InternalCopy::Same => format!("a copy of {} saying what it says (not used)", c.original),
            InternalCopy::Differs(why) => {
                let i = self.problem(
                    ProblemKind::Damaged,
                    dir.path.join(name),
                    None,
                    format!("a sync tool's copy of {}: {why} (not used)", c.original),
                );
                self.remove_leftover(i, dir, name, "removed (never used; holds no user data)");
                return;
            }
        };
        let mut found = ConflictFound {
            cipher_path: dir.path.join(name),
            plain_path: None,
            copy_of: PathBuf::from(&c.original),
            tool: c.tool,
            detail,
            repaired: None,
        };
        if self.repair && !matches!(rule, InternalCopy::Config | InternalCopy::Lock) {
            let r = sys::as_owner_of(&[dir.fd()], || sys::unlinkat(dir.fd(), name.as_bytes(), false));
            match r {
                Ok(()) => found.repaired = Some("removed (holds nothing the vault needs)".into()),
                Err(e) => found.detail.push_str(&format!(" (repair failed: {e})")),
            }
        }
        self.report.conflicts.push(found);
    }

    /// Checks every exchange intent record of `dir` (F§10), before anything else there: one
    /// that verifies ([`Vault::verified_exchange`]) is an interrupted exchange, which
    /// `--repair` finishes as the crash sweep would, with the rights of the directories'
    /// owner (the directory is then listed again); one that does not verify is damage,
    /// reported and left alone: never executed, never removed. Returns `raw`, or the new
    /// listing after a repair.
    fn exchange_records(&mut self, dir: &CipherDir, plain: &Path, raw: Vec<RawDirEntry>) -> Vec<RawDirEntry> {
        let names: Vec<String> = raw
            .iter()
            .filter(|r| r.name.starts_with(XCHG_PREFIX.as_bytes()))
            .map(|r| String::from_utf8_lossy(&r.name).into_owned())
            .collect();
        if names.is_empty() {
            return raw;
        }
        let root = match sys::open_dir_path(self.vault.root_path()) {
            Ok(fd) => fd,
            Err(e) => {
                let at = self.vault.root_path().to_path_buf();
                self.problem(ProblemKind::Damaged, at, None, format!("cannot be opened: {e}"));
                return raw;
            }
        };
        let mut changed = false;
        for name in names {
            match self.vault.verified_exchange(root.as_fd(), dir.fd(), &dir.path, &name) {
                Err(e) => {
                    let i = self.damaged(dir, &name, Some(plain), &e);
                    self.report.problems[i].detail.push_str("; left alone, never executed");
                }
                Ok(_) => {
                    let i = self.problem(
                        ProblemKind::TempName,
                        dir.path.join(&name),
                        Some(plain),
                        "the authenticated intent record of an interrupted exchange".into(),
                    );
                    if self.repair && !self.in_lost_found {
                        changed = true;
                        let r = self.vault.finish_exchange(root.as_fd(), dir.fd(), &dir.path, &name);
                        self.repaired(
                            i,
                            r.map(|moved| {
                                if moved { "finished the exchange" } else { "removed (the exchange had not begun)" }
                                    .into()
                            }),
                        );
                    }
                }
            }
        }
        if !changed {
            return raw;
        }
        sys::read_dir_fd(dir.fd()).unwrap_or(raw)
    }

    /// Checks `dir`'s IV copy: missing is a crash leftover (restored), anything else wrong is
    /// damage (rewritten from the entry, below the top). False when it was reported wrong.
    fn check_iv_copy(&mut self, dir: &CipherDir, plain: &Path) -> bool {
        let at = dir.path.join(self.vault.iv_copy().name(&dir.iv));
        match self.vault.verify_diriv(dir) {
            Ok(true) => true,
            Ok(false) => {
                let i = self.problem(ProblemKind::MissingDirIv, at, Some(plain), "is missing".into());
                if self.repair {
                    let r = self.vault.restore_diriv(dir).map(|()| "restored from the directory's entry".into());
                    self.repaired(i, r);
                }
                true
            }
            Err(e) => {
                let path = match &e {
                    Error::Auth { what, .. } => PathBuf::from(what),
                    _ => at,
                };
                let detail = match &e {
                    Error::Auth { detail, .. } => detail.clone(),
                    e => e.to_string(),
                };
                let i = self.problem(ProblemKind::Damaged, path, Some(plain), detail);
                // Entries of a directory whose IV copy is wrong are still named under the IV
                // the parent's entry promises: rewriting the copy restores them.
                if self.repair && !plain.as_os_str().is_empty() {
                    let r = self.vault.rewrite_diriv(dir).map(|()| "rewritten from the directory's entry".into());
                    self.repaired(i, r);
                }
                false
            }
        }
    }

    /// A second IV name in `dir` (`iv-in-name`) beside the right one, or the old form's file:
    /// copied in from elsewhere. `--repair` removes an empty or IV-sized regular file (it holds
    /// no data) and moves anything else to lost+found.
    fn extra_iv_copy(&mut self, dir: &CipherDir, name: &str, plain: &Path) {
        let i = self.problem(
            ProblemKind::Damaged,
            dir.path.join(name),
            Some(plain),
            "is an IV copy that is not this directory's (copied from another directory?)".into(),
        );
        let Ok(st) = sys::fstatat(dir.fd(), name.as_bytes()) else { return };
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size <= 16 {
            self.remove_leftover(i, dir, name, "removed (it held no data)");
        } else {
            self.move_to_lost_found(i, dir, name, &st);
        }
    }

    /// Symlink target side files that no symlink of `dir` uses (an interrupted symlink,
    /// rename or unlink, F§8.1); checked after strays moved to lost+found took theirs along.
    fn check_target_files(&mut self, dir: &CipherDir, plain: &Path, target_files: Vec<String>) {
        for side in target_files {
            if sys::fstatat(dir.fd(), side.as_bytes()).is_err()
                || self.vault.target_side_used(dir, &side).unwrap_or(true)
            {
                continue;
            }
            let i = self.problem(
                ProblemKind::OrphanSideFile,
                dir.path.join(&side),
                Some(plain),
                "no symlink uses this target side file".into(),
            );
            self.remove_leftover(i, dir, &side, "removed (it held only the encrypted target of a removed symlink)");
        }
    }

    fn check_entry(&mut self, dir: &CipherDir, e: Entry, plain: PathBuf) {
        let r = match e.kind {
            EntryKind::Dir => {
                self.check_xattrs(dir, &e, &plain);
                let sub = CipherDir::from_parts(
                    match sys::open_dir_at(dir.fd(), e.on_disk.as_bytes()) {
                        Ok(fd) => fd,
                        Err(err) => {
                            let i = self.damaged(
                                dir,
                                &e.on_disk,
                                Some(&plain),
                                &Error::io(dir.child_path(&e.on_disk), err),
                            );
                            self.move_to_lost_found(i, dir, &e.on_disk, &e.stat);
                            return;
                        }
                    },
                    e.identity,
                    dir.path.join(&e.on_disk),
                );
                let was = self.in_lost_found;
                self.check_dir(sub, plain);
                self.in_lost_found = was;
                return;
            }
            EntryKind::File => self.check_file(dir, &e, &plain),
            EntryKind::Symlink => {
                self.report.symlinks += 1;
                self.vault.readlink(dir, &e).map(drop)
            }
            // Its type and (with `special-kinds`) device number were checked with its binding.
            EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice => {
                self.report.specials += 1;
                Ok(())
            }
        };
        if let Err(Error::Rollback { detail, .. }) = &r {
            // An older version of the file, whole and authentic: nothing to salvage or move.
            let detail = format!("{detail}; left alone");
            self.problem(ProblemKind::RolledBack, dir.path.join(&e.on_disk), Some(&plain), detail);
            return;
        }
        if let Err(err) = r {
            let i = self.damaged(dir, &e.on_disk, Some(&plain), &err);
            if e.kind == EntryKind::File && self.vault.content().block_map {
                self.note_trailing(i, dir, &e);
            }
            if e.kind == EntryKind::File && self.repair && !self.in_lost_found {
                // Keep what authenticates under the file's name; the original goes to
                // lost+found untouched.
                let salvaged = self.salvage(dir, &e);
                self.move_to_lost_found(i, dir, &e.on_disk, &e.stat);
                match salvaged {
                    Ok(Some(s)) => {
                        let done = self.place_salvage(dir, &e, s);
                        let r = &mut self.report.problems[i];
                        match done {
                            Ok(text) => r.repaired = Some(format!("{}; {text}", r.repaired.take().unwrap_or_default())),
                            Err(x) => r.detail.push_str(&format!(" (salvage failed: {x})")),
                        }
                    }
                    Ok(None) => {}
                    Err(x) => self.report.problems[i].detail.push_str(&format!(" (nothing salvaged: {x})")),
                }
            } else {
                self.move_to_lost_found(i, dir, &e.on_disk, &e.stat);
            }
            return;
        }
        if e.kind == EntryKind::File {
            self.check_xattrs(dir, &e, &plain);
        }
    }

    fn check_xattrs(&mut self, dir: &CipherDir, e: &Entry, plain: &Path) {
        if let Err(err) = self.vault.xattrs(dir, e) {
            self.damaged(dir, &e.on_disk, Some(plain), &err);
        }
        for more in self.vault.xattr_leftovers(dir, e).unwrap_or_default() {
            let i = self.problem(
                ProblemKind::OrphanXattrPiece,
                dir.path.join(&e.on_disk),
                Some(plain),
                format!("xattr continuation {more} is used by no value (an interrupted setxattr)"),
            );
            if self.repair {
                let r = self.vault.remove_xattr_leftover(dir, e, &more).map(|()| "removed".to_string());
                self.repaired(i, r);
            }
        }
    }

    /// Reads and authenticates every block of a regular file (each inode once; a second name
    /// of one inode must promise the same identity).
    fn check_file(&mut self, dir: &CipherDir, e: &Entry, plain: &Path) -> Result<()> {
        let key = (e.stat.st_dev, e.stat.st_ino);
        if let Some(id) = self.inodes.get(&key) {
            if *id != e.identity {
                return Err(Error::auth(
                    dir.child_path(&e.on_disk),
                    "is a hard link to another file than its entry names",
                ));
            }
            return Ok(());
        }
        self.report.files += 1;
        let block_map = self.vault.content().block_map;
        if block_map {
            // Its log belongs to it whether or not it reads (see `unsettled`).
            if let Some(h) = header_v2(self.vault, dir, &e.on_disk).filter(|h| h.is_unsettled() && h.id == e.identity) {
                self.unsettled.insert(h.id, Some(h.generation));
            }
        }
        let f = self.vault.open_file(dir, e, libc::O_RDONLY)?;
        let header_len = if block_map { HEADER_V2_LEN } else { HEADER_LEN };
        if e.stat.st_size as u64 == header_len as u64 {
            // A header alone reads as empty; it must still be this file's header.
            f.verify_header()?;
        }
        let off = f.stream(|_| Ok::<(), Error>(()))?;
        if let Some((rule, size)) = f.crash_state() {
            self.unsettled.entry(*f.id()).or_insert(None);
            let detail = format!("recovered crash state: {}; reads as {size} bytes", rule.describe());
            let i = self.problem(ProblemKind::Unsettled, dir.path.join(&e.on_disk), Some(plain), detail);
            if self.repair {
                drop(f);
                let r = self.vault.open_file(dir, e, libc::O_RDWR).and_then(|f| f.recover_tail());
                self.repaired(i, r.map(|_| "settled as it reads".into()));
            }
        }
        self.report.bytes += off;
        (self.progress)(off);
        self.inodes.insert(key, e.identity);
        Ok(())
    }

    /// Adds to problem `i` (the damaged block-map file `e`) that bytes follow the end its
    /// header's block count and final block give, when they do: a reader reports that only
    /// as a size or a final block that does not match, which reads like a cut.
    fn note_trailing(&mut self, i: usize, dir: &CipherDir, e: &Entry) {
        let s = self.vault.open_for_salvage(dir, e).and_then(|f| f.salvage(|_| Ok(())));
        if let Some(s) = s.ok().filter(|s| s.trailing > 0) {
            let whole = if s.lost.is_empty() && s.unverified.is_empty() { "; every block authenticates" } else { "" };
            let p = &mut self.report.problems[i];
            p.detail.push_str(&format!(
                " ({} ciphertext bytes follow the end its header's block count and final block give: appended{whole})",
                s.trailing
            ));
        }
    }

    /// Reads what still authenticates of the damaged file `e` (its header must verify).
    /// `None` when nothing authenticates.
    fn salvage(&mut self, dir: &CipherDir, e: &Entry) -> Result<Option<(Vec<u8>, crate::file::Salvaged)>> {
        let f = self.vault.open_for_salvage(dir, e)?;
        let mut data = Vec::new();
        let s = f.salvage(|piece| {
            data.extend_from_slice(piece);
            Ok(())
        })?;
        Ok((s.kept > 0).then_some((data, s)))
    }

    /// Writes a salvaged copy of `e` under its name in `dir` (a new file: the damaged one was
    /// moved to lost+found) with its mode, owner and times; says what was lost.
    fn place_salvage(
        &mut self,
        dir: &CipherDir,
        e: &Entry,
        (data, s): (Vec<u8>, crate::file::Salvaged),
    ) -> Result<String> {
        let (on_disk, id, f) = self.vault.create_file_at(dir, &e.key, e.stat.st_mode & 0o7777)?;
        f.write_at(&data, 0, 0)?;
        f.sync(false)?;
        let size = data.len() as u64;
        let new = self.vault.entry_after_create(dir, &e.name, e.key.clone(), on_disk, EntryKind::File, id)?;
        // Owner and times as the damaged file had them, where this user may set them (a
        // non-root fsck cannot give a file away); the salvage stands either way.
        let _ = self.vault.set_attrs(dir, &new, None, Some((e.stat.st_uid, e.stat.st_gid)), None);
        let times = [
            libc::timespec { tv_sec: e.stat.st_atime, tv_nsec: e.stat.st_atime_nsec },
            libc::timespec { tv_sec: e.stat.st_mtime, tv_nsec: e.stat.st_mtime_nsec },
        ];
        let _ = self.vault.set_attrs(dir, &new, None, None, Some(&times));
        let lost: Vec<String> = s.lost.iter().map(|(a, b)| format!("{a}..{b}")).collect();
        Ok(format!(
            "salvaged {size} bytes under its name ({} authenticated; lost byte ranges: {}{})",
            s.kept,
            if lost.is_empty() { "none".into() } else { lost.join(", ") },
            s.notes()
        ))
    }

    /// With `--repair`: moves `on_disk` of `dir` into `lost+found`, bound to the identity it
    /// carries, and records what happened on problem `i`.
    fn move_to_lost_found(&mut self, i: usize, dir: &CipherDir, on_disk: &str, st: &Stat) {
        if !self.repair || self.in_lost_found {
            return;
        }
        let r = self.try_move(dir, on_disk, st);
        self.repaired(i, r);
    }

    fn try_move(&mut self, dir: &CipherDir, on_disk: &str, st: &Stat) -> Result<String> {
        if self.lost_found.is_none() {
            self.lost_found = Some(self.vault.lost_found()?);
        }
        let lf = self.lost_found.as_ref().expect("just made");
        if lf.path == dir.path.join(on_disk) {
            return Err(Error::Invalid("lost+found itself".into()));
        }
        let kind = EntryKind::from_mode(st.st_mode);
        let identity = carried_identity(self.vault, dir, on_disk, st).unwrap_or_else(crate::random::bytes);
        self.moved += 1;
        let kind_name = match kind {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice => "special",
        };
        let tag = crate::names::b64_encode(&crate::keys::hmac16(b"lost+found", &[on_disk.as_bytes()])[..6]);
        let name = format!("{kind_name}-{tag}-{}", self.moved);
        let (_, new_on_disk) = self.vault.new_entry_name(lf, name.as_bytes(), kind, &identity)?;
        // A client's move, not a deletion by the storage: other clients that remember the
        // entry find its tombstone.
        let _ = self.vault.tombstone_before_remove(dir, on_disk, kind);
        let side = self.vault.carry_target_side(dir, on_disk, kind, lf)?;
        // With the rights of the owner of both directories: a privileged repair never moves
        // one user's object into another user's directory (sys::as_owner_of).
        let moved = sys::as_owner_of(&[dir.fd(), lf.fd()], || {
            sys::rename_noreplace(dir.fd(), on_disk.as_bytes(), lf.fd(), new_on_disk.as_bytes())
        });
        if let Err(e) = moved {
            if let Some(side) = &side {
                self.vault.drop_target_side(lf, side);
            }
            return Err(Error::io(dir.child_path(on_disk), e));
        }
        if let Some(side) = side {
            self.vault.drop_target_side(dir, &side);
        }
        Ok(format!("moved to /lost+found/{name}"))
    }
}

/// The identity an object (backing `st`) carries in itself: a file's header ID, a directory's
/// IV copy, a symlink's ID, a device's number (`special-kinds`). `None` when it carries none
/// that can be read.
fn carried_identity(vault: &Vault, dir: &CipherDir, on_disk: &str, st: &Stat) -> Option<Identity> {
    let kind = EntryKind::from_mode(st.st_mode);
    match kind {
        EntryKind::File if vault.content().block_map => header_v2(vault, dir, on_disk).map(|h| h.id),
        EntryKind::File => {
            let fd = Vault::open_content(dir, on_disk, libc::O_RDONLY, 0).ok()?;
            let mut hdr = [0u8; HEADER_LEN];
            (sys::pread_full(fd.as_fd(), &mut hdr, 0).ok()? == HEADER_LEN).then_some(())?;
            FileHeader::decode(&hdr, &vault.content().keys, on_disk).ok().map(|h| h.id)
        }
        EntryKind::Dir => {
            let sub = sys::open_dir_at(dir.fd(), on_disk.as_bytes()).ok()?;
            carried_iv(vault, &sub)
        }
        EntryKind::Symlink => {
            let stored = sys::readlinkat(dir.fd(), on_disk.as_bytes()).ok()?;
            let blob = b64_decode(std::str::from_utf8(&stored).ok()?)?;
            blob.get(..16)?.try_into().ok()
        }
        EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice => {
            Some(vault.names().new_identity(kind, st.st_rdev))
        }
    }
}

/// The header v2 (docs/FORMAT.md §5.10) of the file `on_disk` of `dir`, if it authenticates.
fn header_v2(vault: &Vault, dir: &CipherDir, on_disk: &str) -> Option<HeaderV2> {
    let fd = Vault::open_content(dir, on_disk, libc::O_RDONLY, 0).ok()?;
    let mut hdr = [0u8; HEADER_V2_LEN];
    (sys::pread_full(fd.as_fd(), &mut hdr, 0).ok()? == HEADER_V2_LEN).then_some(())?;
    HeaderV2::decode(&hdr, &vault.content().keys).ok()
}

/// The IV a directory's copy carries. Of several IV names (one copied in), the one under
/// which a child's name decrypts; one alone is taken as it is (an empty directory has no
/// child to try).
fn carried_iv(vault: &Vault, sub: &std::os::fd::OwnedFd) -> Option<Identity> {
    let ivs = vault.iv_copy().carried(sub.as_fd());
    if ivs.len() <= 1 {
        return ivs.first().copied();
    }
    let raw = sys::read_dir_fd(sub.as_fd()).ok()?;
    let d = raw.iter().find_map(|r| match ParsedEntry::parse(&r.name) {
        ParsedEntry::Short { key, .. } => b64_decode(key),
        _ => None,
    })?;
    ivs.into_iter().find(|iv| vault.names().decrypt_name(iv, &d).is_ok())
}

/// The vault lock, if present: not part of the tree.
fn is_lock_file(name: &str) -> bool {
    name == crate::names::LOCK_NAME
}
