//! The operations, as plain methods returning `io::Result`: what each FUSE request does to
//! the ciphertext. `fs.rs` only unpacks requests and sends replies.

use crate::attr;
use crate::dirs::{Decoded, DirState, IndexEntry};
use crate::handles::{Handles, OpenFile, SnapEntry};
use crate::inodes::{Node, NodeTable, ROOT};
use fuser::FileAttr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use veilfs_core::content::Layout;
use veilfs_core::names::{NameKey, ParsedEntry};
use veilfs_core::xattr::XattrCipher;
use veilfs_core::{sys, CipherDir, ContentCtx, CryptFile, EntryKind, Identity, NameCipher, Vault};

/// Mount-time choices that change behaviour.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Refuse every change.
    pub read_only: bool,
    /// Another mount or a sync tool may change the ciphertext: no caches.
    pub shared_storage: bool,
    /// Attribute and entry cache time.
    pub ttl: Duration,
    /// Cache time of "no such name" answers (zero: none).
    pub negative_ttl: Duration,
    /// Ask for the kernel writeback cache.
    pub writeback: bool,
}

/// What a SETATTR asks to change (`None`: leave as is).
#[derive(Debug, Default, Clone)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New plaintext size.
    pub size: Option<u64>,
    /// New access time (`UTIME_NOW` allowed).
    pub atime: Option<libc::timespec>,
    /// New modification time (`UTIME_NOW` allowed).
    pub mtime: Option<libc::timespec>,
}

impl SetAttr {
    fn changes_anything(&self) -> bool {
        self.mode.is_some()
            || self.uid.is_some()
            || self.gid.is_some()
            || self.size.is_some()
            || self.atime.is_some()
            || self.mtime.is_some()
    }

    /// The two timespecs of `utimensat`, `UTIME_OMIT` for the ones not asked for.
    fn times(&self) -> [libc::timespec; 2] {
        let omit = libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT };
        [self.atime.unwrap_or(omit), self.mtime.unwrap_or(omit)]
    }

    /// Applies the changes to a remembered `stat` (of a deleted object).
    fn apply_to(&self, st: &mut libc::stat) {
        if let Some(m) = self.mode {
            st.st_mode = (st.st_mode & libc::S_IFMT) | (m & 0o7777);
        }
        if let Some(u) = self.uid {
            st.st_uid = u;
        }
        if let Some(g) = self.gid {
            st.st_gid = g;
        }
        for (t, (sec, nsec)) in self
            .times()
            .iter()
            .zip([(&mut st.st_atime, &mut st.st_atime_nsec), (&mut st.st_mtime, &mut st.st_mtime_nsec)])
        {
            if t.tv_nsec != libc::UTIME_OMIT && t.tv_nsec != libc::UTIME_NOW {
                *sec = t.tv_sec;
                *nsec = t.tv_nsec;
            }
        }
    }
}

/// What the mount is doing, shared with the process that runs it: when it last served a
/// request and how many files are open (for `--idle`), and whether it has ended.
#[derive(Debug, Default)]
pub struct Activity {
    /// Seconds since the epoch of the last request.
    pub last: AtomicU64,
    /// Open file handles (never unmount for idleness under an open file).
    pub open_files: std::sync::atomic::AtomicUsize,
    ended: parking_lot::Mutex<bool>,
    ended_cv: parking_lot::Condvar,
}

impl Activity {
    /// Blocks until the filesystem has been torn down (its keys dropped).
    pub fn wait_ended(&self) {
        let mut g = self.ended.lock();
        while !*g {
            self.ended_cv.wait(&mut g);
        }
    }

    fn set_ended(&self) {
        *self.ended.lock() = true;
        self.ended_cv.notify_all();
    }
}

impl Drop for VeilFs {
    fn drop(&mut self) {
        // The vault (and its keys, zeroized on drop) goes with us unless someone else
        // still holds it.
        self.activity.set_ended();
    }
}

/// The filesystem state.
#[derive(Debug)]
pub struct VeilFs {
    pub(crate) vault: Arc<Vault>,
    pub(crate) names: Arc<NameCipher>,
    pub(crate) ctx: ContentCtx,
    pub(crate) layout: Layout,
    pub(crate) xattr: XattrCipher,
    pub(crate) nodes: NodeTable,
    pub(crate) handles: Handles,
    pub(crate) opts: FsOptions,
    pub(crate) writeback: bool,
    pub(crate) euid: u32,
    pub(crate) activity: Arc<Activity>,
}

pub(crate) fn errno(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

/// Maps a core error to an `io::Error` with the right errno; integrity failures are logged
/// (naming the ciphertext) and become EIO.
pub(crate) fn cerr(e: veilfs_core::Error) -> io::Error {
    if let veilfs_core::Error::Auth { .. } = e {
        tracing::error!("{e}");
    }
    match e {
        veilfs_core::Error::Io { source, .. } => source,
        e => errno(e.errno()),
    }
}

/// Who sent a request: the ids a root daemon acts with for it (see [`VeilFs::acting`]).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Process id (0 for requests the kernel makes on its own).
    pub pid: u32,
}

thread_local! {
    static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl VeilFs {
    /// A filesystem over an unlocked vault.
    pub fn new(vault: Arc<Vault>, opts: FsOptions, activity: Arc<Activity>) -> io::Result<Self> {
        let root = vault.root().map_err(cerr)?;
        let st = sys::fstat(root.fd())?;
        let iv = root.iv;
        let ctx = vault.content().clone();
        let xattr = XattrCipher::new(&ctx.keys, ctx.cipher);
        let names = vault.names().clone();
        let layout = ctx.layout;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let fs = VeilFs {
            nodes: NodeTable::new(DirState::new(root, opts.shared_storage), iv, st.st_ino),
            vault,
            names,
            ctx,
            layout,
            xattr,
            handles: Handles::default(),
            writeback: false,
            euid,
            opts,
            activity,
        };
        Ok(fs)
    }

    /// For a daemon running as root: acts as `c` (fsuid, fsgid, supplementary groups) on this
    /// thread until the guard drops, so a change made for a user has that user's rights on
    /// the backing store, whatever a race or a planted link makes of its name. Nothing to do
    /// for a daemon running as the mounting user or for root's own requests. Supplementary
    /// groups come from `/proc/PID/status`; a request the kernel makes itself (pid 0) gets none.
    pub(crate) fn acting(&self, c: Caller) -> io::Result<Option<sys::ActingGuard>> {
        if self.euid != 0 || (c.uid == 0 && c.gid == 0) {
            return Ok(None);
        }
        let groups = if c.pid == 0 { Vec::new() } else { sys::groups_of(c.pid).unwrap_or_default() };
        sys::act_as(c.uid, c.gid, groups).map(Some)
    }

    /// Notes activity (for `--idle`).
    pub(crate) fn touch(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.activity.last.store(now, Ordering::Relaxed);
    }

    pub(crate) fn check_writable(&self) -> io::Result<()> {
        if self.opts.read_only {
            Err(errno(libc::EROFS))
        } else {
            Ok(())
        }
    }

    /// The attributes of `node` given its backing `st`.
    pub(crate) fn attr_of(&self, node: &Node, st: &libc::stat) -> FileAttr {
        let size = node.file.as_ref().and_then(|f| f.open.lock().as_ref().map(|_| f.size.load(Ordering::Acquire)));
        attr::file_attr(st, node.id, &self.layout, size)
    }

    // ---- lookups -------------------------------------------------------------------------

    /// The lookup key of `name` in `dir` and its on-disk entry, if it exists.
    fn find(&self, dir: &DirState, name: &[u8]) -> io::Result<(NameKey, Option<String>)> {
        let key = self.names.name_key(&dir.cd.iv, name).map_err(cerr)?;
        let found =
            dir.index(self.opts.shared_storage)?.as_ref().and_then(|i| i.get(&key.key).map(|e| e.on_disk.clone()));
        Ok((key, found))
    }

    /// The identity `on_disk` (in `dir`, with `D` = `d`, backing type from `st`) promises.
    fn identity(&self, dir: &DirState, d: &[u8], on_disk: &str, st: &libc::stat) -> io::Result<(EntryKind, Identity)> {
        let kind = EntryKind::from_mode(st.st_mode);
        // `on_disk` comes from the index, which holds only names that parsed as entries, so
        // the binding is what follows the last dot.
        let s = on_disk.rsplit_once('.').map(|(_, s)| s).ok_or_else(|| errno(libc::EIO))?;
        let id = self
            .names
            .unbind(&dir.cd.iv, d, kind, s)
            .map_err(|e| cerr(veilfs_core::Error::auth(dir.cd.child_path(on_disk), format!("{e}"))))?;
        Ok((kind, id))
    }

    /// The node of entry `on_disk` of `parent` (counts one kernel lookup).
    fn node_at(&self, parent: &Arc<Node>, d: &[u8], on_disk: &str, st: &libc::stat) -> io::Result<Arc<Node>> {
        let dir = parent.dir()?;
        let (kind, identity) = self.identity(dir, d, on_disk, st)?;
        self.nodes.lookup(parent, on_disk, st, kind, identity, || {
            let fd = sys::open_dir_at(dir.cd.fd(), on_disk.as_bytes())?;
            let cd = CipherDir::from_parts(fd, identity, dir.cd.path.join(on_disk));
            // Every directory this mount uses was checked here first: its `veilfs.diriv` is
            // the IV its entry promises (not one copied from another directory, not a FIFO).
            self.vault.check_diriv(&cd).map_err(cerr)?;
            Ok(Some(DirState::new(cd, self.opts.shared_storage)))
        })
    }

    /// LOOKUP.
    pub(crate) fn do_lookup(&self, parent: u64, name: &[u8]) -> io::Result<(Arc<Node>, libc::stat)> {
        let parent = self.nodes.get(parent)?;
        let dir = parent.dir()?;
        let (key, found) = self.find(dir, name)?;
        let on_disk = found.ok_or_else(|| errno(libc::ENOENT))?;
        let st = match sys::fstatat(dir.cd.fd(), on_disk.as_bytes()) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // Changed behind our back (shared storage): forget the stale index.
                dir.drop_index();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let node = self.node_at(&parent, &key.d, &on_disk, &st)?;
        Ok((node, st))
    }

    /// The backing `stat` of `node` (through an open handle's fd when given).
    pub(crate) fn do_getattr(&self, node: &Arc<Node>, fh: Option<u64>) -> io::Result<libc::stat> {
        if let Some(h) = self.handles.file_opt(fh) {
            return sys::fstat(h.crypt.backing().as_fd());
        }
        if let Some(d) = &node.dir {
            return sys::fstat(d.cd.fd());
        }
        if let Some(f) = &node.file {
            if let Some((c, _)) = f.open.lock().as_ref() {
                return sys::fstat(c.backing().as_fd());
            }
        }
        let found = node.find_link(|l| {
            let dir = l.parent.dir.as_ref()?;
            sys::fstatat(dir.cd.fd(), l.on_disk.as_bytes()).ok()
        });
        // A deleted, closed object stays ESTALE here (answering with its last attributes made
        // stress-ng's inotify IN_DELETE_SELF check time out); only SETATTR uses them.
        found.ok_or_else(|| errno(libc::ESTALE))
    }

    // ---- file content --------------------------------------------------------------------

    /// The content layer over `fd`, the backing file `on_disk` in `dir` whose entry promises
    /// `identity`. Used by every path that opens a file's content, so they all read the header
    /// the same way and agree on when SPARSE is written.
    fn content(&self, fd: OwnedFd, identity: Identity, dir: &DirState, on_disk: &str) -> io::Result<CryptFile> {
        let crypt = CryptFile::open(sys::into_file(fd), self.ctx.clone(), identity, dir.cd.child_path(on_disk))
            .map_err(cerr)?;
        // Only this process writes the file: holes left by out-of-order write-back can wait
        // for the writes that fill them before the header is marked SPARSE.
        crypt.set_defer_sparse(!self.opts.shared_storage);
        Ok(crypt)
    }

    /// The inode's open file, opening it if this is the first user.
    pub(crate) fn acquire(&self, node: &Arc<Node>) -> io::Result<Arc<CryptFile>> {
        let f = node.file()?;
        let mut g = f.open.lock();
        if let Some((c, n)) = g.as_mut() {
            *n += 1;
            return Ok(c.clone());
        }
        let mut last = errno(libc::ESTALE);
        for l in node.links() {
            let dir = l.parent.dir()?;
            // Verified: a regular file, and the inode the kernel checked permissions against;
            // a planted FIFO, device or link, or a swapped file, is an integrity error.
            let open = |flags| Vault::open_content(&dir.cd, &l.on_disk, flags, node.backing_ino);
            let fd = match open(if self.opts.read_only { libc::O_RDONLY } else { libc::O_RDWR }) {
                Ok(fd) => fd,
                Err(veilfs_core::Error::Io { source, .. })
                    if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EROFS | libc::EPERM)) =>
                {
                    match open(libc::O_RDONLY) {
                        Ok(fd) => fd,
                        Err(e) => {
                            last = cerr(e);
                            continue;
                        }
                    }
                }
                Err(e @ veilfs_core::Error::Auth { .. }) => return Err(cerr(e)),
                Err(e) => {
                    last = cerr(e);
                    continue;
                }
            };
            let crypt = self.content(fd, node.identity, dir, &l.on_disk)?;
            f.size.store(crypt.plain_size().map_err(cerr)?, Ordering::Release);
            let crypt = Arc::new(crypt);
            *g = Some((crypt.clone(), 1));
            return Ok(crypt);
        }
        Err(last)
    }

    /// Drops one user of the inode's open file.
    pub(crate) fn release_file(&self, node: &Node) {
        if let Some(f) = &node.file {
            let mut g = f.open.lock();
            if let Some((c, n)) = g.as_mut() {
                *n -= 1;
                if *n == 0 {
                    if let Err(e) = c.settle() {
                        tracing::error!("{e}");
                    }
                    *g = None;
                }
            }
        }
    }

    /// At unmount: declares the holes of files still open. Their RELEASE may never come (the
    /// kernel drops queued requests when the connection ends, and a file closed just before
    /// `umount` is often still queued), and a hole left undeclared fails authentication after
    /// a clean unmount.
    pub(crate) fn settle_open_files(&self) {
        for h in self.handles.open_files() {
            if let Err(e) = h.crypt.settle() {
                tracing::error!("{e}");
            }
        }
    }

    /// The inode's open file, if some handle has it open (it stays usable after its last
    /// name is gone, like any open file).
    pub(crate) fn open_crypt(&self, node: &Node) -> Option<Arc<CryptFile>> {
        node.file.as_ref().and_then(|f| f.open.lock().as_ref().map(|(c, _)| c.clone()))
    }

    fn current_size(&self, f: &crate::inodes::FileState, crypt: &CryptFile) -> io::Result<u64> {
        if self.opts.shared_storage {
            let s = crypt.plain_size().map_err(cerr)?;
            f.size.store(s, Ordering::Release);
            Ok(s)
        } else {
            Ok(f.size.load(Ordering::Acquire))
        }
    }

    /// OPEN: returns the handle.
    pub(crate) fn do_open(&self, ino: u64, flags: i32) -> io::Result<u64> {
        let node = self.nodes.get(ino)?;
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.check_writable()?;
        }
        let crypt = self.acquire(&node)?;
        if flags & libc::O_TRUNC != 0 {
            let f = node.file()?;
            let _w = f.size_lock.write();
            let cur = self.current_size(f, &crypt)?;
            if let Err(e) = crypt.truncate(0, cur) {
                self.release_file(&node);
                return Err(cerr(e));
            }
            f.size.store(0, Ordering::Release);
        }
        self.activity.open_files.fetch_add(1, Ordering::Relaxed);
        Ok(self.handles.add_file(OpenFile { node, crypt }))
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
            let _s = f.size_lock.read();
            let cur = self.current_size(f, &h.crypt)?;
            if off >= cur || size == 0 {
                return Ok(0);
            }
            let len = (size as u64).min(cur - off);
            let (first, last) = self.layout.blocks_touched(off, len).expect("non-empty");
            let _r = f.ranges.lock(first, last, false);
            BUF.with_borrow_mut(|buf| {
                if buf.len() < len as usize {
                    buf.resize(len as usize, 0);
                }
                h.crypt.read_at(&mut buf[..len as usize], off, cur).map_err(cerr)
            })
        })();
        match res {
            Ok(0) => reply(Ok(&[])),
            Ok(n) => BUF.with_borrow(|buf| reply(Ok(&buf[..n]))),
            Err(e) => reply(Err(e)),
        }
    }

    /// WRITE.
    pub(crate) fn do_write(&self, fh: u64, off: u64, data: &[u8], kill_suid: bool) -> io::Result<usize> {
        self.check_writable()?;
        let h = self.handles.file(fh)?;
        let f = h.node.file()?;
        if kill_suid {
            kill_suid_sgid(&h.crypt)?;
        }
        let end = off.checked_add(data.len() as u64).ok_or_else(|| errno(libc::EFBIG))?;
        {
            // Inside the current size: only the touched blocks are locked, so writers to
            // different blocks of one file run in parallel.
            let _s = f.size_lock.read();
            let cur = self.current_size(f, &h.crypt)?;
            if end <= cur {
                if let Some((first, last)) = self.layout.blocks_touched(off, data.len() as u64) {
                    let _r = f.ranges.lock(first, last, true);
                    h.crypt.write_at(data, off, cur).map_err(cerr)?;
                }
                return Ok(data.len());
            }
        }
        let _w = f.size_lock.write();
        let cur = self.current_size(f, &h.crypt)?;
        let new = h.crypt.write_at(data, off, cur).map_err(cerr)?;
        f.size.store(new, Ordering::Release);
        Ok(data.len())
    }

    /// Sets the plaintext size of `node`.
    pub(crate) fn truncate(&self, node: &Arc<Node>, size: u64) -> io::Result<()> {
        self.check_writable()?;
        if size > i64::MAX as u64 / 2 {
            return Err(errno(libc::EFBIG));
        }
        let crypt = self.acquire(node)?;
        let f = node.file()?;
        let res = (|| {
            let _w = f.size_lock.write();
            let cur = self.current_size(f, &crypt)?;
            crypt.truncate(size, cur).map_err(cerr)?;
            f.size.store(size, Ordering::Release);
            Ok(())
        })();
        self.release_file(node);
        res
    }

    /// FALLOCATE (modes 0 and KEEP_SIZE; holes are punched by nothing yet).
    pub(crate) fn do_fallocate(&self, fh: u64, off: u64, len: u64, mode: i32) -> io::Result<()> {
        self.check_writable()?;
        let h = self.handles.file(fh)?;
        let f = h.node.file()?;
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let end = off.checked_add(len).ok_or_else(|| errno(libc::EFBIG))?;
        let _w = f.size_lock.write();
        let cur = self.current_size(f, &h.crypt)?;
        // Reserve the ciphertext space, so later writes cannot fail with ENOSPC.
        let start = self.layout.block_offset(self.layout.block_of(off));
        let cend = self.layout.cipher_size(end);
        sys::fallocate(h.crypt.backing().as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, start, cend.saturating_sub(start))?;
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > cur {
            h.crypt.truncate(end, cur).map_err(cerr)?;
            f.size.store(end, Ordering::Release);
        }
        Ok(())
    }

    /// LSEEK (SEEK_DATA / SEEK_HOLE) without the writeback cache: the backing file's answer,
    /// widened to whole blocks (so a block partly in a hole counts as data).
    pub(crate) fn do_lseek(&self, fh: u64, off: i64, whence: i32) -> io::Result<i64> {
        let h = self.handles.file(fh)?;
        let f = h.node.file()?;
        let _s = f.size_lock.read();
        let size = self.current_size(f, &h.crypt)? as i64;
        if off < 0 || off >= size {
            return Err(errno(libc::ENXIO));
        }
        let l = self.layout;
        let coff = l.block_offset(l.block_of(off as u64)) as i64;
        let fd = h.crypt.backing().as_raw_fd();
        let to_plain = |c: i64| -> i64 {
            let b = (c.max(l.header() as i64) - l.header() as i64) as u64 / l.cipher_block();
            (b * l.block_size) as i64
        };
        match whence {
            libc::SEEK_DATA => {
                let c = sys::lseek(fd, coff, libc::SEEK_DATA)?;
                Ok(to_plain(c).max(off))
            }
            libc::SEEK_HOLE => {
                let c = sys::lseek(fd, coff, libc::SEEK_HOLE)?;
                let p = to_plain(c + l.cipher_block() as i64 - 1);
                Ok(p.clamp(off, size))
            }
            _ => Err(errno(libc::EINVAL)),
        }
    }

    // ---- directories ---------------------------------------------------------------------

    /// OPENDIR.
    pub(crate) fn do_opendir(&self, ino: u64) -> io::Result<u64> {
        let node = self.nodes.get(ino)?;
        node.dir()?;
        Ok(self.handles.add_dir(node))
    }

    /// The listing of an open directory (taken at the first READDIR).
    pub(crate) fn snapshot(&self, fh: u64) -> io::Result<(Arc<Node>, Arc<Vec<SnapEntry>>)> {
        let h = self.handles.dir(fh)?;
        let mut g = h.entries.lock();
        if let Some(s) = g.as_ref() {
            return Ok((h.node.clone(), s.clone()));
        }
        let dir = h.node.dir()?;
        if self.opts.shared_storage {
            dir.rebuild()?;
        }
        let idx = dir.index(false)?;
        let mut out = Vec::with_capacity(idx.as_ref().map_or(0, |i| i.len()));
        for e in idx.as_ref().expect("built").values() {
            let plain = e.plain.get_or_init(|| match self.decode_d(dir, &e.on_disk) {
                Ok(d) => match self.names.decrypt_name(&dir.cd.iv, &d) {
                    Ok(name) => Some(Decoded { name, d }),
                    Err(err) => {
                        tracing::error!("integrity error in {}: {err}", dir.cd.child_path(&e.on_disk));
                        None
                    }
                },
                Err(err) => {
                    tracing::error!("{err}");
                    None
                }
            });
            if let Some(p) = plain {
                out.push(SnapEntry {
                    name: p.name.clone(),
                    on_disk: e.on_disk.clone(),
                    d: p.d.clone(),
                    d_type: e.d_type,
                });
            }
        }
        let s = Arc::new(out);
        *g = Some(s.clone());
        Ok((h.node.clone(), s))
    }

    /// `D` of an on-disk entry (reading the side file of a long name).
    pub(crate) fn decode_d(&self, dir: &DirState, on_disk: &str) -> veilfs_core::Result<Vec<u8>> {
        let parsed = ParsedEntry::parse(on_disk.as_bytes());
        self.names.entry_d(&parsed, |side| Vault::read_side_file(&dir.cd, side))
    }

    /// One READDIRPLUS entry: its node (one lookup counted) and backing stat.
    pub(crate) fn plus_entry(&self, parent: &Arc<Node>, e: &SnapEntry) -> io::Result<(Arc<Node>, libc::stat)> {
        let dir = parent.dir()?;
        let st = sys::fstatat(dir.cd.fd(), e.on_disk.as_bytes())?;
        Ok((self.node_at(parent, &e.d, &e.on_disk, &st)?, st))
    }

    /// Registers a new entry in the parent's index and node table; returns its node.
    fn created(
        &self,
        parent: &Arc<Node>,
        key: &NameKey,
        on_disk: &str,
        d_type: u8,
        name: &[u8],
    ) -> io::Result<(Arc<Node>, libc::stat)> {
        let dir = parent.dir()?;
        dir.update(|idx| {
            let plain = Decoded { name: name.to_vec(), d: key.d.clone() };
            idx.insert(key.key.clone(), IndexEntry::new(on_disk.to_string(), d_type, Some(plain)));
        });
        let st = sys::fstatat(dir.cd.fd(), on_disk.as_bytes())?;
        Ok((self.node_at(parent, &key.d, on_disk, &st)?, st))
    }

    /// CREATE: a new regular file, opened. Returns node, stat and handle.
    pub(crate) fn do_create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> io::Result<(Arc<Node>, libc::stat, u64)> {
        self.check_writable()?;
        let pnode = self.nodes.get(parent)?;
        let dir = pnode.dir()?;
        let guard = dir.ops.lock();
        let (key, found) = self.find(dir, name)?;
        if found.is_some() {
            drop(guard);
            if flags & libc::O_EXCL != 0 {
                return Err(errno(libc::EEXIST));
            }
            let (node, st) = self.do_lookup(parent, name)?;
            let fh = self.do_open(node.id, flags)?;
            return Ok((node, st, fh));
        }
        let id: Identity = veilfs_core::random::bytes();
        let on_disk = self.vault.entry_name_for(&dir.cd, &key, EntryKind::File, &id).map_err(cerr)?;
        let fd = sys::openat(
            dir.cd.fd(),
            on_disk.as_bytes(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode & 0o7777,
        )?;
        let crypt = Arc::new(self.content(fd, id, dir, &on_disk)?);
        let (node, st) = self.created(&pnode, &key, &on_disk, libc::DT_REG, name)?;
        drop(guard);
        let f = node.file()?;
        {
            let mut g = f.open.lock();
            match g.as_mut() {
                Some((_, n)) => *n += 1,
                None => {
                    f.size.store(0, Ordering::Release);
                    *g = Some((crypt.clone(), 1));
                }
            }
        }
        let crypt = f.open.lock().as_ref().map(|(c, _)| c.clone()).expect("just set");
        self.activity.open_files.fetch_add(1, Ordering::Relaxed);
        let fh = self.handles.add_file(OpenFile { node: node.clone(), crypt });
        Ok((node, st, fh))
    }

    /// Makes a new entry `name` in directory `parent`: under the directory's lock, refuses a
    /// name in use (EEXIST), lets `make` create the backing object (returning its on-disk name
    /// and `d_type`) and registers it. The object belongs to whoever the thread acts as
    /// ([`acting`](Self::acting)).
    fn make_entry(
        &self,
        parent: u64,
        name: &[u8],
        make: impl FnOnce(&DirState, &NameKey) -> io::Result<(String, u8)>,
    ) -> io::Result<(Arc<Node>, libc::stat)> {
        self.check_writable()?;
        let pnode = self.nodes.get(parent)?;
        let dir = pnode.dir()?;
        let _g = dir.ops.lock();
        let (key, found) = self.find(dir, name)?;
        if found.is_some() {
            return Err(errno(libc::EEXIST));
        }
        let (on_disk, d_type) = make(dir, &key)?;
        self.created(&pnode, &key, &on_disk, d_type, name)
    }

    /// MKNOD (FIFOs, sockets, device nodes; regular files too).
    pub(crate) fn do_mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
    ) -> io::Result<(Arc<Node>, libc::stat)> {
        let kind = EntryKind::from_mode(mode);
        if kind == EntryKind::Dir {
            return Err(errno(libc::EINVAL));
        }
        self.make_entry(parent, name, |dir, key| {
            let id: Identity = veilfs_core::random::bytes();
            let on_disk = self.vault.entry_name_for(&dir.cd, key, kind, &id).map_err(cerr)?;
            if kind == EntryKind::File {
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
                drop(sys::openat(dir.cd.fd(), on_disk.as_bytes(), flags, mode & 0o7777)?);
                Ok((on_disk, libc::DT_REG))
            } else {
                sys::mknodat(dir.cd.fd(), on_disk.as_bytes(), mode, attr::rdev_from_fuse(rdev))?;
                Ok((on_disk, libc::DT_UNKNOWN))
            }
        })
    }

    /// MKDIR.
    pub(crate) fn do_mkdir(&self, parent: u64, name: &[u8], mode: u32) -> io::Result<(Arc<Node>, libc::stat)> {
        self.make_entry(parent, name, |dir, _key| {
            // A set-group-id directory passes the bit on, as local filesystems do.
            let mode = (mode & 0o7777) | (sys::fstat(dir.cd.fd())?.st_mode & libc::S_ISGID);
            let (entry, _sub) = self.vault.mkdir_unchecked(&dir.cd, name, mode).map_err(cerr)?;
            Ok((entry.on_disk, libc::DT_DIR))
        })
    }

    /// SYMLINK.
    pub(crate) fn do_symlink(&self, parent: u64, name: &[u8], target: &[u8]) -> io::Result<(Arc<Node>, libc::stat)> {
        self.make_entry(parent, name, |dir, key| {
            let id: Identity = veilfs_core::random::bytes();
            let stored = self.vault.encrypt_target(&id, target).map_err(cerr)?;
            let on_disk = self.vault.entry_name_for(&dir.cd, key, EntryKind::Symlink, &id).map_err(cerr)?;
            sys::symlinkat(&stored, dir.cd.fd(), on_disk.as_bytes())?;
            Ok((on_disk, libc::DT_LNK))
        })
    }

    /// READLINK.
    pub(crate) fn do_readlink(&self, ino: u64) -> io::Result<Vec<u8>> {
        let node = self.nodes.get(ino)?;
        let l = node.link()?;
        let dir = l.parent.dir()?;
        let what = dir.cd.child_path(&l.on_disk);
        let stored = sys::readlinkat(dir.cd.fd(), l.on_disk.as_bytes())?;
        self.vault.decrypt_target(&node.identity, &stored, &what).map_err(cerr)
    }

    fn unlink_side_file(&self, dir: &DirState, key: &NameKey) {
        if let Some(side) = &key.side_file {
            let _ = sys::unlinkat(dir.cd.fd(), side.as_bytes(), false);
        }
    }

    /// UNLINK and RMDIR.
    pub(crate) fn do_remove(&self, parent: u64, name: &[u8], is_dir: bool) -> io::Result<()> {
        self.check_writable()?;
        let pnode = self.nodes.get(parent)?;
        let dir = pnode.dir()?;
        let _g = dir.ops.lock();
        let (key, found) = self.find(dir, name)?;
        let on_disk = found.ok_or_else(|| errno(libc::ENOENT))?;
        let st = sys::fstatat(dir.cd.fd(), on_disk.as_bytes())?;
        let kind = EntryKind::from_mode(st.st_mode);
        match (is_dir, kind == EntryKind::Dir) {
            (true, false) => return Err(errno(libc::ENOTDIR)),
            (false, true) => return Err(errno(libc::EISDIR)),
            _ => {}
        }
        // A directory's identity (its IV) is needed to put it back if removal fails halfway;
        // a file's is not, so spare the SIV.
        let identity = if kind == EntryKind::Dir { self.identity(dir, &key.d, &on_disk, &st)?.1 } else { [0u8; 16] };
        self.vault.remove_entry(&dir.cd, &on_disk, kind, &identity).map_err(cerr)?;
        self.unlink_side_file(dir, &key);
        dir.update(|idx| {
            idx.remove(&key.key);
        });
        self.after_unlink(pnode.id, &on_disk, &st);
        Ok(())
    }

    /// Bookkeeping once `parent/on_disk` (backing `st` before removal) is gone.
    fn after_unlink(&self, parent: u64, on_disk: &str, st: &libc::stat) {
        if let Some(id) = self.nodes.id_of(st.st_ino) {
            if let Ok(n) = self.nodes.get(id) {
                let named = n.remove_link(parent, on_disk);
                // Gone only if this was its last name on disk, not merely the last one this
                // mount had looked up (other hard links may exist).
                if st.st_nlink <= 1 && n.dir.is_none() && !named {
                    n.set_gone(st);
                }
            }
        }
        if st.st_nlink <= 1 || EntryKind::from_mode(st.st_mode) == EntryKind::Dir {
            self.nodes.backing_gone(st.st_ino);
        }
    }

    /// LINK.
    pub(crate) fn do_link(&self, ino: u64, newparent: u64, newname: &[u8]) -> io::Result<(Arc<Node>, libc::stat)> {
        let node = self.nodes.get(ino)?;
        if node.kind == EntryKind::Dir {
            return Err(errno(libc::EPERM));
        }
        self.make_entry(newparent, newname, |dir, key| {
            let src = node.link()?;
            let on_disk = self.vault.entry_name_for(&dir.cd, key, node.kind, &node.identity).map_err(cerr)?;
            sys::linkat(src.parent.dir()?.cd.fd(), src.on_disk.as_bytes(), dir.cd.fd(), on_disk.as_bytes())?;
            Ok((on_disk, if node.kind == EntryKind::File { libc::DT_REG } else { libc::DT_UNKNOWN }))
        })
    }

    /// RENAME (flags: RENAME_NOREPLACE, RENAME_EXCHANGE).
    pub(crate) fn do_rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.check_writable()?;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(errno(libc::EINVAL));
        }
        let (from, to) = (self.nodes.get(parent)?, self.nodes.get(newparent)?);
        let (fd_, td) = (from.dir()?, to.dir()?);
        // Lock both directories, in node-id order so two renames cannot deadlock.
        let (_g1, _g2) = if from.id == to.id {
            (fd_.ops.lock(), None)
        } else if from.id < to.id {
            let a = fd_.ops.lock();
            (a, Some(td.ops.lock()))
        } else {
            let b = td.ops.lock();
            (fd_.ops.lock(), Some(b))
        };
        let (skey, sfound) = self.find(fd_, name)?;
        let s_on = sfound.ok_or_else(|| errno(libc::ENOENT))?;
        let sst = sys::fstatat(fd_.cd.fd(), s_on.as_bytes())?;
        let (skind, sid) = self.identity(fd_, &skey.d, &s_on, &sst)?;
        let (dkey, dfound) = self.find(td, newname)?;
        let dst = match &dfound {
            Some(on) => {
                let st = sys::fstatat(td.cd.fd(), on.as_bytes())?;
                let (k, id) = self.identity(td, &dkey.d, on, &st)?;
                Some((on.clone(), st, k, id))
            }
            None => None,
        };
        if flags & libc::RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(errno(libc::EEXIST));
        }
        if from.id == to.id && skey.key == dkey.key {
            return Ok(()); // rename onto itself
        }
        // Moving a directory into itself or below it.
        if skind == EntryKind::Dir && self.is_ancestor_or_self(&to, &sst) {
            return Err(errno(libc::EINVAL));
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            let (d_on, dst_st, dkind, did) = dst.ok_or_else(|| errno(libc::ENOENT))?;
            if dkind == EntryKind::Dir && self.is_ancestor_or_self(&from, &dst_st) {
                return Err(errno(libc::EINVAL));
            }
            let new_s = self.vault.entry_name_for(&td.cd, &dkey, skind, &sid).map_err(cerr)?;
            let new_d = self.vault.entry_name_for(&fd_.cd, &skey, dkind, &did).map_err(cerr)?;
            // Not atomic on disk: the displaced object waits under a temporary name, so a
            // crash leaves it recoverable rather than lost.
            let tmp = format!("veilfs.tmp.{}", veilfs_core::names::b64_encode(&veilfs_core::random::bytes::<12>()));
            sys::renameat2(td.cd.fd(), d_on.as_bytes(), td.cd.fd(), tmp.as_bytes(), libc::RENAME_NOREPLACE)?;
            sys::renameat2(fd_.cd.fd(), s_on.as_bytes(), td.cd.fd(), new_s.as_bytes(), libc::RENAME_NOREPLACE)?;
            sys::renameat2(td.cd.fd(), tmp.as_bytes(), fd_.cd.fd(), new_d.as_bytes(), libc::RENAME_NOREPLACE)?;
            fd_.update(|i| {
                let plain = Decoded { name: name.to_vec(), d: skey.d.clone() };
                i.insert(skey.key.clone(), IndexEntry::new(new_d.clone(), dtype(dkind), Some(plain)));
            });
            td.update(|i| {
                let plain = Decoded { name: newname.to_vec(), d: dkey.d.clone() };
                i.insert(dkey.key.clone(), IndexEntry::new(new_s.clone(), dtype(skind), Some(plain)));
            });
            self.relink(sst.st_ino, from.id, &s_on, &to, &new_s);
            self.relink(dst_st.st_ino, to.id, &d_on, &from, &new_d);
            return Ok(());
        }
        if let Some((_, dst_st, dkind, _)) = &dst {
            if (dst_st.st_dev, dst_st.st_ino) == (sst.st_dev, sst.st_ino) {
                return Ok(()); // two links of one file: POSIX says do nothing
            }
            match (skind == EntryKind::Dir, *dkind == EntryKind::Dir) {
                (false, true) => return Err(errno(libc::EISDIR)),
                (true, false) => return Err(errno(libc::ENOTDIR)),
                (true, true) => {
                    let sub = sys::open_dir_at(td.cd.fd(), dst.as_ref().expect("some").0.as_bytes())?;
                    let raw = sys::read_dir_fd(sub.as_fd())?;
                    if raw.iter().any(|r| {
                        r.name != b"." && r.name != b".." && r.name != veilfs_core::names::DIRIV_NAME.as_bytes()
                    }) {
                        return Err(errno(libc::ENOTEMPTY));
                    }
                }
                _ => {}
            }
        }
        let new_on = self.vault.entry_name_for(&td.cd, &dkey, skind, &sid).map_err(cerr)?;
        sys::renameat2(fd_.cd.fd(), s_on.as_bytes(), td.cd.fd(), new_on.as_bytes(), libc::RENAME_NOREPLACE)?;
        // The old entry of the target name goes right after; a crash in between leaves two
        // entries for one name, and the newer one (this rename's) wins.
        if let Some((d_on, dst_st, dkind, did)) = &dst {
            if let Err(e) = self.vault.remove_entry(&td.cd, d_on, *dkind, did) {
                tracing::error!("rename: could not remove the replaced entry {}: {e}", td.cd.child_path(d_on));
            }
            self.after_unlink(to.id, d_on, dst_st);
        }
        if skey.side_file.is_some() && !(from.id == to.id && skey.key == dkey.key) {
            self.unlink_side_file(fd_, &skey);
        }
        let plain = Some(Decoded { name: newname.to_vec(), d: dkey.d.clone() });
        if from.id == to.id {
            fd_.update(|i| {
                i.remove(&skey.key);
                i.insert(dkey.key.clone(), IndexEntry::new(new_on.clone(), dtype(skind), plain));
            });
        } else {
            fd_.update(|i| {
                i.remove(&skey.key);
            });
            td.update(|i| {
                i.insert(dkey.key.clone(), IndexEntry::new(new_on.clone(), dtype(skind), plain));
            });
        }
        self.relink(sst.st_ino, from.id, &s_on, &to, &new_on);
        Ok(())
    }

    fn relink(&self, backing_ino: u64, from: u64, old: &str, to: &Arc<Node>, new: &str) {
        if let Some(id) = self.nodes.id_of(backing_ino) {
            if let Ok(n) = self.nodes.get(id) {
                n.move_link(from, old, to, new);
            }
        }
    }

    /// True when the directory with backing stat `st` is `node` or one of its ancestors.
    fn is_ancestor_or_self(&self, node: &Arc<Node>, st: &libc::stat) -> bool {
        let mut cur = node.clone();
        loop {
            if cur.backing_ino == st.st_ino {
                return true;
            }
            match cur.link() {
                Ok(l) => cur = l.parent,
                Err(_) => return false,
            }
        }
    }

    // ---- attributes ----------------------------------------------------------------------

    /// SETATTR.
    pub(crate) fn do_setattr(&self, ino: u64, a: &SetAttr, fh: Option<u64>, caller: Caller) -> io::Result<FileAttr> {
        let node = self.nodes.get(ino)?;
        if a.changes_anything() {
            self.check_writable()?;
        }
        if let Some(size) = a.size {
            if node.kind == EntryKind::Dir {
                return Err(errno(libc::EISDIR));
            }
            match self.handles.file_opt(fh) {
                Some(h) => {
                    let f = node.file()?;
                    let _w = f.size_lock.write();
                    let cur = self.current_size(f, &h.crypt)?;
                    if size > i64::MAX as u64 / 2 {
                        return Err(errno(libc::EFBIG));
                    }
                    h.crypt.truncate(size, cur).map_err(cerr)?;
                    f.size.store(size, Ordering::Release);
                }
                None => {
                    let _as = self.acting(caller)?;
                    self.truncate(&node, size)?
                }
            }
        }
        // Directories and open files are changed through the fd this mount holds (verified
        // when opened; an open file keeps working once its names are gone). Anything else
        // through a verified handle on the object its name holds now, acting as the caller.
        if let Some(d) = &node.dir {
            return self.set_on_fd(&node, d.cd.fd(), a);
        }
        let open = self.handles.file_opt(fh).map(|h| h.crypt.clone()).or_else(|| self.open_crypt(&node));
        if let Some(c) = open {
            return self.set_on_fd(&node, c.backing().as_fd(), a);
        }
        let l = match node.link() {
            Ok(l) => l,
            Err(e) => {
                // Deleted and closed: the kernel may still flush the times of a file it
                // wrote through its cache. The changes have nowhere to go; answer with
                // the last attributes, changed as asked, like an unlinked local inode.
                return node.gone_stat(|st| a.apply_to(st)).map(|st| self.attr_of(&node, &st)).ok_or(e);
            }
        };
        if a.mode.is_some() && node.kind == EntryKind::Symlink {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let handle = self.handle(&node, &l)?;
        let _as = self.acting(caller)?;
        self.set_on_fd(&node, handle.as_fd(), a)
    }

    /// A verified `O_PATH` handle on the object `node` names at `l` (see
    /// [`Vault::entry_handle`]): a swapped or planted object is an integrity error.
    fn handle(&self, node: &Node, l: &crate::inodes::Link) -> io::Result<OwnedFd> {
        let dir = l.parent.dir()?;
        Vault::entry_handle(&dir.cd, &l.on_disk, node.kind, node.backing_ino).map(|(fd, _)| fd).map_err(cerr)
    }

    /// Applies `a`'s mode, owner and times to the object behind `fd` (a handle of `node`).
    fn set_on_fd(&self, node: &Node, fd: std::os::fd::BorrowedFd<'_>, a: &SetAttr) -> io::Result<FileAttr> {
        if a.uid.is_some() || a.gid.is_some() {
            sys::chown_fd(fd, a.uid.unwrap_or(u32::MAX), a.gid.unwrap_or(u32::MAX))?;
        }
        if let Some(m) = a.mode {
            sys::chmod_fd(fd, m & 0o7777)?;
        }
        if a.atime.is_some() || a.mtime.is_some() {
            sys::utimens_fd(fd, &a.times())?;
        }
        Ok(self.attr_of(node, &sys::fstat(fd)?))
    }

    /// STATFS.
    ///
    /// Block counts are in plaintext: what one new file could hold in the backing store's
    /// space, net of its header and every block's overhead (docs/FORMAT.md §5.3), so that a
    /// `fallocate` of all the free space reported fits. Each further file costs another header
    /// and a partial block's overhead, and the backing filesystem rounds every file up to its
    /// own allocation unit; neither is predictable, so many small files fit less.
    pub(crate) fn do_statfs(&self) -> io::Result<libc::statvfs> {
        let root = self.nodes.get(ROOT)?;
        let mut s = sys::fstatvfs(root.dir()?.cd.fd())?;
        let unit = (s.f_frsize as u64).max(1);
        let plain = |blocks: u64| self.layout.plain_capacity(blocks.saturating_mul(unit)) / unit;
        (s.f_blocks, s.f_bfree, s.f_bavail) = (plain(s.f_blocks), plain(s.f_bfree), plain(s.f_bavail));
        Ok(s)
    }

    // ---- extended attributes -------------------------------------------------------------

    /// Runs an xattr call on `node`: directories and open files through their fd, anything
    /// else through a verified handle on the object its name holds now (a symlink itself
    /// through a path whose last component is not followed). With `caller`, acting as it
    /// ([`acting`](Self::acting)) on that last path.
    fn with_xattr<T>(
        &self,
        node: &Node,
        caller: Option<Caller>,
        f: impl FnOnce(sys::XattrTarget<'_>) -> io::Result<T>,
    ) -> io::Result<T> {
        if let Some(d) = &node.dir {
            return f(sys::XattrTarget::Fd(d.cd.fd()));
        }
        if let Some(c) = self.open_crypt(node) {
            return f(sys::XattrTarget::Fd(c.backing().as_fd()));
        }
        let l = node.link()?;
        let handle = self.handle(node, &l)?;
        let _as = match caller {
            Some(c) => self.acting(c)?,
            None => None,
        };
        if node.kind == EntryKind::Symlink {
            let path = sys::proc_path(l.parent.dir()?.cd.fd(), Some(l.on_disk.as_bytes()))?;
            return f(sys::XattrTarget::NoFollow(&path));
        }
        f(sys::XattrTarget::Handle(handle.as_fd()))
    }

    /// GETXATTR: the plaintext value.
    pub(crate) fn do_getxattr(&self, ino: u64, name: &[u8]) -> io::Result<Vec<u8>> {
        let node = self.nodes.get(ino)?;
        let Ok(stored) = self.xattr.encrypt_name(&node.identity, name) else {
            return Err(errno(libc::ENODATA));
        };
        let cap = 65536 + self.xattr.value_overhead();
        let buf = self.with_xattr(&node, None, |t| {
            let mut b = vec![0u8; cap];
            let n = t.get(stored.as_bytes(), &mut b)?;
            b.truncate(n);
            Ok(b)
        })?;
        self.xattr.decrypt_value(&node.identity, &stored, &buf).map_err(cerr)
    }

    /// SETXATTR.
    pub(crate) fn do_setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32, c: Caller) -> io::Result<()> {
        self.check_writable()?;
        let node = self.nodes.get(ino)?;
        let stored = self.xattr.encrypt_name(&node.identity, name).map_err(cerr)?;
        let blob = self.xattr.encrypt_value(&node.identity, &stored, value);
        // Stored names are longer than plaintext ones: refuse a new attribute whose name
        // would push the list past the kernel's 64 KiB listxattr limit, instead of letting
        // every later listxattr fail.
        const XATTR_LIST_MAX: usize = 65536;
        self.with_xattr(&node, Some(c), |t| {
            if t.list(&mut [])? + stored.len() + 1 > XATTR_LIST_MAX && t.get(stored.as_bytes(), &mut []).is_err() {
                return Err(errno(libc::ENOSPC));
            }
            t.set(stored.as_bytes(), &blob, flags)
        })
    }

    /// LISTXATTR: NUL-separated plaintext names.
    pub(crate) fn do_listxattr(&self, ino: u64) -> io::Result<Vec<u8>> {
        let node = self.nodes.get(ino)?;
        let raw = self.with_xattr(&node, None, |t| t.list_all())?;
        let mut out = Vec::new();
        for stored in raw.split(|&b| b == 0).filter(|s| !s.is_empty()) {
            match self.xattr.decrypt_name(&node.identity, stored) {
                Some(Ok(plain)) => {
                    out.extend_from_slice(&plain);
                    out.push(0);
                }
                Some(Err(e)) => tracing::error!("xattr of node {}: {e}", node.id),
                None => {}
            }
        }
        Ok(out)
    }

    /// REMOVEXATTR.
    pub(crate) fn do_removexattr(&self, ino: u64, name: &[u8], c: Caller) -> io::Result<()> {
        self.check_writable()?;
        let node = self.nodes.get(ino)?;
        let stored = self.xattr.encrypt_name(&node.identity, name).map_err(|_| errno(libc::ENODATA))?;
        self.with_xattr(&node, Some(c), |t| t.remove(stored.as_bytes()))
    }
}

fn dtype(k: EntryKind) -> u8 {
    match k {
        EntryKind::File => libc::DT_REG,
        EntryKind::Dir => libc::DT_DIR,
        EntryKind::Symlink => libc::DT_LNK,
        EntryKind::Special => libc::DT_UNKNOWN,
    }
}

/// Clears set-user-id (and set-group-id on group-executable files) after a write by an
/// unprivileged process, which the kernel leaves to us with FUSE_HANDLE_KILLPRIV_V2.
fn kill_suid_sgid(c: &CryptFile) -> io::Result<()> {
    let mode = sys::fstat(c.backing().as_fd())?.st_mode;
    let sgid_exec = libc::S_ISGID | libc::S_IXGRP;
    if mode & libc::S_ISUID != 0 || mode & sgid_exec == sgid_exec {
        sys::fchmod(c.backing().as_fd(), mode & 0o7777 & !(libc::S_ISUID | libc::S_ISGID))?;
    }
    Ok(())
}
