//! The vault lock: one writer at a time, unless the user asks otherwise, and a mount that
//! caches never beside a `--shared-storage` one.
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
//! The lock is the file `veilfs.lock` in CIPHERDIR (a reserved name, F§2 and F§6.5) holding
//! who took it (`key=value` lines: `pid`, `host`, `since` in Unix seconds, `command`), plus
//! an `flock(2)` on it held for as long as the holder lives. The OS lock is what decides:
//! the kernel drops it when the holder dies, however it dies, so a crashed daemon's lock is
//! stale by construction and taken over with a warning. Where the filesystem has no `flock`
//! (some network filesystems), a lock of this host whose pid is gone is stale. A lock of
//! another host cannot be checked from here (CIPHERDIR may be a synced copy whose lock file
//! came along, or a network filesystem whose OS locks are not shared): it is refused, naming
//! the host, and `break_lock` takes it over. The holder removes the file when done.
//!
//! Mounts with `--shared-storage` cache nothing and expect other writers: they do not take
//! the lock file, so several of them and offline writers may work on one vault. They must
//! never meet a mount that caches, which would not see their changes. So there is a second
//! OS lock, on the CIPHERDIR directory itself: a mount that caches holds it exclusively
//! ([`VaultLock::exclude_shared_mounts`], taken after the lock file), a shared-storage mount
//! shared ([`SharedLock`]). Each kind is refused while the other is live (exit code 9); a
//! shared-storage mount names the caching mount from the lock file, a caching mount can only
//! say that shared-storage mounts hold the vault (they write no file: several at once would
//! overwrite each other's name). Offline writers take only the lock file, so they still work
//! beside shared-storage mounts. Like the lock file's, this OS lock dies with its holder; on
//! a filesystem without `flock` it is skipped (debug log), and the rule rests on the user.

use crate::error::{Error, IoContext, Result};
use crate::names::LOCK_NAME;
use crate::sys;
use crate::sys::Stat;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a new lock waits for a holder that is going away (a mount whose unmount has
/// begun: `fusermount3 -u` returns before the daemon has let go of the lock).
const ENDING_GRACE: Duration = Duration::from_secs(5);

/// The [`Holder::command`] that stands for `--shared-storage` mounts, which keep a mount that
/// caches out (see [`SharedLock`]) without naming themselves.
pub const SHARED_MOUNTS: &str = "mount --shared-storage";

/// Who holds (or held) a vault lock, as its lock file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Process id of the holder (0: unknown).
    pub pid: u32,
    /// Host name of the holder's machine.
    pub host: String,
    /// When the lock was taken, in seconds since the Unix epoch.
    pub since: u64,
    /// The veilfs command holding it: `mount`, `import`, `passwd`, `fsck`.
    pub command: String,
}

impl Holder {
    fn me(command: &str) -> Holder {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Holder { pid: std::process::id(), host: sys::host_name(), since, command: command.to_string() }
    }

    /// The holder that stands for live `--shared-storage` mounts (no pid: there may be many).
    pub fn shared_mounts() -> Holder {
        Holder { pid: 0, host: sys::host_name(), since: 0, command: SHARED_MOUNTS.to_string() }
    }

    /// The lock file's contents.
    fn to_text(&self) -> String {
        let clean = |s: &str| s.replace(['\n', '\r'], " ");
        format!(
            "pid={}\nhost={}\nsince={}\ncommand={}\n",
            self.pid,
            clean(&self.host),
            self.since,
            clean(&self.command)
        )
    }

    /// Parses a lock file; `None` when it names no holder (empty: the holder is still writing
    /// it, or crashed before it could).
    pub fn parse(text: &str) -> Option<Holder> {
        let mut h = Holder { pid: 0, host: String::new(), since: 0, command: String::new() };
        for line in text.lines() {
            match line.split_once('=') {
                Some(("pid", v)) => h.pid = v.trim().parse().unwrap_or(0),
                Some(("host", v)) => h.host = v.to_string(),
                Some(("since", v)) => h.since = v.trim().parse().unwrap_or(0),
                Some(("command", v)) => h.command = v.to_string(),
                _ => {}
            }
        }
        (h.pid != 0 || !h.host.is_empty()).then_some(h)
    }

    /// Whether the holder runs on this machine.
    pub fn is_this_host(&self) -> bool {
        self.host == sys::host_name()
    }

    /// "mounted by pid 12 on host h since 2025-01-02 03:04:05 UTC", or "in use by `veilfs
    /// import` (pid 12) on host h since …".
    pub fn describe(&self) -> String {
        let since = utc_text(self.since);
        if self.command == SHARED_MOUNTS {
            "mounted with --shared-storage (by this machine or another sharing CIPHERDIR)".to_string()
        } else if self.command == "mount" {
            format!("mounted by pid {} on host {} since {since}", self.pid, self.host)
        } else {
            format!("in use by `veilfs {}` (pid {}) on host {} since {since}", self.command, self.pid, self.host)
        }
    }
}

/// `secs` since the epoch as "YYYY-MM-DD hh:mm:ss UTC" (days to a civil date: the
/// proleptic Gregorian calendar, H. Hinnant's algorithm).
fn utc_text(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A held vault lock; dropping it removes the lock file (if it is still this lock's) and
/// releases the OS lock.
#[derive(Debug)]
pub struct VaultLock {
    /// CIPHERDIR and the lock file, open and `flock`ed (`None`: no lock could be taken on
    /// read-only or foreign storage, and none is held by anyone else).
    held: Option<(OwnedFd, OwnedFd)>,
    path: PathBuf,
    holder: Holder,
    /// A dead holder's lock was taken over: it crashed (see [`took_over`](Self::took_over)).
    took_over: bool,
}

impl VaultLock {
    /// Takes the lock of the vault in `cipherdir` for `command` (`mount`, `import`, …).
    ///
    /// A live lock is an [`Error::Locked`] naming its holder. A stale one (its OS lock is
    /// free, or on a filesystem without OS locks its pid is gone) of this host is taken over
    /// with a warning; one of another host only when `break_lock`. While `ending(holder)` says
    /// a live holder is going away (a mount whose unmount has begun), it is waited for, up to
    /// 5 s. Storage where the lock file cannot be made (read-only, not writable by this user)
    /// gives a lock that holds nothing, unless someone else holds one there.
    pub fn acquire(
        cipherdir: &Path,
        command: &str,
        break_lock: bool,
        ending: &dyn Fn(&Holder) -> bool,
    ) -> Result<Self> {
        let path = cipherdir.join(LOCK_NAME);
        let me = Holder::me(command);
        let deadline = Instant::now() + ENDING_GRACE;
        loop {
            let dir = sys::open_dir_path(cipherdir).ctx(|| format!("opening {}", cipherdir.display()))?;
            let flags = libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK;
            let fd = match sys::openat(dir.as_fd(), LOCK_NAME.as_bytes(), flags, 0o644) {
                Ok(fd) => fd,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM | libc::EROFS)) => {
                    return Self::unwritable(dir, path, me, e);
                }
                // A symbolic link or a directory planted under the lock's name.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::EISDIR)) => {
                    let st = sys::fstatat(dir.as_fd(), LOCK_NAME.as_bytes()).ctx(|| path.display().to_string())?;
                    return Err(not_a_lock(&path, &st));
                }
                Err(e) => return Err(Error::io(path.display().to_string(), e)),
            };
            let st = sys::fstat(fd.as_fd()).ctx(|| path.display().to_string())?;
            // Checked on the open file before anything is written through it: a hard link to
            // another file of the vault (its config) would otherwise be overwritten.
            if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink != 1 {
                return Err(not_a_lock(&path, &st));
            }
            let os_lock = sys::try_flock_exclusive(fd.as_fd());
            // The holder may have removed the file between our open and our flock: a lock on
            // an unlinked file guards nothing. Start again on the file now at the name.
            if os_lock.as_ref().is_ok_and(|&taken| taken) && !same_file(&dir, &st) {
                continue;
            }
            let previous = read_holder(&fd);
            let live = match os_lock {
                Ok(taken) => !taken,
                Err(e) if no_os_locks(&e) => {
                    tracing::debug!("{}: no OS locks here ({e}); the pid decides", path.display());
                    previous.as_ref().is_some_and(|h| h.is_this_host() && h.pid != me.pid && sys::process_exists(h.pid))
                }
                Err(e) => return Err(Error::io(format!("locking {}", path.display()), e)),
            };
            if live {
                let holder = match previous {
                    Some(h) => h,
                    // Just created: its holder writes its name next.
                    None => Self::wait_for_name(&fd, &me),
                };
                if ending(&holder) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                return Err(Error::Locked {
                    cipherdir: cipherdir.to_path_buf(),
                    holder,
                    breakable: false,
                    shared: false,
                });
            }
            let previous_existed = previous.is_some();
            if let Some(h) = previous {
                if !h.is_this_host() && !break_lock {
                    return Err(Error::Locked {
                        cipherdir: cipherdir.to_path_buf(),
                        holder: h,
                        breakable: true,
                        shared: false,
                    });
                }
                tracing::warn!(
                    "{}: taking over the lock of {} (pid {} on host {} since {}): {}",
                    cipherdir.display(),
                    if h.command == "mount" { "a mount" } else { "veilfs" },
                    h.pid,
                    h.host,
                    utc_text(h.since),
                    if h.is_this_host() { "that process is gone" } else { "--break-lock" }
                );
            }
            let lock = VaultLock { held: Some((dir, fd)), path, holder: me, took_over: previous_existed };
            lock.write_holder()?;
            return Ok(lock);
        }
    }

    /// The holder of a lock file that was empty when read: waits a moment for its name.
    fn wait_for_name(fd: &OwnedFd, me: &Holder) -> Holder {
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(25));
            if let Some(h) = read_holder(fd) {
                return h;
            }
        }
        Holder { pid: 0, host: me.host.clone(), since: 0, command: "an unknown command".into() }
    }

    /// No lock file can be made here: refused if someone else holds one, else a lock that
    /// holds nothing (read-only storage needs none; otherwise said once).
    fn unwritable(dir: OwnedFd, path: PathBuf, me: Holder, e: std::io::Error) -> Result<Self> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        if let Ok(fd) = sys::openat(dir.as_fd(), LOCK_NAME.as_bytes(), flags, 0) {
            if let (Ok(false), Some(holder)) = (sys::try_flock_exclusive(fd.as_fd()), read_holder(&fd)) {
                let cipherdir = path.parent().unwrap_or(Path::new("")).to_path_buf();
                return Err(Error::Locked { cipherdir, holder, breakable: false, shared: false });
            }
        }
        if e.raw_os_error() == Some(libc::EROFS) {
            tracing::debug!("{}: read-only storage, no lock taken", path.display());
        } else {
            tracing::warn!("cannot take the vault lock {}: {e}; going on without it", path.display());
        }
        Ok(VaultLock { held: None, path, holder: me, took_over: false })
    }

    /// Whether this lock was taken over from a holder that died holding it (a crash): its
    /// writes may have left files for the crash sweep ([`crate::settle`]).
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// Records this process as the holder: after a fork, the daemon that now holds the lock
    /// (the OS lock goes with the open file) names itself.
    pub fn now_held_by_this_process(&mut self) -> Result<()> {
        self.holder.pid = std::process::id();
        self.write_holder()
    }

    /// Whether an OS lock is held (false on storage where no lock file could be made).
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    fn write_holder(&self) -> Result<()> {
        let Some((_, fd)) = &self.held else { return Ok(()) };
        let what = || format!("writing {}", self.path.display());
        sys::ftruncate(fd.as_fd(), 0).ctx(what)?;
        sys::pwrite_all(fd.as_fd(), self.holder.to_text().as_bytes(), 0).ctx(what)
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
                    return Err(Error::Locked { cipherdir: cipherdir(), holder, breakable: false, shared: false });
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
                    // The caching mount wrote its name before it locked the directory.
                    let holder = holder(cipherdir).unwrap_or_else(|| Holder {
                        pid: 0,
                        host: sys::host_name(),
                        since: 0,
                        command: "mount".into(),
                    });
                    if ending(&holder) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    return Err(Error::Locked {
                        cipherdir: cipherdir.to_path_buf(),
                        holder,
                        breakable: false,
                        shared: true,
                    });
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
        if let Some((dir, fd)) = self.held.take() {
            // Removed only while it is still this lock's file; the OS lock goes with the fd.
            if let Ok(st) = sys::fstat(fd.as_fd()) {
                if same_file(&dir, &st) {
                    if let Err(e) = sys::unlinkat(dir.as_fd(), LOCK_NAME.as_bytes(), false) {
                        tracing::warn!("cannot remove the vault lock {}: {e}", self.path.display());
                    }
                }
            }
        }
    }
}

/// Whether `st` (of an open lock file) is the file now named `veilfs.lock` in `dir`.
fn same_file(dir: &OwnedFd, st: &Stat) -> bool {
    same_name(dir, LOCK_NAME, st)
}

/// Whether `st` (of an open file) is the file now named `name` in `dir`.
fn same_name(dir: &OwnedFd, name: &str, st: &Stat) -> bool {
    sys::fstatat(dir.as_fd(), name.as_bytes()).is_ok_and(|now| (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino))
}

fn read_holder(fd: &OwnedFd) -> Option<Holder> {
    let mut buf = vec![0u8; 4096];
    let n = sys::pread_full(fd.as_fd(), &mut buf, 0).ok()?;
    Holder::parse(&String::from_utf8_lossy(&buf[..n]))
}

/// The holder of the vault lock in `cipherdir`, if a live one holds it (for messages; takes
/// nothing).
pub fn holder(cipherdir: &Path) -> Option<Holder> {
    let dir = sys::open_dir_path(cipherdir).ok()?;
    let fd =
        sys::openat(dir.as_fd(), LOCK_NAME.as_bytes(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0).ok()?;
    match sys::try_flock_exclusive(fd.as_fd()) {
        Ok(false) => read_holder(&fd),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: &Holder) -> bool {
        false
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_text(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_text(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_text(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn a_held_lock_refuses_and_is_removed_when_dropped() {
        let t = tempfile::tempdir().unwrap();
        let lock = VaultLock::acquire(t.path(), "import", false, &never).unwrap();
        assert!(lock.is_held());
        let text = std::fs::read_to_string(t.path().join(LOCK_NAME)).unwrap();
        assert!(text.contains(&format!("pid={}\n", std::process::id())) && text.contains("command=import"), "{text}");
        // A second open file description of this process is refused like another process.
        let e = VaultLock::acquire(t.path(), "mount", false, &never).unwrap_err();
        assert!(matches!(e, Error::Locked { breakable: false, .. }), "{e}");
        assert!(e.to_string().contains("in use by `veilfs import`"), "{e}");
        assert_eq!(holder(t.path()).map(|h| h.command), Some("import".to_string()));
        drop(lock);
        assert!(!t.path().join(LOCK_NAME).exists());
        assert!(holder(t.path()).is_none());
    }

    #[test]
    fn a_lock_planted_as_a_hard_link_to_the_config_is_refused_and_nothing_is_written_through_it() {
        let t = tempfile::tempdir().unwrap();
        let conf = t.path().join("veilfs.conf");
        std::fs::write(&conf, b"{\"the vault's config\": true}").unwrap();
        std::fs::hard_link(&conf, t.path().join(LOCK_NAME)).unwrap();
        for break_lock in [false, true] {
            let e = VaultLock::acquire(t.path(), "mount", break_lock, &never).unwrap_err();
            assert!(matches!(&e, Error::Auth { detail, .. } if detail.contains("2 hard links")), "{e}");
        }
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
            let t = tempfile::tempdir().unwrap();
            std::fs::write(t.path().join("veilfs.conf"), b"config").unwrap();
            plant(&t.path().join(LOCK_NAME));
            let e = VaultLock::acquire(t.path(), "import", true, &never).unwrap_err();
            assert!(matches!(&e, Error::Auth { detail, .. } if detail.contains(kind)), "{kind}: {e}");
            assert_eq!(std::fs::read(t.path().join("veilfs.conf")).unwrap(), b"config", "{kind}");
        }
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
    fn a_stale_lock_of_this_host_is_taken_over_and_another_hosts_only_when_broken() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join(LOCK_NAME);
        let stale = Holder { pid: 999_999_999, host: sys::host_name(), since: 1, command: "mount".into() };
        std::fs::write(&file, stale.to_text()).unwrap();
        let lock = VaultLock::acquire(t.path(), "passwd", false, &never).unwrap();
        assert!(std::fs::read_to_string(&file).unwrap().contains("command=passwd"));
        drop(lock);
        let other = Holder { pid: 42, host: "elsewhere.example".into(), since: 1, command: "mount".into() };
        std::fs::write(&file, other.to_text()).unwrap();
        let e = VaultLock::acquire(t.path(), "import", false, &never).unwrap_err();
        assert!(matches!(e, Error::Locked { breakable: true, .. }), "{e}");
        assert!(e.to_string().contains("elsewhere.example") && e.to_string().contains("--break-lock"), "{e}");
        let lock = VaultLock::acquire(t.path(), "import", true, &never).unwrap();
        assert!(std::fs::read_to_string(&file).unwrap().contains(&format!("host={}", sys::host_name())));
        drop(lock);
    }

    #[test]
    fn caching_and_shared_storage_mounts_exclude_each_other() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (SharedLock::acquire(t.path(), &never).unwrap(), SharedLock::acquire(t.path(), &never).unwrap());
        // Offline writers work beside shared-storage mounts; a mount that caches does not.
        let lock = VaultLock::acquire(t.path(), "mount", false, &never).unwrap();
        let e = lock.exclude_shared_mounts(&|| false).unwrap_err();
        assert!(matches!(&e, Error::Locked { holder, .. } if holder.command == SHARED_MOUNTS), "{e}");
        assert!(e.to_string().contains("mounted with --shared-storage"), "{e}");
        drop((a, b, lock));
        let lock = VaultLock::acquire(t.path(), "mount", false, &never).unwrap();
        lock.exclude_shared_mounts(&|| false).unwrap();
        let e = SharedLock::acquire(t.path(), &never).unwrap_err();
        assert!(matches!(&e, Error::Locked { shared: true, .. }), "{e}");
        assert!(e.to_string().contains(&format!("mounted by pid {} on host", std::process::id())), "{e}");
        drop(lock);
        SharedLock::acquire(t.path(), &never).unwrap();
    }

    #[test]
    fn a_holder_that_is_ending_is_waited_for() {
        let t = tempfile::tempdir().unwrap();
        let first = VaultLock::acquire(t.path(), "mount", false, &never).unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(first);
        });
        let started = Instant::now();
        let lock = VaultLock::acquire(t.path(), "mount", false, &|h| h.command == "mount").unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        releaser.join().unwrap();
        drop(lock);
    }
}
