//! fuser's `Filesystem` trait for the reverse view: unpack each request, call `ops.rs`, send
//! exactly one reply. Everything that would change the view is refused by the kernel (the
//! mount is `ro`) or by fuser's defaults (ENOSYS).

use super::ops::{Handle, ReverseFs, ROOT};
use crate::attr;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    Request,
};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use veilfs_core::sys::Stat;

const GEN: Generation = Generation(0);

/// The attributes of node `ino` from its view `stat` (sizes already those of the ciphertext).
fn view_attr(st: &Stat, ino: u64) -> FileAttr {
    let ctime = attr::time(st.st_ctime, st.st_ctime_nsec);
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: attr::time(st.st_atime, st.st_atime_nsec),
        mtime: attr::time(st.st_mtime, st.st_mtime_nsec),
        ctime,
        crtime: ctime,
        kind: attr::kind(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: attr::rdev_to_fuse(st.st_rdev),
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for ReverseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let want = InitFlags::FUSE_ASYNC_READ | InitFlags::FUSE_MAX_PAGES | InitFlags::FUSE_PARALLEL_DIROPS;
        let granted = want & config.capabilities();
        config
            .add_capabilities(granted)
            .map_err(|_| io::Error::other("the kernel refused offered FUSE capabilities"))?;
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.touch();
        match self.do_lookup(parent.0, name.as_bytes()) {
            Ok((ino, st)) => reply.entry(&self.ttl, &view_attr(&st, ino), GEN),
            Err(e) => reply.error(e.into()),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        ReverseFs::forget(self, ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.touch();
        match self.do_getattr(ino.0) {
            Ok(st) => reply.attr(&self.ttl, &view_attr(&st, ino.0)),
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

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.touch();
        match self.do_open(ino.0, flags.0) {
            // No FOPEN_KEEP_CACHE: each open sees the plaintext's current ciphertext.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
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
        match self.do_read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e.into()),
        }
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

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.touch();
        match self.do_opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e.into()),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.touch();
        let h = match self.handle(fh.0) {
            Ok(h) => h,
            Err(e) => return reply.error(e.into()),
        };
        let Handle::Dir(listing, known) = &*h else { return reply.error(Errno::ENOTDIR) };
        let parent = if ino.0 == ROOT { ROOT } else { self.parent_of(ino.0) };
        let mut i = offset as usize;
        loop {
            let full = match i {
                0 => reply.add(ino, 1, FileType::Directory, "."),
                1 => reply.add(INodeNo(parent), 2, FileType::Directory, ".."),
                _ => match listing.items.get(i - 2) {
                    None => break,
                    Some(item) => {
                        let kind = match &item.kind {
                            veilfs_core::reverse::ViewKind::Entry(e) => attr::kind(e.stat.st_mode),
                            _ => FileType::RegularFile,
                        };
                        // Only a hint: LOOKUP gives the node id.
                        let hint = match known[i - 2] {
                            0 => u64::MAX,
                            n => n,
                        };
                        reply.add(INodeNo(hint), (i + 1) as u64, kind, &item.on_disk)
                    }
                },
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.do_release(fh.0);
        reply.ok();
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
}
