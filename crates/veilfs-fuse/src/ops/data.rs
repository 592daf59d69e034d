//! A file's content: the shared open `CryptFile` of an inode, OPEN/RELEASE, READ, WRITE,
//! truncation, FALLOCATE and LSEEK, with block-range locks for parallel writers.

use super::*;

impl VeilFs {
    /// The content layer over `fd`, the backing file `on_disk` in `dir` whose entry promises
    /// `identity` (of node `ino`). Used by every path that opens a file's content, so they all
    /// read the header the same way and agree on when SPARSE is written.
    pub(super) fn content(
        &self,
        fd: OwnedFd,
        (ino, identity): (u64, Identity),
        dir: &DirState,
        on_disk: &str,
    ) -> io::Result<CryptFile> {
        // Before the header is read.
        no_backing_atime(fd.as_fd());
        let crypt = self.vault.open_crypt(&dir.cd, on_disk, identity, sys::into_file(fd)).map_err(cerr)?;
        // Only this process writes the file: holes left by out-of-order write-back can wait
        // for the writes that fill them before the header is marked SPARSE.
        crypt.set_defer_sparse(!self.opts.shared_storage);
        // Every handle ends with a RELEASE or FSYNC that settles: with shared storage too, a
        // file with a block map keeps one write session until then (docs/FORMAT.md §5.10).
        crypt.set_session_until_settle(true);
        // A file a crash left UNSETTLED is settled as soon as it opens (docs/FORMAT.md §5.8);
        // without a writable backing file it is read by the crash rules instead.
        if !self.opts.shared_storage && !self.opts.read_only {
            match crypt.recover_tail() {
                // The size the kernel had from the entry may have been cut by the crash rules.
                Ok(Some(_)) => self.invalidate_attr(ino),
                Ok(None) => {}
                Err(e) => tracing::warn!("{e}"),
            }
        }
        Ok(crypt)
    }

    /// The inode's open file, opening it if this is the first user.
    pub(crate) fn acquire(&self, node: &Arc<Node>) -> io::Result<Arc<CryptFile>> {
        node.file()?.acquire(|| {
            let mut last = errno(libc::ESTALE);
            for l in node.links() {
                let dir = l.parent.dir()?;
                // Verified: a regular file, and the inode the kernel checked permissions
                // against; a planted FIFO, device or link, or a swapped file, is an integrity
                // error.
                // The file is opened once for every handle, for reading and writing (writes
                // read too: partial blocks); a mode that denies the owner is the engine's to
                // get past (see `Vault::open_content`).
                // A grant moves change times the kernel may hold for long: it is told.
                let rw = |flags| {
                    self.telling_grants(&[node.id, l.parent.id], || {
                        Vault::open_content(&dir.cd, &l.on_disk, flags, node.backing_ino)
                    })
                };
                let fd = match rw(if self.opts.read_only { libc::O_RDONLY } else { libc::O_RDWR }) {
                    Ok(fd) => fd,
                    Err(veilfs_core::Error::Io { source, .. })
                        if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EROFS | libc::EPERM)) =>
                    {
                        match rw(libc::O_RDONLY) {
                            Ok(fd) => fd,
                            Err(e) => {
                                last = cerr(e);
                                continue;
                            }
                        }
                    }
                    Err(e @ (veilfs_core::Error::Auth { .. } | veilfs_core::Error::Rollback { .. })) => {
                        if self.replaced_behind(dir, &l.on_disk, node) {
                            return Err(errno(libc::ESTALE));
                        }
                        return Err(cerr(e));
                    }
                    Err(e) => {
                        last = cerr(e);
                        continue;
                    }
                };
                let crypt = self.content(fd, (node.id, node.identity), dir, &l.on_disk)?;
                let size = crypt.plain_size().map_err(cerr)?;
                return Ok((crypt, size));
            }
            Err(last)
        })
    }

    /// Whether entry `on_disk` of `dir`, which names `node`, now holds another regular file
    /// whose entry binding verifies: what a sync tool delivering another machine's edit (a new
    /// file renamed over the name) leaves until CIPHERDIR's watch has told the kernel
    /// (`watch.rs`). Opening the node's old inode then answers ESTALE, not an integrity
    /// error: the kernel looks the name up again (`LOOKUP_REVAL`) and opens the new file, which
    /// is verified as any other. A planted FIFO, device or link, or a file whose binding fails,
    /// stays an integrity error.
    fn replaced_behind(&self, dir: &DirState, on_disk: &str, node: &Node) -> bool {
        if self.opts.shared_storage {
            return false;
        }
        let Ok(st) = Self::stat_entry(dir, on_disk) else { return false };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_ino == node.backing_ino {
            return false;
        }
        let ok = self.vault.entry_d(&dir.cd, on_disk).is_ok_and(|d| self.identity(dir, &d, on_disk, &st).is_ok());
        if ok {
            tracing::debug!("{}: replaced behind the mount; the kernel looks it up again", dir.cd.child_path(on_disk));
        }
        ok
    }

    /// Drops one user of the inode's open file; the last one settles it (declares the holes
    /// that writes left) before it is closed. Settling writes the header, which moves the
    /// backing times after the kernel last heard of them: it is told.
    ///
    /// A file whose write-back failed part-way is first cut where the first refused write
    /// left a hole ([`CryptFile::drop_lost`]), and the kernel drops what it caches of it:
    /// the pages that were never stored, and (by a new generation for the node id and by
    /// forgetting its names, so that the inode goes) the size it kept for itself, which with
    /// the write-back cache no reply can correct.
    pub(crate) fn release_file(&self, node: &Node) {
        if let Some(f) = &node.file {
            let mut lost = false;
            f.release(|c| {
                match c.drop_lost() {
                    Ok(Some(_)) => lost = true,
                    Ok(None) => {}
                    Err(e) => tracing::error!("{e}"),
                }
                match c.settle() {
                    Ok(true) => self.invalidate_attr(node.id),
                    Ok(false) => {}
                    Err(e) => tracing::error!("{e}"),
                }
                // CIPHERDIR's watch reports the close that follows: after writes, the file
                // is as the mount left it. (Not after reads only: the file may have been
                // rewritten by others since the kernel last heard of it, see `watch.rs`.)
                if f.take_written() {
                    if let Ok(st) = sys::fstat(c.backing().as_fd()) {
                        f.note_own(&st);
                    }
                }
            });
            if lost {
                f.renew();
                self.forget_cached(node);
            }
        }
    }

    /// After the write-back of a file failed: the kernel drops its cached pages and
    /// attributes, and its names, so that the inode, unused, is evicted and the next lookup
    /// reads the size from the backing file. From another thread (the kernel takes the
    /// parent's lock for a name, which a request in flight may hold).
    fn forget_cached(&self, node: &Node) {
        let Some(n) = self.notifier.get().cloned() else { return };
        let mut names = Vec::new();
        for l in node.links() {
            let Some(parent) = l.parent.dir.as_ref() else { continue };
            let Ok(d) = self.decode_d(parent, &l.on_disk) else { continue };
            if let Ok(name) = self.names.decrypt_name(&parent.cd.iv, &d) {
                names.push((l.parent.id, name));
            }
        }
        let id = node.id;
        // From another thread: dropping the pages waits for any of them under write-back,
        // whose WRITE needs a worker thread.
        std::thread::spawn(move || {
            if let Err(e) = n.inval_inode(fuser::INodeNo(id), 0, 0) {
                tracing::debug!("node {id}: page invalidation: {e}");
            }
            for (parent, name) in names {
                if let Err(e) =
                    n.inval_entry(fuser::INodeNo(parent), std::os::unix::ffi::OsStrExt::from_bytes(&name[..]))
                {
                    tracing::debug!("node {parent}: entry invalidation: {e}");
                }
            }
        });
    }

    /// After a WRITE from the kernel's write-back cache failed: its application was told
    /// the write succeeded, and hears of the failure only at `fsync` or `close`; the last
    /// close then cuts the file where the write left a hole ([`release_file`](Self::release_file)).
    pub(crate) fn note_lost_write(&self, fh: u64, off: u64) {
        if let Ok(h) = self.handles.file(fh) {
            h.crypt.lost_write(off);
        }
    }

    /// Whether files opened for writing now bypass the write-back cache (`FOPEN_DIRECT_IO`):
    /// the backing store has less than [`LOW_SPACE`] free. The cache acknowledges a `write`
    /// before the data reaches the daemon, so on a full disk the application would hear of
    /// the failure only at `fsync` or `close`; written through, each `write` gets its own
    /// ENOSPC. One `fstatvfs` at most every [`SPACE_CHECK_MS`] milliseconds, at open.
    pub(crate) fn space_low(&self) -> bool {
        if !self.writeback {
            return false;
        }
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let last = self.space.checked.load(Ordering::Relaxed);
        if now.saturating_sub(last) < SPACE_CHECK_MS && last != 0 {
            return self.space.low.load(Ordering::Relaxed);
        }
        let low = self
            .nodes
            .get(crate::inodes::ROOT)
            .and_then(|root| sys::fstatvfs(root.dir()?.cd.fd()))
            .map(|s| s.f_bavail.saturating_mul(s.f_frsize) < LOW_SPACE)
            .unwrap_or(false);
        self.space.low.store(low, Ordering::Relaxed);
        self.space.checked.store(now, Ordering::Relaxed);
        low
    }

    /// FSYNC: flushes the file (settling its header, which the kernel is told of as at
    /// [`release_file`](Self::release_file)).
    pub(crate) fn do_fsync(&self, fh: u64, datasync: bool) -> io::Result<()> {
        let h = self.handles.file(fh)?;
        if h.crypt.sync(datasync).map_err(cerr)? {
            self.invalidate_attr(h.node.id);
        }
        Ok(())
    }

    /// At unmount: declares the holes of files still open. Their RELEASE may never come (the
    /// kernel drops queued requests when the connection ends, and a file closed just before
    /// `umount` is often still queued), and a hole left undeclared fails authentication after
    /// a clean unmount.
    pub(crate) fn settle_open_files(&self) {
        for h in self.handles.open_files() {
            if let Err(e) = h.crypt.drop_lost() {
                tracing::error!("{e}");
            }
            if let Err(e) = h.crypt.settle() {
                tracing::error!("{e}");
            }
        }
    }

    /// The inode's open file, if some handle has it open (it stays usable after its last
    /// name is gone, like any open file).
    pub(crate) fn open_crypt(&self, node: &Node) -> Option<Arc<CryptFile>> {
        node.file.as_ref().and_then(|f| f.opened())
    }

    pub(super) fn current_size(&self, f: &crate::inodes::FileState, crypt: &CryptFile) -> io::Result<u64> {
        if self.opts.shared_storage {
            let s = crypt.plain_size().map_err(cerr)?;
            f.set_size(s);
            Ok(s)
        } else {
            Ok(f.size())
        }
    }

    /// OPEN (by `caller`): returns the handle, and whether the kernel may keep the file's
    /// cached pages (not when a read is to update the access time, see `atime.rs`).
    pub(crate) fn do_open(&self, ino: u64, flags: i32, caller: Caller) -> io::Result<(u64, bool)> {
        let node = self.nodes.get(ino)?;
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.check_writable()?;
        }
        self.may(caller, &node, crate::perm::open_mask(flags))?;
        let crypt = self.acquire(&node)?;
        if flags & libc::O_TRUNC != 0 {
            let f = node.file()?;
            // A change of the content like any other: the last close notes the backing file
            // as the mount leaves it, so that CIPHERDIR's watch takes the close for the
            // mount's own. Missed, an O_TRUNC open closed without a write looked like someone
            // else's rewrite: the watch gave the backing inode a new node while the kernel
            // could still open the old one, and two open files of one inode (two block maps
            // in memory) went stale against each other (EIO, wrong sizes).
            f.wrote();
            let _w = f.resizing();
            let cur = self.current_size(f, &crypt)?;
            let r = crypt.truncate(0, cur).map_err(cerr).and_then(|()| {
                f.set_size(0);
                self.drop_setid(&node, &crypt, caller, false)
            });
            match r {
                Ok(true) => self.invalidate_attr(node.id),
                Ok(false) => {}
                Err(e) => {
                    self.release_file(&node);
                    return Err(e);
                }
            }
        }
        let keep = !self.atime_due_at_open(&node, &crypt, flags);
        self.activity.open_files.fetch_add(1, Ordering::Relaxed);
        Ok((self.handles.add_file(OpenFile { node, crypt }), keep))
    }

    /// RELEASE.
    pub(crate) fn do_release(&self, fh: u64) {
        if let Some(h) = self.handles.remove_file(fh) {
            self.release_file(&h.node);
            self.activity.open_files.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// READ: calls `reply` with the plaintext.
    pub(crate) fn do_read(&self, fh: u64, off: u64, size: u32, reply: impl FnOnce(io::Result<&[u8]>)) {
        let res = (|| -> io::Result<usize> {
            let h = self.handles.file(fh)?;
            let f = h.node.file()?;
            let _s = f.sized();
            let cur = self.current_size(f, &h.crypt)?;
            if off >= cur || size == 0 {
                return Ok(0);
            }
            let len = (size as u64).min(cur - off);
            let (first, last) = self.layout.blocks_touched(off, len).expect("non-empty");
            let _r = f.blocks(first, last, false);
            BUF.with_borrow_mut(|buf| {
                if buf.len() < len as usize {
                    buf.resize(len as usize, 0);
                }
                h.crypt.read_at(&mut buf[..len as usize], off, cur).map_err(cerr)
            })
            .inspect(|_| self.atime_after_read(f, &h.crypt))
        })();
        match res {
            Ok(0) => reply(Ok(&[])),
            Ok(n) => BUF.with_borrow(|buf| reply(Ok(&buf[..n]))),
            Err(e) => reply(Err(e)),
        }
    }

    /// WRITE. `unprivileged`: the writer, when the kernel says it lacks CAP_FSETID
    /// (`FUSE_WRITE_KILL_SUIDGID`), so the file's set-id bits may have to go.
    pub(crate) fn do_write(&self, fh: u64, off: u64, data: &[u8], unprivileged: Option<Caller>) -> io::Result<usize> {
        self.check_writable()?;
        let h = self.handles.file(fh)?;
        let f = h.node.file()?;
        f.wrote();
        if let Some(c) = unprivileged {
            if self.drop_setid(&h.node, &h.crypt, c, true)? {
                self.invalidate_attr(h.node.id);
            }
        }
        let end = off.checked_add(data.len() as u64).ok_or_else(|| errno(libc::EFBIG))?;
        self.atime_recheck(&h.node);
        self.write_locked(&h.crypt, f, off, end, data)
    }

    /// The part of [`do_write`](Self::do_write) under the file's locks.
    fn write_locked(
        &self,
        crypt: &CryptFile,
        f: &crate::inodes::FileState,
        off: u64,
        end: u64,
        data: &[u8],
    ) -> io::Result<usize> {
        {
            // Inside the current size: only the touched blocks are locked, so writers to
            // different blocks of one file run in parallel.
            let _s = f.sized();
            let cur = self.current_size(f, crypt)?;
            if end <= cur {
                if let Some((first, last)) = self.layout.blocks_touched(off, data.len() as u64) {
                    let _r = f.blocks(first, last, true);
                    crypt.write_at(data, off, cur).map_err(cerr)?;
                }
                return Ok(data.len());
            }
        }
        let _w = f.resizing();
        let cur = self.current_size(f, crypt)?;
        let new = crypt.write_at(data, off, cur).map_err(cerr)?;
        f.set_size(new);
        Ok(data.len())
    }

    /// Sets the plaintext size of `node`, open as `crypt`, for `caller` (whose truncation may
    /// clear set-id bits).
    pub(crate) fn resize(&self, node: &Node, crypt: &CryptFile, size: u64, caller: Caller) -> io::Result<()> {
        self.check_writable()?;
        if let Some(f) = &node.file {
            f.wrote();
        }
        if size > i64::MAX as u64 / 2 {
            return Err(errno(libc::EFBIG));
        }
        let f = node.file()?;
        let _w = f.resizing();
        let cur = self.current_size(f, crypt)?;
        crypt.truncate(size, cur).map_err(cerr)?;
        f.set_size(size);
        self.atime_recheck(node);
        self.drop_setid(node, crypt, caller, false).map(drop)
    }

    /// FALLOCATE (modes 0 and KEEP_SIZE; holes are punched by nothing yet) by `caller`.
    pub(crate) fn do_fallocate(&self, fh: u64, off: u64, len: u64, mode: i32, caller: Caller) -> io::Result<()> {
        self.check_writable()?;
        let h = self.handles.file(fh)?;
        let f = h.node.file()?;
        f.wrote();
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(errno(libc::EOPNOTSUPP));
        }
        off.checked_add(len).ok_or_else(|| errno(libc::EFBIG))?;
        let _w = f.resizing();
        let cur = self.current_size(f, &h.crypt)?;
        let extend = mode & libc::FALLOC_FL_KEEP_SIZE == 0;
        let new = h.crypt.allocate(off, len, extend, cur).map_err(cerr)?;
        f.set_size(new);
        self.atime_recheck(&h.node);
        if self.drop_setid(&h.node, &h.crypt, caller, false)? {
            self.invalidate_attr(h.node.id);
        }
        Ok(())
    }

    /// After `caller` changed the content or size of an open file (WRITE, truncation,
    /// FALLOCATE): clears its set-id bits as Linux does (`setattr_should_drop_suidgid`) unless
    /// the caller holds `CAP_FSETID` — set-user-id always; set-group-id when the file is
    /// group-executable or the caller is not in its group (without group-execute the bit
    /// marks mandatory locking, which Linux keeps for the group's own writers). With
    /// `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves this to us, and fuser passes on only
    /// WRITE's flag for it (`unprivileged`); for the other requests the caller's capabilities
    /// are read from /proc. Returns whether the mode changed: a reply without attributes
    /// must then have the kernel drop the mode it caches ([`invalidate_attr`](Self::invalidate_attr)).
    pub(crate) fn drop_setid(
        &self,
        node: &Node,
        crypt: &CryptFile,
        caller: Caller,
        unprivileged: bool,
    ) -> io::Result<bool> {
        // Most files have no set-id bit: known without a system call (see `CryptFile::mode`).
        if crypt.mode().map_err(cerr)? & (libc::S_ISUID | libc::S_ISGID) == 0 {
            return Ok(false);
        }
        let st = sys::fstat(crypt.backing().as_fd())?;
        let mode = st.st_mode;
        if mode & (libc::S_ISUID | libc::S_ISGID) == 0 || mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(false);
        }
        let creds = std::cell::OnceCell::new();
        let creds = || creds.get_or_init(|| if caller.pid == 0 { None } else { sys::creds_of(caller.pid).ok() });
        let privileged = !unprivileged && creds().as_ref().map_or(caller.uid == 0, |c| c.cap_fsetid);
        if privileged {
            return Ok(false);
        }
        let in_group = || caller.gid == st.st_gid || creds().as_ref().is_some_and(|c| c.groups.contains(&st.st_gid));
        let mut drop = mode & libc::S_ISUID;
        if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !in_group()) {
            drop |= libc::S_ISGID;
        }
        if drop == 0 {
            return Ok(false);
        }
        tracing::debug!("node {}: set-id bits {:o} cleared after a change by uid {}", node.id, drop, caller.uid);
        // As the daemon: the caller need not own the file (Linux forces this change too).
        sys::privileged(|| crypt.chmod(mode & 0o7777 & !drop)).map_err(cerr)?;
        Ok(true)
    }

    /// LSEEK (SEEK_DATA / SEEK_HOLE) without the writeback cache: the backing file's answer,
    /// widened to whole blocks (so a block partly in a hole counts as data).
    pub(crate) fn do_lseek(&self, fh: u64, off: i64, whence: i32) -> io::Result<i64> {
        let h = self.handles.file(fh)?;
        let f = h.node.file()?;
        let _s = f.sized();
        let size = self.current_size(f, &h.crypt)? as i64;
        if off < 0 || off >= size {
            return Err(errno(libc::ENXIO));
        }
        let l = self.layout;
        let coff = l.block_offset(l.block_of(off as u64));
        let fd = h.crypt.backing().as_fd();
        let to_plain = |c: i64| -> i64 {
            let b = (c.max(l.header() as i64) - l.header() as i64) as u64 / l.cipher_block();
            (b * l.block_size) as i64
        };
        match whence {
            libc::SEEK_DATA => {
                let c = sys::seek_data(fd, coff)? as i64;
                Ok(to_plain(c).max(off))
            }
            libc::SEEK_HOLE => {
                let c = sys::seek_hole(fd, coff)? as i64;
                let p = to_plain(c + l.cipher_block() as i64 - 1);
                Ok(p.clamp(off, size))
            }
            _ => Err(errno(libc::EINVAL)),
        }
    }
}

/// Free space on the backing store below which files opened for writing bypass the
/// write-back cache ([`VeilFs::space_low`]). A small disk, or one nearly full, is where a
/// file outgrows the free space; there each `write` is told ENOSPC itself. It does not cover
/// every case: the kernel lets one FUSE mount hold up to 1 % of its dirty limit unwritten
/// (about 46 MiB on a machine with 24 GB), so a file opened with more free than this can
/// still fill the disk from the cache (then `fsync` and `close` tell, and the last close cuts
/// the file to what was stored, see [`VeilFs::release_file`]). Not higher, because the cache
/// is what makes small writes fast.
pub(crate) const LOW_SPACE: u64 = 32 << 20;

/// How old (ms) the free-space reading [`VeilFs::space_low`] uses may be.
const SPACE_CHECK_MS: u64 = 100;

/// The last free-space reading of the backing store.
#[derive(Debug, Default)]
pub(crate) struct FreeSpace {
    /// When it was taken (ms since the epoch; 0: never).
    checked: std::sync::atomic::AtomicU64,
    /// Whether there was less than [`LOW_SPACE`] free.
    low: std::sync::atomic::AtomicBool,
}

/// Reads of the backing file leave its access time alone (`O_NOATIME`): the mount keeps it
/// by its own rule (`atime.rs`), whatever the backing filesystem's option. Best effort: a
/// daemon may not set it on a file it does not own.
pub(super) fn no_backing_atime(fd: std::os::fd::BorrowedFd<'_>) {
    if let Err(e) = sys::set_noatime(fd) {
        tracing::debug!("O_NOATIME: {e}");
    }
}
