//! Set-id bits through this process's own changes of a backing file.
//!
//! Linux clears a file's set-user-id bit, and its set-group-id bit when it is
//! group-executable, when a process without `CAP_FSETID` writes, truncates or allocates the
//! file. A daemon running as the mounting user is such a process for every backing change it
//! makes: its own header rewrites (settling holes at the last close, clearing UNSETTLED), a
//! write-back of a shared mapping (by nobody), a writer that holds `CAP_FSETID`. The plaintext
//! rule is the mount's (it clears the bits where Linux would, for the one who asked); this
//! puts back what the backing filesystem cleared on its own.
//!
//! Cost: the mode is remembered while this process owns the file (the mount without shared
//! storage), refreshed by every chmod the mount makes, so a file without set-id bits costs no
//! system call; one with them costs one `fstat` after the change (and an `fchmod` if the bits
//! went). Counted for a `dd bs=4k` through a user's mount in docs/PERFORMANCE.md.

use crate::sys;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, Ordering};

/// `mode` not known.
const UNKNOWN: u32 = u32::MAX;
const SETID: u32 = libc::S_ISUID | libc::S_ISGID;

/// The remembered mode of one backing file and whether its set-id bits need keeping.
#[derive(Debug)]
pub(crate) struct SetIdKeeper {
    /// This process lacks `CAP_FSETID` (it is not root), so the backing filesystem clears
    /// set-id bits at its changes.
    keep: bool,
    /// `st_mode & 0o7777` as last seen or set by this process, or `UNKNOWN`.
    mode: AtomicU32,
}

impl SetIdKeeper {
    /// For a file whose mode was just read as `st_mode`.
    pub(crate) fn new(st_mode: u32) -> Self {
        SetIdKeeper { keep: sys::euid() != 0, mode: AtomicU32::new(st_mode & 0o7777) }
    }

    /// The mode bits of the file behind `fd`: the remembered ones when `trusted` (this
    /// process is the file's only changer), else read with `fstat`.
    pub(crate) fn mode(&self, fd: BorrowedFd<'_>, trusted: bool) -> io::Result<u32> {
        match self.mode.load(Ordering::Acquire) {
            m if trusted && m != UNKNOWN => Ok(m),
            _ => {
                let m = sys::fstat(fd)?.st_mode & 0o7777;
                self.note(m);
                Ok(m)
            }
        }
    }

    /// Remembers mode bits set or seen through any handle of the file.
    pub(crate) fn note(&self, mode: u32) {
        self.mode.store(mode & 0o7777, Ordering::Release);
    }

    /// Runs `f`, a change of the file behind `fd` by this process, and puts back the set-id
    /// bits the backing filesystem cleared at it. Only when nothing but those bits changed
    /// meanwhile (a chmod in between wins); best effort: a failure leaves the file as Linux
    /// would for an unprivileged writer, and is logged.
    pub(crate) fn keeping<R>(&self, fd: BorrowedFd<'_>, trusted: bool, what: &str, f: impl FnOnce() -> R) -> R {
        if !self.keep {
            return f();
        }
        let before = match self.mode(fd, trusted) {
            Ok(m) if m & SETID != 0 => m,
            _ => return f(),
        };
        let r = f();
        match sys::fstat(fd) {
            Ok(st) => {
                let now = st.st_mode & 0o7777;
                if now != before && now & 0o1777 == before & 0o1777 {
                    match sys::fchmod(fd, before) {
                        Ok(()) => return r,
                        Err(e) => tracing::warn!("set-id bits of {what} not restored: {e}"),
                    }
                }
                self.note(now);
            }
            Err(_) => self.note(UNKNOWN),
        }
        r
    }
}
