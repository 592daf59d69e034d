//! fuser's `Filesystem` trait: unpack each request, call the operation in `ops/` (one file
//! per family: lookup, entries, data, attrs, xattrs, readdir, rename, …), send exactly one
//! reply.

use crate::attr;
use crate::ops::{Caller, SetAttr, VeilFs};
use fuser::{
    AccessFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};
use veilfs_core::sys::Stat;

/// Largest request.
pub const MAX_WRITE: u32 = 1 << 20;
const GEN: Generation = Generation(0);

fn empty(reply: ReplyEmpty, r: io::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e.into()),
    }
}

fn ts(t: Option<TimeOrNow>) -> Option<libc::timespec> {
    t.map(|t| match t {
        TimeOrNow::Now => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 },
            Err(e) => {
                let d = e.duration();
                let (mut s, mut ns) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if ns < 0 {
                    s -= 1;
                    ns += 1_000_000_000;
                }
                libc::timespec { tv_sec: s, tv_nsec: ns }
            }
        },
    })
}

/// The ids a request came with.
fn caller(req: &Request) -> Caller {
    Caller { uid: req.uid(), gid: req.gid(), pid: req.pid() }
}

fn xattr_reply(reply: ReplyXattr, size: u32, r: io::Result<Vec<u8>>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e.into()),
    }
}

impl VeilFs {
    fn entry(&self, reply: ReplyEntry, r: io::Result<(std::sync::Arc<crate::inodes::Node>, Stat)>) {
        match r {
            Ok((node, st)) => reply.entry(&self.opts.ttl, &self.attr_of(&node, &st), node.generation()),
            Err(e) => reply.error(e.into()),
        }
    }

    /// `FOPEN_DIRECT_IO` for a file opened for writing (`flags`) while the backing store is
    /// low on space (see `VeilFs::space_low`): each write then reaches the daemon and gets
    /// its own ENOSPC.
    fn write_through(&self, flags: i32) -> FopenFlags {
        if flags & libc::O_ACCMODE != libc::O_RDONLY && self.space_low() {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    fn keep_cache(&self) -> FopenFlags {
        if self.opts.shared_storage {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        }
    }
}

impl Filesystem for VeilFs {
    fn destroy(&mut self) {
        self.settle_open_files();
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let mut want = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if !self.opts.shared_storage {
            want |= InitFlags::FUSE_CACHE_SYMLINKS;
            if self.opts.writeback {
                // Shared mappings of a file written through on a disk low on space
                // (`FOPEN_DIRECT_IO`, see `write_through`) go through the page cache.
                want |= InitFlags::FUSE_WRITEBACK_CACHE | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
            }
        }
        let granted = want & config.capabilities();
        config
            .add_capabilities(granted)
            .map_err(|_| io::Error::other("the kernel refused offered FUSE capabilities"))?;
        self.writeback = granted.contains(InitFlags::FUSE_WRITEBACK_CACHE);
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.touch();
        match self.do_lookup(parent.0, name.as_bytes(), caller(req)) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !self.opts.negative_ttl.is_zero() => {
                reply.entry(&self.opts.negative_ttl, &attr::negative(), GEN)
            }
            r => self.entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.touch();
        let r =
            self.nodes.get(ino.0).and_then(|n| self.do_getattr(&n, fh.map(|f| f.0)).map(|st| self.attr_of(&n, &st)));
        match r {
            Ok(a) => reply.attr(&self.opts.ttl, &a),
            Err(e) => reply.error(e.into()),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.touch();
        match self.do_setattr(
            ino.0,
            &SetAttr { mode, uid, gid, size, atime: ts(atime), mtime: ts(mtime) },
            fh.map(|f| f.0),
            caller(req),
        ) {
            Ok(a) => reply.attr(&self.opts.ttl, &a),
            Err(e) => reply.error(e.into()),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.touch();
        match self.do_readlink(ino.0) {
            Ok(t) => reply.data(&t),
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
        self.touch();
        let c = caller(req);
        self.entry(reply, self.acting(c).and_then(|_as| self.do_mknod(parent.0, name.as_bytes(), mode, rdev, c)));
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        self.touch();
        let c = caller(req);
        self.entry(reply, self.acting(c).and_then(|_as| self.do_mkdir(parent.0, name.as_bytes(), mode, c)));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.touch();
        let c = caller(req);
        empty(reply, self.acting(c).and_then(|_as| self.do_remove(parent.0, name.as_bytes(), false, c)));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.touch();
        let c = caller(req);
        empty(reply, self.acting(c).and_then(|_as| self.do_remove(parent.0, name.as_bytes(), true, c)));
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.touch();
        let c = caller(req);
        let r = self
            .acting(c)
            .and_then(|_as| self.do_symlink(parent.0, link_name.as_bytes(), target.as_os_str().as_bytes(), c));
        self.entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.touch();
        let c = caller(req);
        let r = self.acting(c).and_then(|_as| {
            self.do_rename(parent.0, name.as_bytes(), newparent.0, newname.as_bytes(), flags.bits(), c)
        });
        empty(reply, r);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.touch();
        let c = caller(req);
        self.entry(reply, self.acting(c).and_then(|_as| self.do_link(ino.0, newparent.0, newname.as_bytes(), c)));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.touch();
        match self.do_open(ino.0, flags.0, caller(req)) {
            Ok((fh, keep)) => {
                let cache = if keep { self.keep_cache() } else { FopenFlags::empty() };
                reply.opened(FileHandle(fh), cache | self.write_through(flags.0))
            }
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
        self.touch();
        self.do_read(fh.0, offset, size, |r| match r {
            Ok(d) => reply.data(d),
            Err(e) => reply.error(e.into()),
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.touch();
        let unprivileged = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID).then(|| caller(req));
        match self.do_write(fh.0, offset, data, unprivileged) {
            Ok(n) => {
                // A direct write (O_DIRECT, not the kernel's write-back of cached pages, whose
                // pages wait for this answer) drops its range from the page cache once more,
                // now that the data is in the backing file: the kernel drops it when the write
                // is submitted, and an asynchronous one (libaio, io_uring) is still on its way
                // then, so a buffered read in between caches the old data for good.
                if flags.0 & libc::O_DIRECT != 0 && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
                    self.inval_range(ino.0, offset, n as u64);
                }
                reply.written(n as u32)
            }
            Err(e) => {
                if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
                    self.note_lost_write(fh.0, offset);
                }
                reply.error(e.into())
            }
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Data reaches the backing file at WRITE, so there is nothing to flush. ENOSYS makes
        // the kernel stop sending FLUSH (one round trip less per close); it still writes
        // dirty pages back on close first, and locks are kept by the kernel itself.
        reply.error(Errno::ENOSYS);
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
        self.do_release(fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.touch();
        empty(reply, self.do_fsync(fh.0, datasync));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.touch();
        match self.do_opendir(ino.0, caller(req)) {
            // Shared storage only: no listing cache in the kernel.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e.into()),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.touch();
        let (node, entries, start) = match self.listing(ino.0, fh.0, offset, caller(req)) {
            Ok(x) => x,
            Err(e) => return reply.error(e.into()),
        };
        let parent = node.link().map(|l| l.parent.id).unwrap_or(ino.0);
        if offset == 0 && reply.add(INodeNo(node.id), 1, FileType::Directory, ".") {
            return reply.ok();
        }
        if offset <= 1 && reply.add(INodeNo(parent), 2, FileType::Directory, "..") {
            return reply.ok();
        }
        for e in &entries[start..] {
            let full = match self.entry_ino(&node, e) {
                Ok(ino) => {
                    let kind = attr::kind_from_dtype(e.d_type).unwrap_or(FileType::RegularFile);
                    reply.add(INodeNo(ino), e.cookie, kind, OsStr::from_bytes(&e.name))
                }
                Err(_) => false, // vanished or damaged (logged): skipped, as by READDIRPLUS
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        self.touch();
        let (node, entries, start) = match self.listing(ino.0, fh.0, offset, caller(req)) {
            Ok(x) => x,
            Err(e) => return reply.error(e.into()),
        };
        let parent = node.link().map(|l| l.parent.id).unwrap_or(ino.0);
        // A reader who may list but not search the directory gets no entry the kernel may
        // keep: its next use of a name is a LOOKUP, which checks search permission.
        let ttl = match self.may(caller(req), &node, crate::perm::EXEC) {
            Ok(_) => self.opts.ttl,
            Err(_) => std::time::Duration::ZERO,
        };
        for (i, id, name) in [(0, node.id, "."), (1, parent, "..")] {
            if offset <= i {
                let mut a = attr::negative();
                a.ino = INodeNo(id);
                a.kind = FileType::Directory;
                if reply.add(INodeNo(id), i + 1, name, &ttl, &a, GEN) {
                    return reply.ok();
                }
            }
        }
        for e in &entries[start..] {
            let full = match self.plus_entry(&node, e) {
                Ok((child, st)) => {
                    let a = self.attr_of(&child, &st);
                    let full = reply.add(
                        INodeNo(child.id),
                        e.cookie,
                        OsStr::from_bytes(&e.name),
                        &ttl,
                        &a,
                        child.generation(),
                    );
                    if full {
                        self.nodes.forget(child.id, 1);
                    }
                    full
                }
                Err(_) => false, // vanished or damaged (logged): skip it
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.handles.remove_dir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.touch();
        let r = self.nodes.get(ino.0).and_then(|n| {
            let d = n.dir()?;
            veilfs_core::sys::fsync(d.cd.fd())
        });
        empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.do_statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                255,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e.into()),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.touch();
        empty(reply, self.do_setxattr(ino.0, name.as_bytes(), value, flags, caller(req)));
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.touch();
        xattr_reply(reply, size, self.do_getxattr(ino.0, name.as_bytes(), caller(req)));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.touch();
        xattr_reply(reply, size, self.do_listxattr(ino.0));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.touch();
        empty(reply, self.do_removexattr(ino.0, name.as_bytes(), caller(req)));
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // Sent only without default_permissions (a mount that is not --allow-other).
        self.touch();
        empty(reply, self.do_access(ino.0, mask.bits() as u32, caller(req)));
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
        self.touch();
        let c = caller(req);
        match self.acting(c).and_then(|_as| self.do_create(parent.0, name.as_bytes(), mode, flags, c)) {
            Ok((node, st, fh)) => {
                let open = self.keep_cache() | self.write_through(flags);
                reply.created(&self.opts.ttl, &self.attr_of(&node, &st), node.generation(), FileHandle(fh), open)
            }
            Err(e) => reply.error(e.into()),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.touch();
        empty(reply, self.do_fallocate(fh.0, offset, length, mode, caller(req)));
    }

    fn lseek(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        // With the writeback cache the kernel forwards SEEK_DATA/SEEK_HOLE without writing
        // dirty pages back, so the backing file would call unwritten data a hole. ENOSYS
        // makes the kernel answer "all data" itself, which is always correct.
        if self.writeback {
            return reply.error(Errno::ENOSYS);
        }
        match self.do_lseek(fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e.into()),
        }
    }
}
