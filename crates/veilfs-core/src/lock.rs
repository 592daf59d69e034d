//! The vault lock: one writer at a time on this machine, unless the user asks otherwise, and a
//! mount that caches never beside a `--shared-storage` one.
//!
//! Why: a mount keeps each directory's entries in memory, and the kernel caches names,
//! attributes and pages — for an hour on a mount that holds this lock (`veilfs mount` says
//! why), trusting that nothing but the mount changes CIPHERDIR. So a file that `veilfs
//! import` writes into a mounted vault would never appear in the mount, and two writers could
//! undo each other's renames. So a mount, and every offline command that writes the vault
//! (`import`, `fsck --repair`), first takes the lock; the others (`cat`, `ls`, `export`,
//! `info`, `fsck`) only read and take none. `passwd` changes only the config's key slots,
//! which a mount does not read again: it takes [`ConfigLock`] instead.
//!
//! The lock is an `flock(2)` on the file `veilfs.lock` in CIPHERDIR (a reserved name, F§2 and
//! F§6.5), held for as long as the holder lives; the kernel drops it when the holder dies,
//! however it dies, so a crashed writer never blocks anyone. The file has no content: `init`
//! (or the first writer of a vault made before) creates it empty, and nothing ever writes,
//! replaces or removes it, so a sync tool never sees it change: no conflict copies, no lock
//! file that arrives from another machine and refuses a mount there, no file that vanishes
//! under `cp -a` after an unmount. A lock file of an older version, which held its holder's
//! pid and host, opens like an empty one: its content is never read. Who holds the lock is
//! asked of the kernel for messages ([`crate::holder`]), never of the file. The lock must be a
//! regular file with one link, opened without following a link and without blocking: a hard
//! link to the config, a FIFO, a symbolic link or a directory planted under its name is
//! refused as damage and never written through (nothing is ever written through it anyway).
//!
//! What it cannot do, by design: an `flock` excludes writers of this machine, and of machines
//! that share CIPHERDIR over a network filesystem whose locks reach across machines (NFS, SMB
//! with working locks). Two machines that share a vault through a sync tool each hold their
//! own copy's lock: no file can exclude across a sync, so none pretends to. Their writes meet
//! in the sync tool, and what it makes of concurrent changes (conflict copies, two entries for
//! one name) is read as such by veilfs (docs/GUIDE.md, "Synced folders"). A sync tool's
//! conflict copy of the lock file itself ([`is_conflict_copy`]) is ignored everywhere.
//!
//! Whether the last writer of this machine ended cleanly, which the crash sweep needs to know,
//! is kept outside CIPHERDIR for the same reason ([`crate::unclean`]).
//!
//! Mounts with `--shared-storage` cache nothing and expect other writers: they do not take
//! the lock file, so several of them and offline writers may work on one vault. They must
//! never meet a mount that caches, which would not see their changes. So there is a second
//! OS lock, on the CIPHERDIR directory itself: a mount that caches holds it exclusively
//! ([`VaultLock::exclude_shared_mounts`], taken after the lock file), a shared-storage mount
//! and every other writer shared ([`SharedLock`]; the directory, unlike the file, is never
//! replaced by a sync tool, so a caching mount stays exclusive even if its lock file was).
//! Each kind of mount is refused while the other is live (exit code 9), naming what the
//! kernel says holds it. Like the file's, this OS lock dies with its holder; on a filesystem
//! without `flock` both are skipped (said once), and the rule rests on the user.

use crate::error::{Error, IoContext, Result};
use crate::holder::{holder_of, Holder};
use crate::names::LOCK_NAME;
use crate::sys;
use crate::sys::Stat;
use crate::unclean::UncleanMark;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a new lock waits for a holder that is going away (a mount whose unmount has
/// begun: `fusermount3 -u` returns before the daemon has let go of the lock).
const ENDING_GRACE: Duration = Duration::from_secs(5);

/// How long a new lock retries while the holder is not a veilfs command it can name. A
/// process that is exiting has its command line gone, and then its file table, before its
/// last close of the lock file has run (the kernel defers it): for a moment the lock is held
/// by a process without a command, or by none it can name; it is free at once after.
const UNNAMED_GRACE: Duration = Duration::from_secs(1);

/// How the lock file is opened: read-only (nothing is written through it; `flock` needs no
/// write access, and a read-only open leaves a sync tool's watch quiet), created empty when
/// missing, never through a symbolic link, never blocking on a planted FIFO.
const LOCK_OPEN: libc::c_int = libc::O_RDONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK;

/// Creates the (empty) lock file in the new vault whose top directory is `dir` (`init`), so
/// that every copy of the vault, synced or not, has the same one from the start.
pub fn create_lock_file(dir: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    sys::openat(dir, LOCK_NAME.as_bytes(), LOCK_OPEN | libc::O_EXCL, 0o644).map(drop)
}

/// Whether `name` (in CIPHERDIR's top directory) is a sync tool's copy of the lock file:
/// `veilfs<something>.lock` other than `veilfs.lock` itself, as Syncthing
/// (`veilfs.sync-conflict-20261127-101010-ABCDEFG.lock`), Dropbox and Nextcloud
/// (`veilfs (… conflicted copy …).lock`), OneDrive (`veilfs-HOST.lock`) and Google Drive
/// (`veilfs (1).lock`) name them. Such a copy means nothing (the lock is the `flock` on the
/// original): everything ignores it, fsck names it as a sync tool's file and never touches it.
/// No name veilfs writes has this form (entry names are base64url with a 22-character
/// binding; reserved names never end in `.lock`).
pub fn is_conflict_copy(name: &[u8]) -> bool {
    name.len() > "veilfs.lock".len()
        && name.starts_with(b"veilfs")
        && name.ends_with(b".lock")
        && std::str::from_utf8(name).is_ok()
        && !name.contains(&b'/')
}

/// A held vault lock; dropping it releases the OS locks (the file stays: see the module docs)
/// and, unless a crash it found is still unswept, clears the host-local crash mark.
#[derive(Debug)]
pub struct VaultLock {
    /// CIPHERDIR and the lock file, open and `flock`ed (`None`: no lock could be taken on
    /// read-only or foreign storage, and none is held by anyone else).
    held: Option<(OwnedFd, OwnedFd)>,
    path: PathBuf,
    /// This writer's host-local mark ([`crate::unclean`]), set while the lock is held.
    mark: Option<UncleanMark>,
    /// The last writer on this machine did not end cleanly (see [`Self::last_writer_crashed`]).
    crashed: bool,
    /// The crash sweep ran under this lock ([`Self::swept`]).
    swept: bool,
}

impl VaultLock {
    /// Takes the lock of the vault in `cipherdir` for `command` (`mount`, `import`, …).
    ///
    /// A live lock is an [`Error::Locked`] naming its holder as the kernel knows it. While
    /// `ending(holder)` says a live holder is going away (a mount whose unmount has begun), it
    /// is waited for, up to 5 s. Storage where the lock file cannot be made (read-only, not
    /// writable by this user) gives a lock that holds nothing, unless someone else holds one
    /// there. The lock file's content, if any (an older version's), is never read.
    pub fn acquire(cipherdir: &Path, command: &str, ending: &dyn Fn(&Holder) -> bool) -> Result<Self> {
        Self::acquire_marked(cipherdir, command, ending, crate::unclean::state_dir().as_deref())
    }

    /// [`acquire`](Self::acquire), keeping the crash mark in `state`.
    pub fn acquire_marked(
        cipherdir: &Path,
        command: &str,
        ending: &dyn Fn(&Holder) -> bool,
        state: Option<&Path>,
    ) -> Result<Self> {
        let path = cipherdir.join(LOCK_NAME);
        let started = Instant::now();
        let deadline = started + ENDING_GRACE;
        let mut replaced = 0;
        // The holder of the lock on `st`: one that is ending, or cannot be named (an exiting
        // daemon has no command line left), is waited for a moment; any other refuses.
        let wait_or_refuse = |st: &sys::Stat| -> Result<()> {
            let holder = holder_of(st, true);
            let unnamed = holder.command.is_empty() && started.elapsed() < UNNAMED_GRACE;
            if unnamed || (ending(&holder) && Instant::now() < deadline) {
                std::thread::sleep(Duration::from_millis(50));
                return Ok(());
            }
            Err(Error::Locked { cipherdir: cipherdir.to_path_buf(), holder, shared: false })
        };
        loop {
            let dir = sys::open_dir_path(cipherdir).ctx(|| format!("opening {}", cipherdir.display()))?;
            let fd = match sys::openat(dir.as_fd(), LOCK_NAME.as_bytes(), LOCK_OPEN, 0o644) {
                Ok(fd) => fd,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM | libc::EROFS)) => {
                    return Self::unwritable(dir, path, e);
                }
                // A symbolic link or a directory planted under the lock's name.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::EISDIR)) => {
                    let st = sys::fstatat(dir.as_fd(), LOCK_NAME.as_bytes()).ctx(|| path.display().to_string())?;
                    return Err(not_a_lock(&path, &st));
                }
                Err(e) => return Err(Error::io(path.display().to_string(), e)),
            };
            let st = sys::fstat(fd.as_fd()).ctx(|| path.display().to_string())?;
            // Checked on the open file: a hard link to another file of the vault (its config)
            // or a FIFO is not a lock file veilfs made.
            if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink != 1 {
                return Err(not_a_lock(&path, &st));
            }
            match sys::try_flock_exclusive(fd.as_fd()) {
                Ok(true) => {
                    // A sync tool may have replaced the file (a new version from elsewhere is
                    // written aside and renamed over it) between our open and our flock: a
                    // lock on a file no longer at the name guards nothing.
                    if !same_name(&dir, LOCK_NAME, &st) && replaced < 10 {
                        replaced += 1;
                        continue;
                    }
                }
                Ok(false) => {
                    wait_or_refuse(&st)?;
                    continue;
                }
                Err(e) if no_os_locks(&e) => {
                    tracing::warn!(
                        "{}: this filesystem has no OS locks ({e}): veilfs cannot keep a second writer out; \
                         mount with --shared-storage if several may write",
                        path.display()
                    );
                }
                Err(e) => return Err(Error::io(format!("locking {}", path.display()), e)),
            }
            // Every writer also holds CIPHERDIR shared: a mount that caches holds it
            // exclusively, also if its lock file was replaced since it took it.
            loop {
                match sys::try_flock_shared(dir.as_fd()) {
                    Ok(true) => break,
                    Ok(false) => {
                        wait_or_refuse(&sys::fstat(dir.as_fd()).ctx(|| cipherdir.display().to_string())?)?;
                    }
                    Err(e) if no_os_locks(&e) => break,
                    Err(e) => return Err(Error::io(format!("locking {}", cipherdir.display()), e)),
                }
            }
            let (mark, crashed) = UncleanMark::set(cipherdir, state, command);
            if crashed {
                tracing::warn!(
                    "{}: the last veilfs writer of this vault on this machine did not end cleanly (it crashed or \
                     was killed)",
                    cipherdir.display()
                );
            }
            return Ok(VaultLock { held: Some((dir, fd)), path, mark: Some(mark), crashed, swept: false });
        }
    }

    /// No lock file can be made here: refused if someone else holds one, else a lock that
    /// holds nothing (read-only storage needs none; otherwise said once).
    fn unwritable(dir: OwnedFd, path: PathBuf, e: std::io::Error) -> Result<Self> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        if let Ok(fd) = sys::openat(dir.as_fd(), LOCK_NAME.as_bytes(), flags, 0) {
            if let (Ok(st), Ok(false)) = (sys::fstat(fd.as_fd()), sys::try_flock_exclusive(fd.as_fd())) {
                let cipherdir = path.parent().unwrap_or(Path::new("")).to_path_buf();
                return Err(Error::Locked { cipherdir, holder: holder_of(&st, true), shared: false });
            }
        }
        if e.raw_os_error() == Some(libc::EROFS) {
            tracing::debug!("{}: read-only storage, no lock taken", path.display());
        } else {
            tracing::warn!("cannot take the vault lock {}: {e}; going on without it", path.display());
        }
        Ok(VaultLock { held: None, path, mark: None, crashed: false, swept: false })
    }

    /// Whether the last writer of this vault on this machine did not end cleanly (it crashed,
    /// was killed, or the machine lost power): its writes may have left files for the crash
    /// sweep ([`crate::settle`]).
    pub fn last_writer_crashed(&self) -> bool {
        self.crashed
    }

    /// Records that the crash sweep ran under this lock: a clean end then clears the crash
    /// mark. Without it the mark of a crash found stays for the next writer (a read-only
    /// mount or an import does not sweep).
    pub fn swept(&mut self) {
        self.swept = true;
    }

    /// Whether an OS lock is held (false on storage where no lock file could be made).
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Releases the lock now (what dropping it does).
    pub fn release(self) {}

    /// For a mount that caches: also keeps `--shared-storage` mounts out, with an exclusive
    /// OS lock on CIPHERDIR held as long as this lock. While one is live this is an
    /// [`Error::Locked`] naming them, unless `ending()` says they are all going away (a
    /// mount whose unmount has begun), which is waited for, up to 5 s.
    pub fn exclude_shared_mounts(&self, ending: &dyn Fn() -> bool) -> Result<()> {
        let Some((dir, _)) = &self.held else { return Ok(()) };
        let cipherdir = || self.path.parent().unwrap_or(Path::new("")).to_path_buf();
        let deadline = Instant::now() + ENDING_GRACE;
        loop {
            match sys::try_flock_exclusive(dir.as_fd()) {
                Ok(true) => return Ok(()),
                Ok(false) if ending() && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Ok(false) => {
                    let holder = Holder::shared_mounts();
                    return Err(Error::Locked { cipherdir: cipherdir(), holder, shared: false });
                }
                Err(e) if no_os_locks(&e) => {
                    tracing::debug!("{}: no OS locks on the directory ({e})", cipherdir().display());
                    return Ok(());
                }
                Err(e) => return Err(Error::io(format!("locking {}", cipherdir().display()), e)),
            }
        }
    }
}

/// A `--shared-storage` mount's hold on its vault: a shared OS lock on CIPHERDIR, which keeps
/// a mount that caches out and is refused while one is live (see the module docs). Takes no
/// lock file: other shared-storage mounts and offline writers are welcome. Released on drop.
#[derive(Debug)]
pub struct SharedLock {
    _dir: Option<OwnedFd>,
}

impl SharedLock {
    /// Takes the shared lock of the vault in `cipherdir`. While a mount that caches holds the
    /// vault this is an [`Error::Locked`] naming it, unless `ending(holder)` says it is going
    /// away, which is waited for, up to 5 s.
    pub fn acquire(cipherdir: &Path, ending: &dyn Fn(&Holder) -> bool) -> Result<Self> {
        let dir = sys::open_dir_path(cipherdir).ctx(|| format!("opening {}", cipherdir.display()))?;
        let deadline = Instant::now() + ENDING_GRACE;
        loop {
            match sys::try_flock_shared(dir.as_fd()) {
                Ok(true) => return Ok(SharedLock { _dir: Some(dir) }),
                Ok(false) => {
                    // The kernel names the mount that holds the directory exclusively.
                    let st = sys::fstat(dir.as_fd()).ctx(|| cipherdir.display().to_string())?;
                    let mut holder = holder_of(&st, true);
                    if holder.pid == 0 {
                        holder = Holder { command: "mount".into(), host: sys::host_name(), ..holder };
                    }
                    if ending(&holder) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    return Err(Error::Locked { cipherdir: cipherdir.to_path_buf(), holder, shared: true });
                }
                Err(e) if no_os_locks(&e) => {
                    tracing::debug!("{}: no OS locks on the directory ({e})", cipherdir.display());
                    return Ok(SharedLock { _dir: None });
                }
                Err(e) => return Err(Error::io(format!("locking {}", cipherdir.display()), e)),
            }
        }
    }
}

/// An exclusive `flock` on the vault's config file, held by a command that rewrites it
/// (`passwd`) so that two of them never interleave. It is not the vault lock: a config change
/// touches only the key slots, which a mount read once at unlock and never again, so passwd
/// works while the vault is mounted. The config is replaced by a rename, so the lock is taken
/// on the file now at the name, and taken again if it was replaced while this waited.
#[derive(Debug)]
pub struct ConfigLock {
    _fd: Option<OwnedFd>,
}

impl ConfigLock {
    /// Waits (up to 30 s) for the config of the vault in `cipherdir` to be free, then holds it.
    pub fn acquire(cipherdir: &Path) -> Result<Self> {
        let path = crate::config::VaultConfig::path_in(cipherdir);
        let what = || path.display().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let dir = sys::open_dir_path(cipherdir).ctx(what)?;
            let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
            let fd = sys::openat(dir.as_fd(), crate::names::CONFIG_NAME.as_bytes(), flags, 0).ctx(what)?;
            let st = sys::fstat(fd.as_fd()).ctx(what)?;
            match sys::try_flock_exclusive(fd.as_fd()) {
                Ok(true) if same_name(&dir, crate::names::CONFIG_NAME, &st) => return Ok(ConfigLock { _fd: Some(fd) }),
                Ok(true) => continue, // replaced while we opened it: lock the new one
                Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Ok(false) => {
                    return Err(Error::io(
                        format!("{}: another veilfs command is changing it", path.display()),
                        std::io::Error::from_raw_os_error(libc::EWOULDBLOCK),
                    ))
                }
                Err(e) if no_os_locks(&e) => return Ok(ConfigLock { _fd: None }),
                Err(e) => return Err(Error::io(format!("locking {}", path.display()), e)),
            }
        }
    }
}

/// The error for a file under the lock's name that veilfs cannot have made: anything but a
/// regular file with one link. It is damage (or a planted file), never written through.
fn not_a_lock(path: &Path, st: &Stat) -> Error {
    let what = if st.st_mode & libc::S_IFMT == libc::S_IFREG {
        format!("a regular file with {} hard links", st.st_nlink)
    } else {
        sys::type_name(st.st_mode).to_string()
    };
    Error::Auth {
        what: path.display().to_string(),
        detail: format!(
            "is {what}, not a lock file veilfs made (one link, a regular file); nothing was written to it. \
             Remove it if you know where it came from"
        ),
    }
}

/// Whether a `flock` error means the filesystem has no OS locks.
fn no_os_locks(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL))
}

impl Drop for VaultLock {
    fn drop(&mut self) {
        // The mark goes first, while the lock is still held: a writer that takes the lock next
        // must not find the mark of a writer that ended cleanly. Then the OS locks go with
        // the fds; the lock file stays (see the module docs).
        if let Some(mark) = self.mark.take() {
            if self.held.is_some() && (!self.crashed || self.swept) {
                mark.clear();
            }
        }
        drop(self.held.take());
    }
}

/// Whether `st` (of an open file) is the file now named `name` in `dir`.
fn same_name(dir: &OwnedFd, name: &str, st: &Stat) -> bool {
    sys::fstatat(dir.as_fd(), name.as_bytes()).is_ok_and(|now| (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino))
}

/// The holder of the vault lock in `cipherdir`, if a live one holds it (for messages and
/// waits; takes nothing, the kernel is asked).
pub fn holder(cipherdir: &Path) -> Option<Holder> {
    let dir = sys::open_dir_path(cipherdir).ok()?;
    let fd =
        sys::openat(dir.as_fd(), LOCK_NAME.as_bytes(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0).ok()?;
    let st = sys::fstat(fd.as_fd()).ok()?;
    crate::holder::holders_of(&st, true).into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: &Holder) -> bool {
        false
    }

    /// Takes the lock with its crash mark in `state`.
    fn take(dir: &Path, command: &str, state: &Path) -> Result<VaultLock> {
        VaultLock::acquire_marked(dir, command, &never, Some(state))
    }

    #[test]
    fn a_held_lock_refuses_naming_the_process_and_its_file_stays_empty_and_in_place() {
        let (t, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let lock = take(t.path(), "import", state.path()).unwrap();
        assert!(lock.is_held() && !lock.last_writer_crashed());
        // A second open file description of this process is refused like another process,
        // and the kernel names the holder.
        let e = take(t.path(), "mount", state.path()).unwrap_err();
        assert!(matches!(&e, Error::Locked { holder, .. } if holder.pid == std::process::id()), "{e}");
        assert!(e.to_string().contains(&format!("locked by pid {} (`", std::process::id())), "{e}");
        assert_eq!(holder(t.path()).map(|h| h.pid), Some(std::process::id()));
        drop(lock);
        let meta = std::fs::metadata(t.path().join(LOCK_NAME)).unwrap();
        assert_eq!(meta.len(), 0, "nothing is ever written into the lock file");
        assert!(holder(t.path()).is_none());
        let again = take(t.path(), "mount", state.path()).unwrap();
        assert!(!again.last_writer_crashed(), "a clean release leaves no crash mark");
        let same = std::fs::metadata(t.path().join(LOCK_NAME)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((same.ino(), same.mtime(), same.mtime_nsec()), (meta.ino(), meta.mtime(), meta.mtime_nsec()));
    }

    #[test]
    fn a_lock_file_that_came_from_elsewhere_never_refuses_and_is_not_rewritten() {
        // The format of older versions: the holder's pid, host and command, here of another
        // machine (a synced copy) and of a live process of this one (pid 1).
        for text in [
            "pid=4242\nhost=laptop.example\nsince=1700000000\ncommand=mount\n".to_string(),
            format!("pid=1\nhost={}\nsince=0\ncommand=mount\n", sys::host_name()),
            "\u{0}garbage".to_string(),
        ] {
            let (t, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            std::fs::write(t.path().join(LOCK_NAME), &text).unwrap();
            let lock = take(t.path(), "mount", state.path()).unwrap();
            assert!(!lock.last_writer_crashed(), "a lock file is no crash mark: {text:?}");
            drop(lock);
            assert_eq!(std::fs::read_to_string(t.path().join(LOCK_NAME)).unwrap(), text);
        }
    }

    #[test]
    fn a_crash_mark_is_reported_until_the_sweep_ran_under_the_lock() {
        let (t, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // What a writer that died leaves: its mark (its OS lock died with it).
        let (_left, _) = UncleanMark::set(t.path(), Some(state.path()), "mount");
        let lock = take(t.path(), "import", state.path()).unwrap();
        assert!(lock.last_writer_crashed());
        drop(lock); // an import does not sweep: the mark stays for the next mount
        let mut lock = take(t.path(), "mount", state.path()).unwrap();
        assert!(lock.last_writer_crashed());
        lock.swept();
        drop(lock);
        assert!(!take(t.path(), "mount", state.path()).unwrap().last_writer_crashed());
    }

    #[test]
    fn a_lock_planted_as_a_hard_link_to_the_config_is_refused_and_nothing_is_written_through_it() {
        let (t, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let conf = t.path().join("veilfs.conf");
        std::fs::write(&conf, b"{\"the vault's config\": true}").unwrap();
        std::fs::hard_link(&conf, t.path().join(LOCK_NAME)).unwrap();
        let e = take(t.path(), "mount", state.path()).unwrap_err();
        assert!(matches!(&e, Error::Auth { detail, .. } if detail.contains("2 hard links")), "{e}");
        assert_eq!(std::fs::read(&conf).unwrap(), b"{\"the vault's config\": true}");
    }

    #[test]
    fn a_lock_planted_as_a_fifo_symlink_or_directory_is_refused_as_damage_without_blocking() {
        use std::os::unix::fs::symlink;
        for (kind, plant) in [
            (
                "a FIFO",
                &(|p: &Path| {
                    crate::sys::mknodat(crate::sys::CWD, p.as_os_str().as_encoded_bytes(), libc::S_IFIFO | 0o644, 0)
                        .unwrap()
                }) as &dyn Fn(&Path),
            ),
            ("a symbolic link", &|p: &Path| symlink("veilfs.conf", p).unwrap()),
            ("a directory", &|p: &Path| std::fs::create_dir(p).unwrap()),
        ] {
            let (t, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            std::fs::write(t.path().join("veilfs.conf"), b"config").unwrap();
            plant(&t.path().join(LOCK_NAME));
            let e = take(t.path(), "import", state.path()).unwrap_err();
            assert!(matches!(&e, Error::Auth { detail, .. } if detail.contains(kind)), "{kind}: {e}");
            assert_eq!(std::fs::read(t.path().join("veilfs.conf")).unwrap(), b"config", "{kind}");
        }
    }

    #[test]
    fn a_caching_mount_stays_exclusive_when_a_sync_tool_replaces_its_lock_file() {
        let (t, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mount = take(t.path(), "mount", state.path()).unwrap();
        mount.exclude_shared_mounts(&|| false).unwrap();
        // A sync tool writes a new version aside and renames it over the name.
        std::fs::write(t.path().join(".syncthing.veilfs.lock.tmp"), b"").unwrap();
        std::fs::rename(t.path().join(".syncthing.veilfs.lock.tmp"), t.path().join(LOCK_NAME)).unwrap();
        let e = take(t.path(), "import", state.path()).unwrap_err();
        assert!(matches!(&e, Error::Locked { holder, .. } if holder.pid == std::process::id()), "{e}");
        drop(mount);
        take(t.path(), "import", state.path()).unwrap();
    }

    #[test]
    fn sync_tools_copies_of_the_lock_file_are_recognised_and_nothing_else_is() {
        for copy in [
            "veilfs.sync-conflict-20261127-101010-ABCDEFG.lock",
            "veilfs (laptop's conflicted copy 2026-11-27).lock",
            "veilfs (conflicted copy 2026-11-27 101010).lock",
            "veilfs-LAPTOP.lock",
            "veilfs (1).lock",
        ] {
            assert!(is_conflict_copy(copy.as_bytes()), "{copy}");
        }
        for other in [
            "veilfs.lock",
            "veilfs.conf",
            "veilfs.diriv",
            "veilfs.lock.tmp",
            "Zm9vYmFyYmF6cXV4cXV1eA.AAAAAAAAAAAAAAAAAAAAAA",
            "notveilfs.lock",
        ] {
            assert!(!is_conflict_copy(other.as_bytes()), "{other}");
        }
        assert!(!is_conflict_copy(b"veilfs\xff.lock"));
    }

    #[test]
    fn init_creates_the_lock_file_once() {
        let t = tempfile::tempdir().unwrap();
        let dir = sys::open_dir_path(t.path()).unwrap();
        create_lock_file(dir.as_fd()).unwrap();
        assert_eq!(std::fs::metadata(t.path().join(LOCK_NAME)).unwrap().len(), 0);
        assert!(create_lock_file(dir.as_fd()).is_err(), "never over an existing file");
    }

    #[test]
    fn the_config_lock_is_exclusive_and_follows_a_config_replaced_while_waiting() {
        let t = tempfile::tempdir().unwrap();
        let conf = crate::config::VaultConfig::path_in(t.path());
        std::fs::write(&conf, b"one").unwrap();
        let first = ConfigLock::acquire(t.path()).unwrap();
        let dir = t.path().to_path_buf();
        let waiter = std::thread::spawn(move || {
            let _second = ConfigLock::acquire(&dir).unwrap();
            std::fs::read(crate::config::VaultConfig::path_in(&dir)).unwrap()
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "a second holder must wait");
        // The holder replaces the config by rename, as saving does, then lets go.
        std::fs::write(t.path().join("new"), b"two").unwrap();
        std::fs::rename(t.path().join("new"), &conf).unwrap();
        drop(first);
        assert_eq!(waiter.join().unwrap(), b"two", "the waiter holds the new file, not the replaced one");
    }

    #[test]
    fn caching_and_shared_storage_mounts_exclude_each_other() {
        let (t, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (a, b) = (SharedLock::acquire(t.path(), &never).unwrap(), SharedLock::acquire(t.path(), &never).unwrap());
        // Offline writers work beside shared-storage mounts; a mount that caches does not.
        let lock = take(t.path(), "mount", state.path()).unwrap();
        let e = lock.exclude_shared_mounts(&|| false).unwrap_err();
        assert!(matches!(&e, Error::Locked { holder, .. } if holder.command == crate::holder::SHARED_MOUNTS), "{e}");
        assert!(e.to_string().contains("mounted with --shared-storage"), "{e}");
        drop((a, b, lock));
        let lock = take(t.path(), "mount", state.path()).unwrap();
        lock.exclude_shared_mounts(&|| false).unwrap();
        let e = SharedLock::acquire(t.path(), &never).unwrap_err();
        assert!(matches!(&e, Error::Locked { shared: true, .. }), "{e}");
        assert!(e.to_string().contains(&format!("locked by pid {} (`", std::process::id())), "{e}");
        drop(lock);
        SharedLock::acquire(t.path(), &never).unwrap();
    }

    #[test]
    fn a_holder_that_is_ending_is_waited_for() {
        let (t, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = take(t.path(), "mount", state.path()).unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(first);
        });
        let started = Instant::now();
        let ending = |h: &Holder| h.pid == std::process::id();
        let lock = VaultLock::acquire_marked(t.path(), "mount", &ending, Some(state.path())).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        releaser.join().unwrap();
        drop(lock);
    }
}
