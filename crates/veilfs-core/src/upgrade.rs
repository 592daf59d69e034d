//! `veilfs upgrade`: converts a vault of v1 files (docs/FORMAT.md §5.1–§5.9) to block maps
//! (feature `"block-map"`, §5.10), in place, one file at a time, so that a crash leaves every
//! file either old or new and a second run finishes the job.
//!
//! Why it exists: a reader of a block-map vault must refuse v1 files (otherwise an old v1
//! ciphertext put back into a file would bypass the map), so a vault cannot simply start
//! naming the feature; every file has to be rewritten first, and until then the vault is in a
//! state no ordinary reader may open.
//!
//! The steps (docs/FORMAT.md §5.10, "Upgrade"):
//! 1. **Check** (only while the config does not yet name `"block-map-upgrade"`): the crash
//!    sweep settles UNSETTLED files and finishes interrupted exchanges (v1 rules), then every
//!    file is read through once. A file that does not read back is reported and nothing is
//!    changed: the vault stays an ordinary v1 vault that `fsck --repair` can salvage, and the
//!    upgrade is run again afterwards. Converting around a damaged file would leave it a v1
//!    file in a block-map vault, where salvage (which then follows the map's rules) no longer
//!    recovers its intact blocks. A damaged file in `/lost+found` (what `fsck --repair` set
//!    aside, after salvaging it under its name) does not hold the upgrade up: it is left as
//!    it is and reported.
//! 2. **Mark**: the config gets `"block-map-upgrade"` (authenticated by the config MAC). From
//!    here on only this module opens the vault ([`Vault::open_for_upgrade`]); everything else
//!    refuses it with "run veilfs upgrade to finish".
//! 3. **Convert**: each regular file with a v1 header is copied, block by block (all-zero
//!    blocks stay holes), into a new file with the same file ID, written with the block-map
//!    layout under the reserved name `veilfs.upgrade.<random>` in its directory, settled and
//!    flushed, given the original's owner, mode, extended attributes and times, and renamed
//!    over the original (atomic). A file with several names (hard links) is written once, then
//!    renamed to `veilfs.upgrade.link.<file ID>.<original inode>`, every name is pointed at it
//!    (a link under a fresh temporary name renamed over the name), and the `link` name is
//!    removed last; a crash in between is finished by the next run, which points every
//!    remaining name of the original inode (whose entry promises that file ID) at the `link`
//!    file, so the names stay one file.
//!    A file whose header is already v2 (an earlier run converted it) is skipped; an empty
//!    file is the same in both layouts and is left alone.
//! 4. **Finish**: once no v1 file and no temporary is left, the config names `"block-map"`
//!    instead of `"block-map-upgrade"`.
//!
//! A resumed run (the config names `"block-map-upgrade"`) first removes the temporaries a
//! crash left (`veilfs.upgrade.<random>`, with the write-session log their header names),
//! finishes `link` files as above, then goes on with step 3.
//!
//! Telling the two versions apart is safe during the window: a v2 header verifies only under
//! the vault's header key with its own label (§5.10), so no one without the key can make a v1
//! file pass as converted, and a v1 file is read by the v1 rules, as before the upgrade. What
//! the window does allow, and only until the run finishes, is putting back the old v1
//! ciphertext of a file already converted (docs/SECURITY.md).

use crate::config::{FEATURE_BLOCK_MAP, FEATURE_BLOCK_MAP_UPGRADE};
use crate::content::blockmap::{HeaderV2, HEADER_V2_LEN};
use crate::error::{Error, IoContext, Result};
use crate::file::{ContentCtx, CryptFile};
use crate::names::{b64_decode, b64_encode, DirIv, EntryKind, UPGRADE_LINK_PREFIX, UPGRADE_PREFIX};
use crate::sys;
use crate::vault::{CipherDir, Entry, Vault};
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;

/// Where a vault stands with respect to the upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The vault already names `"block-map"`: nothing to do.
    Done,
    /// A deterministic (reverse) vault: its files never get a block map.
    Deterministic,
    /// A v1 vault that has not been touched yet.
    Fresh,
    /// An upgrade was started and has not finished (`"block-map-upgrade"`).
    Unfinished,
}

/// Where the vault whose config is `cfg` stands.
pub fn status(cfg: &crate::VaultConfig) -> Status {
    if cfg.has_feature(FEATURE_BLOCK_MAP) {
        Status::Done
    } else if cfg.is_deterministic() {
        Status::Deterministic
    } else if cfg.has_feature(FEATURE_BLOCK_MAP_UPGRADE) {
        Status::Unfinished
    } else {
        Status::Fresh
    }
}

/// The phase a progress report belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Reading every file through before anything is changed.
    Check,
    /// Converting files.
    Convert,
}

/// A file the upgrade could not convert.
#[derive(Clone, Debug)]
pub struct Problem {
    /// The ciphertext path.
    pub cipher_path: String,
    /// The plaintext path in the vault (relative to its top), where known.
    pub plain_path: PathBuf,
    /// What went wrong.
    pub detail: String,
    /// An integrity error (the file is damaged), not an I/O error.
    pub damaged: bool,
    /// A damaged file in `/lost+found`, left as it is: it does not hold the upgrade up.
    pub left: bool,
}

impl Problem {
    /// Whether this problem holds the upgrade up: everything but a damaged file that
    /// `fsck --repair` already moved into `/lost+found` (after salvaging what authenticates
    /// under its name): that one is left a v1 file, as unreadable as it was, and reported.
    /// Anywhere else a damaged file must be repaired first, because once the vault has block
    /// maps a v1 file can no longer be salvaged block by block.
    pub fn holds_up(&self) -> bool {
        !self.left
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Files converted by this run (a file with several names counts once).
    pub converted: u64,
    /// Plaintext bytes of the files converted.
    pub bytes: u64,
    /// Files with several names among them (kept one file).
    pub linked: u64,
    /// Files that needed nothing: empty, or converted by an earlier run.
    pub unchanged: u64,
    /// UNSETTLED v1 files the check settled first.
    pub settled: u64,
    /// Leftovers of an interrupted run removed or finished (ciphertext paths).
    pub leftovers: Vec<String>,
    /// Files not converted. While one is left the vault does not get `"block-map"`.
    pub problems: Vec<Problem>,
    /// Whether the config now names `"block-map"`.
    pub finished: bool,
    /// Whether the check found damage and so nothing was changed.
    pub refused: bool,
}

/// A point at which a test stops a run, as a crash would (the `fail` crate's crash points
/// abort the whole process; these stop one run inside a test, leaving the vault exactly as a
/// crash there would).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopAt {
    /// After this many files are converted.
    AfterFiles(u64),
    /// When the next file after this many is written under its temporary name, before the
    /// rename.
    BeforeRename(u64),
    /// In a file with several names, after the first name was pointed at the new file.
    MidLinks,
}

/// Options of a run.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Test hook: stop there as a crash would.
    #[doc(hidden)]
    pub stop: Option<StopAt>,
    /// Asked before each file: `true` ends the run there with [`interrupted`] (a signal asked
    /// to stop). The file being converted is finished first, so no temporary is left.
    pub interrupted: Option<fn() -> bool>,
}

/// The error a run asked to stop by [`Options::interrupted`] ends with.
pub fn interrupted() -> Error {
    Error::Invalid("interrupted: run veilfs upgrade again to finish it".into())
}

impl Options {
    fn check_interrupted(&self) -> Result<()> {
        match self.interrupted {
            Some(f) if f() => Err(interrupted()),
            _ => Ok(()),
        }
    }
}

/// The error a [`StopAt`] ends a run with.
fn stopped() -> Error {
    Error::Invalid("upgrade stopped by the test hook".into())
}

/// A directory found by the walk, reopened later by its on-disk path below the top.
#[derive(Clone)]
struct DirRef {
    /// On-disk path below the top ("" for the top), `/`-separated.
    rel: String,
    iv: DirIv,
    path: PathBuf,
    plain: PathBuf,
}

/// Converts `vault` (opened with [`Vault::open_for_upgrade`], its lock held by the caller) to
/// block maps. `progress` gets the plaintext bytes of each file checked or converted.
pub fn run(vault: &mut Vault, opts: &Options, progress: &dyn Fn(Phase, u64)) -> Result<Report> {
    let mut report = Report::default();
    match status(vault.config()) {
        Status::Done => {
            report.finished = true;
            return Ok(report);
        }
        Status::Deterministic => {
            return Err(Error::Invalid(format!(
                "{} is a deterministic (reverse) vault: its files do not get block maps",
                vault.root_path().display()
            )))
        }
        Status::Fresh => {
            report.settled = crate::settle::crash_sweep(vault)?.files as u64;
            check(vault, opts, &mut report, progress)?;
            if report.problems.iter().any(Problem::holds_up) {
                report.refused = true;
                return Ok(report);
            }
            // Files left as they are: the conversion reports them again.
            report.problems.clear();
            let mut cfg = vault.config().clone();
            cfg.features.push(FEATURE_BLOCK_MAP_UPGRADE.to_string());
            vault.save_config(cfg)?;
        }
        Status::Unfinished => {}
    }
    let mut up = Upgrader::new(vault, opts, progress);
    up.leftovers(&mut report)?;
    up.convert_all(&mut report)?;
    if !report.problems.iter().any(Problem::holds_up) {
        let mut cfg = vault.config().clone();
        cfg.features.retain(|f| f != FEATURE_BLOCK_MAP_UPGRADE);
        cfg.features.push(FEATURE_BLOCK_MAP.to_string());
        vault.save_config(cfg)?;
        report.finished = true;
    }
    Ok(report)
}

/// Step 1: every file reads back whole by the v1 rules.
fn check(vault: &Vault, opts: &Options, report: &mut Report, progress: &dyn Fn(Phase, u64)) -> Result<()> {
    walk(vault, &mut |dir, d, entries, bad, _| {
        for b in bad {
            report.problems.push(bad_problem(dir, d, b));
        }
        for e in entries.iter().filter(|e| e.kind == EntryKind::File) {
            opts.check_interrupted()?;
            let read = vault.open_file(dir, e, libc::O_RDONLY).and_then(|f| f.stream::<Error>(|_| Ok(())));
            match read {
                Ok(n) => progress(Phase::Check, n),
                Err(err) => report.problems.push(problem(dir, d, e, err)),
            }
        }
        Ok(())
    })
}

/// An entry of `dir` whose name does not decode: whatever it names is not converted.
fn bad_problem(dir: &CipherDir, d: &DirRef, b: &crate::vault::BadEntry) -> Problem {
    Problem {
        cipher_path: dir.child_path(&String::from_utf8_lossy(&b.on_disk)),
        plain_path: d.plain.clone(),
        detail: b.error.to_string(),
        damaged: true,
        left: in_lost_found(d),
    }
}

fn in_lost_found(d: &DirRef) -> bool {
    d.plain.starts_with(std::str::from_utf8(crate::names::LOST_FOUND).expect("ASCII"))
}

fn problem(dir: &CipherDir, d: &DirRef, e: &Entry, err: Error) -> Problem {
    let damaged = matches!(err, Error::Auth { .. });
    Problem {
        cipher_path: dir.child_path(&e.on_disk),
        plain_path: d.plain.join(String::from_utf8_lossy(&e.name).as_ref()),
        damaged,
        left: damaged && in_lost_found(d),
        detail: err.to_string(),
    }
}

/// Calls `f` for every directory of the vault, top first, with its entries, the entries that
/// failed to decode, and the names of upgrade temporaries in it.
#[allow(clippy::type_complexity)]
fn walk(
    vault: &Vault,
    f: &mut dyn FnMut(&CipherDir, &DirRef, &[Entry], &[crate::vault::BadEntry], &[String]) -> Result<()>,
) -> Result<()> {
    let root = vault.root()?;
    let top = DirRef { rel: String::new(), iv: root.iv, path: root.path.clone(), plain: PathBuf::new() };
    walk_dir(vault, root, top, f)
}

#[allow(clippy::type_complexity)]
fn walk_dir(
    vault: &Vault,
    dir: CipherDir,
    d: DirRef,
    f: &mut dyn FnMut(&CipherDir, &DirRef, &[Entry], &[crate::vault::BadEntry], &[String]) -> Result<()>,
) -> Result<()> {
    let (entries, bad) = vault.list(&dir)?;
    let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
    let temps: Vec<String> = raw
        .into_iter()
        .filter(|r| r.name.starts_with(UPGRADE_PREFIX.as_bytes()))
        .map(|r| String::from_utf8_lossy(&r.name).into_owned())
        .collect();
    f(&dir, &d, &entries, &bad, &temps)?;
    for e in entries.iter().filter(|e| e.kind == EntryKind::Dir) {
        let sub = vault.open_dir(&dir, e)?;
        let rel = if d.rel.is_empty() { e.on_disk.clone() } else { format!("{}/{}", d.rel, e.on_disk) };
        let sd = DirRef {
            rel,
            iv: sub.iv,
            path: sub.path.clone(),
            plain: d.plain.join(String::from_utf8_lossy(&e.name).as_ref()),
        };
        walk_dir(vault, sub, sd, f)?;
    }
    Ok(())
}

/// A file with several names: where each name is.
type LinkGroup = Vec<(DirRef, Entry)>;

struct Upgrader<'a> {
    vault: &'a Vault,
    /// The context files are written with: the vault's, with the block map.
    v2: ContentCtx,
    opts: &'a Options,
    progress: &'a dyn Fn(Phase, u64),
    /// Files converted so far (for the test hook).
    done: u64,
}

impl<'a> Upgrader<'a> {
    fn new(vault: &'a Vault, opts: &'a Options, progress: &'a dyn Fn(Phase, u64)) -> Self {
        let v2 = vault.content().clone().with_block_map(true).with_stashes(vault.root_path());
        Upgrader { vault, v2, opts, progress, done: 0 }
    }

    /// Removes the temporaries of an interrupted run and finishes its `link` files.
    fn leftovers(&mut self, report: &mut Report) -> Result<()> {
        // (directory, name, file ID, the original's inode) of every `link` file.
        let mut links: Vec<(DirRef, String, crate::Identity, u64)> = Vec::new();
        let vault = self.vault;
        let v2 = &self.v2;
        walk(vault, &mut |dir, d, _, _, temps| {
            for t in temps {
                let what = dir.child_path(t);
                let link = parse_link_name(t);
                let header = header_v2(v2, dir, t);
                match (link, header) {
                    // A complete file, written and flushed before it got the name.
                    (Some((id, ino)), Some(h)) if h.id == id => links.push((d.clone(), t.clone(), id, ino)),
                    _ => {
                        if let (Some(stashes), Some(h)) = (&v2.stashes, header) {
                            // The write session's log of a file cut short, if any. The
                            // original keeps no stash: it was settled before the run.
                            let _ = stashes.remove(&h.id);
                        }
                        sys::unlinkat(dir.fd(), t.as_bytes(), false).ctx(|| what.clone())?;
                        report.leftovers.push(what);
                    }
                }
            }
            Ok(())
        })?;
        if links.is_empty() {
            return Ok(());
        }
        let mut names: HashMap<crate::Identity, LinkGroup> = HashMap::new();
        walk(vault, &mut |_, d, entries, _, _| {
            // Only names of the original inode: another file promising the same ID (a sync
            // tool's conflict copy of it, with other content) is a file of its own.
            for e in entries.iter().filter(|e| e.kind == EntryKind::File) {
                if links.iter().any(|(_, _, id, ino)| *id == e.identity && *ino == e.stat.st_ino) {
                    names.entry(e.identity).or_default().push((d.clone(), e.clone()));
                }
            }
            Ok(())
        })?;
        for (d, t, id, _) in links {
            let dir = self.reopen(&d)?;
            let group = names.remove(&id).unwrap_or_default();
            self.point_names_at(&dir, &t, &group)?;
            report.leftovers.push(dir.child_path(&t));
        }
        Ok(())
    }

    /// Step 3 over the whole vault.
    fn convert_all(&mut self, report: &mut Report) -> Result<()> {
        let mut groups: HashMap<(u64, u64), LinkGroup> = HashMap::new();
        let vault = self.vault;
        walk(vault, &mut |dir, d, entries, bad, _| {
            for b in bad {
                report.problems.push(bad_problem(dir, d, b));
            }
            keeping_dir_times(dir, || {
                for e in entries.iter().filter(|e| e.kind == EntryKind::File) {
                    if e.stat.st_nlink > 1 {
                        groups.entry((e.stat.st_dev, e.stat.st_ino)).or_default().push((d.clone(), e.clone()));
                        continue;
                    }
                    match self.convert(dir, d, e, &[]) {
                        Ok(Some(n)) => {
                            report.converted += 1;
                            report.bytes += n;
                        }
                        Ok(None) => report.unchanged += 1,
                        Err(err) if is_stop(&err) || is_interrupted(&err) => return Err(err),
                        Err(err) => report.problems.push(problem(dir, d, e, err)),
                    }
                }
                Ok(())
            })
        })?;
        let mut groups: Vec<LinkGroup> = groups.into_values().collect();
        groups.sort_by(|a, b| a[0].1.on_disk.cmp(&b[0].1.on_disk));
        for g in groups {
            let (d, e) = &g[0];
            let dir = self.reopen(d)?;
            match keeping_dir_times(&dir, || self.convert(&dir, d, e, &g[1..])) {
                Ok(Some(n)) => {
                    report.converted += 1;
                    report.linked += 1;
                    report.bytes += n;
                }
                Ok(None) => report.unchanged += 1,
                Err(err) if is_stop(&err) || is_interrupted(&err) => return Err(err),
                Err(err) => report.problems.push(problem(&dir, d, e, err)),
            }
        }
        Ok(())
    }

    fn reopen(&self, d: &DirRef) -> Result<CipherDir> {
        let root = sys::open_dir_path(self.vault.root_path()).ctx(|| self.vault.root_path().display().to_string())?;
        let fd = sys::open_dir_below(root.as_fd(), &d.rel).ctx(|| d.path.display().to_string())?;
        Ok(CipherDir::from_parts(fd, d.iv, d.path.clone()))
    }

    /// Converts the file `e` of `dir` (and its other names `others`); `None` if it needs
    /// nothing. Returns its plaintext size.
    fn convert(&mut self, dir: &CipherDir, _d: &DirRef, e: &Entry, others: &[(DirRef, Entry)]) -> Result<Option<u64>> {
        if e.stat.st_size == 0 || header_v2(&self.v2, dir, &e.on_disk).is_some() {
            return Ok(None);
        }
        self.opts.check_interrupted()?;
        if self.opts.stop == Some(StopAt::AfterFiles(self.done)) {
            return Err(stopped());
        }
        let (tmp, size) = self.write_v2(dir, e)?;
        if self.opts.stop == Some(StopAt::BeforeRename(self.done)) {
            return Err(stopped());
        }
        if others.is_empty() {
            sys::renameat2(dir.fd(), tmp.as_bytes(), dir.fd(), e.on_disk.as_bytes(), 0)
                .ctx(|| format!("renaming {} to {}", dir.child_path(&tmp), e.on_disk))?;
            sys::fsync(dir.fd()).ctx(|| format!("syncing {}", dir.path.display()))?;
        } else {
            let link = format!("{UPGRADE_LINK_PREFIX}{}.{}", b64_encode(&e.identity), e.stat.st_ino);
            sys::rename_noreplace(dir.fd(), tmp.as_bytes(), dir.fd(), link.as_bytes())
                .ctx(|| format!("renaming {} to {link}", dir.child_path(&tmp)))?;
            sys::fsync(dir.fd()).ctx(|| format!("syncing {}", dir.path.display()))?;
            let mut group: LinkGroup = vec![(_d.clone(), e.clone())];
            group.extend(others.iter().cloned());
            self.point_names_at(dir, &link, &group)?;
        }
        self.done += 1;
        (self.progress)(Phase::Convert, size);
        Ok(Some(size))
    }

    /// Points every name of `group` at the converted file `link` of `dir`, then removes
    /// `link`. Each name is replaced atomically; a crash in between leaves `link`, which the
    /// next run finishes the same way.
    fn point_names_at(&self, dir: &CipherDir, link: &str, group: &[(DirRef, Entry)]) -> Result<()> {
        let lst = sys::fstatat(dir.fd(), link.as_bytes()).ctx(|| dir.child_path(link))?;
        for (i, (d, e)) in group.iter().enumerate() {
            let target = self.reopen(d)?;
            match sys::fstatat(target.fd(), e.on_disk.as_bytes()) {
                Ok(st) if st.st_ino == lst.st_ino && st.st_dev == lst.st_dev => continue,
                Ok(_) => {}
                Err(_) => continue,
            }
            keeping_dir_times(&target, || {
                let t = temp_name();
                sys::linkat(dir.fd(), link.as_bytes(), target.fd(), t.as_bytes())
                    .ctx(|| format!("linking {} as {}", dir.child_path(link), target.child_path(&t)))?;
                sys::renameat2(target.fd(), t.as_bytes(), target.fd(), e.on_disk.as_bytes(), 0)
                    .ctx(|| format!("renaming {} to {}", target.child_path(&t), e.on_disk))?;
                sys::fsync(target.fd()).ctx(|| format!("syncing {}", target.path.display()))
            })?;
            if i == 0 && self.opts.stop == Some(StopAt::MidLinks) {
                return Err(stopped());
            }
        }
        sys::unlinkat(dir.fd(), link.as_bytes(), false).ctx(|| dir.child_path(link))?;
        sys::fsync(dir.fd()).ctx(|| format!("syncing {}", dir.path.display()))?;
        Ok(())
    }

    /// Writes the v2 form of `e` under a temporary name in `dir`, flushed, with the
    /// original's owner, mode, extended attributes and times. Returns the name and the size.
    fn write_v2(&self, dir: &CipherDir, e: &Entry) -> Result<(String, u64)> {
        let src = self.vault.open_file(dir, e, libc::O_RDONLY)?;
        let src_what = dir.child_path(&e.on_disk);
        let size = src.plain_size()?;
        let tmp = temp_name();
        let what = dir.child_path(&tmp);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let fd = sys::openat(dir.fd(), tmp.as_bytes(), flags, 0o600).ctx(|| what.clone())?;
        let dst = CryptFile::open(sys::into_file(fd), self.v2.clone(), e.identity, what.clone());
        let r = dst.and_then(|dst| {
            dst.set_session_until_settle(true);
            let r = self.copy(&src, &dst, size, &src_what).and_then(|()| self.finish(&src, &dst, &src_what, &what));
            if r.is_err() {
                dst.discard_session();
            }
            r
        });
        if let Err(err) = r {
            let _ = sys::unlinkat(dir.fd(), tmp.as_bytes(), false);
            return Err(err);
        }
        Ok((tmp, size))
    }

    /// Copies the plaintext of `src` (`size` bytes) into the empty `dst` ([`copy_plain`]).
    fn copy(&self, src: &CryptFile, dst: &CryptFile, size: u64, what: &str) -> Result<()> {
        copy_plain(src, dst, size, self.v2.layout.block_size as usize, what)
    }

    /// Settles and flushes `dst` and gives it what the backing file of `src` carries besides
    /// its content, extended attributes as stored ([`finish_copy`]).
    fn finish(&self, src: &CryptFile, dst: &CryptFile, src_what: &str, what: &str) -> Result<()> {
        let xattrs = |from: BorrowedFd<'_>, to: BorrowedFd<'_>| {
            copy_xattrs(from, to, &|_| true).ctx(|| format!("{src_what}: copying extended attributes"))
        };
        finish_copy(src, dst, src_what, what, &xattrs)
    }
}

/// Copies the plaintext of `src` (`size` bytes) into the empty `dst` (blocks of `bs`
/// bytes), leaving every all-zero block a hole (it reads as zeros, and a hole of the source
/// stays one). For every rewrite of a file into a new one: the upgrade, and a version of a
/// file that gets a fresh file ID ([`Vault::rename_fresh_at`]).
pub(crate) fn copy_plain(src: &CryptFile, dst: &CryptFile, size: u64, bs: usize, what: &str) -> Result<()> {
    let mut buf = vec![0u8; (256 * bs).min(size as usize).max(1)];
    let (mut off, mut cur) = (0u64, 0u64);
    while off < size {
        let want = buf.len().min((size - off) as usize);
        let got = src.read_at(&mut buf[..want], off, size)?;
        if got != want {
            return Err(Error::auth(what, "ended before its size while it was being read"));
        }
        // Runs of blocks that are not all zeros, written one run at a time.
        let chunk = &buf[..got];
        let mut i = 0;
        while i < chunk.len() {
            let block = |j: usize| &chunk[j..(j + bs).min(chunk.len())];
            if block(i).iter().all(|&b| b == 0) {
                i += bs;
                continue;
            }
            let start = i;
            while i < chunk.len() && !block(i).iter().all(|&b| b == 0) {
                i += bs;
            }
            let end = i.min(chunk.len());
            cur = dst.write_at(&chunk[start..end], off + start as u64, cur)?;
        }
        off += got as u64;
    }
    if cur < size {
        // Ends in zeros: the final block is written, never a hole (§5.10).
        dst.truncate(size, cur)?;
    }
    Ok(())
}

/// Settles and flushes `dst` and gives it what the backing file of `src` carries besides
/// its content: owner, mode (set-ID bits included), extended attributes (by `xattrs`, from
/// the source's backing fd to the copy's), times. The access time is the original's as the
/// copy's own reads left it (any reader's reads move it the same way, by the backing mount's
/// atime rules); the change time is now.
pub(crate) fn finish_copy(
    src: &CryptFile,
    dst: &CryptFile,
    src_what: &str,
    what: &str,
    xattrs: &dyn Fn(BorrowedFd<'_>, BorrowedFd<'_>) -> Result<()>,
) -> Result<()> {
    dst.sync(false)?;
    let sfd = src.backing().as_fd();
    let dfd = dst.backing().as_fd();
    let st = sys::fstat(sfd).ctx(|| src_what.to_string())?;
    let mine = sys::fstat(dfd).ctx(|| what.to_string())?;
    if (st.st_uid, st.st_gid) != (mine.st_uid, mine.st_gid) {
        sys::chown_fd(dfd, st.st_uid, st.st_gid).ctx(|| {
            format!(
                "{}: giving the new file its owner {}:{} (run this as root, or as that owner)",
                what, st.st_uid, st.st_gid
            )
        })?;
    }
    sys::chmod_fd(dfd, st.st_mode & 0o7777).ctx(|| what.to_string())?;
    xattrs(sfd, dfd)?;
    let ts = [
        libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
        libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
    ];
    sys::utimens_fd(dfd, &ts).ctx(|| what.to_string())?;
    sys::fsync(dfd).ctx(|| format!("syncing {what}"))?;
    Ok(())
}

/// Runs `f`, which makes and renames names in `dir`, and gives `dir` back the access and
/// modification times it had before: a conversion changes no directory's listing, so its
/// times should not change either (export and `ls -l` show them). Best effort: a directory
/// the caller may not set times of keeps the new ones.
fn keeping_dir_times<T>(dir: &CipherDir, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let before = sys::fstat(dir.fd()).ok();
    let r = f();
    if let Some(st) = before {
        let ts = [
            libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
            libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
        ];
        if let Err(e) = sys::utimens_fd(dir.fd(), &ts) {
            tracing::debug!("{}: times not restored: {e}", dir.path.display());
        }
    }
    r
}

/// Whether `e` is [`interrupted`].
pub fn is_interrupted(e: &Error) -> bool {
    matches!((e, interrupted()), (Error::Invalid(a), Error::Invalid(b)) if *a == b)
}

fn is_stop(e: &Error) -> bool {
    matches!(e, Error::Invalid(m) if m == "upgrade stopped by the test hook")
}

/// The file ID and original inode a `link` name `veilfs.upgrade.link.<b64(ID)>.<inode>`
/// carries (`None` for any other name).
fn parse_link_name(name: &str) -> Option<(crate::Identity, u64)> {
    let (id, ino) = name.strip_prefix(UPGRADE_LINK_PREFIX)?.split_once('.')?;
    Some((b64_decode(id)?.try_into().ok()?, ino.parse().ok()?))
}

/// A fresh temporary name of the upgrade (`veilfs.upgrade.` and 96 random bits).
fn temp_name() -> String {
    format!("{UPGRADE_PREFIX}{}", b64_encode(&crate::random::bytes::<12>()))
}

/// The header v2 of the file `name` of `dir`, if there is one and it authenticates.
fn header_v2(v2: &ContentCtx, dir: &CipherDir, name: &str) -> Option<HeaderV2> {
    let (fd, _) = sys::open_regular_at(dir.fd(), name.as_bytes(), libc::O_RDONLY).ok()?;
    let mut buf = [0u8; HEADER_V2_LEN];
    (sys::pread_full(fd.as_fd(), &mut buf, 0).ok()? == HEADER_V2_LEN).then_some(())?;
    HeaderV2::decode(&buf, &v2.keys).ok()
}

/// Copies every extended attribute of the backing file `from` whose stored name `keep`
/// accepts to `to` as stored (the vault's encrypted attributes are bound to the file's ID,
/// not to the inode, so they stay valid for a copy with the same ID). An attribute of a
/// namespace the caller may not set (`trusted.*` unless root, `security.*` set by the system)
/// is skipped.
pub(crate) fn copy_xattrs(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    keep: &dyn Fn(&[u8]) -> bool,
) -> std::io::Result<()> {
    let (f, t) = (sys::XattrTarget::Fd(from), sys::XattrTarget::Fd(to));
    let names = match f.list_all() {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty() && keep(n)) {
        let mut value = vec![0u8; f.get(name, &mut [])? + 256];
        let n = f.get(name, &mut value)?;
        value.truncate(n);
        match t.set(name, &value, 0) {
            Ok(()) => {}
            Err(e) if !name.starts_with(b"user.") && matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOTSUP)) => {
                tracing::debug!("not copied: attribute {}: {e}", String::from_utf8_lossy(name));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether `name` is one of the upgrade's temporaries (`veilfs.upgrade.*`).
pub fn is_temp_name(name: &[u8]) -> bool {
    name.starts_with(UPGRADE_PREFIX.as_bytes())
}
