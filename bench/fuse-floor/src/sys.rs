//! Thin, safe wrappers over the Linux syscalls the passthrough needs.
//!
//! Every `unsafe` block of the crate that talks to the kernel lives here, so the
//! filesystem logic in `fs.rs` is plain safe Rust. Each wrapper turns the C
//! "-1 and errno" convention into `io::Result`, which converts straight into
//! `fuser::Errno` for replies.
//!
//! Inodes are held as `O_PATH` descriptors (see `inodes.rs`), so most metadata
//! calls use the `*at(fd, "", …, AT_EMPTY_PATH)` form; the few calls that have
//! no such form (truncate, xattrs, re-opening for I/O) go through the
//! `/proc/self/fd/N` magic link instead, as libfuse's passthrough_ll does.

use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Write as _};
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

/// `/proc/self/fd/N` for `fd`, built on the stack.
///
/// Used where Linux has no `AT_EMPTY_PATH` variant of a call; resolving the
/// magic link lands on the very inode the descriptor refers to (a symlink
/// descriptor resolves to the symlink itself, not its target).
pub struct ProcPath([u8; 40]);

impl ProcPath {
    pub fn new(fd: BorrowedFd<'_>) -> Self {
        let mut buf = [0u8; 40];
        let mut cursor = &mut buf[..];
        // Cannot fail: "/proc/self/fd/" + at most 10 digits fits in 40 bytes,
        // and the zero-initialised tail provides the terminating NUL.
        let _ = write!(cursor, "/proc/self/fd/{}", fd.as_raw_fd());
        ProcPath(buf)
    }

    pub fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.0).expect("ProcPath is NUL-terminated")
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
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: openat returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the file behind an `O_PATH` descriptor for real I/O.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    let path = ProcPath::new(fd);
    // SAFETY: the path is NUL-terminated; no O_CREAT so the mode is ignored.
    let fd = cvt(unsafe { libc::open(path.as_cstr().as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: open returned a fresh descriptor that nothing else owns.
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
            libc::pread(
                fd.as_raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
                (offset + done as u64) as libc::off_t,
            )
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
            libc::pwrite(
                fd.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                (offset + done as u64) as libc::off_t,
            )
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
    cvt(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    })?;
    Ok(())
}

/// Hard-links the inode behind `fd` as `newdir/newname`.
pub fn link_fd(fd: BorrowedFd<'_>, newdir: BorrowedFd<'_>, newname: &CStr) -> io::Result<()> {
    // SAFETY: both paths are NUL-terminated. AT_EMPTY_PATH links the inode the
    // O_PATH descriptor refers to (needs CAP_DAC_READ_SEARCH).
    let res = cvt(unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    });
    match res {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EPERM)) => {
            // Unprivileged fallback: follow the /proc magic link.
            let path = ProcPath::new(fd);
            // SAFETY: both paths are NUL-terminated.
            cvt(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    path.as_cstr().as_ptr(),
                    newdir.as_raw_fd(),
                    newname.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })?;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

pub fn readlink_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `buf` is writable for `buf.len()` bytes; readlinkat with an empty
    // path reads the symlink the O_PATH|O_NOFOLLOW descriptor refers to.
    let n = cvt_size(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// chown(2) on the inode behind `fd`; `u32::MAX` leaves an id unchanged.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: EMPTY is NUL-terminated; AT_EMPTY_PATH acts on `fd` itself, and
    // AT_SYMLINK_NOFOLLOW keeps a symlink descriptor on the link.
    cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// chown(2) of `dir/name` without following a final symlink.
pub fn chown_at(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// chmod(2) on the inode behind an `O_PATH` descriptor.
///
/// fchmod() rejects O_PATH descriptors; Linux 6.6+ has fchmodat2 with
/// AT_EMPTY_PATH, older kernels get the /proc magic-link fallback.
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: raw fchmodat2(dirfd, path, mode, flags) with a NUL-terminated path.
    let res = unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            mode as libc::mode_t,
            libc::AT_EMPTY_PATH,
        )
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
            Stamp::Omit => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            Stamp::Now => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            },
            Stamp::At(t) => match t.duration_since(UNIX_EPOCH) {
                Ok(d) => libc::timespec {
                    tv_sec: d.as_secs() as libc::time_t,
                    tv_nsec: d.subsec_nanos() as libc::c_long,
                },
                Err(before) => {
                    // Pre-1970: seconds round down, nanoseconds stay positive.
                    let d = before.duration();
                    let mut secs = -(d.as_secs() as i64);
                    let mut nsec = d.subsec_nanos() as i64;
                    if nsec > 0 {
                        secs -= 1;
                        nsec = 1_000_000_000 - nsec;
                    }
                    libc::timespec {
                        tv_sec: secs as libc::time_t,
                        tv_nsec: nsec as libc::c_long,
                    }
                }
            },
        }
    }
}

/// utimensat(2) on the inode behind `fd` (works on O_PATH and symlinks).
pub fn utimens_fd(fd: BorrowedFd<'_>, atime: Stamp, mtime: Stamp) -> io::Result<()> {
    let times = [atime.timespec(), mtime.timespec()];
    // SAFETY: `times` is a valid two-element array; EMPTY is NUL-terminated.
    cvt(unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            times.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a valid descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) })?;
    Ok(())
}

/// truncate(2) on the inode behind an `O_PATH` descriptor (no fd form exists).
pub fn truncate_fd(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let path = ProcPath::new(fd);
    // SAFETY: the path is NUL-terminated.
    cvt(unsafe { libc::truncate(path.as_cstr().as_ptr(), size as libc::off_t) })?;
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
    cvt(unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })?;
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

pub fn faccess_fd(fd: BorrowedFd<'_>, mask: i32) -> io::Result<()> {
    // SAFETY: EMPTY is NUL-terminated; glibc routes AT_EMPTY_PATH to faccessat2.
    cvt(unsafe { libc::faccessat(fd.as_raw_fd(), EMPTY.as_ptr(), mask, libc::AT_EMPTY_PATH) })?;
    Ok(())
}

/// getxattr(2) through /proc; an empty `buf` asks for the value's size.
pub fn getxattr_fd(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let path = ProcPath::new(fd);
    // SAFETY: path and name are NUL-terminated, `buf` is writable for its length
    // (a null pointer with length 0 is the documented size query).
    cvt_size(unsafe {
        libc::getxattr(
            path.as_cstr().as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
}

/// listxattr(2) through /proc; an empty `buf` asks for the list's size.
pub fn listxattr_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let path = ProcPath::new(fd);
    // SAFETY: the path is NUL-terminated and `buf` is writable for its length.
    cvt_size(unsafe {
        libc::listxattr(path.as_cstr().as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })
}

pub fn setxattr_fd(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let path = ProcPath::new(fd);
    // SAFETY: path and name are NUL-terminated, `value` readable for its length.
    cvt(unsafe {
        libc::setxattr(
            path.as_cstr().as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })?;
    Ok(())
}

pub fn removexattr_fd(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let path = ProcPath::new(fd);
    // SAFETY: path and name are NUL-terminated.
    cvt(unsafe { libc::removexattr(path.as_cstr().as_ptr(), name.as_ptr()) })?;
    Ok(())
}

/// Reads raw `linux_dirent64` records into `buf`; returns 0 at end of directory.
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for `buf.len()` bytes; the kernel writes whole
    // records only.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
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
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    // Root may lift the hard limit up to fs.nr_open.
    if let Ok(s) = std::fs::read_to_string("/proc/sys/fs/nr_open") {
        if let Ok(max) = s.trim().parse::<libc::rlim_t>() {
            let want = libc::rlimit {
                rlim_cur: max,
                rlim_max: max,
            };
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
