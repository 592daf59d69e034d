//! Thin, safe wrappers over the `*at` system calls, so every operation is relative to an
//! open directory fd: no path is re-walked per request, and a directory renamed while in
//! use keeps working (the gocryptfs 2.0 lesson: directory-fd caching made small-file work
//! 2–3× faster).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `openat(dir, name, flags, mode)` with `O_CLOEXEC`.
pub fn openat(dir: BorrowedFd<'_>, name: &[u8], flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: `c` is a valid NUL-terminated string and `dir` a valid fd for the call's duration.
    let fd =
        check(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    // SAFETY: openat returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a directory (`O_DIRECTORY | O_RDONLY`) relative to `dir`.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    openat(dir, name, libc::O_DIRECTORY | libc::O_RDONLY | libc::O_NOFOLLOW, 0)
}

/// Opens the directory `rel` below `root` (names separated by `/`; empty: `root` itself), one
/// name at a time, never following a link and never going up (`..` is refused).
pub fn open_dir_below(root: BorrowedFd<'_>, rel: &str) -> io::Result<OwnedFd> {
    let mut cur = open_dir_at(root, b".")?;
    for c in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        cur = open_dir_at(cur.as_fd(), c.as_bytes())?;
    }
    Ok(cur)
}

/// Opens a directory by path.
pub fn open_dir_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: valid C string; the returned fd is checked and owned below.
    let fd = check(unsafe { libc::open(c.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC) })?;
    // SAFETY: fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dir` itself.
pub fn fstatat(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    let flags =
        if name.is_empty() { libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: zeroed `stat` is a valid out-buffer; pointers are valid for the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    check(unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `fstat(fd)`.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: zeroed `stat` is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `mkdirat`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid fd and C string.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode) }).map(drop)
}

/// `unlinkat` (with `AT_REMOVEDIR` when `dir_flag`).
pub fn unlinkat(dir: BorrowedFd<'_>, name: &[u8], dir_flag: bool) -> io::Result<()> {
    let c = cstr(name)?;
    let flags = if dir_flag { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid fd and C string.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) }).map(drop)
}

/// `renameat2(olddir, old, newdir, new, flags)`.
pub fn renameat2(
    olddir: BorrowedFd<'_>,
    old: &[u8],
    newdir: BorrowedFd<'_>,
    new: &[u8],
    flags: libc::c_uint,
) -> io::Result<()> {
    let (o, n) = (cstr(old)?, cstr(new)?);
    // SAFETY: valid fds and C strings.
    check(unsafe { libc::renameat2(olddir.as_raw_fd(), o.as_ptr(), newdir.as_raw_fd(), n.as_ptr(), flags) }).map(drop)
}

/// `linkat(olddir, old, newdir, new, 0)`.
pub fn linkat(olddir: BorrowedFd<'_>, old: &[u8], newdir: BorrowedFd<'_>, new: &[u8]) -> io::Result<()> {
    let (o, n) = (cstr(old)?, cstr(new)?);
    // SAFETY: valid fds and C strings.
    check(unsafe { libc::linkat(olddir.as_raw_fd(), o.as_ptr(), newdir.as_raw_fd(), n.as_ptr(), 0) }).map(drop)
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (t, n) = (cstr(target)?, cstr(name)?);
    // SAFETY: valid fd and C strings.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), n.as_ptr()) }).map(drop)
}

/// `readlinkat(dir, name)`.
pub fn readlinkat(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<u8>> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buffer pointer and length describe writable memory we own.
    let n = unsafe { libc::readlinkat(dir.as_raw_fd(), c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// `mknodat`.
pub fn mknodat(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid fd and C string.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), c.as_ptr(), mode, dev) }).map(drop)
}

/// `fchmodat` on an entry (not following symlinks is not supported by Linux for chmod, so
/// callers must not pass symlinks).
pub fn fchmodat(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid fd and C string.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), c.as_ptr(), mode, 0) }).map(drop)
}

/// `fchownat(..., AT_SYMLINK_NOFOLLOW)`; `u32::MAX` leaves an id unchanged.
pub fn fchownat(dir: BorrowedFd<'_>, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
    let c = cstr(name)?;
    let flags =
        if name.is_empty() { libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: valid fd and C string.
    check(unsafe { libc::fchownat(dir.as_raw_fd(), c.as_ptr(), uid, gid, flags) }).map(drop)
}

/// `utimensat(..., AT_SYMLINK_NOFOLLOW)` with two timespecs (use `UTIME_OMIT` to skip one).
pub fn utimensat(dir: BorrowedFd<'_>, name: &[u8], times: &[libc::timespec; 2]) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid fd, C string and a two-element timespec array.
    check(unsafe { libc::utimensat(dir.as_raw_fd(), c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }).map(drop)
}

/// `pread` that loops until `buf` is full or EOF; returns the bytes read.
pub fn pread_full(fd: RawFd, buf: &mut [u8], mut off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer/length pair describes the unfilled tail of `buf`.
        let n = unsafe { libc::pread(fd, buf[done..].as_mut_ptr().cast(), buf.len() - done, off as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        done += n as usize;
        off += n as u64;
    }
    Ok(done)
}

/// `pwrite` that loops until all of `buf` is written.
pub fn pwrite_all(fd: RawFd, buf: &[u8], mut off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer/length pair describes the unwritten tail of `buf`.
        let n = unsafe { libc::pwrite(fd, buf[done..].as_ptr().cast(), buf.len() - done, off as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
        off += n as u64;
    }
    Ok(())
}

/// `ftruncate`.
pub fn ftruncate(fd: RawFd, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::ftruncate(fd, len as libc::off_t) }).map(drop)
}

/// One raw directory entry.
#[derive(Clone, Debug)]
pub struct RawDirEntry {
    /// On-disk name.
    pub name: Vec<u8>,
    /// Inode number in the backing filesystem.
    pub ino: u64,
    /// `d_type` (may be `DT_UNKNOWN`).
    pub d_type: u8,
}

/// Lists a directory (all entries, including `.`/`..`) without following any path.
pub fn read_dir_fd(dir: BorrowedFd<'_>) -> io::Result<Vec<RawDirEntry>> {
    // Read through a fresh fd of the same directory so the caller's fd offset is untouched.
    let own = open_dir_at(dir, b".")?;
    let raw = own.as_raw_fd();
    std::mem::forget(own);
    // SAFETY: `raw` is an open directory fd we own; fdopendir takes ownership of it.
    let dirp = unsafe { libc::fdopendir(raw) };
    if dirp.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so we still own `raw`.
        unsafe { libc::close(raw) };
        return Err(e);
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: errno is thread-local; resetting it lets us tell EOF from error.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `dirp` is a valid DIR* until closedir below.
        let ent = unsafe { libc::readdir64(dirp) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: valid DIR*, closed exactly once.
            unsafe { libc::closedir(dirp) };
            if e.raw_os_error().unwrap_or(0) != 0 {
                return Err(e);
            }
            return Ok(out);
        }
        // SAFETY: readdir64 returned a valid entry whose d_name is NUL-terminated.
        let (name, ino, d_type) = unsafe {
            let e = &*ent;
            (std::ffi::CStr::from_ptr(e.d_name.as_ptr()).to_bytes().to_vec(), e.d_ino, e.d_type)
        };
        out.push(RawDirEntry { name, ino, d_type });
    }
}

/// Why a small metadata file (directory IV, long-name side file, config) could not be read.
#[derive(Debug)]
pub enum MetaError {
    /// The system call failed (`NotFound` when the file is absent).
    Io(io::Error),
    /// Something other than a regular file is there: a FIFO, socket, device, directory or
    /// symlink was planted where the format puts a small file. Its `st_mode` (`S_IFLNK` for a
    /// symlink, which is never opened).
    NotRegular(u32),
    /// The file is larger than the format allows (its size).
    TooLarge(u64),
}

impl MetaError {
    /// True when the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, MetaError::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

impl std::fmt::Display for MetaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaError::Io(e) => write!(f, "{e}"),
            MetaError::NotRegular(mode) => write!(f, "is {}, not a regular file", type_name(*mode)),
            MetaError::TooLarge(n) => write!(f, "is {n} bytes long, larger than the format allows"),
        }
    }
}

/// "a FIFO", "a directory", ... for a `st_mode`.
pub fn type_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "an object of unknown type",
    }
}

/// Flags for opening anything an attacker may have planted: never follow a symlink, never
/// block (a FIFO opens at once instead of waiting for a writer), never become a controlling
/// terminal.
const SAFE_OPEN: libc::c_int = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Opens `name` in `dir` for reading as a regular file and checks it is one of at most `max`
/// bytes, then reads it whole (with one read more than `max` to catch growth meanwhile).
/// Nothing planted there can block or exhaust the reader: a symlink is not followed, a FIFO
/// or device is opened non-blocking and refused by type before any read.
pub fn read_meta_at(dir: BorrowedFd<'_>, name: &[u8], max: usize) -> Result<Vec<u8>, MetaError> {
    let fd = match openat(dir, name, libc::O_RDONLY | SAFE_OPEN, 0) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(MetaError::NotRegular(libc::S_IFLNK)),
        Err(e) => return Err(MetaError::Io(e)),
    };
    read_meta_fd(fd, max)
}

/// [`read_meta_at`] for a path (the config file), not following a final symlink.
pub fn read_meta_path(path: &std::path::Path, max: usize) -> Result<Vec<u8>, MetaError> {
    let c = cstr(path.as_os_str().as_bytes()).map_err(MetaError::Io)?;
    // SAFETY: valid C string; the returned fd is checked and owned below.
    let fd = match check(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | SAFE_OPEN) }) {
        // SAFETY: fresh fd owned by nobody else.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(MetaError::NotRegular(libc::S_IFLNK)),
        Err(e) => return Err(MetaError::Io(e)),
    };
    read_meta_fd(fd, max)
}

fn read_meta_fd(fd: OwnedFd, max: usize) -> Result<Vec<u8>, MetaError> {
    let st = fstat(fd.as_fd()).map_err(MetaError::Io)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(MetaError::NotRegular(st.st_mode));
    }
    if st.st_size as u64 > max as u64 {
        return Err(MetaError::TooLarge(st.st_size as u64));
    }
    let mut buf = vec![0u8; st.st_size as usize + 1];
    let n = pread_full(fd.as_raw_fd(), &mut buf, 0).map_err(MetaError::Io)?;
    if n > max {
        return Err(MetaError::TooLarge(n as u64));
    }
    buf.truncate(n);
    Ok(buf)
}

/// Creates `name` in `dir` exclusively with `contents` and mode `mode`.
pub fn write_new_file(dir: BorrowedFd<'_>, name: &[u8], contents: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let fd = openat(dir, name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)?;
    pwrite_all(fd.as_raw_fd(), contents, 0)
}

/// `fsync`.
pub fn fsync(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::fsync(fd) }).map(drop)
}

/// `fdatasync`.
pub fn fdatasync(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::fdatasync(fd) }).map(drop)
}

/// Converts an `OwnedFd` to a `File`.
pub fn into_file(fd: OwnedFd) -> File {
    File::from(fd)
}

/// The bytes of an `OsStr`.
pub fn os_bytes(s: &OsStr) -> &[u8] {
    s.as_bytes()
}

/// `fchmod`.
pub fn fchmod(fd: BorrowedFd<'_>, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map(drop)
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: `Ok(true)` when taken, `Ok(false)` when another open file
/// description holds it.
pub fn try_flock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: plain syscall on an fd.
    match check(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// This machine's host name (`gethostname`), lossy UTF-8.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length; gethostname NUL-terminates within it
    // unless the name was truncated, which the search below handles.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Whether a process with this pid exists on this machine (in this pid namespace).
pub fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    unsafe { libc::kill(pid, 0) == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) }
}

/// `futimens(fd, times)`.
pub fn futimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: valid fd and a two-element timespec array.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(drop)
}

/// Adds `O_NOATIME` to an open file's flags, so reading it leaves its access time alone
/// (EPERM for a process that neither owns the file nor holds `CAP_FOWNER`).
pub fn set_noatime(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl F_GETFL/F_SETFL on a valid fd, no pointers.
    let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NOATIME) }).map(drop)
}

/// Reads a byte of `fd` with `O_NOATIME` lifted for that read, so that the file's own
/// filesystem moves its access time by its mount's rule — without moving the change time, as
/// setting the time with `futimens` would.
pub fn read_for_atime(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl F_GETFL/F_SETFL on a valid fd, no pointers.
    let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NOATIME) })?;
    let r = pread_full(fd.as_raw_fd(), &mut [0u8; 1], 0);
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) })?;
    r.map(drop)
}

/// `fstatvfs`.
pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs> {
    // SAFETY: zeroed statvfs is a valid out-buffer.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    check(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut s) })?;
    Ok(s)
}

/// `fallocate`.
pub fn fallocate(fd: RawFd, mode: libc::c_int, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::fallocate(fd, mode, off as libc::off_t, len as libc::off_t) }).map(drop)
}

/// `lseek`.
pub fn lseek(fd: RawFd, off: i64, whence: libc::c_int) -> io::Result<i64> {
    // SAFETY: plain syscall on an fd.
    let r = unsafe { libc::lseek(fd, off, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A `/proc/self/fd/<dir>[/<name>]` path, to reach an entry with the path-based `l*xattr`
/// calls (there is no `*xattrat` for all of them on older kernels).
pub fn proc_path(dir: BorrowedFd<'_>, name: Option<&[u8]>) -> io::Result<CString> {
    let mut p = format!("/proc/self/fd/{}", dir.as_raw_fd()).into_bytes();
    if let Some(n) = name {
        p.push(b'/');
        p.extend_from_slice(n);
    }
    cstr(&p)
}

fn ssize(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `lgetxattr`; an empty `buf` asks for the size.
pub fn lgetxattr(path: &CString, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    let n = cstr(name)?;
    // SAFETY: valid C strings; the buffer pointer/length describe writable memory (or 0/null).
    ssize(unsafe { libc::lgetxattr(path.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `lsetxattr`.
pub fn lsetxattr(path: &CString, name: &[u8], value: &[u8], flags: libc::c_int) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: valid C strings and a readable value buffer.
    check(unsafe { libc::lsetxattr(path.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) }).map(drop)
}

/// `llistxattr`; an empty `buf` asks for the size.
pub fn llistxattr(path: &CString, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid C string; the buffer describes writable memory.
    ssize(unsafe { libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `lremovexattr`.
pub fn lremovexattr(path: &CString, name: &[u8]) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: valid C strings.
    check(unsafe { libc::lremovexattr(path.as_ptr(), n.as_ptr()) }).map(drop)
}

/// `fgetxattr`; an empty `buf` asks for the size.
pub fn fgetxattr(fd: BorrowedFd<'_>, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    let n = cstr(name)?;
    // SAFETY: valid fd and C string; the buffer describes writable memory.
    ssize(unsafe { libc::fgetxattr(fd.as_raw_fd(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `fsetxattr`.
pub fn fsetxattr(fd: BorrowedFd<'_>, name: &[u8], value: &[u8], flags: libc::c_int) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: valid fd, C string and value buffer.
    check(unsafe { libc::fsetxattr(fd.as_raw_fd(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) }).map(drop)
}

/// `flistxattr`; an empty `buf` asks for the size.
pub fn flistxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid fd; the buffer describes writable memory.
    ssize(unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `fremovexattr`.
pub fn fremovexattr(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: valid fd and C string.
    check(unsafe { libc::fremovexattr(fd.as_raw_fd(), n.as_ptr()) }).map(drop)
}

// ---- verified handles on entries ---------------------------------------------------------
//
// Every change of an entry's attributes goes through a handle on the object itself, obtained
// without following a link and checked by type: a name is resolved once, and what is acted
// on is what was checked. (A name-based `fchmodat` by a root daemon follows a symlink that a
// user planted in the ciphertext; see docs/SECURITY.md, "Multi-user mounts".)

/// An `O_PATH | O_NOFOLLOW` handle on `dir/name` (a symlink is the symlink itself) and its
/// `stat`. Opening with `O_PATH` touches nothing: no FIFO blocks, no device driver runs.
pub fn open_path_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<(OwnedFd, libc::stat)> {
    let fd = openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
    let st = fstat(fd.as_fd())?;
    Ok((fd, st))
}

/// Opens `dir/name` as a regular file with `flags` (access mode and the like): never follows
/// a symlink, never blocks on a FIFO, and refuses anything but a regular file by type
/// (`Err(Ok(st_mode))`), so a planted FIFO, socket or device is reported, not used.
pub fn open_regular_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    flags: libc::c_int,
) -> Result<(OwnedFd, libc::stat), Result<u32, io::Error>> {
    let fd = match openat(dir, name, flags | SAFE_OPEN, 0) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Ok(libc::S_IFLNK)),
        Err(e) => return Err(Err(e)),
    };
    let st = fstat(fd.as_fd()).map_err(Err)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Ok(st.st_mode));
    }
    Ok((fd, st))
}

/// `/proc/self/fd/N`: reaches the object behind `fd` itself (for calls that have no fd form
/// taking an `O_PATH` handle).
pub fn fd_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
}

/// chmod of the object behind `fd` (any fd, `O_PATH` too; never a symlink: callers check).
/// `fchmodat2(fd, "", AT_EMPTY_PATH)` on Linux 6.6+, else through `/proc/self/fd/N`, which
/// resolves to the object the fd holds, not to whatever has its name now.
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: raw fchmodat2(fd, "", mode, AT_EMPTY_PATH) with a static NUL-terminated path.
    let r = unsafe { libc::syscall(libc::SYS_fchmodat2, fd.as_raw_fd(), c"".as_ptr(), mode, libc::AT_EMPTY_PATH) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(e);
    }
    let p = fd_path(fd);
    // SAFETY: valid C string.
    check(unsafe { libc::chmod(p.as_ptr(), mode) }).map(drop)
}

/// chown of the object behind `fd` (`O_PATH` handles too; a symlink itself, not its target);
/// `u32::MAX` leaves an id unchanged.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    fchownat(fd, b"", uid, gid)
}

/// Sets the times of the object behind `fd` (`O_PATH` handles too; a symlink itself).
pub fn utimens_fd(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: valid fd, static empty C string and a two-element timespec array.
    check(unsafe { libc::utimensat(fd.as_raw_fd(), c"".as_ptr(), times.as_ptr(), flags) }).map(drop)
}

/// `getxattr` of the object behind `fd` (an `O_PATH` handle of a non-symlink); an empty
/// `buf` asks for the size.
pub fn getxattr_fd(fd: BorrowedFd<'_>, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    let (p, n) = (fd_path(fd), cstr(name)?);
    // SAFETY: valid C strings; the buffer describes writable memory (or is empty).
    ssize(unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `setxattr` of the object behind `fd` (an `O_PATH` handle of a non-symlink).
pub fn setxattr_fd(fd: BorrowedFd<'_>, name: &[u8], value: &[u8], flags: libc::c_int) -> io::Result<()> {
    let (p, n) = (fd_path(fd), cstr(name)?);
    // SAFETY: valid C strings and a readable value buffer.
    check(unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) }).map(drop)
}

/// `listxattr` of the object behind `fd` (an `O_PATH` handle of a non-symlink).
pub fn listxattr_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let p = fd_path(fd);
    // SAFETY: valid C string; the buffer describes writable memory.
    ssize(unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `removexattr` of the object behind `fd` (an `O_PATH` handle of a non-symlink).
pub fn removexattr_fd(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (p, n) = (fd_path(fd), cstr(name)?);
    // SAFETY: valid C strings.
    check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
}

// ---- acting as the caller ----------------------------------------------------------------
//
// A daemon running as root for `--allow-other` makes changes with the requesting user's
// filesystem ids and groups, so that even a missed race acts with that user's rights, not
// root's. fsuid/fsgid are per thread in Linux; supplementary groups are per thread too when
// set with the raw system call (glibc's setgroups() would change every thread of the daemon).

thread_local! {
    /// The caller this thread acts as, if any: (uid, gid, groups).
    static ACTING: std::cell::RefCell<Option<(u32, u32, Vec<libc::gid_t>)>> =
        const { std::cell::RefCell::new(None) };
}

fn set_creds(uid: u32, gid: u32, groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: raw setgroups(2) for this thread only, with a valid array of `groups.len()` ids.
    check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) as libc::c_int })?;
    // SAFETY: setfsgid/setfsuid take plain ids; they return the previous id and cannot fail
    // in a way that needs memory effects. Verified by reading the value back.
    unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
    }
    // SAFETY: an invalid id (-1) leaves the fs ids unchanged and returns the current ones.
    let (u, g) = unsafe { (libc::setfsuid(u32::MAX), libc::setfsgid(u32::MAX)) };
    if u as u32 != uid || g as u32 != gid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// Acts as `uid`/`gid` with supplementary `groups` on this thread until the guard drops
/// (then back to root with no supplementary groups). Only for a daemon running as root.
pub fn act_as(uid: u32, gid: u32, groups: Vec<libc::gid_t>) -> io::Result<ActingGuard> {
    set_creds(uid, gid, &groups)?;
    ACTING.with_borrow_mut(|a| *a = Some((uid, gid, groups)));
    Ok(ActingGuard(std::marker::PhantomData))
}

/// Returned by [`act_as`]; restores root's filesystem ids on drop. Not `Send`: the ids
/// belong to the thread.
pub struct ActingGuard(std::marker::PhantomData<*const ()>);

impl Drop for ActingGuard {
    fn drop(&mut self) {
        ACTING.with_borrow_mut(|a| *a = None);
        if let Err(e) = set_creds(0, 0, &[]) {
            // Never serve a later request with a user's ids: nothing sane can continue.
            eprintln!("veilfs: cannot restore the daemon's credentials: {e}");
            std::process::abort();
        }
    }
}

/// Runs `f` with the daemon's own (root) ids even while this thread acts as a caller: for
/// the format's internal steps on objects the daemon itself just verified or created (the
/// directory IV file of a directory being removed), which the caller's plaintext rights
/// cover but the backing modes may not.
pub fn privileged<R>(f: impl FnOnce() -> R) -> R {
    let acting = ACTING.with_borrow(|a| a.clone());
    let Some((uid, gid, groups)) = acting else { return f() };
    if set_creds(0, 0, &[]).is_err() {
        return f();
    }
    let r = f();
    if let Err(e) = set_creds(uid, gid, &groups) {
        eprintln!("veilfs: cannot switch back to the caller's credentials: {e}");
        std::process::abort();
    }
    r
}

/// What `/proc/PID/status` says of a process's rights: its supplementary groups and whether
/// its effective capabilities hold `CAP_FSETID` (which keeps set-id bits through a write).
#[derive(Debug, Clone, Default)]
pub struct ProcCreds {
    /// Supplementary groups.
    pub groups: Vec<libc::gid_t>,
    /// `CAP_FSETID` is effective.
    pub cap_fsetid: bool,
}

/// The credentials of process `pid` (from `/proc/PID/status`).
pub fn creds_of(pid: u32) -> io::Result<ProcCreds> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)).ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
    };
    let groups = field("Groups:")?.split_ascii_whitespace().filter_map(|g| g.parse().ok()).collect();
    let caps =
        u64::from_str_radix(field("CapEff:")?.trim(), 16).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    const CAP_FSETID: u32 = 4;
    Ok(ProcCreds { groups, cap_fsetid: caps & (1 << CAP_FSETID) != 0 })
}

/// The supplementary groups of process `pid` (from `/proc/PID/status`), for [`act_as`].
pub fn groups_of(pid: u32) -> io::Result<Vec<libc::gid_t>> {
    creds_of(pid).map(|c| c.groups)
}

/// Where an xattr call goes: an open fd (a directory, an open file), a verified `O_PATH`
/// handle of a non-symlink (through `/proc/self/fd/N`), or a path whose last component is
/// not followed (a symlink itself, which only takes `trusted.*`/`security.*` attributes).
#[derive(Debug, Clone, Copy)]
pub enum XattrTarget<'a> {
    /// An fd opened for I/O (not `O_PATH`).
    Fd(BorrowedFd<'a>),
    /// An `O_PATH` handle of anything but a symlink.
    Handle(BorrowedFd<'a>),
    /// A path, the last component not followed (`l*xattr`).
    NoFollow(&'a CString),
}

impl XattrTarget<'_> {
    /// `getxattr`; an empty `buf` asks for the size.
    pub fn get(self, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
        match self {
            XattrTarget::Fd(fd) => fgetxattr(fd, name, buf),
            XattrTarget::Handle(fd) => getxattr_fd(fd, name, buf),
            XattrTarget::NoFollow(p) => lgetxattr(p, name, buf),
        }
    }

    /// `setxattr`.
    pub fn set(self, name: &[u8], value: &[u8], flags: libc::c_int) -> io::Result<()> {
        match self {
            XattrTarget::Fd(fd) => fsetxattr(fd, name, value, flags),
            XattrTarget::Handle(fd) => setxattr_fd(fd, name, value, flags),
            XattrTarget::NoFollow(p) => lsetxattr(p, name, value, flags),
        }
    }

    /// `listxattr`; an empty `buf` asks for the size.
    pub fn list(self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            XattrTarget::Fd(fd) => flistxattr(fd, buf),
            XattrTarget::Handle(fd) => listxattr_fd(fd, buf),
            XattrTarget::NoFollow(p) => llistxattr(p, buf),
        }
    }

    /// `removexattr`.
    pub fn remove(self, name: &[u8]) -> io::Result<()> {
        match self {
            XattrTarget::Fd(fd) => fremovexattr(fd, name),
            XattrTarget::Handle(fd) => removexattr_fd(fd, name),
            XattrTarget::NoFollow(p) => lremovexattr(p, name),
        }
    }

    /// The whole list of stored names (NUL-separated).
    pub fn list_all(self) -> io::Result<Vec<u8>> {
        loop {
            let mut buf = vec![0u8; self.list(&mut [])? + 256];
            match self.list(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf);
                }
                // Grew meanwhile: ask again.
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
