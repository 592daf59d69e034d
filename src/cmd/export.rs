//! `veilfs export`: decrypt a vault (or part of it) into a plain folder without mounting.
//! Also the disaster-recovery tool: a damaged file is reported by name and skipped (or, with
//! `--salvage`, written with every block that authenticates and its lost ranges named), and
//! everything else still comes out.

use super::{Conflict, UnlockArgs};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use veilfs_core::sys::{self, Stat};
use veilfs_core::{CipherDir, Entry, EntryKind, Vault};

/// Arguments of `veilfs export`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Like `cp -a`: modes, times, symlinks, hard links and user.* extended attributes are \
kept, owners too when run as root. Set-user-id and set-group-id bits of files and device nodes are not restored \
unless --preserve-special is given: whoever could write the ciphertext chose them. Files that fail \
authentication (tampered or damaged) are named on stderr and left out; the rest is exported and the exit \
code is 6. With --salvage a damaged file whose header still authenticates is written under its name with \
every block that authenticates: lost ranges inside read as zeros, a lost end is cut off, and each lost byte \
range is named on stderr (the exit code stays 6; the file gets the current time, so a later run does not take \
it for a complete copy).\n\n\
Interrupted exports resume: each file is written under a temporary name beside its destination \
(.veilfs-part-PID-N) and renamed when complete, with its mode and times; directories get theirs last \
(Ctrl-C removes the file being written; a re-run removes what a killed one left). Run the same command again: a \
file already in the destination with the same size and modification time (to the second, rsync's quick check) \
is skipped as identical; one that differs is a conflict, reported and kept unless --overwrite replaces it. The \
last line counts files exported, skipped as identical, conflicts and errors; exit code 1 if there were conflicts \
or errors. Reading only, export works while the vault is mounted.")]
pub struct Args {
    /// CIPHERDIR, optionally followed by a plaintext path inside the vault.
    pub src: PathBuf,
    /// Destination folder (created if missing).
    pub dest: PathBuf,
    /// Also restore set-user-id/set-group-id bits of files and recreate device nodes.
    #[arg(long)]
    pub preserve_special: bool,
    /// Replace files in the destination that differ from the vault's (never a directory).
    #[arg(long)]
    pub overwrite: bool,
    /// Write what still authenticates of a damaged file under its name (zeros for lost
    /// ranges inside, a lost end cut off) and name each lost byte range; exit code 6 still.
    #[arg(long)]
    pub salvage: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
}

struct Exporter<'a> {
    vault: &'a Vault,
    /// First exported name of each hard-linked inode, by the vault's (device, inode).
    links: HashMap<(u64, u64), FirstName>,
    damaged: usize,
    errors: usize,
    /// Regular files and their bytes written, entries skipped as identical, conflicts (for
    /// the summary line).
    files: u64,
    bytes: u64,
    skipped: usize,
    conflicts: usize,
    pb: indicatif::ProgressBar,
    is_root: bool,
    preserve_special: bool,
    /// Replace differing files (`--overwrite`).
    overwrite: bool,
    /// Write the authenticated part of damaged files (`--salvage`).
    salvage: bool,
    /// Damaged files written in part (`--salvage`).
    salvaged: usize,
    /// Set-id bits not restored and device nodes not made (without --preserve-special).
    withheld: usize,
    /// Attributes the destination could not hold.
    xattrs_lost: usize,
    /// Directories whose times are set after their contents.
    dir_times: Vec<(PathBuf, Stat)>,
    /// Temporary names handed out.
    seq: u64,
}

/// The first exported name of a hard-linked inode: its path, the identity its entry
/// promised, and its (device, inode) in the destination.
type FirstName = (PathBuf, veilfs_core::Identity, (u64, u64));

/// Prefix of the temporary names files are written under (`.veilfs-part-PID-N`).
const TEMP_PREFIX: &str = ".veilfs-part-";

/// Whether `name` is one of our temporary names.
fn is_temp_name(name: &[u8]) -> bool {
    name.strip_prefix(TEMP_PREFIX.as_bytes()).is_some_and(|rest| {
        let mut parts = rest.split(|&b| b == b'-');
        let digits = |p: Option<&[u8]>| p.is_some_and(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit));
        digits(parts.next()) && digits(parts.next()) && parts.next().is_none()
    })
}

/// Renames the finished `tmp` to `out`: over an existing `out` only when `replace`; else an
/// `out` that appeared meanwhile is a conflict.
fn place(tmp: &Path, out: &Path, replace: bool) -> Result<()> {
    let flags = if replace { 0 } else { libc::RENAME_NOREPLACE };
    // Relative to the working directory, like the paths themselves.
    let (a, b) = (tmp.as_os_str().as_bytes(), out.as_os_str().as_bytes());
    let Err(e) = sys::renameat2(sys::CWD, a, sys::CWD, b, flags) else { return Ok(()) };
    if !replace && e.raw_os_error() == Some(libc::EINVAL) && std::fs::symlink_metadata(out).is_err() {
        // A destination filesystem without RENAME_NOREPLACE (some network filesystems).
        return std::fs::rename(tmp, out).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()));
    }
    if e.kind() == std::io::ErrorKind::AlreadyExists {
        return Err(Conflict("appeared in the destination during the export; kept (--overwrite replaces it)").into());
    }
    Err(e).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))
}

fn set_times(path: &Path, st: &Stat, follow: bool) -> std::io::Result<()> {
    let ts = [
        libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
        libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
    ];
    let path = path.as_os_str().as_bytes();
    if follow {
        sys::utimensat_follow(sys::CWD, path, &ts)
    } else {
        sys::utimensat(sys::CWD, path, &ts)
    }
}

impl Exporter<'_> {
    fn note(&mut self, what: &str, e: &anyhow::Error) {
        if crate::interrupt::is(e) {
            return;
        }
        if e.is::<Conflict>() {
            self.conflicts += 1;
            self.pb.suspend(|| eprintln!("veilfs: export: {what}: conflict: {e}"));
            return;
        }
        let integrity = crate::exit::classify(e) == crate::exit::INTEGRITY;
        if integrity {
            self.damaged += 1;
        } else {
            self.errors += 1;
        }
        let label = match (integrity, self.salvage) {
            (true, true) => "DAMAGED, not exported (nothing of it authenticates)",
            (true, false) => "DAMAGED, not exported (--salvage writes what authenticates)",
            (false, _) => "error",
        };
        self.pb.suspend(|| eprintln!("veilfs: export: {what}: {label}: {e:#}"));
    }

    fn export_dir(&mut self, dir: &CipherDir, dest: &Path) {
        let (entries, bad) = match self.vault.list(dir) {
            Ok(x) => x,
            Err(e) => return self.note(&dest.display().to_string(), &e.into()),
        };
        for b in bad {
            let e: anyhow::Error = b.error.into();
            self.note(&format!("{} (ciphertext entry {})", dest.display(), String::from_utf8_lossy(&b.on_disk)), &e);
        }
        self.remove_leftovers(dest, &entries);
        for e in entries {
            if crate::interrupt::requested() {
                return;
            }
            let out = dest.join(OsStr::from_bytes(&e.name));
            if let Err(err) = self.export_entry(dir, &e, &out) {
                self.note(&format!("{} (ciphertext {})", out.display(), dir.path.join(&e.on_disk).display()), &err);
            }
        }
    }

    /// Removes the temporary files a killed export left in `dest` (a vault entry that
    /// happens to have such a name is left alone).
    fn remove_leftovers(&mut self, dest: &Path, entries: &[Entry]) {
        let Ok(it) = std::fs::read_dir(dest) else { return };
        for d in it.flatten() {
            let name = d.file_name();
            if is_temp_name(name.as_bytes())
                && d.file_type().is_ok_and(|t| !t.is_dir())
                && !entries.iter().any(|e| e.name == name.as_bytes())
            {
                match std::fs::remove_file(d.path()) {
                    Ok(()) => tracing::info!("removed {}, left by an interrupted export", d.path().display()),
                    Err(e) => tracing::warn!("cannot remove {}: {e}", d.path().display()),
                }
            }
        }
    }

    /// A fresh temporary name beside `out`.
    fn temp_beside(&mut self, out: &Path) -> PathBuf {
        self.seq += 1;
        out.with_file_name(format!("{TEMP_PREFIX}{}-{}", std::process::id(), self.seq))
    }

    /// Whether `x` (what is at the destination already) is a complete copy of the vault's `e`:
    /// the same size and modification time to the second for files (rsync's quick check),
    /// the same target for symlinks, the same type and device number for special files.
    fn identical(&self, dir: &CipherDir, e: &Entry, out: &Path, x: &std::fs::Metadata) -> bool {
        let st = &e.stat;
        match e.kind {
            EntryKind::File => {
                x.is_file()
                    && x.len() == self.vault.content().layout.plain_size_lenient(st.st_size as u64)
                    && x.mtime() == st.st_mtime
            }
            EntryKind::Symlink => {
                x.is_symlink()
                    && matches!((std::fs::read_link(out), self.vault.readlink(dir, e)),
                                (Ok(a), Ok(b)) if a.as_os_str().as_bytes() == b)
            }
            EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice => {
                x.mode() & libc::S_IFMT == st.st_mode & libc::S_IFMT && x.rdev() == st.st_rdev
            }
            EntryKind::Dir => x.is_dir(),
        }
    }

    /// Makes a non-directory at a temporary name beside `out` with `make`, then renames it to
    /// `out` (replacing what is there only when `replace`); the temporary file is removed if
    /// anything fails.
    fn make_and_place(
        &mut self,
        out: &Path,
        replace: bool,
        make: impl FnOnce(&mut Self, &Path) -> Result<()>,
    ) -> Result<()> {
        let tmp = self.temp_beside(out);
        let r = make(self, &tmp).and_then(|()| place(&tmp, out, replace));
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    fn export_entry(&mut self, dir: &CipherDir, e: &Entry, out: &Path) -> Result<()> {
        let st = e.stat;
        let existing = std::fs::symlink_metadata(out).ok();
        if e.kind == EntryKind::Dir {
            return self.export_subdir(dir, e, out, existing);
        }
        let replace = match &existing {
            None => false,
            Some(x) if self.identical(dir, e, out, x) || self.same_inode_as_first(e, x) => {
                self.skipped += 1;
                self.pb.inc(if e.kind == EntryKind::File { x.len() } else { 0 });
                if st.st_nlink > 1 {
                    self.links.entry((st.st_dev, st.st_ino)).or_insert((
                        out.to_path_buf(),
                        e.identity,
                        (x.dev(), x.ino()),
                    ));
                }
                return Ok(());
            }
            Some(x) if x.is_dir() => return Err(Conflict("is a directory in the destination; kept").into()),
            Some(_) if !self.overwrite => {
                return Err(Conflict(
                    "already in the destination and different (size, modification time, type or target); kept \
                     (--overwrite replaces it)",
                )
                .into())
            }
            Some(_) => true,
        };
        if st.st_nlink > 1 {
            // Another name of an inode already exported: a link, but only if this name
            // promises the same identity (a hard link planted under another file's name
            // is read and verified like any file, and fails).
            if let Some((first, id, _)) = self.links.get(&(st.st_dev, st.st_ino)) {
                if *id == e.identity {
                    let first = first.clone();
                    return self.make_and_place(out, replace, |_, tmp| Ok(std::fs::hard_link(&first, tmp)?));
                }
            }
        }
        // Type and (in a vault with `special-kinds`) device number were verified with the
        // entry's binding (Vault::verified_identity), from this same `stat`.
        if e.kind.is_device() && !self.preserve_special {
            self.withheld += 1;
            self.pb.suspend(|| {
                eprintln!("veilfs: export: {}: device node not made (--preserve-special makes it)", out.display())
            });
            return Ok(());
        }
        let mut size = 0;
        let r = self.make_and_place(out, replace, |ex, tmp| {
            match e.kind {
                EntryKind::File => size = ex.export_file(dir, e, tmp)?,
                EntryKind::Symlink => {
                    let target = ex.vault.readlink(dir, e)?;
                    std::os::unix::fs::symlink(OsStr::from_bytes(&target), tmp)?;
                }
                _ => {
                    // Mode and rdev come from the backing stat.
                    sys::mknodat(sys::CWD, tmp.as_os_str().as_bytes(), st.st_mode, st.st_rdev).context("mknod")?;
                }
            }
            if e.kind != EntryKind::Symlink {
                ex.copy_xattrs(dir, e, tmp)?;
            }
            ex.finish_meta(tmp, out, &st, e.kind != EntryKind::Symlink)
        });
        match r {
            Err(err)
                if self.salvage
                    && e.kind == EntryKind::File
                    && crate::exit::classify(&err) == crate::exit::INTEGRITY =>
            {
                return self.salvage_file(dir, e, out, replace, err);
            }
            r => r?,
        }
        if e.kind == EntryKind::File {
            self.files += 1;
            self.bytes += size;
        }
        if st.st_nlink > 1 {
            let m = std::fs::symlink_metadata(out)?;
            self.links.insert((st.st_dev, st.st_ino), (out.to_path_buf(), e.identity, (m.dev(), m.ino())));
        }
        Ok(())
    }

    /// Whether `x` is the destination inode of an earlier name of `e`'s inode (a hard link
    /// made by an earlier run).
    fn same_inode_as_first(&self, e: &Entry, x: &std::fs::Metadata) -> bool {
        self.links
            .get(&(e.stat.st_dev, e.stat.st_ino))
            .is_some_and(|(_, id, ino)| *id == e.identity && *ino == (x.dev(), x.ino()))
    }

    /// A vault directory: merged into the destination directory of that name (made if
    /// missing), private while it is filled; its mode comes once its contents are in, its
    /// times at the very end.
    fn export_subdir(
        &mut self,
        dir: &CipherDir,
        e: &Entry,
        out: &Path,
        existing: Option<std::fs::Metadata>,
    ) -> Result<()> {
        let sub = self.vault.open_dir(dir, e)?;
        match existing {
            Some(x) if x.is_dir() => {}
            Some(_) if !self.overwrite => {
                return Err(Conflict(
                    "exists in the destination and is not a directory; kept (--overwrite replaces it)",
                )
                .into())
            }
            Some(_) => {
                std::fs::remove_file(out)?;
                std::fs::create_dir(out)?;
            }
            None => std::fs::create_dir(out)?,
        }
        std::fs::set_permissions(out, std::fs::Permissions::from_mode(0o700))?;
        self.export_dir(&sub, out);
        if crate::interrupt::requested() {
            return Ok(());
        }
        self.copy_xattrs(dir, e, out)?;
        self.finish_meta(out, out, &e.stat, true)?;
        self.dir_times.push((out.to_path_buf(), e.stat));
        Ok(())
    }

    /// Decrypts the file `e` into the new file `tmp`; returns its size.
    fn export_file(&mut self, dir: &CipherDir, e: &Entry, tmp: &Path) -> Result<u64> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = self.vault.open_file(dir, e, libc::O_RDONLY)?;
        let mut w = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(tmp)?;
        let pb = &self.pb;
        let size = f.stream(|piece| -> Result<()> {
            crate::interrupt::check()?;
            std::io::Write::write_all(&mut w, piece)?;
            pb.inc(piece.len() as u64);
            Ok(())
        })?;
        Ok(size)
    }

    /// `--salvage`: writes what authenticates of the damaged file `e` (`damage` says how it
    /// failed) under `out` and says which byte ranges were lost. Fails (leaving the file out)
    /// when its header does not authenticate or no block does.
    fn salvage_file(
        &mut self,
        dir: &CipherDir,
        e: &Entry,
        out: &Path,
        replace: bool,
        damage: anyhow::Error,
    ) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = match self.vault.open_file(dir, e, libc::O_RDONLY) {
            Ok(f) => f,
            Err(_) => return Err(damage),
        };
        let mut got = None;
        let r = self.make_and_place(out, replace, |ex, tmp| {
            let mut w = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(tmp)?;
            let s = f.salvage(|piece| {
                crate::interrupt::check().map_err(|_| veilfs_core::Error::Invalid("interrupted".into()))?;
                std::io::Write::write_all(&mut w, piece)
                    .map_err(|x| veilfs_core::Error::io(tmp.display().to_string(), x))
            })?;
            if s.kept == 0 {
                anyhow::bail!("nothing authenticates");
            }
            ex.copy_xattrs(dir, e, tmp)?;
            if ex.is_root {
                std::os::unix::fs::lchown(tmp, Some(e.stat.st_uid), Some(e.stat.st_gid))?;
            }
            std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(e.stat.st_mode & 0o777))?;
            got = Some(s);
            Ok(())
        });
        let s = match (r, got) {
            (Ok(()), Some(s)) => s,
            _ => return Err(damage),
        };
        self.damaged += 1;
        self.salvaged += 1;
        let lost: Vec<String> = s.lost.iter().map(|(a, b)| format!("{a}..{b}")).collect();
        self.pb.suspend(|| {
            eprintln!(
                "veilfs: export: {} (ciphertext {}): DAMAGED, salvaged: {damage:#}; {} bytes authenticated, lost byte \
                 ranges: {} (zeros inside the file, cut off at its end)",
                out.display(),
                dir.path.join(&e.on_disk).display(),
                s.kept,
                lost.join(", ")
            )
        });
        Ok(())
    }

    /// Copies the `user.*` attributes of `e` onto `out`; a destination that cannot hold them
    /// is counted (and said once at the end), not an error.
    fn copy_xattrs(&mut self, dir: &CipherDir, e: &Entry, out: &Path) -> Result<()> {
        let c = std::ffi::CString::new(out.as_os_str().as_bytes())?;
        for (name, value) in self.vault.xattrs(dir, e)? {
            if let Err(err) = sys::lsetxattr(&c, &name, &value, 0) {
                if matches!(err.raw_os_error(), Some(libc::ENOTSUP | libc::EPERM)) {
                    self.xattrs_lost += 1;
                    continue;
                }
                return Err(err).with_context(|| format!("setting an extended attribute on {}", out.display()));
            }
        }
        Ok(())
    }

    /// Owner, mode and times of `path` from `st`; `label` names it in messages (the final
    /// name of a file still under its temporary name).
    fn finish_meta(&mut self, path: &Path, label: &Path, st: &Stat, chmod: bool) -> Result<()> {
        if self.is_root {
            std::os::unix::fs::lchown(path, Some(st.st_uid), Some(st.st_gid))?;
        }
        if chmod {
            let mut mode = st.st_mode & 0o7777;
            let set_id = libc::S_ISUID | libc::S_ISGID;
            // A directory's set-group-id bit only passes its group on; a file's runs code as
            // its owner or group, so it comes back only when asked for.
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR && mode & set_id != 0 && !self.preserve_special {
                mode &= !set_id;
                self.withheld += 1;
                self.pb.suspend(|| {
                    eprintln!(
                        "veilfs: export: {}: set-user-id/set-group-id bit not restored (--preserve-special restores it)",
                        label.display()
                    )
                });
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        }
        set_times(path, st, false)?;
        Ok(())
    }
}

/// Runs `veilfs export`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.src)?;
    let vault = a.unlock.open(&t.cipherdir)?;
    crate::interrupt::catch();
    let (parent, entry) = vault.resolve(&t.inner).map_err(|e| super::plain_path_error(e, &a.src))?;
    let is_root = sys::euid() == 0;
    let total = match &entry {
        Some(e) if e.kind == EntryKind::Dir => {
            super::plain_bytes_under(&parent.path.join(&e.on_disk), &vault.content().layout)
        }
        Some(e) => vault.content().layout.plain_size_lenient(e.stat.st_size as u64),
        None => super::plain_bytes_under(&parent.path, &vault.content().layout),
    };
    let pb = super::progress(total, "exporting");
    let mut ex = Exporter {
        vault: &vault,
        links: HashMap::new(),
        damaged: 0,
        errors: 0,
        files: 0,
        bytes: 0,
        pb,
        is_root,
        preserve_special: a.preserve_special,
        overwrite: a.overwrite,
        salvage: a.salvage,
        salvaged: 0,
        skipped: 0,
        conflicts: 0,
        withheld: 0,
        xattrs_lost: 0,
        dir_times: Vec::new(),
        seq: 0,
    };
    match entry {
        None if t.inner.as_os_str().is_empty() => {
            std::fs::create_dir_all(&a.dest).with_context(|| format!("creating {}", a.dest.display()))?;
            ex.export_dir(&parent, &a.dest);
        }
        None => return Err(super::not_found(&a.src).into()),
        Some(e) => {
            let out = if a.dest.is_dir() { a.dest.join(OsStr::from_bytes(&e.name)) } else { a.dest.clone() };
            if let Err(err) = ex.export_entry(&parent, &e, &out) {
                ex.note(&out.display().to_string(), &err);
            }
        }
    }
    // Directory times last: writing into a directory changes its mtime.
    for (p, st) in std::mem::take(&mut ex.dir_times).iter().rev() {
        let _ = set_times(p, st, false);
    }
    ex.pb.finish_and_clear();
    if ex.xattrs_lost > 0 {
        eprintln!(
            "veilfs: export: {} extended attribute(s) not kept: {} cannot hold user.* attributes",
            ex.xattrs_lost,
            a.dest.display()
        );
    }
    let errors = match (ex.damaged, ex.salvaged) {
        (0, _) => super::count(ex.errors, "error"),
        (n, 0) => format!("{} left out, {}", super::count(n, "damaged item"), super::count(ex.errors, "other error")),
        (n, k) => format!(
            "{} ({k} salvaged in part, {} left out), {}",
            super::count(n, "damaged item"),
            n - k,
            super::count(ex.errors, "other error")
        ),
    };
    super::summary("exported", ex.files, ex.bytes, ex.skipped, ex.conflicts, &errors);
    super::say_if_interrupted("export");
    Ok(if ex.damaged > 0 {
        crate::exit::INTEGRITY
    } else if ex.errors + ex.conflicts > 0 {
        crate::exit::OTHER
    } else {
        crate::exit::OK
    })
}
