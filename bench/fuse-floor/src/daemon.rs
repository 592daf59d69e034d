//! Process plumbing: daemonizing with a readiness handshake, and turning
//! SIGINT/SIGTERM/SIGHUP into an unmount.
//!
//! Readiness: `fuser::Session::new` returns only after the kernel's INIT has
//! been answered, so from then on the mount is live (requests queue until the
//! worker threads start). The daemon child tells its parent through a pipe at
//! that point, and the parent exits 0; if the child fails first the pipe just
//! closes and the parent exits 1. A script can therefore run `fuse-floor …`
//! and use the mount as soon as the command returns.
//!
//! Shutdown: the signals are blocked in every thread (the mask is inherited by
//! fuser's workers) and a dedicated thread `sigwait`s for them. The first one
//! unmounts (plain umount, or a lazy detach if the mount is busy); the kernel
//! then tears the connection down, the workers' reads of /dev/fuse fail with
//! ENODEV and `Session::run` returns. A second signal detaches and exits at
//! once, which closes /dev/fuse and aborts the connection. An external
//! `fusermount3 -u` / `umount` ends the session the same way as the first.

use std::ffi::CString;
use std::io::{self, Read as _, Write as _};
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use fuser::SessionUnmounter;

/// Forks; the parent waits until the child reports a live mount and exits.
///
/// Must be called before any thread is spawned. Returns, in the child, the
/// write end of the readiness pipe to pass to [`notify_ready`].
pub fn daemonize() -> io::Result<OwnedFd> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process is still single-threaded, so the child inherits a
    // consistent address space.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(read_end);
            // SAFETY: setsid cannot corrupt memory; it detaches the child from
            // the terminal's session so Ctrl-C in the shell does not reach it.
            unsafe { libc::setsid() };
            Ok(write_end)
        }
        _child => {
            drop(write_end);
            let mut byte = [0u8; 1];
            let mut pipe = std::fs::File::from(read_end);
            let ok = matches!(pipe.read(&mut byte), Ok(1));
            std::process::exit(if ok { 0 } else { 1 });
        }
    }
}

/// Tells the waiting parent the mount is live, then detaches stdio.
pub fn notify_ready(pipe: OwnedFd) -> io::Result<()> {
    std::fs::File::from(pipe).write_all(b"1")?;
    let devnull = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    for target in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors; both fds are valid.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&devnull), target) };
    }
    // Do not pin whatever directory the daemon was started from.
    std::env::set_current_dir("/")
}

/// The set of signals that end the session.
pub struct TerminationSignals(libc::sigset_t);

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and in every thread
/// spawned after this call, so only the handler thread ever sees them.
pub fn block_termination_signals() -> io::Result<TerminationSignals> {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set before sigaddset touches it, and
    // pthread_sigmask reads a fully initialised set.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(set.as_mut_ptr(), sig);
        }
        let set = set.assume_init();
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(TerminationSignals(set))
    }
}

fn wait_for(signals: &TerminationSignals) -> i32 {
    let mut sig = 0;
    // SAFETY: the set is initialised and blocked; `sig` is a valid out-pointer.
    unsafe { libc::sigwait(&signals.0, &mut sig) };
    sig
}

/// Lazily detaches the mount at `mountpoint` (MNT_DETACH).
fn detach(mountpoint: &Path) {
    if let Ok(path) = CString::new(mountpoint.as_os_str().as_bytes()) {
        // SAFETY: the path is NUL-terminated.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Starts the thread that unmounts on SIGINT/SIGTERM/SIGHUP.
pub fn spawn_signal_handler(
    signals: TerminationSignals,
    mut unmounter: SessionUnmounter,
    mountpoint: PathBuf,
) -> io::Result<()> {
    std::thread::Builder::new().name("fuse-floor-signals".into()).spawn(move || {
        wait_for(&signals);
        // fuser tries umount(2) (or `fusermount3 -u` when unprivileged);
        // it fails with EBUSY while files are open, so detach instead.
        if unmounter.unmount().is_err() {
            detach(&mountpoint);
        }
        wait_for(&signals);
        detach(&mountpoint);
        std::process::exit(0);
    })?;
    Ok(())
}
