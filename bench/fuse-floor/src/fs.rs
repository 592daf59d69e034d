//! The passthrough itself: fuser's `Filesystem` trait over a backing directory.
//!
//! Each trait method is a thin shell: it resolves node ids / handles, calls a
//! helper returning `io::Result`, and turns the result into exactly one reply
//! (`io::Error` converts into `fuser::Errno`, which carries the errno to the
//! caller). There is no global lock around I/O: file handles *are* backing
//! descriptors used with pread/pwrite, and the inode table lock is held only
//! for hash lookups.

use std::cell::RefCell;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};

use crate::attr;
use crate::dirstream::{DirEntry, DirHandles, DirStream, Take, DIR_HANDLE_BIT};
use crate::inodes::{Inode, InodeTable, ROOT_ID};
use crate::sys::{self, Stamp};

/// Largest WRITE the kernel may send us (and READ it will ask for).
pub const MAX_WRITE: u32 = 1 << 20;

/// Tunables chosen on the command line.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// How long the kernel may cache attributes and name→inode entries.
    pub ttl: Duration,
    /// How long the kernel may cache "no such name" (zero disables).
    pub negative_ttl: Duration,
    /// Ask for the kernel writeback cache.
    pub writeback: bool,
}

/// Generation numbers are not used: node ids are pinned inodes (see inodes.rs).
const GENERATION: Generation = Generation(0);

thread_local! {
    /// Per-worker read buffer, so READ never allocates or zeroes memory.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The passthrough filesystem.
#[derive(Debug)]
pub struct FloorFs {
    inodes: InodeTable,
    dirs: DirHandles,
    opts: FsOptions,
    /// Whether the kernel agreed to the writeback cache (decided in `init`).
    writeback: bool,
    euid: u32,
    egid: u32,
}

/// A verified name of a non-directory: `parent/name` currently leads to it,
/// and `st` is what `fstatat` saw there.
#[derive(Debug)]
struct Located {
    parent: Arc<Inode>,
    name: CString,
    st: libc::stat,
}

impl Located {
    fn dir(&self) -> BorrowedFd<'_> {
        // `parent` came out of a `Name`, which only ever holds directories.
        self.parent.dir_fd().expect("a name's parent is a directory")
    }
}

/// The file descriptor behind a file handle the kernel passed along, if any.
///
/// Directory handles carry [`DIR_HANDLE_BIT`] and are never descriptors.
fn file_handle(fh: Option<FileHandle>) -> Option<BorrowedFd<'static>> {
    fh.filter(|fh| fh.0 & DIR_HANDLE_BIT == 0).map(|fh| sys::handle_fd(fh.0))
}

/// ESTALE: the kernel refers to an inode we can no longer reach.
fn stale() -> io::Error {
    io::Error::from_raw_os_error(libc::ESTALE)
}

impl FloorFs {
    /// Opens `backing` as the root of the passthrough.
    pub fn new(backing: &Path, opts: FsOptions) -> io::Result<Self> {
        let root: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(backing)?
            .into();
        let st = sys::fstat(root.as_fd())?;
        Ok(FloorFs {
            inodes: InodeTable::new(root, &st),
            dirs: DirHandles::default(),
            opts,
            writeback: false,
            euid: sys::geteuid(),
            egid: sys::getegid(),
        })
    }

    /// The flags to open a backing file with, given the caller's open flags.
    fn backing_open_flags(&self, flags: i32) -> i32 {
        // O_DIRECT is handled by the FUSE kernel side (and tmpfs rejects it).
        let mut f = flags & !(libc::O_DIRECT | libc::O_NOCTTY);
        if self.writeback {
            // With writeback caching the kernel computes append offsets
            // itself and may READ from a write-only open to fill partial
            // pages, so the backing fd must be readable and non-appending.
            f &= !libc::O_APPEND;
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
        }
        f
    }

    /// Finds a name that still leads to the non-directory `inode`.
    fn locate(&self, inode: &Inode) -> io::Result<Located> {
        for n in inode.names() {
            let dir = n.parent.dir_fd()?;
            if let Ok(st) = sys::fstatat(dir, &n.name, libc::AT_SYMLINK_NOFOLLOW) {
                if inode.is(&st) {
                    return Ok(Located { parent: n.parent, name: n.name, st });
                }
            }
        }
        Err(stale())
    }

    /// Resolves `dir/name` and counts a kernel lookup of it.
    fn lookup_in(&self, dir: &Arc<Inode>, name: &CStr) -> io::Result<(u64, libc::stat)> {
        let dfd = dir.dir_fd()?;
        let st = sys::fstatat(dfd, name, libc::AT_SYMLINK_NOFOLLOW)?;
        if let Some(id) = self.inodes.lookup_known(&st, dir, name) {
            return Ok((id, st));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            let id = self.inodes.lookup_insert(&st, None, dir, name)?;
            return Ok((id, st));
        }
        // A new directory: pin it with an O_PATH descriptor (O_DIRECTORY
        // guards against the name being swapped for something else).
        let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY;
        let fd = sys::openat(dfd, name, flags, 0)?;
        let st = sys::fstat(fd.as_fd())?;
        let id = self.inodes.lookup_insert(&st, Some(fd), dir, name)?;
        Ok((id, st))
    }

    fn reply_entry(&self, reply: ReplyEntry, res: io::Result<(u64, libc::stat)>) {
        match res {
            Ok((id, st)) => reply.entry(&self.opts.ttl, &attr::file_attr(&st, id), GENERATION),
            Err(e) => reply.error(e.into()),
        }
    }

    /// Gives a node created on behalf of another user to that user.
    ///
    /// The daemon usually runs as root and creates everything as root; like
    /// gocryptfs, hand ownership to the caller afterwards (only when it
    /// differs, so the common same-user case costs nothing). A set-group-id
    /// parent directory already chose the group, so keep it then.
    fn chown_new(&self, req: &Request, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        if self.euid != 0 || (req.uid() == self.euid && req.gid() == self.egid) {
            return Ok(());
        }
        let parent = sys::fstat(dir)?;
        let gid = if parent.st_mode & libc::S_ISGID != 0 { u32::MAX } else { req.gid() };
        sys::chown_at(dir, name, req.uid(), gid, libc::AT_SYMLINK_NOFOLLOW)
    }

    /// Shared tail of mknod/mkdir/symlink/create: fix ownership, look up.
    fn finish_create(&self, req: &Request, dir: &Arc<Inode>, name: &CStr) -> io::Result<(u64, libc::stat)> {
        self.chown_new(req, dir.dir_fd()?, name)?;
        self.lookup_in(dir, name)
    }

    fn do_getattr(&self, ino: INodeNo, fh: Option<FileHandle>) -> io::Result<libc::stat> {
        // fstat() on an open file arrives with its handle: use it, it also
        // works after the file was unlinked.
        if let Some(fd) = file_handle(fh) {
            return sys::fstat(fd);
        }
        let inode = self.inodes.get(ino.0)?;
        match inode.dir_fd() {
            Ok(fd) => sys::fstat(fd),
            Err(_) => Ok(self.locate(&inode)?.st),
        }
    }

    fn do_setattr(&self, ino: INodeNo, change: AttrChange) -> io::Result<FileAttr> {
        let (uid, gid) = (change.uid.unwrap_or(u32::MAX), change.gid.unwrap_or(u32::MAX));
        let chown = change.uid.is_some() || change.gid.is_some();
        let times = change.atime.is_some() || change.mtime.is_some();
        let (atime, mtime) = (stamp(change.atime), stamp(change.mtime));
        let here = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;

        // ftruncate() and the writeback cache's timestamp flush pass the
        // handle of an open regular file: act on that descriptor.
        if let Some(fd) = file_handle(change.fh) {
            if let Some(mode) = change.mode {
                sys::fchmod(fd, mode)?;
            }
            if chown {
                sys::chown_at(fd, sys::EMPTY, uid, gid, here)?;
            }
            if let Some(size) = change.size {
                sys::ftruncate(fd, size)?;
            }
            if times {
                sys::utimens_at(fd, sys::EMPTY, atime, mtime, here)?;
            }
            return Ok(attr::file_attr(&sys::fstat(fd)?, ino.0));
        }

        let inode = self.inodes.get(ino.0)?;
        if let Ok(fd) = inode.dir_fd() {
            if let Some(mode) = change.mode {
                sys::chmod_fd(fd, mode)?;
            }
            if chown {
                sys::chown_at(fd, sys::EMPTY, uid, gid, here)?;
            }
            if change.size.is_some() {
                return Err(io::Error::from_raw_os_error(libc::EISDIR));
            }
            if times {
                sys::utimens_at(fd, sys::EMPTY, atime, mtime, here)?;
            }
            return Ok(attr::file_attr(&sys::fstat(fd)?, ino.0));
        }

        let loc = self.locate(&inode)?;
        let (dir, name) = (loc.dir(), loc.name.as_c_str());
        if let Some(mode) = change.mode {
            if loc.st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                // Linux has no lchmod; chmod(2) never reaches a symlink.
                return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
            }
            sys::chmod_at(dir, name, mode)?;
        }
        if chown {
            sys::chown_at(dir, name, uid, gid, libc::AT_SYMLINK_NOFOLLOW)?;
        }
        if let Some(size) = change.size {
            let file = sys::openat(dir, name, libc::O_WRONLY | libc::O_NOFOLLOW, 0)?;
            sys::ftruncate(file.as_fd(), size)?;
        }
        if times {
            sys::utimens_at(dir, name, atime, mtime, libc::AT_SYMLINK_NOFOLLOW)?;
        }
        let st = sys::fstatat(dir, name, libc::AT_SYMLINK_NOFOLLOW)?;
        Ok(attr::file_attr(&st, ino.0))
    }

    fn do_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &CStr,
        mode: u32,
        flags: i32,
    ) -> io::Result<(OwnedFd, u64, libc::stat)> {
        let dir = self.inodes.get(parent.0)?;
        let flags = self.backing_open_flags(flags) | libc::O_CREAT;
        let fd = sys::openat(dir.dir_fd()?, name, flags, mode)?;
        let (id, st) = self.finish_create(req, &dir, name)?;
        Ok((fd, id, st))
    }

    fn do_open(&self, ino: INodeNo, flags: i32) -> io::Result<OwnedFd> {
        let inode = self.inodes.get(ino.0)?;
        let loc = self.locate(&inode)?;
        let want = self.backing_open_flags(flags);
        match sys::openat(loc.dir(), &loc.name, want, 0) {
            // Upgrading O_WRONLY to O_RDWR can fail on a write-only file when
            // not running as root; fall back to what the caller asked for.
            Err(e) if e.raw_os_error() == Some(libc::EACCES) && want != flags => {
                sys::openat(loc.dir(), &loc.name, flags & !libc::O_DIRECT, 0)
            }
            res => res,
        }
    }

    fn do_write(&self, fh: FileHandle, offset: u64, data: &[u8], flags: WriteFlags) -> io::Result<usize> {
        let fd = sys::handle_fd(fh.0);
        if flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            // We asked for FUSE_HANDLE_KILLPRIV_V2, so clearing set-id bits
            // on write is our job (a root daemon's writes don't clear them).
            kill_suid_sgid(fd)?;
        }
        sys::pwrite(fd, data, offset)
    }

    fn do_unlink(&self, parent: INodeNo, name: &CStr) -> io::Result<()> {
        let dir = self.inodes.get(parent.0)?;
        let dfd = dir.dir_fd()?;
        // Which inode loses this name? (one extra fstatat per unlink keeps
        // the name lists exact, e.g. for hard links).
        let victim = sys::fstatat(dfd, name, libc::AT_SYMLINK_NOFOLLOW)?;
        sys::unlinkat(dfd, name, 0)?;
        self.inodes.name_removed(&victim, &dir, name);
        Ok(())
    }

    fn do_rename(
        &self,
        parent: INodeNo,
        old: &CStr,
        newparent: INodeNo,
        new: &CStr,
        flags: RenameFlags,
    ) -> io::Result<()> {
        let from = self.inodes.get(parent.0)?;
        let to = self.inodes.get(newparent.0)?;
        let nofollow = libc::AT_SYMLINK_NOFOLLOW;
        let moved = sys::fstatat(from.dir_fd()?, old, nofollow)?;
        let replaced = sys::fstatat(to.dir_fd()?, new, nofollow).ok();
        sys::renameat2(from.dir_fd()?, old, to.dir_fd()?, new, flags.bits())?;
        if let Some(r) = &replaced {
            if (r.st_dev, r.st_ino) == (moved.st_dev, moved.st_ino) {
                return Ok(()); // two links of one inode: rename is a no-op
            }
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                self.inodes.name_moved(r, &to, new, &from, old);
            } else {
                self.inodes.name_removed(r, &to, new);
            }
        }
        self.inodes.name_moved(&moved, &from, old, &to, new);
        Ok(())
    }

    fn do_link(&self, ino: INodeNo, newparent: INodeNo, newname: &CStr) -> io::Result<(u64, libc::stat)> {
        let inode = self.inodes.get(ino.0)?;
        let dir = self.inodes.get(newparent.0)?;
        let loc = self.locate(&inode)?;
        sys::linkat(loc.dir(), &loc.name, dir.dir_fd()?, newname)?;
        self.lookup_in(&dir, newname)
    }

    /// Runs an xattr call on `ino`: directories through their descriptor's
    /// /proc path, others through `/proc/self/fd/<parent>/<name>` with the
    /// l*xattr calls so a symlink is not followed.
    fn with_xattr_path<T>(
        &self,
        ino: INodeNo,
        op: impl FnOnce(&sys::ProcPath, bool) -> io::Result<T>,
    ) -> io::Result<T> {
        let inode = self.inodes.get(ino.0)?;
        if let Ok(fd) = inode.dir_fd() {
            return op(&sys::ProcPath::new(fd), true);
        }
        let loc = self.locate(&inode)?;
        op(&sys::ProcPath::child(loc.dir(), &loc.name), false)
    }

    fn do_access(&self, ino: INodeNo, mask: i32) -> io::Result<()> {
        let inode = self.inodes.get(ino.0)?;
        if let Ok(fd) = inode.dir_fd() {
            return sys::faccessat(fd, sys::EMPTY, mask, libc::AT_EMPTY_PATH);
        }
        let loc = self.locate(&inode)?;
        sys::faccessat(loc.dir(), &loc.name, mask, libc::AT_SYMLINK_NOFOLLOW)
    }

    fn do_readlink(&self, ino: INodeNo) -> io::Result<Vec<u8>> {
        let inode = self.inodes.get(ino.0)?;
        let loc = self.locate(&inode)?;
        sys::readlinkat(loc.dir(), &loc.name)
    }

    fn do_opendir(&self, ino: INodeNo) -> io::Result<u64> {
        let inode = self.inodes.get(ino.0)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY;
        let fd = sys::openat(inode.dir_fd()?, c".", flags, 0)?;
        Ok(self.dirs.insert(DirStream::new(inode, fd)))
    }

    /// The kind of a directory entry, stat-ing only if `d_type` is unknown.
    fn entry_kind(dir: BorrowedFd<'_>, entry: &DirEntry<'_>) -> Option<FileType> {
        attr::kind_from_dtype(entry.d_type).or_else(|| {
            let name = OsStr::from_bytes(entry.name);
            sys::with_cstr(name, |c| sys::fstatat(dir, c, libc::AT_SYMLINK_NOFOLLOW))
                .ok()
                .map(|st| attr::kind_from_mode(st.st_mode))
        })
    }
}

/// The SETATTR fields the passthrough acts on (`None` = leave unchanged).
#[derive(Debug)]
struct AttrChange {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    fh: Option<FileHandle>,
}

/// Converts fuser's optional timestamp into a utimensat argument.
fn stamp(t: Option<TimeOrNow>) -> Stamp {
    match t {
        None => Stamp::Omit,
        Some(TimeOrNow::Now) => Stamp::Now,
        Some(TimeOrNow::SpecificTime(t)) => Stamp::At(t),
    }
}

/// Clears set-user-id, and set-group-id on group-executable files, as the
/// kernel would for an unprivileged writer.
fn kill_suid_sgid(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mode = sys::fstat(fd)?.st_mode;
    let sgid_exec = libc::S_ISGID | libc::S_IXGRP;
    if mode & libc::S_ISUID != 0 || mode & sgid_exec == sgid_exec {
        sys::fchmod(fd, mode & 0o7777 & !(libc::S_ISUID | libc::S_ISGID))?;
    }
    Ok(())
}

/// Replies to getxattr/listxattr: with `size` 0 the caller only asked how
/// big the value is, otherwise `buf` holds the `n` bytes read.
fn reply_xattr(reply: ReplyXattr, size: u32, res: io::Result<usize>, buf: &[u8]) {
    match res {
        Ok(n) if size == 0 => reply.size(n as u32),
        Ok(n) => reply.data(&buf[..n]),
        Err(e) => reply.error(e.into()),
    }
}

fn reply_empty(reply: ReplyEmpty, res: io::Result<()>) {
    match res {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e.into()),
    }
}

impl Filesystem for FloorFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // fuser itself requests only ASYNC_READ, BIG_WRITES and MAX_PAGES;
        // everything else is opt-in. Ask only for what this kernel offers
        // (add_capabilities fails on unsupported bits).
        let mut want = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_ASYNC_DIO
            // Lets the kernel set S_NOSEC, so writes stop asking us for
            // security.capability before every write(); in return WRITE
            // carries FUSE_WRITE_KILL_SUIDGID and we clear the bits.
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if self.opts.writeback {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        let granted = want & config.capabilities();
        config.add_capabilities(granted).map_err(|_| io::Error::other("kernel refused offered capabilities"))?;
        self.writeback = granted.contains(InitFlags::FUSE_WRITEBACK_CACHE);
        // fuser's default max_write is 16 MiB, which the kernel clamps to
        // max_pages anyway (fs.fuse.max_pages_limit, 256 pages by default).
        // Say 1 MiB explicitly; max_pages follows from it.
        let _ = config.set_max_write(MAX_WRITE);
        // Room for readahead and writeback requests in flight to all workers.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let res = self.inodes.get(parent.0).and_then(|dir| sys::with_cstr(name, |c| self.lookup_in(&dir, c)));
        match res {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !self.opts.negative_ttl.is_zero() => {
                // Node id 0 = negative entry the kernel caches for the TTL.
                let attr = attr::placeholder(0, FileType::RegularFile);
                reply.entry(&self.opts.negative_ttl, &attr, GENERATION);
            }
            res => self.reply_entry(reply, res),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.do_getattr(ino, fh) {
            Ok(st) => reply.attr(&self.opts.ttl, &attr::file_attr(&st, ino.0)),
            Err(e) => reply.error(e.into()),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        // ctime cannot be set on the backing file; the kernel sends it along
        // with mtime when flushing writeback-cached timestamps.
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = AttrChange { mode, uid, gid, size, atime, mtime, fh };
        match self.do_setattr(ino, change) {
            Ok(attr) => reply.attr(&self.opts.ttl, &attr),
            Err(e) => reply.error(e.into()),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.do_readlink(ino) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e.into()),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let res = self.inodes.get(parent.0).and_then(|dir| {
            sys::with_cstr(name, |c| {
                sys::mknodat(dir.dir_fd()?, c, mode, attr::rdev_from_fuse(rdev))?;
                self.finish_create(req, &dir, c)
            })
        });
        self.reply_entry(reply, res);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let res = self.inodes.get(parent.0).and_then(|dir| {
            sys::with_cstr(name, |c| {
                sys::mkdirat(dir.dir_fd()?, c, mode)?;
                self.finish_create(req, &dir, c)
            })
        });
        self.reply_entry(reply, res);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, sys::with_cstr(name, |c| self.do_unlink(parent, c)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // Directories are held by descriptor, not by name: nothing to track.
        let res = self
            .inodes
            .get(parent.0)
            .and_then(|dir| sys::with_cstr(name, |c| sys::unlinkat(dir.dir_fd()?, c, libc::AT_REMOVEDIR)));
        reply_empty(reply, res);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let res = self.inodes.get(parent.0).and_then(|dir| {
            let target =
                CString::new(target.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            sys::with_cstr(link_name, |c| {
                sys::symlinkat(&target, dir.dir_fd()?, c)?;
                self.finish_create(req, &dir, c)
            })
        });
        self.reply_entry(reply, res);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let res = sys::with_cstr(name, |old| {
            sys::with_cstr(newname, |new| self.do_rename(parent, old, newparent, new, flags))
        });
        reply_empty(reply, res);
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let res = sys::with_cstr(newname, |c| self.do_link(ino, newparent, c));
        self.reply_entry(reply, res);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.do_open(ino, flags.0) {
            // KEEP_CACHE: page cache survives close/open; this mount is the
            // only writer of the backing tree.
            Ok(fd) => reply.opened(FileHandle(sys::into_handle(fd)), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e.into()),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        READ_BUF.with_borrow_mut(|buf| {
            let size = size as usize;
            if buf.len() < size {
                buf.resize(size.max(MAX_WRITE as usize), 0);
            }
            match sys::pread(sys::handle_fd(fh.0), &mut buf[..size], offset) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(e.into()),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.do_write(fh, offset, data, write_flags) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e.into()),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Nothing is buffered here: data went to the backing fd at WRITE.
        // (Replying ENOSYS would make the kernel stop sending FLUSH at all;
        // we answer it so the floor pays the same round trip veilfs does.)
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        sys::close_handle(fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, sys::fsync(sys::handle_fd(fh.0), datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.do_opendir(ino) {
            // CACHE_DIR + KEEP_CACHE: the kernel keeps the listing across
            // opendirs until this mount changes the directory.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e.into()),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let res = self.dirs.get(fh.0).and_then(|dir| {
            dir.read(offset, |entry| {
                let Some(kind) = Self::entry_kind(dir.fd(), entry) else {
                    return Take::Consumed; // vanished meanwhile
                };
                let name = OsStr::from_bytes(entry.name);
                if reply.add(INodeNo(entry.ino), entry.next_offset, kind, name) {
                    Take::Full
                } else {
                    Take::Consumed
                }
            })
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.into()),
        }
    }

    fn readdirplus(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let ttl = self.opts.ttl;
        let res = self.dirs.get(fh.0).and_then(|dir| {
            dir.read(offset, |entry| {
                let name = OsStr::from_bytes(entry.name);
                let off = entry.next_offset;
                if entry.is_dot_or_dotdot() {
                    // The kernel never links "." / ".." from READDIRPLUS, so
                    // they must not count as lookups.
                    let attr = attr::placeholder(entry.ino, FileType::Directory);
                    return if reply.add(INodeNo(entry.ino), off, name, &ttl, &attr, GENERATION) {
                        Take::Full
                    } else {
                        Take::Consumed
                    };
                }
                // Every other entry the kernel accepts counts as one lookup.
                let Ok((id, st)) = sys::with_cstr(name, |c| self.lookup_in(dir.inode(), c)) else {
                    return Take::Consumed; // vanished meanwhile
                };
                let attr = attr::file_attr(&st, id);
                if reply.add(INodeNo(id), off, name, &ttl, &attr, GENERATION) {
                    // Did not fit: the kernel will not see it, undo the lookup.
                    self.inodes.forget(id, 1);
                    Take::Full
                } else {
                    Take::Consumed
                }
            })
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.into()),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let res = self.dirs.get(fh.0).and_then(|d| sys::fsync(d.fd(), datasync));
        reply_empty(reply, res);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let res = self.inodes.get(ROOT_ID).and_then(|root| sys::fstatvfs(root.dir_fd()?));
        match res {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e.into()),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let res = sys::with_cstr(name, |c| {
            self.with_xattr_path(ino, |path, follow| sys::setxattr(path, follow, c, value, flags))
        });
        reply_empty(reply, res);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let mut buf = vec![0u8; size as usize];
        let res = sys::with_cstr(name, |c| {
            self.with_xattr_path(ino, |path, follow| sys::getxattr(path, follow, c, &mut buf))
        });
        reply_xattr(reply, size, res, &buf);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut buf = vec![0u8; size as usize];
        let res = self.with_xattr_path(ino, |path, follow| sys::listxattr(path, follow, &mut buf));
        reply_xattr(reply, size, res, &buf);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let res = sys::with_cstr(name, |c| self.with_xattr_path(ino, |path, follow| sys::removexattr(path, follow, c)));
        reply_empty(reply, res);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // Only reached without default_permissions; checks the daemon's
        // credentials, like any passthrough that does not switch uids.
        reply_empty(reply, self.do_access(ino, mask.bits()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        // The kernel already applied the umask to `mode` (we do not ask for
        // FUSE_DONT_MASK), and the daemon runs with umask 0.
        let res = sys::with_cstr(name, |c| self.do_create(req, parent, c, mode, flags));
        match res {
            Ok((fd, id, st)) => reply.created(
                &self.opts.ttl,
                &attr::file_attr(&st, id),
                GENERATION,
                FileHandle(sys::into_handle(fd)),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e.into()),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, sys::fallocate(sys::handle_fd(fh.0), mode, offset, length));
    }

    fn lseek(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        // Only SEEK_DATA / SEEK_HOLE reach us. With the writeback cache the
        // kernel does not write dirty pages back before forwarding them, so
        // the backing file would report not-yet-written data as a hole;
        // ENOSYS makes the kernel fall back to "all data" for good. Without
        // writeback every write is already in the backing file.
        if self.writeback {
            reply.error(Errno::ENOSYS);
            return;
        }
        // The fd offset is unused by pread/pwrite, so moving it is harmless.
        match sys::lseek(sys::handle_fd(fh.0), offset, whence) {
            Ok(off) => reply.offset(off),
            Err(e) => reply.error(Errno::from(e)),
        }
    }
}
