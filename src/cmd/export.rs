//! `veilfs export`: decrypt a vault (or part of it) into a plain folder without mounting.
//! Also the disaster-recovery tool: a damaged file is reported by name and skipped (or, with
//! `--salvage`, written with every block that authenticates and its lost ranges named), and
//! everything else still comes out.

use super::{Conflict, UnlockArgs};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use veilfs_core::plaintree::{kind, Node, PlainDir};
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
or errors. Reading only, export works while the vault is mounted.\n\n\
DEST is opened by path once (following a symlink there is your choice, as with cp); below it nothing follows a \
symlink: each name is opened through the directory above it, and files are made, given owner, mode, times and \
attributes, and renamed inside that directory, so a user who owns a directory of the destination (a restore run \
as root into /home) cannot redirect the export by swapping names for symlinks (docs/SECURITY.md, section 7d).")]
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
    #[command(flatten)]
    pub rollback: super::RollbackArgs,
}

struct Exporter<'a> {
    vault: &'a Vault,
    /// The top of the destination: the directory given, or the one holding the name given
    /// (opened by path once; everything below it is reached through fds).
    top: Option<Rc<PlainDir>>,
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
    dir_times: Vec<DirTimes>,
    /// Temporary names handed out.
    seq: u64,
}

/// A directory whose times are set after its contents: its names from the top, the
/// (device, inode) made or merged into, and the times.
type DirTimes = (Vec<Vec<u8>>, (u64, u64), Stat);

/// The first exported name of a hard-linked inode: its directory (names from the top) and
/// name, the identity its entry promised, and its (device, inode) in the destination.
type FirstName = (Vec<Vec<u8>>, Vec<u8>, veilfs_core::Identity, (u64, u64));

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

/// Renames the finished `tmp` to `name`, both in `dest`: over an existing `name` only when
/// `replace`; else a `name` that appeared meanwhile is a conflict.
fn place(dest: &PlainDir, tmp: &[u8], name: &[u8], replace: bool) -> Result<()> {
    match dest.rename(tmp, name, replace) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(Conflict("appeared in the destination during the export; kept (--overwrite replaces it)").into())
        }
        Err(e) => {
            Err(e).with_context(|| format!("renaming {} to {}", dest.join(tmp).display(), dest.join(name).display()))
        }
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

    fn export_dir(&mut self, dir: &CipherDir, dest: &PlainDir) {
        let (entries, bad) = match self.vault.list(dir) {
            Ok(x) => x,
            Err(e) => return self.note(&dest.path().display().to_string(), &e.into()),
        };
        for b in bad {
            if b.on_disk.is_empty() {
                // A finding on the directory itself (entries deleted by a non-client): what is
                // there is exported, and the export ends as one that met damage.
                self.damaged += 1;
                let e = b.error;
                self.pb.suspend(|| eprintln!("veilfs: export: {}: {e}", dest.path().display()));
                continue;
            }
            let e: anyhow::Error = b.error.into();
            self.note(
                &format!("{} (ciphertext entry {})", dest.path().display(), String::from_utf8_lossy(&b.on_disk)),
                &e,
            );
        }
        self.remove_leftovers(dest, &entries);
        for e in entries {
            if crate::interrupt::requested() {
                return;
            }
            if let Err(err) = self.export_entry(dir, &e, dest, &e.name) {
                let out = dest.join(&e.name);
                self.note(&format!("{} (ciphertext {})", out.display(), dir.path.join(&e.on_disk).display()), &err);
            }
        }
    }

    /// Removes the temporary files a killed export left in `dest` (a vault entry that
    /// happens to have such a name is left alone).
    fn remove_leftovers(&mut self, dest: &PlainDir, entries: &[Entry]) {
        let Ok(names) = dest.names() else { return };
        for name in names {
            if is_temp_name(&name)
                && dest.stat_at(&name).is_ok_and(|x| x.is_some_and(|x| kind(&x) != libc::S_IFDIR))
                && !entries.iter().any(|e| e.name == name)
            {
                match dest.remove(&name) {
                    Ok(()) => tracing::info!("removed {}, left by an interrupted export", dest.join(&name).display()),
                    Err(e) => tracing::warn!("cannot remove {}: {e}", dest.join(&name).display()),
                }
            }
        }
    }

    /// A fresh temporary name.
    fn temp_name(&mut self) -> Vec<u8> {
        self.seq += 1;
        format!("{TEMP_PREFIX}{}-{}", std::process::id(), self.seq).into_bytes()
    }

    /// Whether `x` (what is at `name` in `dest` already) is a complete copy of the vault's
    /// `e`: the same size and modification time to the second for files (rsync's quick
    /// check), the same target for symlinks, the same type and device number for special
    /// files.
    fn identical(&self, dir: &CipherDir, e: &Entry, dest: &PlainDir, name: &[u8], x: &Stat) -> bool {
        let st = &e.stat;
        match e.kind {
            EntryKind::File => {
                kind(x) == libc::S_IFREG
                    && x.st_size as u64 == self.vault.content().plain_size_lenient(st.st_size as u64)
                    && x.st_mtime == st.st_mtime
            }
            EntryKind::Symlink => {
                kind(x) == libc::S_IFLNK
                    && matches!((dest.readlink(name), self.vault.readlink(dir, e)), (Ok(a), Ok(b)) if a == b)
            }
            EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice => {
                kind(x) == st.st_mode & libc::S_IFMT && x.st_rdev == st.st_rdev
            }
            EntryKind::Dir => kind(x) == libc::S_IFDIR,
        }
    }

    /// Makes a non-directory at a temporary name in `dest` with `make`, then renames it to
    /// `name` there (replacing what is there only when `replace`); the temporary file is
    /// removed if anything fails.
    fn make_and_place(
        &mut self,
        dest: &PlainDir,
        name: &[u8],
        replace: bool,
        make: impl FnOnce(&mut Self, &PlainDir, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let tmp = self.temp_name();
        let r = make(self, dest, &tmp).and_then(|()| place(dest, &tmp, name, replace));
        if r.is_err() {
            let _ = dest.remove(&tmp);
        }
        r
    }

    fn export_entry(&mut self, dir: &CipherDir, e: &Entry, dest: &PlainDir, name: &[u8]) -> Result<()> {
        let st = e.stat;
        let existing = dest.stat_at(name).ok().flatten();
        if e.kind == EntryKind::Dir {
            return self.export_subdir(dir, e, dest, name, existing);
        }
        let replace = match &existing {
            None => false,
            Some(x) if self.identical(dir, e, dest, name, x) || self.same_inode_as_first(e, x) => {
                self.skipped += 1;
                self.pb.inc(if e.kind == EntryKind::File { x.st_size as u64 } else { 0 });
                if st.st_nlink > 1 {
                    self.links.entry((st.st_dev, st.st_ino)).or_insert((
                        dest.rel().to_vec(),
                        name.to_vec(),
                        e.identity,
                        (x.st_dev, x.st_ino),
                    ));
                }
                return Ok(());
            }
            Some(x) if kind(x) == libc::S_IFDIR => {
                return Err(Conflict("is a directory in the destination; kept").into())
            }
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
            if let Some((rel, first, id, ino)) = self.links.get(&(st.st_dev, st.st_ino)) {
                if *id == e.identity {
                    let (rel, first, ino) = (rel.clone(), first.clone(), *ino);
                    return self.make_and_place(dest, name, replace, |ex, d, tmp| {
                        let top = ex.top.clone().context("no destination")?;
                        let from = top.open_below(&rel)?;
                        Ok(d.link(&from, &first, tmp, ino)?)
                    });
                }
            }
        }
        // Type and (in a vault with `special-kinds`) device number were verified with the
        // entry's binding (Vault::verified_identity), from this same `stat`.
        if e.kind.is_device() && !self.preserve_special {
            self.withheld += 1;
            let out = dest.join(name);
            self.pb.suspend(|| {
                eprintln!("veilfs: export: {}: device node not made (--preserve-special makes it)", out.display())
            });
            return Ok(());
        }
        let mut size = 0;
        let mut made = (0, 0);
        let r = self.make_and_place(dest, name, replace, |ex, d, tmp| {
            let node = match e.kind {
                EntryKind::File => {
                    let (node, n) = ex.export_file(dir, e, d, tmp)?;
                    size = n;
                    node
                }
                EntryKind::Symlink => d.symlink(&ex.vault.readlink(dir, e)?, tmp)?,
                // Mode and rdev come from the backing stat.
                _ => d.mknod(tmp, st.st_mode, st.st_rdev).context("mknod")?,
            };
            made = (node.stat.st_dev, node.stat.st_ino);
            if e.kind != EntryKind::Symlink {
                ex.copy_xattrs(dir, e, &node, &d.join(tmp))?;
            }
            ex.finish_meta(&node, &d.join(name), &st, e.kind != EntryKind::Symlink)
        });
        match r {
            Err(err)
                if self.salvage
                    && e.kind == EntryKind::File
                    && crate::exit::classify(&err) == crate::exit::INTEGRITY =>
            {
                return self.salvage_file(dir, e, dest, name, replace, err);
            }
            r => r?,
        }
        if e.kind == EntryKind::File {
            self.files += 1;
            self.bytes += size;
        }
        if st.st_nlink > 1 {
            self.links.insert((st.st_dev, st.st_ino), (dest.rel().to_vec(), name.to_vec(), e.identity, made));
        }
        Ok(())
    }

    /// Whether `x` is the destination inode of an earlier name of `e`'s inode (a hard link
    /// made by an earlier run).
    fn same_inode_as_first(&self, e: &Entry, x: &Stat) -> bool {
        self.links
            .get(&(e.stat.st_dev, e.stat.st_ino))
            .is_some_and(|(_, _, id, ino)| *id == e.identity && *ino == (x.st_dev, x.st_ino))
    }

    /// A vault directory: merged into the destination directory `name` of `dest` (made if
    /// missing; never reached through a symlink), private while it is filled; its mode
    /// comes once its contents are in, its times at the very end.
    fn export_subdir(
        &mut self,
        dir: &CipherDir,
        e: &Entry,
        dest: &PlainDir,
        name: &[u8],
        existing: Option<Stat>,
    ) -> Result<()> {
        let sub = self.vault.open_dir(dir, e)?;
        let out = match existing {
            Some(x) if kind(&x) == libc::S_IFDIR => dest.open_dir_private(name)?,
            Some(_) if !self.overwrite => {
                return Err(Conflict(
                    "exists in the destination and is not a directory; kept (--overwrite replaces it)",
                )
                .into())
            }
            Some(_) => {
                dest.remove(name)?;
                dest.make_dir(name)?
            }
            None => dest.make_dir(name)?,
        };
        let node = out.node()?;
        node.set_mode(0o700)?;
        self.export_dir(&sub, &out);
        if crate::interrupt::requested() {
            return Ok(());
        }
        self.copy_xattrs(dir, e, &node, out.path())?;
        self.finish_meta(&node, out.path(), &e.stat, true)?;
        self.dir_times.push((out.rel().to_vec(), (node.stat.st_dev, node.stat.st_ino), e.stat));
        Ok(())
    }

    /// Decrypts the file `e` into the new file `tmp` of `d`; returns it and its size.
    fn export_file(&mut self, dir: &CipherDir, e: &Entry, d: &PlainDir, tmp: &[u8]) -> Result<(Node, u64)> {
        let f = self.vault.open_file(dir, e, libc::O_RDONLY)?;
        let mut w = d.create_file(tmp, 0o600)?;
        let pb = &self.pb;
        let size = f.stream(|piece| -> Result<()> {
            crate::interrupt::check()?;
            std::io::Write::write_all(&mut w, piece)?;
            pb.inc(piece.len() as u64);
            Ok(())
        })?;
        Ok((Node::of_file(&w)?, size))
    }

    /// `--salvage`: writes what authenticates of the damaged file `e` (`damage` says how it
    /// failed) as `name` in `dest` and says which byte ranges were lost. Fails (leaving the
    /// file out) when its header does not authenticate or no block does.
    fn salvage_file(
        &mut self,
        dir: &CipherDir,
        e: &Entry,
        dest: &PlainDir,
        name: &[u8],
        replace: bool,
        damage: anyhow::Error,
    ) -> Result<()> {
        let f = match self.vault.open_for_salvage(dir, e) {
            Ok(f) => f,
            Err(_) => return Err(damage),
        };
        let mut got = None;
        let r = self.make_and_place(dest, name, replace, |ex, d, tmp| {
            let label = d.join(tmp);
            let mut w = d.create_file(tmp, 0o600)?;
            let s = f.salvage(|piece| {
                crate::interrupt::check().map_err(|_| veilfs_core::Error::Invalid("interrupted".into()))?;
                std::io::Write::write_all(&mut w, piece)
                    .map_err(|x| veilfs_core::Error::io(label.display().to_string(), x))
            })?;
            if s.kept == 0 {
                anyhow::bail!("nothing authenticates");
            }
            let node = Node::of_file(&w)?;
            ex.copy_xattrs(dir, e, &node, &label)?;
            if ex.is_root {
                node.set_owner(e.stat.st_uid, e.stat.st_gid)?;
            }
            node.set_mode(e.stat.st_mode & 0o777)?;
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
                 ranges: {} (zeros inside the file, cut off at its end){}",
                dest.join(name).display(),
                dir.path.join(&e.on_disk).display(),
                s.kept,
                lost.join(", "),
                s.notes()
            )
        });
        Ok(())
    }

    /// Copies the `user.*` attributes of `e` onto `node` (`label` names it); a destination
    /// that cannot hold them is counted (and said once at the end), not an error.
    fn copy_xattrs(&mut self, dir: &CipherDir, e: &Entry, node: &Node, label: &Path) -> Result<()> {
        for (name, value) in self.vault.xattrs(dir, e)? {
            if let Err(err) = node.set_xattr(&name, &value) {
                if matches!(err.raw_os_error(), Some(libc::ENOTSUP | libc::EPERM)) {
                    self.xattrs_lost += 1;
                    continue;
                }
                return Err(err).with_context(|| format!("setting an extended attribute on {}", label.display()));
            }
        }
        Ok(())
    }

    /// Owner, mode and times of `node` from `st`, on its fd; `label` names it in messages
    /// (the final name of a file still under its temporary name).
    fn finish_meta(&mut self, node: &Node, label: &Path, st: &Stat, chmod: bool) -> Result<()> {
        if self.is_root {
            node.set_owner(st.st_uid, st.st_gid)?;
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
            node.set_mode(mode)?;
        }
        node.set_times(st)?;
        Ok(())
    }
}

/// Runs `veilfs export`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.src)?;
    let vault = a.unlock.open_trusting(&t.cipherdir, a.rollback.trust())?;
    crate::interrupt::catch();
    let (parent, entry) = vault.resolve(&t.inner).map_err(|e| super::plain_path_error(e, &a.src))?;
    let is_root = sys::euid() == 0;
    let total = match &entry {
        Some(e) if e.kind == EntryKind::Dir => super::plain_bytes_under(&parent.path.join(&e.on_disk), vault.content()),
        Some(e) => vault.content().plain_size_lenient(e.stat.st_size as u64),
        None => super::plain_bytes_under(&parent.path, vault.content()),
    };
    let pb = super::progress(total, "exporting");
    let mut ex = Exporter {
        vault: &vault,
        top: None,
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
    // The top of the destination, opened by path once (the caller's choice, like cp);
    // everything below it is reached through fds.
    let target = match entry {
        None if t.inner.as_os_str().is_empty() => {
            let top = PlainDir::create_all(&a.dest).with_context(|| format!("creating {}", a.dest.display()))?;
            Ok((top, None))
        }
        None => return Err(super::not_found(&a.src).into()),
        Some(e) if a.dest.is_dir() => PlainDir::open(&a.dest).map(|top| (top, Some((e.name.clone(), e)))),
        Some(e) => match PlainDir::open_parent_of(&a.dest) {
            Ok(Some((top, name))) => Ok((top, Some((name, e)))),
            Ok(None) => Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
            Err(err) => Err(err),
        },
    };
    match target {
        Ok((top, what)) => {
            let top = Rc::new(top);
            ex.top = Some(top.clone());
            match what {
                None => ex.export_dir(&parent, &top),
                Some((name, e)) => {
                    if let Err(err) = ex.export_entry(&parent, &e, &top, &name) {
                        ex.note(&top.join(&name).display().to_string(), &err);
                    }
                }
            }
        }
        Err(err) => ex.note(&a.dest.display().to_string(), &err.into()),
    }
    // Directory times last: writing into a directory changes its mtime. Each is found again
    // through fds and only if it still is the directory made or merged into.
    if let Some(top) = &ex.top {
        for (rel, ino, st) in ex.dir_times.iter().rev() {
            if let Ok(n) = top.open_below(rel).and_then(|d| d.node()) {
                if (n.stat.st_dev, n.stat.st_ino) == *ino {
                    let _ = n.set_times(st);
                }
            }
        }
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
