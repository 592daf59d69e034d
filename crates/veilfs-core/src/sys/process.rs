//! The process calls of the CLI: daemonizing a mount (`fork`, `setsid`, a readiness pipe,
//! standard fds onto `/dev/null`), its hardening and limits (not dumpable, `umask`,
//! `RLIMIT_NOFILE`), signals (a mask and `sigwait` for the mount, a flag for `import` and
//! `export`), unmounting, syslog and the peak memory of `veilfs speed`. Here rather than in
//! the binary so that the workspace has one module with `unsafe` (the binary and veilfs-fuse
//! forbid it).
//!
//! rustix covers the ids, `setsid`, pipes, `dup2` onto the standard fds, `prctl`, `umask`,
//! rlimits and `umount2`; rustix offers signal handling only to language runtimes, and no
//! `fork`, `syslog` or `getrusage`, so those few are libc calls, each behind a safe function
//! whose contract makes it sound.

use std::ffi::CString;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// A pipe whose two ends (read, write) are closed on exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// Which side of a [`fork`] this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The new process.
    Child,
    /// The calling process (the child's pid).
    Parent(u32),
}

/// The number of threads of this process (entries of `/proc/self/task`).
fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// `fork`, refused with `EBUSY` unless this process has a single thread: a child of a
/// multi-threaded process may find a lock held forever by a thread that does not exist in it,
/// which is why fork is unsafe in general. Only the calling thread could start another
/// meanwhile, so the check holds at the call.
pub fn fork() -> io::Result<Forked> {
    let threads = thread_count()
        .map_err(|e| io::Error::other(format!("cannot count this process's threads in /proc/self/task: {e}")))?;
    if threads != 1 {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    // SAFETY: the process has one thread (checked above), so the child inherits no lock or
    // state held by another thread; fork has no other precondition.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid as u32)),
    }
}

/// `setsid`: a new session without a controlling terminal.
pub fn setsid() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}

/// Points standard input, output and error at `fd` (`dup2`).
pub fn stdio_to(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::stdio::dup2_stdin(fd)?;
    rustix::stdio::dup2_stdout(fd)?;
    Ok(rustix::stdio::dup2_stderr(fd)?)
}

/// `prctl(PR_SET_DUMPABLE, 0)`: no core dumps, and no ptrace by same-user processes.
pub fn set_undumpable() -> io::Result<()> {
    Ok(rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?)
}

/// `umask(mask)`; returns the previous mask.
pub fn set_umask(mask: u32) -> u32 {
    rustix::process::umask(rustix::fs::Mode::from_bits_retain(mask)).bits()
}

/// Raises the soft limit of open files to the hard limit.
pub fn raise_fd_limit() -> io::Result<()> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut rl = getrlimit(Resource::Nofile);
    // The soft limit is at most the hard one; `None` is unlimited.
    if rl.current != rl.maximum {
        rl.current = rl.maximum;
        setrlimit(Resource::Nofile, rl)?;
    }
    Ok(())
}

/// `umount2(path, lazy ? MNT_DETACH : 0)`.
pub fn unmount(path: &Path, lazy: bool) -> io::Result<()> {
    let flags = if lazy { rustix::mount::UnmountFlags::DETACH } else { rustix::mount::UnmountFlags::empty() };
    Ok(rustix::mount::unmount(path, flags)?)
}

/// The generic flags of a mount, mount(8)'s `ro`, `nosuid`, `noexec`, … (the defaults:
/// read-write, set-id bits and device files honoured, `relatime`, links followed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountFlags {
    /// `ro`.
    pub read_only: bool,
    /// `nosuid`.
    pub nosuid: bool,
    /// `nodev`.
    pub nodev: bool,
    /// `noexec`.
    pub noexec: bool,
    /// `sync` (of the superblock).
    pub sync: bool,
    /// `dirsync` (of the superblock).
    pub dirsync: bool,
    /// `lazytime` (of the superblock).
    pub lazytime: bool,
    /// `noatime`.
    pub noatime: bool,
    /// `strictatime` (without it and `noatime`: `relatime`).
    pub strictatime: bool,
    /// `nodiratime`.
    pub nodiratime: bool,
    /// `nosymfollow`.
    pub nosymfollow: bool,
}

impl MountFlags {
    fn ms(&self) -> rustix::mount::MountFlags {
        use rustix::mount::MountFlags as M;
        let mut m = M::empty();
        for (on, flag) in [
            (self.read_only, M::RDONLY),
            (self.nosuid, M::NOSUID),
            (self.nodev, M::NODEV),
            (self.noexec, M::NOEXEC),
            (self.sync, M::SYNCHRONOUS),
            (self.dirsync, M::DIRSYNC),
            (self.lazytime, M::LAZYTIME),
            (self.nodiratime, M::NODIRATIME),
            (self.nosymfollow, M::NOSYMFOLLOW),
        ] {
            if on {
                m |= flag;
            }
        }
        // One of the three atime modes is always named: a remount without one would keep
        // the old mode, and relatime is the kernel's default anyway.
        m |= if self.noatime {
            M::NOATIME
        } else if self.strictatime {
            M::STRICTATIME
        } else {
            M::RELATIME
        };
        m
    }
}

/// Changes the flags of the live mount at `path` as `mount -o remount` does (root only):
/// first the superblock's (`sync`, `dirsync`, `lazytime`; its read-only state is kept as
/// `super_read_only` says), then the mount's own (`ro`, `nosuid`, `nodev`, `noexec`, the
/// atime mode, `nodiratime`, `nosymfollow`) with `MS_REMOUNT|MS_BIND`, which touches no
/// superblock. The file system's own options are left alone (FUSE ignores them at remount).
pub fn remount(path: &Path, flags: &MountFlags, super_read_only: bool) -> io::Result<()> {
    use rustix::mount::MountFlags as M;
    let sb = MountFlags { read_only: super_read_only, ..*flags };
    rustix::mount::mount_remount(path, sb.ms(), "")?;
    let per_mount = flags.ms() - (M::SYNCHRONOUS | M::DIRSYNC | M::LAZYTIME);
    Ok(rustix::mount::mount_remount(path, per_mount | M::BIND, "")?)
}

/// Peak resident memory of this process in KiB (`getrusage(RUSAGE_SELF).ru_maxrss`).
pub fn max_rss_kib() -> i64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the rusage it is given; RUSAGE_SELF cannot fail.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    // SAFETY: zero-initialised above (all-zero is a valid rusage) and filled by getrusage.
    unsafe { ru.assume_init() }.ru_maxrss
}

// ---- signals -----------------------------------------------------------------------------

/// Sets the action of `sig` to the default (`SIG_DFL`).
pub fn default_signal(sig: i32) {
    // SAFETY: SIG_DFL runs none of our code, so no handler can break async-signal safety.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// Ignores `sig` (`SIG_IGN`).
pub fn ignore_signal(sig: i32) {
    // SAFETY: SIG_IGN runs none of our code.
    unsafe { libc::signal(sig, libc::SIG_IGN) };
}

/// Sends `sig` to the calling thread (`raise`).
pub fn raise(sig: i32) {
    // SAFETY: raise has no preconditions; what the signal then does is its disposition's.
    unsafe { libc::raise(sig) };
}

/// Ends the process by `sig` with its default action (exit status 128 + `sig` if that does
/// not end it).
pub fn die_of(sig: i32) -> ! {
    die_at_once(sig);
    std::process::exit(128 + sig)
}

/// A set of signals blocked in the thread that made it and in every thread started later.
#[derive(Clone, Copy)]
pub struct BlockedSignals(libc::sigset_t);

/// Blocks `sigs` in this thread and every thread it starts later (`pthread_sigmask`), so they
/// wait for [`BlockedSignals::wait`].
pub fn block_signals(sigs: &[i32]) -> io::Result<BlockedSignals> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given.
    unsafe { libc::sigemptyset(set.as_mut_ptr()) };
    // SAFETY: initialised by sigemptyset just above.
    let mut set = unsafe { set.assume_init() };
    for &s in sigs {
        // SAFETY: an initialised set; an invalid signal number only makes the call fail.
        if unsafe { libc::sigaddset(&mut set, s) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: a valid set; a null old-set pointer is allowed.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(BlockedSignals(set))
}

impl BlockedSignals {
    /// Waits for one of the signals (`sigwait`) and returns its number.
    pub fn wait(&self) -> i32 {
        let mut sig = 0;
        // SAFETY: an initialised set and a valid out-pointer; with a valid set sigwait cannot
        // fail.
        unsafe { libc::sigwait(&self.0, &mut sig) };
        sig
    }
}

/// The signal [`catch_signals`] caught (0: none).
static CAUGHT: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if CAUGHT.swap(sig, Ordering::SeqCst) != 0 {
        // A second signal: end at once. signal() and raise() are async-signal-safe.
        die_at_once(sig);
    }
}

/// The default action of `sig`, raised (async-signal-safe: no exit handlers run).
fn die_at_once(sig: i32) {
    default_signal(sig);
    raise(sig);
}

/// From now on, `sigs` only set a flag ([`caught_signal`]); a second one ends the process
/// by its default action.
pub fn catch_signals(sigs: &[i32]) -> io::Result<()> {
    for &sig in sigs {
        let sa = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
        // SAFETY: all-zero is a valid sigaction (no flags, empty mask, SIG_DFL), filled in
        // below before use.
        let mut sa = unsafe { sa.assume_init() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only swaps an atomic and calls the async-signal-safe signal()
        // and raise(); the struct is valid and a null old-action pointer is allowed.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal caught since [`catch_signals`] (0: none).
pub fn caught_signal() -> i32 {
    CAUGHT.load(Ordering::SeqCst)
}

// ---- syslog ------------------------------------------------------------------------------

/// `openlog("veilfs", LOG_PID, LOG_DAEMON)`.
pub fn open_syslog() {
    // SAFETY: the ident is a static NUL-terminated string, valid for the process lifetime
    // (openlog keeps the pointer).
    unsafe { libc::openlog(c"veilfs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
}

/// One message to syslog at priority `prio` (`LOG_ERR`, ...); a NUL in `text` is sent as a
/// space.
pub fn syslog(prio: i32, text: &str) {
    let c = CString::new(text.replace('\0', " ")).expect("no NUL left");
    // SAFETY: "%s" with one valid C string argument.
    unsafe { libc::syslog(prio, c"%s".as_ptr(), c.as_ptr()) };
}
