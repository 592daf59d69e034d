//! The one system-call layer of veilfs: every call into the kernel made by the workspace
//! (the engine, the FUSE front end and the CLI) goes through this module tree, so that
//! `unsafe` lives here and nowhere else (veilfs-fuse and the binary forbid it).
//!
//! The filesystem calls are the `*at` family on open directory fds, so every operation is
//! relative to a directory handle: no path is re-walked per request, a directory renamed
//! while in use keeps working (the gocryptfs 2.0 lesson: directory-fd caching made
//! small-file work 2–3× faster), and nothing follows a link in CIPHERDIR.
//!
//! They are built on `rustix` (its `linux_raw` backend makes the system call directly, with
//! no libc wrapper in between), which is safe Rust over `BorrowedFd`; `libc` remains only
//! for the few calls rustix does not offer (`fchmodat2`, `setfsuid`/`setfsgid`, and, in
//! [`process`], `fork`, signal dispositions and masks, `syslog`, `getrusage`). Errors are
//! `io::Error`s with the kernel's errno (`raw_os_error`), as before; nothing retries on
//! `EINTR` except the read and write loops, which always did.
//!
//! Submodules: [`xattr`] (extended attributes), [`creds`] (acting as the calling user),
//! [`process`] (the CLI's daemon, signal and resource calls), [`term`] (the password
//! prompt's terminal mode).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, Mode, OFlags};

pub mod creds;
pub mod process;
pub mod term;
pub mod xattr;

pub use creds::{
    act_as, as_owner_of, creds_of, fs_uid, grants, grants_settled, groups_of, in_dir_as_owner, is_eacces, privileged,
    with_owner_rwx, ActingGuard, ProcCreds,
};
pub use rustix::fs::StatVfs;
pub use xattr::{
    fgetxattr, flistxattr, fremovexattr, fsetxattr, getxattr_fd, lgetxattr, listxattr_fd, llistxattr, lremovexattr,
    lsetxattr, removexattr_fd, setxattr_fd, XattrTarget,
};

/// The current working directory as a directory fd, for the `*at` calls on paths the user
/// gave (plaintext-side files of `export`/`import`, never CIPHERDIR).
pub const CWD: BorrowedFd<'static> = rustix::fs::CWD;

/// The status of a file (`struct stat`), with the field names and (x86-64) types of
/// `libc::stat`, so callers read `st_mode`, `st_size`, `st_atime`, ... as before. Our own
/// type rather than rustix's so it can be built in tests and does not change across
/// architectures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Stat {
    pub st_dev: u64,
    pub st_ino: u64,
    pub st_nlink: u64,
    pub st_mode: u32,
    pub st_uid: u32,
    pub st_gid: u32,
    pub st_rdev: u64,
    pub st_size: i64,
    pub st_blksize: i64,
    pub st_blocks: i64,
    pub st_atime: i64,
    pub st_atime_nsec: i64,
    pub st_mtime: i64,
    pub st_mtime_nsec: i64,
    pub st_ctime: i64,
    pub st_ctime_nsec: i64,
}

impl From<rustix::fs::Stat> for Stat {
    // Identity casts on x86-64, widening on other architectures.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    fn from(s: rustix::fs::Stat) -> Stat {
        Stat {
            st_dev: s.st_dev as u64,
            st_ino: s.st_ino as u64,
            st_nlink: s.st_nlink as u64,
            st_mode: s.st_mode as u32,
            st_uid: s.st_uid as u32,
            st_gid: s.st_gid as u32,
            st_rdev: s.st_rdev as u64,
            st_size: s.st_size as i64,
            st_blksize: s.st_blksize as i64,
            st_blocks: s.st_blocks as i64,
            st_atime: s.st_atime as i64,
            st_atime_nsec: s.st_atime_nsec as i64,
            st_mtime: s.st_mtime as i64,
            st_mtime_nsec: s.st_mtime_nsec as i64,
            st_ctime: s.st_ctime as i64,
            st_ctime_nsec: s.st_ctime_nsec as i64,
        }
    }
}

fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn oflags(flags: libc::c_int) -> OFlags {
    OFlags::from_bits_retain(flags as u32)
}

fn mode(mode: libc::mode_t) -> Mode {
    Mode::from_bits_retain(mode)
}

/// `AT_SYMLINK_NOFOLLOW`, plus `AT_EMPTY_PATH` when `name` is empty (the call acts on the
/// fd itself).
fn nofollow(name: &[u8]) -> AtFlags {
    if name.is_empty() {
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    }
}

/// `openat(dir, name, flags, mode)` with `O_CLOEXEC`.
pub fn openat(dir: BorrowedFd<'_>, name: &[u8], flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(dir, name, oflags(flags) | OFlags::CLOEXEC, self::mode(mode))?)
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

/// Opens `name` below `dir` with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_MAGICLINKS)`: no symlink is followed anywhere in `name` (a final one is opened as
/// itself with `O_PATH | O_NOFOLLOW`, else ELOOP) and nothing outside `dir` is reached (`..`
/// or an absolute name: EXDEV). For trees another user may be changing while we walk them
/// (the plaintext side of import and export). On kernels without openat2 (before 5.6): one
/// name, `O_NOFOLLOW`, `/` and `..` refused, which resolves the same way.
pub fn openat_beneath(dir: BorrowedFd<'_>, name: &[u8], flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    use rustix::fs::ResolveFlags;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    // openat2 refuses a mode without O_CREAT or O_TMPFILE.
    let mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 { mode } else { 0 };
    for _ in 0..16 {
        match rustix::fs::openat2(dir, name, oflags(flags) | OFlags::CLOEXEC, self::mode(mode), resolve) {
            // A rename elsewhere during the walk: the kernel asks to try again.
            Err(rustix::io::Errno::AGAIN) => continue,
            Err(rustix::io::Errno::NOSYS) => {
                if name.is_empty() || name.contains(&b'/') || name == b".." {
                    return Err(io::Error::from_raw_os_error(libc::EXDEV));
                }
                return openat(dir, name, flags | libc::O_NOFOLLOW, mode);
            }
            r => return Ok(r?),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Opens the object behind the handle `fd` (an `O_PATH` one too) anew with `flags`, through
/// `/proc/self/fd/N`, which reaches that very inode and not whatever has its name now;
/// `O_NONBLOCK | O_NOCTTY` are added, so nothing blocks or becomes a controlling terminal.
pub fn reopen(fd: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<OwnedFd> {
    let flags = oflags(flags | libc::O_NONBLOCK | libc::O_NOCTTY) | OFlags::CLOEXEC;
    Ok(rustix::fs::open(fd_path(fd), flags, Mode::empty())?)
}

/// Opens a directory by path.
pub fn open_dir_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dir` itself.
pub fn fstatat(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Stat> {
    Ok(rustix::fs::statat(dir, name, nofollow(name))?.into())
}

/// `fstat(fd)`.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    Ok(rustix::fs::fstat(fd)?.into())
}

/// `mkdirat`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(dir, name, self::mode(mode))?)
}

/// `unlinkat` (with `AT_REMOVEDIR` when `dir_flag`).
pub fn unlinkat(dir: BorrowedFd<'_>, name: &[u8], dir_flag: bool) -> io::Result<()> {
    let flags = if dir_flag { AtFlags::REMOVEDIR } else { AtFlags::empty() };
    Ok(rustix::fs::unlinkat(dir, name, flags)?)
}

/// `renameat2(olddir, old, newdir, new, flags)`.
pub fn renameat2(
    olddir: BorrowedFd<'_>,
    old: &[u8],
    newdir: BorrowedFd<'_>,
    new: &[u8],
    flags: libc::c_uint,
) -> io::Result<()> {
    Ok(rustix::fs::renameat_with(olddir, old, newdir, new, rustix::fs::RenameFlags::from_bits_retain(flags))?)
}

/// Renames `old` of `olddir` to `new` of `newdir` unless `new` exists (then EEXIST):
/// `renameat2(RENAME_NOREPLACE)`, or where the file system refuses that flag, the fallback
/// below.
///
/// Some file systems refuse every `renameat2` flag with EINVAL: sshfs (SFTP has no such
/// rename), and FUSE file systems in general that do not implement it. On the first EINVAL
/// the rename is made again the fallback way, and when that works the file system (its
/// `st_dev`, one per mount) is remembered for the life of the process, so later renames on
/// it go straight to the fallback; a file system that takes the flag never pays more than
/// before. An EINVAL the fallback repeats (a directory moved into itself) is the caller's
/// answer and remembers nothing.
///
/// The fallback, never following a link:
/// * a non-directory is hard-linked under `new` (`linkat` without `AT_SYMLINK_FOLLOW`,
///   which fails with EEXIST if `new` exists, atomically, as the flag would) and then
///   unlinked under `old`. A crash between the two leaves the object under both names,
///   never under none. Where hard links are refused too, it goes as a directory does.
/// * a directory (which cannot be hard-linked) is renamed with a plain `renameat` after a
///   check that `new` does not exist. Not atomic: an empty directory another client makes
///   under `new` in between is replaced (a non-directory there makes the rename fail with
///   ENOTDIR). On such a file system this is the best there is; over SFTP a server without
///   `posix-rename` even refuses an existing target itself.
pub fn rename_noreplace(olddir: BorrowedFd<'_>, old: &[u8], newdir: BorrowedFd<'_>, new: &[u8]) -> io::Result<()> {
    if no_rename_flags::known(newdir) {
        return rename_noreplace_fallback(olddir, old, newdir, new);
    }
    match renameat2(olddir, old, newdir, new, libc::RENAME_NOREPLACE) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            rename_noreplace_fallback(olddir, old, newdir, new).inspect(|()| no_rename_flags::remember(newdir))
        }
        r => r,
    }
}

/// The file systems (by `st_dev`) that refused `RENAME_NOREPLACE` while the fallback worked
/// (see [`rename_noreplace`]).
mod no_rename_flags {
    use std::os::fd::BorrowedFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    /// Whether any is known: until then no `fstat` is spent on asking.
    static ANY: AtomicBool = AtomicBool::new(false);
    static DEVICES: Mutex<Vec<u64>> = Mutex::new(Vec::new());

    pub(super) fn known(dir: BorrowedFd<'_>) -> bool {
        ANY.load(Ordering::Relaxed)
            && super::fstat(dir).is_ok_and(|st| DEVICES.lock().unwrap_or_else(|e| e.into_inner()).contains(&st.st_dev))
    }

    pub(super) fn remember(dir: BorrowedFd<'_>) {
        if let Ok(st) = super::fstat(dir) {
            let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
            if !d.contains(&st.st_dev) {
                tracing::debug!("the file system of device {:#x} refuses RENAME_NOREPLACE: renames use link and unlink, or a check, there", st.st_dev);
                d.push(st.st_dev);
            }
            ANY.store(true, Ordering::Relaxed);
        }
    }
}

/// [`rename_noreplace`] without `renameat2` flags.
fn rename_noreplace_fallback(olddir: BorrowedFd<'_>, old: &[u8], newdir: BorrowedFd<'_>, new: &[u8]) -> io::Result<()> {
    let st = fstatat(olddir, old)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        match linkat(olddir, old, newdir, new) {
            Ok(()) => {
                if let Err(e) = unlinkat(olddir, old, false) {
                    // Not moved: take the new name back rather than leave two.
                    let _ = unlinkat(newdir, new, false);
                    return Err(e);
                }
                return Ok(());
            }
            // No hard links here: as for a directory.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOSYS | libc::EMLINK)) => {}
            Err(e) => return Err(e),
        }
    }
    match fstatat(newdir, new) {
        Ok(_) => Err(io::Error::from_raw_os_error(libc::EEXIST)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => renameat2(olddir, old, newdir, new, 0),
        Err(e) => Err(e),
    }
}

/// `linkat(olddir, old, newdir, new, 0)`.
pub fn linkat(olddir: BorrowedFd<'_>, old: &[u8], newdir: BorrowedFd<'_>, new: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::linkat(olddir, old, newdir, new, AtFlags::empty())?)
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::symlinkat(target, dir, name)?)
}

/// `readlinkat(dir, name)`.
pub fn readlinkat(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<u8>> {
    Ok(rustix::fs::readlinkat(dir, name, Vec::with_capacity(256))?.into_bytes())
}

/// `mknodat`; `mode` carries the file type (`S_IFIFO`, `S_IFCHR`, ...; none means a regular
/// file, as for mknod(2)).
pub fn mknodat(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let kind = match mode & libc::S_IFMT {
        0 => rustix::fs::FileType::RegularFile,
        t => rustix::fs::FileType::from_raw_mode(t),
    };
    Ok(rustix::fs::mknodat(dir, name, kind, self::mode(mode & !libc::S_IFMT), dev)?)
}

/// `fchmodat` on an entry (not following symlinks is not supported by Linux for chmod, so
/// callers must not pass symlinks).
pub fn fchmodat(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    Ok(rustix::fs::chmodat(dir, name, self::mode(mode), AtFlags::empty())?)
}

/// `fchownat(..., AT_SYMLINK_NOFOLLOW)`; `u32::MAX` leaves an id unchanged.
pub fn fchownat(dir: BorrowedFd<'_>, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
    let uid = (uid != u32::MAX).then(|| rustix::process::Uid::from_raw(uid));
    let gid = (gid != u32::MAX).then(|| rustix::process::Gid::from_raw(gid));
    Ok(rustix::fs::chownat(dir, name, uid, gid, nofollow(name))?)
}

/// The two times of a `utimensat` (`UTIME_OMIT`/`UTIME_NOW` pass through as they are).
fn timestamps(times: &[libc::timespec; 2]) -> rustix::fs::Timestamps {
    let ts = |t: &libc::timespec| rustix::fs::Timespec { tv_sec: t.tv_sec, tv_nsec: t.tv_nsec };
    rustix::fs::Timestamps { last_access: ts(&times[0]), last_modification: ts(&times[1]) }
}

/// `utimensat(..., AT_SYMLINK_NOFOLLOW)` with two timespecs (use `UTIME_OMIT` to skip one).
pub fn utimensat(dir: BorrowedFd<'_>, name: &[u8], times: &[libc::timespec; 2]) -> io::Result<()> {
    Ok(rustix::fs::utimensat(dir, name, &timestamps(times), AtFlags::SYMLINK_NOFOLLOW)?)
}

/// `utimensat(..., 0)`: as [`utimensat`] but a final symlink is followed (for a path the
/// user named outside CIPHERDIR, such as an export's destination).
pub fn utimensat_follow(dir: BorrowedFd<'_>, name: &[u8], times: &[libc::timespec; 2]) -> io::Result<()> {
    Ok(rustix::fs::utimensat(dir, name, &timestamps(times), AtFlags::empty())?)
}

/// `pread` that loops until `buf` is full or EOF; returns the bytes read.
pub fn pread_full(fd: BorrowedFd<'_>, buf: &mut [u8], mut off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pread(fd, &mut buf[done..], off) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                off += n as u64;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// `pwrite` that loops until all of `buf` is written.
pub fn pwrite_all(fd: BorrowedFd<'_>, buf: &[u8], mut off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pwrite(fd, &buf[done..], off) {
            Ok(n) => {
                done += n;
                off += n as u64;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `ftruncate`.
pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    Ok(rustix::fs::ftruncate(fd, len)?)
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

/// The `d_type` of a rustix file type (`DT_x` is `S_IFx >> 12`).
fn d_type(t: rustix::fs::FileType) -> u8 {
    match t {
        rustix::fs::FileType::Unknown => libc::DT_UNKNOWN,
        t => (t.as_raw_mode() >> 12) as u8,
    }
}

/// Bytes per `getdents64` call: glibc's `readdir` buffer size, so a directory of a few
/// hundred entries is read in one call.
const DIRENT_BUF: usize = 32 * 1024;

/// Lists a directory (all entries, including `.`/`..`) without following any path.
pub fn read_dir_fd(dir: BorrowedFd<'_>) -> io::Result<Vec<RawDirEntry>> {
    // Read through a fresh fd of the same directory so the caller's fd offset is untouched.
    // A directory its owner may not read or search (mode 0100, 0644) still lists on Linux
    // where the mode allows it: the fresh fd is opened with the owner's rights granted.
    let own = open_dir_at(dir, b".").or_else(|e| match e.raw_os_error() {
        Some(libc::EACCES) => creds::with_owner_rwx(dir, || open_dir_at(dir, b".")),
        _ => Err(e),
    })?;
    list_dir(own)
}

/// Lists a directory (all entries, including `.`/`..`) with the caller's own rights, granting
/// nothing (for trees outside the vault, whose modes are their owners' business).
pub fn read_dir_plain(dir: BorrowedFd<'_>) -> io::Result<Vec<RawDirEntry>> {
    list_dir(open_dir_at(dir, b".")?)
}

/// The entries of the freshly opened directory `own`.
fn list_dir(own: OwnedFd) -> io::Result<Vec<RawDirEntry>> {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); DIRENT_BUF];
    let mut entries = rustix::fs::RawDir::new(&own, &mut buf);
    let mut out = Vec::new();
    loop {
        match entries.next() {
            None => return Ok(out),
            Some(Ok(e)) => out.push(RawDirEntry {
                name: e.file_name().to_bytes().to_vec(),
                ino: e.ino(),
                d_type: d_type(e.file_type()),
            }),
            Some(Err(rustix::io::Errno::INTR)) => continue,
            Some(Err(e)) => return Err(e.into()),
        }
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
    read_meta_at(CWD, path.as_os_str().as_bytes(), max)
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
    let n = pread_full(fd.as_fd(), &mut buf, 0).map_err(MetaError::Io)?;
    if n > max {
        return Err(MetaError::TooLarge(n as u64));
    }
    buf.truncate(n);
    Ok(buf)
}

/// Creates `name` in `dir` exclusively with `contents` and mode `mode`.
pub fn write_new_file(dir: BorrowedFd<'_>, name: &[u8], contents: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let fd = openat(dir, name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)?;
    pwrite_all(fd.as_fd(), contents, 0)
}

/// `fsync`.
pub fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rustix::fs::fsync(fd)?)
}

/// `fdatasync`.
pub fn fdatasync(fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rustix::fs::fdatasync(fd)?)
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
    Ok(rustix::fs::fchmod(fd, self::mode(mode))?)
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: `Ok(true)` when taken, `Ok(false)` when another open file
/// description holds it.
pub fn try_flock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `flock(fd, LOCK_SH | LOCK_NB)`: `Ok(true)` when taken, `Ok(false)` when another open file
/// description holds an exclusive lock.
pub fn try_flock_shared(fd: BorrowedFd<'_>) -> io::Result<bool> {
    match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// This machine's host name (the `nodename` of `uname`, which is what `gethostname` reads),
/// lossy UTF-8.
pub fn host_name() -> String {
    String::from_utf8_lossy(rustix::system::uname().nodename().to_bytes()).into_owned()
}

/// `futimens(fd, times)`.
pub fn futimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    Ok(rustix::fs::futimens(fd, &timestamps(times))?)
}

/// Adds `O_NOATIME` to an open file's flags, so reading it leaves its access time alone
/// (EPERM for a process that neither owns the file nor holds `CAP_FOWNER`).
pub fn set_noatime(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    Ok(rustix::fs::fcntl_setfl(fd, flags | OFlags::NOATIME)?)
}

/// Reads a byte of `fd` with `O_NOATIME` lifted for that read, so that the file's own
/// filesystem moves its access time by its mount's rule — without moving the change time, as
/// setting the time with `futimens` would.
pub fn read_for_atime(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags - OFlags::NOATIME)?;
    let r = pread_full(fd, &mut [0u8; 1], 0);
    rustix::fs::fcntl_setfl(fd, flags)?;
    r.map(drop)
}

/// `fstatvfs`.
pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<StatVfs> {
    Ok(rustix::fs::fstatvfs(fd)?)
}

/// `fallocate`.
pub fn fallocate(fd: BorrowedFd<'_>, mode: libc::c_int, off: u64, len: u64) -> io::Result<()> {
    Ok(rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::from_bits_retain(mode as u32), off, len)?)
}

/// `lseek(fd, off, SEEK_DATA)`: the start of the first data at or after `off` (`ENXIO`
/// past the last).
pub fn seek_data(fd: BorrowedFd<'_>, off: u64) -> io::Result<u64> {
    Ok(rustix::fs::seek(fd, rustix::fs::SeekFrom::Data(off))?)
}

/// `lseek(fd, off, SEEK_HOLE)`: the start of the first hole at or after `off` (the end of
/// the file counts as one).
pub fn seek_hole(fd: BorrowedFd<'_>, off: u64) -> io::Result<u64> {
    Ok(rustix::fs::seek(fd, rustix::fs::SeekFrom::Hole(off))?)
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

// ---- verified handles on entries ---------------------------------------------------------
//
// Every change of an entry's attributes goes through a handle on the object itself, obtained
// without following a link and checked by type: a name is resolved once, and what is acted
// on is what was checked. (A name-based `fchmodat` by a root daemon follows a symlink that a
// user planted in the ciphertext; see docs/SECURITY.md, "Multi-user mounts".)

/// An `O_PATH | O_NOFOLLOW` handle on `dir/name` (a symlink is the symlink itself) and its
/// `stat`. Opening with `O_PATH` touches nothing: no FIFO blocks, no device driver runs.
pub fn open_path_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<(OwnedFd, Stat)> {
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
) -> Result<(OwnedFd, Stat), Result<u32, io::Error>> {
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

/// As [`open_regular_at`], but the object is first held by an `O_PATH` handle and type-checked,
/// and only a regular file is then opened for I/O (through [`reopen`], which reaches that very
/// inode). For trees whose owner is not trusted (reverse mode's PLAINDIR): opening a device
/// node runs its driver even with `O_NONBLOCK` (a tape rewinds, a modem line drops), and
/// opening a FIFO wakes a writer blocked in its own `open`; neither may happen because a user
/// swapped a file. One more syscall per open than [`open_regular_at`].
pub fn open_regular_untouched_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    flags: libc::c_int,
) -> Result<(OwnedFd, Stat), Result<u32, io::Error>> {
    let (handle, st) = open_path_at(dir, name).map_err(Err)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Ok(st.st_mode));
    }
    let fd = reopen(handle.as_fd(), flags).map_err(Err)?;
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
    // rustix has no fchmodat2 (its chmodat refuses flags), hence the raw call.
    // SAFETY: raw fchmodat2(fd, "", mode, AT_EMPTY_PATH) with a static NUL-terminated path
    // and a borrowed fd that stays open for the call.
    let r = unsafe { libc::syscall(libc::SYS_fchmodat2, fd.as_raw_fd(), c"".as_ptr(), mode, libc::AT_EMPTY_PATH) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(e);
    }
    Ok(rustix::fs::chmod(fd_path(fd), self::mode(mode))?)
}

/// chown of the object behind `fd` (`O_PATH` handles too; a symlink itself, not its target);
/// `u32::MAX` leaves an id unchanged.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    fchownat(fd, b"", uid, gid)
}

/// Sets the times of the object behind `fd` (`O_PATH` handles too; a symlink itself).
pub fn utimens_fd(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    Ok(rustix::fs::utimensat(fd, c"", &timestamps(times), nofollow(b""))?)
}

/// Whether a process with this pid exists on this machine (in this pid namespace).
pub fn process_exists(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return false };
    // Signal 0 only checks that the process exists and may be signalled.
    matches!(rustix::process::test_kill_process(pid), Ok(()) | Err(rustix::io::Errno::PERM))
}

/// This process's effective user id (`geteuid`).
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The way renames go where `RENAME_NOREPLACE` is refused (sshfs; tests/sync.rs
    /// `directories_and_renames_work_through_sshfs` runs it there): a file, a symlink (moved
    /// itself, never its target) and a directory move; an existing target of either kind is
    /// EEXIST and left as it was.
    #[test]
    fn the_fallback_of_rename_noreplace_never_replaces() {
        let t = tempfile::tempdir().unwrap();
        let d = open_dir_path(t.path()).unwrap();
        let d = d.as_fd();
        std::fs::write(t.path().join("f"), "f").unwrap();
        std::fs::write(t.path().join("taken"), "taken").unwrap();
        std::os::unix::fs::symlink("taken", t.path().join("l")).unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::create_dir(t.path().join("taken-dir")).unwrap();
        let eexist = |r: io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::EEXIST);
        assert!(eexist(rename_noreplace_fallback(d, b"f", d, b"taken")));
        assert!(eexist(rename_noreplace_fallback(d, b"d", d, b"taken-dir")));
        assert!(eexist(rename_noreplace_fallback(d, b"d", d, b"taken")));
        assert!(eexist(rename_noreplace_fallback(d, b"l", d, b"taken-dir")));
        rename_noreplace_fallback(d, b"f", d, b"f2").unwrap();
        rename_noreplace_fallback(d, b"l", d, b"l2").unwrap();
        rename_noreplace_fallback(d, b"d", d, b"d2").unwrap();
        let names = |p: &std::path::Path| {
            let mut v: Vec<_> =
                std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            v.sort();
            v
        };
        assert_eq!(names(t.path()), ["d2", "f2", "l2", "taken", "taken-dir"]);
        assert_eq!(std::fs::read_to_string(t.path().join("f2")).unwrap(), "f");
        assert_eq!(std::fs::read_to_string(t.path().join("taken")).unwrap(), "taken");
        assert_eq!(std::fs::read_link(t.path().join("l2")).unwrap(), std::path::Path::new("taken"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(t.path().join("f2")).unwrap().nlink(), 1);
    }
}
