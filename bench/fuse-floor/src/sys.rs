//! Thin, safe wrappers over the Linux syscalls the passthrough needs.
//!
//! Every `unsafe` block of the crate that talks to the filesystem lives here
//! (process plumbing is in `daemon.rs`), so the logic in `fs.rs` is plain safe
//! Rust. Each wrapper turns the C "-1 and errno" convention into
//! `io::Result`, which converts straight into `fuser::Errno` for replies.
//!
//! Directories are held as `O_PATH` descriptors and everything else as
//! (directory descriptor, name) (see `inodes.rs`), so calls come in two
//! shapes: `*at(dirfd, name, …)` and `*at(fd, "", …, AT_EMPTY_PATH)` to act
//! on a descriptor itself. Calls with neither form (path xattr calls) go
//! through the `/proc/self/fd/N` magic link.
//!
//! Why its own layer rather than `veilfs_core::sys` (the syscall layer of the
//! rest of the workspace): this crate is the neutral floor veilfs is measured
//! against, so it depends on no veilfs code. A change to veilfs's layer must
//! not move the floor, and the floor keeps measuring the same plain
//! passthrough over libc that its earlier figures in PERFORMANCE.md measured
//! (hence libc, not rustix, here). Its `unsafe` blocks (here and the
//! process plumbing in `daemon.rs`) each carry a `SAFETY:` line, checked by
//! `clippy::undocumented_unsafe_blocks` like the rest of the workspace.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{SystemTime, UNIX_EPOCH};

/// The empty path used with `AT_EMPTY_PATH` to act on the descriptor itself.
pub const EMPTY: &CStr = c"";

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// Runs `f` with a NUL-terminated copy of `name`.
///
/// File names arrive from fuser as byte slices into the request buffer, not
/// NUL-terminated. Names are at most `NAME_MAX` (255) bytes, so a stack buffer
/// avoids a heap allocation on every lookup/create.
pub fn with_cstr<T>(name: &OsStr, f: impl FnOnce(&CStr) -> io::Result<T>) -> io::Result<T> {
    let bytes = name.as_bytes();
    let mut buf = [0u8; 256];
    if bytes.len() < buf.len() {
        buf[..bytes.len()].copy_from_slice(bytes);
        let c = CStr::from_bytes_with_nul(&buf[..=bytes.len()]).map_err(|_| einval())?;
        f(c)
    } else {
        let c = CString::new(bytes).map_err(|_| einval())?;
        f(&c)
    }
}

/// A `/proc/self/fd/N[/name]` path, for the calls Linux offers no
/// descriptor-relative form of (path-based xattr calls, chmod of an O_PATH
/// fd before Linux 6.6). Resolving the magic link lands on the very inode
/// the descriptor refers to. The caller keeps `fd` open while it is used.
pub struct ProcPath(CString);

impl ProcPath {
    pub fn new(fd: BorrowedFd<'_>) -> Self {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        ProcPath(CString::new(path).expect("digits contain no NUL"))
    }

    /// `name` inside the directory `dir`.
    pub fn child(dir: BorrowedFd<'_>, name: &CStr) -> Self {
        let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        path.extend_from_slice(name.to_bytes());
        ProcPath(CString::new(path).expect("a CStr has no interior NUL"))
    }

    pub fn as_cstr(&self) -> &CStr {
        &self.0
    }
}

/// A zeroed `struct stat`, filled by the kernel.
fn stat_buf() -> MaybeUninit<libc::stat> {
    MaybeUninit::zeroed()
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = stat_buf();
    // SAFETY: `st` is a valid, writable `struct stat`; fstat accepts O_PATH fds.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so the kernel filled the whole struct.
    Ok(unsafe { st.assume_init() })
}

pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<libc::stat> {
    let mut st = stat_buf();
    // SAFETY: `name` is NUL-terminated and `st` is a valid `struct stat`.
    cvt(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded, so the kernel filled the whole struct.
    Ok(unsafe { st.assume_init() })
}

pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; the mode is passed as the variadic
    // argument open(2) expects.
    let fd =
        cvt(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    // SAFETY: openat returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Borrows the descriptor stored in a FUSE file handle.
///
/// The passthrough stores the raw backing descriptor as the FUSE `fh` (the same
/// trick libfuse's passthrough examples use), so I/O needs no table lookup and
/// no lock. The descriptor is created by `into_handle` in open/create and closed
/// only by `close_handle` in release; the kernel sends no request carrying an
/// `fh` after its RELEASE (in-flight requests pin the kernel's file object,
/// which is what triggers RELEASE), so the descriptor is open for every use.
pub fn handle_fd(fh: u64) -> BorrowedFd<'static> {
    // SAFETY: see the function documentation: `fh` is a descriptor we own that
    // stays open until the kernel releases the handle, after which it is never
    // passed to us again.
    unsafe { BorrowedFd::borrow_raw(fh as RawFd) }
}

/// Turns an owned descriptor into a FUSE file handle (see [`handle_fd`]).
pub fn into_handle(fd: OwnedFd) -> u64 {
    fd.into_raw_fd() as u64
}

/// Closes the descriptor behind a FUSE file handle on RELEASE.
pub fn close_handle(fh: u64) {
    // SAFETY: RELEASE is sent exactly once per handle and is the last request
    // to carry it, so we are the sole owner of this descriptor now.
    drop(unsafe { OwnedFd::from_raw_fd(fh as RawFd) });
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a valid writable buffer of `rest.len()` bytes.
        let n = cvt_size(unsafe {
            libc::pread(fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len(), (offset + done as u64) as libc::off_t)
        });
        match n {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}

pub fn pwrite(fd: BorrowedFd<'_>, data: &[u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        let rest = &data[done..];
        // SAFETY: `rest` is a valid readable buffer of `rest.len()` bytes.
        let n = cvt_size(unsafe {
            libc::pwrite(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len(), (offset + done as u64) as libc::off_t)
        });
        match n {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: libc::dev_t) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, rdev) })?;
    Ok(())
}

pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

pub fn renameat2(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated.
    cvt(unsafe { libc::renameat2(olddir.as_raw_fd(), oldname.as_ptr(), newdir.as_raw_fd(), newname.as_ptr(), flags) })?;
    Ok(())
}

pub fn linkat(olddir: BorrowedFd<'_>, oldname: &CStr, newdir: BorrowedFd<'_>, newname: &CStr) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated.
    cvt(unsafe { libc::linkat(olddir.as_raw_fd(), oldname.as_ptr(), newdir.as_raw_fd(), newname.as_ptr(), 0) })?;
    Ok(())
}

pub fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `name` is NUL-terminated and `buf` is writable for its length.
    let n = cvt_size(unsafe { libc::readlinkat(dir.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(n);
    Ok(buf)
}

/// fchownat(2); `u32::MAX` leaves an id unchanged. With `AT_EMPTY_PATH` and
/// an empty name it acts on `dir` itself (O_PATH descriptors included).
pub fn chown_at(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32, flags: i32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::fchownat(dir.as_raw_fd(), name.as_ptr(), uid, gid, flags) })?;
    Ok(())
}

/// fchmodat(2) of `dir/name` (follows a final symlink, as chmod(2) does).
pub fn chmod_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, 0) })?;
    Ok(())
}

/// chmod(2) on the inode behind an `O_PATH` descriptor.
///
/// fchmod() rejects O_PATH descriptors; Linux 6.6+ has fchmodat2 with
/// AT_EMPTY_PATH, older kernels get the /proc magic-link fallback.
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: raw fchmodat2(dirfd, path, mode, flags) with a NUL-terminated path.
    let res = unsafe {
        libc::syscall(libc::SYS_fchmodat2, fd.as_raw_fd(), EMPTY.as_ptr(), mode as libc::mode_t, libc::AT_EMPTY_PATH)
    };
    if res == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(err);
    }
    let path = ProcPath::new(fd);
    // SAFETY: the path is NUL-terminated.
    cvt(unsafe { libc::chmod(path.as_cstr().as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on a valid descriptor.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) })?;
    Ok(())
}

/// What to set a timestamp to in [`utimens_fd`].
#[derive(Clone, Copy, Debug)]
pub enum Stamp {
    Omit,
    Now,
    At(SystemTime),
}

impl Stamp {
    fn timespec(self) -> libc::timespec {
        match self {
            Stamp::Omit => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            Stamp::Now => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
            Stamp::At(t) => match t.duration_since(UNIX_EPOCH) {
                Ok(d) => {
                    libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long }
                }
                Err(before) => {
                    // Pre-1970: seconds round down, nanoseconds stay positive.
                    let d = before.duration();
                    let mut secs = -(d.as_secs() as i64);
                    let mut nsec = d.subsec_nanos() as i64;
                    if nsec > 0 {
                        secs -= 1;
                        nsec = 1_000_000_000 - nsec;
                    }
                    libc::timespec { tv_sec: secs as libc::time_t, tv_nsec: nsec as libc::c_long }
                }
            },
        }
    }
}

/// utimensat(2); with `AT_EMPTY_PATH` and an empty name it acts on `dir`
/// itself (O_PATH descriptors included).
pub fn utimens_at(dir: BorrowedFd<'_>, name: &CStr, atime: Stamp, mtime: Stamp, flags: i32) -> io::Result<()> {
    let times = [atime.timespec(), mtime.timespec()];
    // SAFETY: `times` is a valid two-element array; `name` is NUL-terminated.
    cvt(unsafe { libc::utimensat(dir.as_raw_fd(), name.as_ptr(), times.as_ptr(), flags) })?;
    Ok(())
}

pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a valid descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) })?;
    Ok(())
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: plain syscalls on a valid descriptor.
    cvt(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })?;
    Ok(())
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a valid descriptor.
    cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) })?;
    Ok(())
}

pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall on a valid descriptor.
    let res = unsafe { libc::lseek(fd.as_raw_fd(), offset as libc::off_t, whence) };
    if res < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(res as i64)
    }
}

pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs> {
    let mut st = MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `st` is a valid, writable `struct statvfs`.
    cvt(unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded and filled the struct.
    Ok(unsafe { st.assume_init() })
}

pub fn faccessat(dir: BorrowedFd<'_>, name: &CStr, mask: i32, flags: i32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; glibc routes non-zero flags to faccessat2.
    cvt(unsafe { libc::faccessat(dir.as_raw_fd(), name.as_ptr(), mask, flags) })?;
    Ok(())
}

/// getxattr(2), or lgetxattr(2) when `!follow`; an empty `buf` asks for the
/// value's size.
pub fn getxattr(path: &ProcPath, follow: bool, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let (p, n) = (path.as_cstr().as_ptr(), name.as_ptr());
    let (b, len) = (buf.as_mut_ptr().cast(), buf.len());
    // SAFETY: path and name are NUL-terminated and `buf` is writable for its
    // length (length 0 is the documented size query).
    cvt_size(unsafe {
        if follow {
            libc::getxattr(p, n, b, len)
        } else {
            libc::lgetxattr(p, n, b, len)
        }
    })
}

/// listxattr(2), or llistxattr(2) when `!follow`; an empty `buf` asks for
/// the list's size.
pub fn listxattr(path: &ProcPath, follow: bool, buf: &mut [u8]) -> io::Result<usize> {
    let p = path.as_cstr().as_ptr();
    let (b, len) = (buf.as_mut_ptr().cast(), buf.len());
    // SAFETY: the path is NUL-terminated and `buf` is writable for its length.
    cvt_size(unsafe {
        if follow {
            libc::listxattr(p, b, len)
        } else {
            libc::llistxattr(p, b, len)
        }
    })
}

pub fn setxattr(path: &ProcPath, follow: bool, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let (p, n) = (path.as_cstr().as_ptr(), name.as_ptr());
    let (v, len) = (value.as_ptr().cast(), value.len());
    // SAFETY: path and name are NUL-terminated, `value` readable for its length.
    cvt(unsafe {
        if follow {
            libc::setxattr(p, n, v, len, flags)
        } else {
            libc::lsetxattr(p, n, v, len, flags)
        }
    })?;
    Ok(())
}

pub fn removexattr(path: &ProcPath, follow: bool, name: &CStr) -> io::Result<()> {
    let (p, n) = (path.as_cstr().as_ptr(), name.as_ptr());
    // SAFETY: path and name are NUL-terminated.
    cvt(unsafe {
        if follow {
            libc::removexattr(p, n)
        } else {
            libc::lremovexattr(p, n)
        }
    })?;
    Ok(())
}

/// Reads raw `linux_dirent64` records into `buf`; returns 0 at end of directory.
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for `buf.len()` bytes; the kernel writes whole
    // records only.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
    cvt_size(n as isize)
}

/// Sets this process's file-creation mask; returns the previous one.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// Raises RLIMIT_NOFILE as far as allowed; returns the new soft limit.
///
/// The passthrough keeps one O_PATH descriptor per inode the kernel remembers,
/// so `ls -lR` of a big tree needs far more than the usual 1024.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    // Root may lift the hard limit up to fs.nr_open.
    if let Ok(s) = std::fs::read_to_string("/proc/sys/fs/nr_open") {
        if let Ok(max) = s.trim().parse::<libc::rlim_t>() {
            let want = libc::rlimit { rlim_cur: max, rlim_max: max };
            // SAFETY: `want` is a valid rlimit struct.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
                return max;
            }
        }
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit struct.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    lim.rlim_cur
}

pub fn geteuid() -> u32 {
    // SAFETY: cannot fail.
    unsafe { libc::geteuid() }
}

pub fn getegid() -> u32 {
    // SAFETY: cannot fail.
    unsafe { libc::getegid() }
}
