//! `veilfs import`: encrypt a plaintext tree into a vault without mounting.

use super::{Conflict, UnlockArgs};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use veilfs_core::plaintree::{kind, Node, PlainDir};
use veilfs_core::sys::{self, Stat};
use veilfs_core::{CipherDir, Entry, EntryKind, Vault};

/// Arguments of `veilfs import`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Like `cp -a SRC DEST`: if DEST is an existing directory of the vault, SRC is copied into it \
under its own name; otherwise DEST names the copy. A SRC ending in `/.` copies the contents of SRC. \
Modes, times, symlinks, hard links and user.* extended attributes are kept; owners too when run as root.\n\n\
Interrupted imports resume: each file is written under a temporary name that no listing shows and appears under \
its own name only when complete (Ctrl-C removes the file being written). Run the same command again: a file \
already in the vault with the same size and modification time (to the second: rsync's quick check; contents are \
not compared) is skipped as identical; one that differs is a conflict, reported and kept unless --overwrite \
replaces it. The last line counts files imported, skipped as identical, conflicts and errors; the exit code is 1 \
if there were conflicts or errors.\n\n\
The vault must not be mounted (exit code 9), unless with --shared-storage.\n\n\
SRC is opened by path once; below it nothing follows a symlink: each entry's type, owner, mode and times come \
from the one object opened and its content is read from that same object, so a symlink swapped in is stored as a \
symlink and a FIFO as a FIFO (never read, never a hang): run as root over a user's tree, nothing she cannot read \
is stored as hers (docs/SECURITY.md, section 7d).")]
pub struct Args {
    /// Plaintext file or directory to encrypt.
    pub src: PathBuf,
    /// CIPHERDIR, optionally followed by a path inside the vault.
    pub dest: PathBuf,
    /// Replace entries of the vault that differ from their source (never a directory).
    #[arg(long)]
    pub overwrite: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
    #[command(flatten)]
    pub lock: super::LockArgs,
}

/// The source of an import, opened: one entry (copied under its name) or, for a name
/// ending in `/.`, a directory whose contents are copied.
enum Source {
    Entry(Node),
    Contents(PlainDir),
}

struct Importer<'a> {
    vault: &'a Vault,
    links: HashMap<(u64, u64), (Rc<CipherDir>, Entry)>,
    /// Replace differing entries (`--overwrite`).
    overwrite: bool,
    /// Counts for the summary line: regular files and their bytes encrypted, entries skipped
    /// as identical, conflicts (existing entries that differ, kept), errors.
    files: u64,
    bytes: u64,
    skipped: usize,
    conflicts: usize,
    errors: usize,
    pb: indicatif::ProgressBar,
    is_root: bool,
}

/// Sets mode, owner (when `chown`) and times of a freshly created `entry` of `dir` from the
/// source's `fstat`, through a verified handle on it (never through a planted link).
fn apply_meta(vault: &Vault, dir: &CipherDir, entry: &Entry, m: &Stat, chown: bool) -> Result<()> {
    let ts = |s: i64, ns: i64| libc::timespec { tv_sec: s, tv_nsec: ns };
    let times = [ts(m.st_atime, m.st_atime_nsec), ts(m.st_mtime, m.st_mtime_nsec)];
    vault.set_attrs(dir, entry, Some(m.st_mode), chown.then_some((m.st_uid, m.st_gid)), Some(&times))?;
    Ok(())
}

/// Whether the vault's `e` already is a complete copy of the source `src`: rsync's quick
/// check for files — the same size and the same modification time to the second (a file
/// only gets its name once complete and its time is set before that, so a file under its
/// name with the source's time is whole; comparing contents would cost as much as importing
/// again); the same target for symlinks; the same type and device number for special files.
fn identical(vault: &Vault, dir: &CipherDir, e: &Entry, src: &Node) -> bool {
    let m = &src.stat;
    match (e.kind, kind(m)) {
        (EntryKind::File, libc::S_IFREG) => {
            vault.content().plain_size_lenient(e.stat.st_size as u64) == m.st_size as u64
                && e.stat.st_mtime == m.st_mtime
        }
        (EntryKind::Symlink, libc::S_IFLNK) => {
            matches!((vault.readlink(dir, e), src.readlink()), (Ok(a), Ok(b)) if a == b)
        }
        (EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice, _) => {
            e.stat.st_mode & libc::S_IFMT == kind(m) && e.stat.st_rdev == m.st_rdev
        }
        _ => false,
    }
}

/// The bytes of a regular file (0 for anything else), for the progress bar.
fn file_bytes(m: &Stat) -> u64 {
    if kind(m) == libc::S_IFREG {
        m.st_size as u64
    } else {
        0
    }
}

impl Importer<'_> {
    /// Encrypts the regular file `src` (named `label`) as `name` in `dir`, replacing
    /// `replaced`. Its content is read from the very inode its owner, mode and times come
    /// from. The file is written under an internal name and gets its attributes, owner,
    /// mode and times there; only then is it renamed to `name` (see
    /// [`Vault::create_partial`]): a full disk, an error or Ctrl-C never leaves a cut-off file
    /// under the final name, and the partial copy is removed.
    fn copy_file(
        &mut self,
        src: &Node,
        label: &Path,
        dir: &CipherDir,
        name: &[u8],
        replaced: Option<&Entry>,
    ) -> Result<Entry> {
        let mut input = src.read_content()?;
        let partial = self.vault.create_partial(dir, name, 0o600)?;
        let mut fill = || -> Result<u64> {
            let mut buf = vec![0u8; 1 << 20];
            let mut size = 0u64;
            loop {
                crate::interrupt::check()?;
                let n = std::io::Read::read(&mut input, &mut buf)?;
                if n == 0 {
                    break;
                }
                size = partial.file.write_at(&buf[..n], size, size)?;
                self.pb.inc(n as u64);
            }
            // Ends the file's write session (a file with a block map keeps one for the whole
            // copy) before its times are set, which settling would otherwise have to put back.
            partial.file.settle()?;
            self.copy_xattrs(src, label, dir, &partial.entry)?;
            apply_meta(self.vault, dir, &partial.entry, &src.stat, self.is_root)?;
            Ok(size)
        };
        match fill() {
            Ok(size) => {
                let entry = self.vault.commit_partial(dir, partial, replaced)?;
                self.files += 1;
                self.bytes += size;
                Ok(entry)
            }
            Err(e) => {
                let what = partial.entry.on_disk.clone();
                if let Err(r) = self.vault.discard_partial(dir, partial) {
                    self.pb.suspend(|| eprintln!("veilfs: import: could not remove the partial copy {what}: {r}"));
                }
                Err(e)
            }
        }
    }

    /// Copies the `user.*` attributes of `src` (named `label`) onto `entry` (encrypted like
    /// the mount does).
    fn copy_xattrs(&self, src: &Node, label: &Path, dir: &CipherDir, entry: &Entry) -> Result<()> {
        for (name, value) in
            src.user_xattrs().with_context(|| format!("reading the attributes of {}", label.display()))?
        {
            self.vault.set_xattr(dir, entry, &name, &value)?;
        }
        Ok(())
    }

    /// The entries of `dir` by name, after removing what an interrupted import left there.
    fn entries(&mut self, dir: &CipherDir) -> Result<HashMap<Vec<u8>, Entry>> {
        let n = self.vault.remove_partials(dir)?;
        if n > 0 {
            tracing::info!("{}: removed {n} partial copies an interrupted import left", dir.path.display());
        }
        let (entries, _) = self.vault.list(dir)?;
        Ok(entries.into_iter().map(|e| (e.name.clone(), e)).collect())
    }

    /// Imports the children of the source directory `src` into `dir`, each reached through
    /// `src`'s fd without following a link.
    fn import_children(&mut self, src: &PlainDir, dir: &Rc<CipherDir>) -> Result<()> {
        let mut existing = self.entries(dir)?;
        for name in src.names()? {
            let old = existing.remove(&name);
            self.import(src.entry(&name), &src.join(&name), dir, &name, old);
        }
        Ok(())
    }

    fn import(
        &mut self,
        src: std::io::Result<Node>,
        label: &Path,
        dir: &Rc<CipherDir>,
        name: &[u8],
        existing: Option<Entry>,
    ) {
        if crate::interrupt::requested() {
            return;
        }
        match src.map_err(anyhow::Error::from).and_then(|src| self.import_one(&src, label, dir, name, existing)) {
            Ok(()) => {}
            Err(e) if crate::interrupt::is(&e) => {}
            Err(e) if e.is::<Conflict>() => {
                self.conflicts += 1;
                self.pb.suspend(|| eprintln!("veilfs: import: {}: conflict: {e}", label.display()));
            }
            Err(e) => {
                self.errors += 1;
                self.pb.suspend(|| eprintln!("veilfs: import: {}: {e:#}", label.display()));
            }
        }
    }

    /// A source entry whose name exists in the vault: `Ok(true)` when it is identical there
    /// (skipped), `Ok(false)` when it is to be replaced (`--overwrite`), a [`Conflict`]
    /// otherwise. A directory is never replaced.
    fn settle_existing(&mut self, src: &Node, dir: &CipherDir, e: &Entry) -> Result<bool> {
        if identical(self.vault, dir, e, src) {
            self.skipped += 1;
            self.pb.inc(file_bytes(&src.stat));
            return Ok(true);
        }
        if e.kind == EntryKind::Dir {
            return Err(Conflict("is a directory in the vault; not replaced").into());
        }
        if !self.overwrite {
            self.pb.inc(file_bytes(&src.stat));
            return Err(Conflict(
                "already in the vault and different (size, modification time, type or target); kept \
                 (--overwrite replaces it)",
            )
            .into());
        }
        Ok(false)
    }

    /// Imports the source object `src` (named `label`) as `name` in `dir`. Its type, owner,
    /// mode, times and link count are those of the object opened (`fstat`), never of a name
    /// that may have been swapped since.
    fn import_one(
        &mut self,
        src: &Node,
        label: &Path,
        dir: &Rc<CipherDir>,
        name: &[u8],
        existing: Option<Entry>,
    ) -> Result<()> {
        let m = src.stat;
        if kind(&m) == libc::S_IFDIR {
            return self.import_dir(src, label, dir, name, existing);
        }
        let linked = m.st_nlink > 1;
        let inode = (m.st_dev, m.st_ino);
        if let Some(e) = &existing {
            let same_inode = linked && self.links.get(&inode).is_some_and(|(_, first)| first.identity == e.identity);
            if same_inode {
                self.skipped += 1;
                return Ok(());
            }
            if self.settle_existing(src, dir, e)? {
                if linked {
                    self.links.entry(inode).or_insert_with(|| (dir.clone(), e.clone()));
                }
                return Ok(());
            }
        }
        if linked {
            if let Some((first_dir, first)) = self.links.get(&inode) {
                if let Some(e) = &existing {
                    self.vault.remove(dir, e)?;
                }
                self.vault.link(first_dir, first, dir, name)?;
                return Ok(());
            }
        }
        let entry = if kind(&m) == libc::S_IFREG {
            self.copy_file(src, label, dir, name, existing.as_ref())?
        } else {
            if let Some(e) = &existing {
                self.vault.remove(dir, e)?;
            }
            let entry = if kind(&m) == libc::S_IFLNK {
                self.vault.symlink(dir, name, &src.readlink()?)?
            } else {
                self.vault.mknod(dir, name, m.st_mode, m.st_rdev)?
            };
            if entry.kind != EntryKind::Symlink {
                self.copy_xattrs(src, label, dir, &entry)?;
            }
            apply_meta(self.vault, dir, &entry, &m, self.is_root)?;
            entry
        };
        if linked {
            self.links.insert(inode, (dir.clone(), entry));
        }
        Ok(())
    }

    /// A source directory: merged into the vault's directory of that name (made if missing);
    /// its attributes, mode and times are set once its contents are in.
    fn import_dir(
        &mut self,
        src: &Node,
        label: &Path,
        dir: &Rc<CipherDir>,
        name: &[u8],
        existing: Option<Entry>,
    ) -> Result<()> {
        let sub = match existing {
            Some(e) if e.kind == EntryKind::Dir => self.vault.open_dir(dir, &e)?,
            Some(e) if self.overwrite => {
                self.vault.remove(dir, &e)?;
                self.vault.mkdir_unchecked(dir, name, 0o700)?.1
            }
            Some(_) => {
                return Err(
                    Conflict("exists in the vault and is not a directory; kept (--overwrite replaces it)").into()
                )
            }
            None => self.vault.mkdir_unchecked(dir, name, 0o700)?.1,
        };
        self.import_children(&src.as_dir(label)?, &Rc::new(sub))?;
        if crate::interrupt::requested() {
            return Ok(());
        }
        let e = self.vault.lookup(dir, name)?.context("directory vanished during import")?;
        self.copy_xattrs(src, label, dir, &e)?;
        apply_meta(self.vault, dir, &e, &src.stat, self.is_root)?;
        Ok(())
    }
}

/// Runs `veilfs import`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.dest)?;
    let contents_only = a.src.as_os_str().as_bytes().ends_with(b"/.");
    // The source as the caller named it, opened by path once (like `cp -a`, a final symlink
    // is copied as a symlink unless the name ends in `/`); everything below it is reached
    // through fds.
    let source = if contents_only {
        Source::Contents(PlainDir::open(&a.src).with_context(|| format!("{}", a.src.display()))?)
    } else {
        let follow = a.src.file_name().is_none() || a.src.as_os_str().as_bytes().ends_with(b"/");
        Source::Entry(Node::open_path(&a.src, follow).with_context(|| format!("{}", a.src.display()))?)
    };
    let _lock = a.lock.take(&t.cipherdir, "import")?;
    let vault = a.unlock.open(&t.cipherdir)?;
    crate::interrupt::catch();
    let (parent, entry) = vault.resolve(&t.inner).map_err(|e| super::plain_path_error(e, &a.dest))?;
    let src_name = a.src.canonicalize()?.file_name().map(|n| n.as_bytes().to_vec());
    // Where the copy goes: (directory, name) or "into this directory" for `/.` sources.
    let (dest_dir, dest_name): (Rc<CipherDir>, Option<Vec<u8>>) = match entry {
        Some(e) if e.kind == EntryKind::Dir => {
            (Rc::new(vault.open_dir(&parent, &e)?), if contents_only { None } else { src_name })
        }
        None if t.inner.as_os_str().is_empty() => (Rc::new(parent), if contents_only { None } else { src_name }),
        // A missing name, or an existing non-directory (skipped if identical, else a conflict).
        _ => {
            let last = t.inner.file_name().context("bad destination")?.as_bytes().to_vec();
            (Rc::new(parent), Some(last))
        }
    };
    let total = match &source {
        Source::Contents(d) => d.bytes_under(),
        Source::Entry(n) => n.bytes_under(&a.src),
    };
    let pb = super::progress(total, "importing");
    let is_root = sys::euid() == 0;
    let mut imp = Importer {
        vault: &vault,
        links: HashMap::new(),
        overwrite: a.overwrite,
        files: 0,
        bytes: 0,
        skipped: 0,
        conflicts: 0,
        errors: 0,
        pb,
        is_root,
    };
    let top = match (dest_name, source) {
        (Some(name), Source::Entry(src)) => imp.entries(&dest_dir).map(|mut existing| {
            let old = existing.remove(&name);
            imp.import(Ok(src), &a.src, &dest_dir, &name, old)
        }),
        (None, Source::Entry(src)) => {
            src.as_dir(&a.src).map_err(Into::into).and_then(|d| imp.import_children(&d, &dest_dir))
        }
        (_, Source::Contents(d)) => imp.import_children(&d, &dest_dir),
    };
    if let Err(e) = top {
        if !crate::interrupt::is(&e) {
            imp.errors += 1;
            imp.pb.suspend(|| eprintln!("veilfs: import: {}: {e:#}", a.src.display()));
        }
    }
    imp.pb.finish_and_clear();
    super::summary("imported", imp.files, imp.bytes, imp.skipped, imp.conflicts, &super::count(imp.errors, "error"));
    super::say_if_interrupted("import");
    Ok(if imp.errors + imp.conflicts > 0 { crate::exit::OTHER } else { crate::exit::OK })
}
