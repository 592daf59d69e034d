//! The operations, as plain methods returning `io::Result`: what each FUSE request does, by
//! op family — `lookup` (LOOKUP, GETATTR), `data` (OPEN, READ, WRITE, truncation, FALLOCATE,
//! LSEEK), `readdir`, `entries` (CREATE, MKNOD, MKDIR, SYMLINK, LINK, UNLINK, RMDIR,
//! READLINK), `rename`, `attrs` (SETATTR, STATFS) and `xattrs`. The on-disk steps are the
//! core's tree engine (`veilfs_core::Vault`); this layer keeps the node table, the directory
//! indexes and the open files. `fs.rs` only unpacks requests and sends replies, so tests can
//! drive these methods without /dev/fuse (`tests.rs`).

use crate::attr;
use crate::dirs::{Decoded, DirState, IndexEntry, SnapEntry};
use crate::handles::{Handles, OpenFile};
use crate::inodes::{Node, NodeTable, ROOT};
use fuser::FileAttr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use veilfs_core::content::Layout;
use veilfs_core::names::NameKey;
use veilfs_core::sys::Stat;
use veilfs_core::xattr::XattrCipher;
use veilfs_core::{sys, ContentCtx, CryptFile, Entry, EntryKind, Identity, NameCipher, Vault};

mod atime;
mod attrs;
mod data;
mod entries;
mod lookup;
mod perms;
mod readdir;
mod rename;
mod xattrs;

use entries::dtype;

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
    /// Reads never change access times (`noatime`); otherwise they do as with Linux's
    /// `relatime` (see `ops/atime.rs`).
    pub noatime: bool,
    /// Every open for reading that reads moves the access time (`strictatime`), not only
    /// the first read after a change or a day (`relatime`).
    pub strictatime: bool,
    /// The daemon checks permissions itself (`perm.rs`): set by [`mount`](crate::mount)
    /// for a mount without `--allow-other`, which has no `default_permissions`.
    pub check_permissions: bool,
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
    fn apply_to(&self, st: &mut Stat) {
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

    pub(crate) fn set_ended(&self) {
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
    pub(crate) nodes: Arc<NodeTable>,
    pub(crate) handles: Handles,
    pub(crate) opts: FsOptions,
    pub(crate) writeback: bool,
    pub(crate) euid: u32,
    /// `fs.protected_hardlinks` at mount time (`perm::check_link_source`).
    pub(crate) protected_hardlinks: bool,
    pub(crate) activity: Arc<Activity>,
    /// Tells the kernel of changes it cannot see in replies; set once the session is
    /// mounted (empty when the operations are driven without a kernel).
    pub(crate) notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// Keys of the READDIR offsets (`VeilFs::listing`).
    pub(crate) cookie_keys: std::hash::RandomState,
    /// Whether the backing store is low on space (`VeilFs::space_low`).
    pub(crate) space: data::FreeSpace,
}

pub(crate) fn errno(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

/// Maps a core error to an `io::Error` with the right errno; integrity failures are logged
/// (naming the ciphertext) and become EIO.
pub(crate) fn cerr(e: veilfs_core::Error) -> io::Error {
    // Integrity errors and the backing store's I/O errors (its text names the ciphertext
    // path); the log keeps one line per incident (src/logging.rs).
    match &e {
        veilfs_core::Error::Auth { .. } | veilfs_core::Error::Rollback { .. } => tracing::error!("{e}"),
        veilfs_core::Error::Io { source, .. } if source.raw_os_error() == Some(libc::EIO) => tracing::error!("{e}"),
        _ => {}
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
        let xattr = vault.xattr_cipher();
        let names = vault.names().clone();
        let layout = ctx.layout;
        let euid = sys::euid();
        let fs = VeilFs {
            nodes: Arc::new(NodeTable::new(DirState::new(root, opts.shared_storage), iv, st.st_ino)),
            vault,
            names,
            ctx,
            layout,
            xattr,
            handles: Handles::default(),
            writeback: false,
            euid,
            protected_hardlinks: crate::perm::hardlinks_protected(),
            opts,
            activity,
            notifier: Arc::default(),
            cookie_keys: std::hash::RandomState::new(),
            space: data::FreeSpace::default(),
        };
        Ok(fs)
    }

    /// A mount that caches starts watching CIPHERDIR, so changes others make there (a sync
    /// tool delivering another machine's work) reach the kernel's caches (`watch.rs`). A
    /// `--shared-storage` mount caches nothing and needs no watch.
    pub(crate) fn start_watch(&self) {
        if self.opts.shared_storage {
            return;
        }
        let w = crate::watch::Watcher::new();
        self.nodes.set_watcher(w.clone());
        let cx = crate::watch::Context {
            nodes: Arc::downgrade(&self.nodes),
            vault: Arc::downgrade(&self.vault),
            notifier: self.notifier.clone(),
        };
        if let Err(e) = crate::watch::spawn(w, cx) {
            tracing::warn!("cannot watch CIPHERDIR for changes made by others: {e}");
        }
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

    /// Has the kernel drop the attributes it caches for node `ino`: for a change the daemon
    /// makes on its own, which no reply carries (see "Caching" in the crate docs). Not while
    /// unmounting or for a node it forgot (ENOENT): then there is nothing cached.
    ///
    /// Sent at once, from the request that made the change, so the change is visible when
    /// that request's reply arrives. This cannot deadlock: for an offset < 0 the kernel's
    /// `fuse_reverse_inval_inode` takes only the connection's `killsb` (shared) and the
    /// inode's attribute spinlock, never the inode or page locks a request in flight holds
    /// (an entry invalidation, `inval_entry`, would take the parent directory's lock and must
    /// never be sent from a request on it; none is needed so far).
    pub(crate) fn invalidate_attr(&self, ino: u64) {
        self.inval_inode(ino, -1, "attribute");
    }

    /// Sends the kernel an inode invalidation of node `ino`: its attributes, and with
    /// `pages_from` ≥ 0 its cached pages from that offset on (a directory's: its listing).
    /// A failure (unmounting, a node the kernel forgot) is logged as a `what` invalidation.
    pub(crate) fn inval_inode(&self, ino: u64, pages_from: i64, what: &str) {
        if let Some(n) = self.notifier.get() {
            if let Err(e) = n.inval_inode(fuser::INodeNo(ino), pages_from, 0) {
                tracing::debug!("node {ino}: {what} invalidation: {e}");
            }
        }
    }

    /// Has the kernel drop the pages of `len` bytes at `off` of `ino` from its cache (and its
    /// cached attributes).
    pub(crate) fn inval_range(&self, ino: u64, off: u64, len: u64) {
        if let (Some(n), Ok(off), Ok(len)) = (self.notifier.get(), i64::try_from(off), i64::try_from(len)) {
            if len > 0 {
                if let Err(e) = n.inval_inode(fuser::INodeNo(ino), off, len) {
                    tracing::debug!("node {ino}: direct write invalidation: {e}");
                }
            }
        }
    }

    /// The attributes of `node` given its backing `st`.
    pub(crate) fn attr_of(&self, node: &Node, st: &Stat) -> FileAttr {
        let size = node.file.as_ref().and_then(|f| f.open_size());
        // A closed file's size from its ciphertext size, by its vault's layout.
        let size = size.or_else(|| {
            (attr::kind(st.st_mode) == fuser::FileType::RegularFile)
                .then(|| self.ctx.plain_size_lenient(st.st_size as u64))
        });
        attr::file_attr(st, node.id, &self.layout, size)
    }
}
