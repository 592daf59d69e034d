//! The node table: FUSE node ids ↔ backing objects.
//!
//! Node ids are our own (root = 1, then a counter), mapped from the backing inode number so
//! that hard links share one node and a file keeps its number for the life of the mount even
//! when the kernel forgets and looks it up again. Directories hold an open fd (cached, so a
//! path is never re-walked); other objects are reached through (parent directory, on-disk
//! name) links, because one fd per file would exhaust the fd limit on large trees.

use crate::dirs::DirState;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use veilfs_core::sys::Stat;
use veilfs_core::{CryptFile, EntryKind, Identity};

/// The root's node id.
pub const ROOT: u64 = 1;

/// A name of a node: the directory holding it and the on-disk entry name.
#[derive(Debug, Clone)]
pub struct Link {
    /// The parent directory node.
    pub parent: Arc<Node>,
    /// The on-disk entry name in it.
    pub on_disk: String,
}

/// The I/O state of one backing file: its one open `CryptFile` with its count of users, the
/// plaintext size while it is open, and the locks that order I/O on it (see the crate docs
/// for the lock order). Shared by every node of the backing inode ([`NodeTable::lookup`]):
/// CIPHERDIR's watch can give a backing inode a new node while the kernel still holds the
/// old one, and a file with a block map keeps its map and write session in memory
/// (docs/FORMAT.md §5.10), so two open files of one inode would go stale against each other
/// (a write through one, then EIO or a wrong size through the other).
#[derive(Debug, Default)]
pub struct FileIo {
    open: Mutex<Option<(Arc<CryptFile>, usize)>>,
    size: AtomicU64,
    size_lock: RwLock<()>,
    ranges: crate::rangelock::RangeLock,
    /// Written (or resized) since the open file was last noted.
    written: std::sync::atomic::AtomicBool,
}

/// Per-file state of one node: the backing file's I/O state (shared with any other node of
/// the same backing inode) and what the kernel knows of the file through this node.
#[derive(Debug, Default)]
pub struct FileState {
    io: Arc<FileIo>,
    /// The next READ must check whether the access time is due (see `ops/atime.rs`).
    pub atime_due: std::sync::atomic::AtomicBool,
    /// The backing file's modification time, size, mode and owner as the kernel knows the
    /// file: when its node was made (the LOOKUP or CREATE reply), then as this mount left it
    /// (its last close after writes, a SETATTR). The close of a file opened for writing and a
    /// change of its attributes are reported by CIPHERDIR's watch, and this tells the mount's
    /// own from another writer's (`watch.rs`). Not the change time, which the mount's own
    /// rename or chmod moves while the report of its close is still on its way.
    own: Mutex<Option<Known>>,
    /// Held by a SETATTR from its change until [`note_own`](Self::note_own) noted it, and by
    /// the watch before it takes an attribute change for someone else's: the watch may read
    /// the event of the mount's own chmod or utimes before the SETATTR noted it.
    pub setting: Mutex<()>,
    /// The FUSE generation of the node id, raised when the kernel must drop its inode
    /// ([`renew`](Self::renew)).
    generation: AtomicU64,
}

/// What the kernel knows of a regular file's backing state (see `FileState::own`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    mtime: (i64, i64),
    size: i64,
    mode: u32,
    owner: (u32, u32),
}

impl Known {
    fn of(st: &Stat) -> Known {
        Known {
            mtime: (st.st_mtime, st.st_mtime_nsec),
            size: st.st_size,
            mode: st.st_mode,
            owner: (st.st_uid, st.st_gid),
        }
    }
}

impl FileState {
    /// Makes the kernel drop the inode it holds for this node, with the size it keeps for
    /// itself under the write-back cache (which no attribute reply corrects): the next
    /// LOOKUP answers with a new generation, and the kernel, seeing the node id come back
    /// with another generation, marks its old inode stale and builds a new one from the
    /// reply. Invalidating the names alone is not enough: a LOOKUP that comes while the
    /// kernel still holds the inode (as it does until RELEASE is answered) finds it again.
    pub fn renew(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The open file, if some handle has it open.
    pub fn opened(&self) -> Option<Arc<CryptFile>> {
        self.io.open.lock().as_ref().map(|(c, _)| c.clone())
    }

    /// The plaintext size while the file is open (`None`: not open, ask the backing file).
    pub fn open_size(&self) -> Option<u64> {
        self.io.open.lock().as_ref().map(|_| self.size())
    }

    /// One more user of the open file; if it is not open, `open` opens it (under this
    /// state's lock, so two first users never open it twice) and gives its plaintext size.
    pub fn acquire(&self, open: impl FnOnce() -> io::Result<(CryptFile, u64)>) -> io::Result<Arc<CryptFile>> {
        let mut g = self.io.open.lock();
        if let Some((c, n)) = g.as_mut() {
            *n += 1;
            return Ok(c.clone());
        }
        let (crypt, size) = open()?;
        self.set_size(size);
        let crypt = Arc::new(crypt);
        *g = Some((crypt.clone(), 1));
        Ok(crypt)
    }

    /// One more user of `fresh`, a file just created empty; if another thread opened the
    /// inode meanwhile, of that one.
    pub fn adopt(&self, fresh: Arc<CryptFile>) -> Arc<CryptFile> {
        let mut g = self.io.open.lock();
        match g.as_mut() {
            Some((c, n)) => {
                *n += 1;
                c.clone()
            }
            None => {
                self.set_size(0);
                *g = Some((fresh.clone(), 1));
                fresh
            }
        }
    }

    /// One user fewer; when that was the last one, `last` runs on the file before it is
    /// closed, still under this state's lock (so a new opener sees what `last` wrote).
    pub fn release(&self, last: impl FnOnce(&CryptFile)) {
        let mut g = self.io.open.lock();
        if let Some((c, n)) = g.as_mut() {
            *n -= 1;
            if *n == 0 {
                last(c);
                *g = None;
            }
        }
    }

    /// Notes the backing file's state `st` as this mount leaves it.
    pub fn note_own(&self, st: &Stat) {
        *self.own.lock() = Some(Known::of(st));
    }

    /// Notes a write or size change through the mount.
    pub fn wrote(&self) {
        self.io.written.store(true, Ordering::Relaxed);
    }

    /// Whether the file was written since this was last asked.
    pub fn take_written(&self) -> bool {
        self.io.written.swap(false, Ordering::Relaxed)
    }

    /// Whether the backing file, found as `st` after a close that wrote or a change of its
    /// attributes, is as this mount last left it.
    pub fn is_own(&self, st: &Stat) -> bool {
        *self.own.lock() == Some(Known::of(st))
    }

    /// Whether the backing file, found as `st`, has another modification time or size than
    /// the one the kernel knows: with the write-back cache the kernel keeps those two of a
    /// regular file as its own, and no attribute reply corrects them.
    pub fn content_moved(&self, st: &Stat) -> bool {
        let now = Known::of(st);
        self.own.lock().is_none_or(|k| (k.mtime, k.size) != (now.mtime, now.size))
    }

    /// The cached plaintext size (valid while open).
    pub fn size(&self) -> u64 {
        self.io.size.load(Ordering::Acquire)
    }

    /// Records a new plaintext size (hold [`resizing`](Self::resizing)).
    pub fn set_size(&self, n: u64) {
        self.io.size.store(n, Ordering::Release);
    }

    /// Shared: I/O inside the current size may proceed (with [`blocks`](Self::blocks)).
    pub fn sized(&self) -> RwLockReadGuard<'_, ()> {
        self.io.size_lock.read()
    }

    /// Exclusive: the size is about to change (a write past the end, a truncate).
    pub fn resizing(&self) -> RwLockWriteGuard<'_, ()> {
        self.io.size_lock.write()
    }

    /// Locks blocks `first..=last` for reading (shared) or writing (exclusive).
    pub fn blocks(&self, first: u64, last: u64, write: bool) -> crate::rangelock::RangeGuard<'_> {
        self.io.ranges.lock(first, last, write)
    }
}

/// One node.
#[derive(Debug)]
pub struct Node {
    /// FUSE node id (= the inode number users see).
    pub id: u64,
    /// Object kind.
    pub kind: EntryKind,
    /// The identity its entries bind.
    pub identity: Identity,
    /// Backing inode number.
    pub backing_ino: u64,
    lookups: AtomicU64,
    links: Mutex<Vec<Link>>,
    /// Directory state (directories only).
    pub dir: Option<DirState>,
    /// The last attributes of an object whose last name is gone while the kernel still
    /// knows it (it may flush times of a deleted file before forgetting it).
    gone: Mutex<Option<Gone>>,
    /// File state (regular files only).
    pub file: Option<FileState>,
}

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

/// The attributes of a deleted object (`stat` has no `Debug` without libc's extra traits).
pub struct Gone(pub Stat);

impl std::fmt::Debug for Gone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gone(ino {})", self.0.st_ino)
    }
}

impl Node {
    /// The FUSE generation to answer with (see [`FileState::renew`]).
    pub fn generation(&self) -> fuser::Generation {
        fuser::Generation(self.file.as_ref().map_or(0, |f| f.generation.load(Ordering::Acquire)))
    }

    /// Records that the object's last name was removed; `st` is its stat from before.
    pub fn set_gone(&self, st: &Stat) {
        let mut st = *st;
        st.st_nlink = 0;
        *self.gone.lock() = Some(Gone(st));
    }

    /// The attributes of a deleted object, changed by `f` (the changes have nowhere to go).
    pub fn gone_stat(&self, f: impl FnOnce(&mut Stat)) -> Option<Stat> {
        self.gone.lock().as_mut().map(|g| {
            f(&mut g.0);
            g.0
        })
    }

    /// The directory state, or ENOTDIR.
    pub fn dir(&self) -> io::Result<&DirState> {
        self.dir.as_ref().ok_or_else(|| io::Error::from_raw_os_error(libc::ENOTDIR))
    }

    /// The file state, or EISDIR/EINVAL.
    pub fn file(&self) -> io::Result<&FileState> {
        self.file.as_ref().ok_or_else(|| {
            io::Error::from_raw_os_error(if self.kind == EntryKind::Dir { libc::EISDIR } else { libc::EINVAL })
        })
    }

    /// Every known name.
    pub fn links(&self) -> Vec<Link> {
        self.links.lock().clone()
    }

    /// The first result of `f` over the known names, without copying them (hot paths such as
    /// GETATTR). Holds this node's name list locked while `f` runs.
    pub fn find_link<T>(&self, f: impl FnMut(&Link) -> Option<T>) -> Option<T> {
        self.links.lock().iter().find_map(f)
    }

    /// The first known name (ESTALE if none is left).
    pub fn link(&self) -> io::Result<Link> {
        self.links.lock().first().cloned().ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))
    }

    /// Records that `parent/on_disk` names this node.
    pub fn add_link(&self, parent: &Arc<Node>, on_disk: &str) {
        let mut l = self.links.lock();
        if !l.iter().any(|x| x.parent.id == parent.id && x.on_disk == on_disk) {
            l.push(Link { parent: parent.clone(), on_disk: on_disk.to_string() });
        }
    }

    /// Forgets the name `parent/on_disk`; returns whether this mount still knows another.
    pub fn remove_link(&self, parent: u64, on_disk: &str) -> bool {
        let mut links = self.links.lock();
        links.retain(|x| !(x.parent.id == parent && x.on_disk == on_disk));
        !links.is_empty()
    }

    /// Renames `from_parent/from` to `to_parent/to`.
    pub fn move_link(&self, from_parent: u64, from: &str, to_parent: &Arc<Node>, to: &str) {
        let mut l = self.links.lock();
        l.retain(|x| !(x.parent.id == from_parent && x.on_disk == from));
        l.insert(0, Link { parent: to_parent.clone(), on_disk: to.to_string() });
    }
}

/// All nodes the kernel knows.
#[derive(Debug)]
pub struct NodeTable {
    nodes: RwLock<HashMap<u64, Arc<Node>>>,
    /// backing inode → (node id, identity); kept after a forget so numbers stay stable.
    ids: Mutex<HashMap<u64, (u64, Identity)>>,
    next: AtomicU64,
    /// backing inode → (identity, I/O state) of its file nodes: every node of one backing
    /// file shares one [`FileIo`], so the mount never holds two open files of one inode.
    io: Mutex<HashMap<u64, (Identity, Weak<FileIo>)>>,
    /// CIPHERDIR's watch (a mount that caches): every directory node is watched while the
    /// kernel knows it (`watch.rs`).
    watcher: std::sync::OnceLock<Arc<crate::watch::Watcher>>,
}

impl NodeTable {
    /// A table holding only the root.
    pub fn new(root: DirState, root_iv: Identity, backing_ino: u64) -> Self {
        let node = Arc::new(Node {
            id: ROOT,
            kind: EntryKind::Dir,
            identity: root_iv,
            backing_ino,
            lookups: AtomicU64::new(1),
            links: Mutex::new(Vec::new()),
            gone: Mutex::new(None),
            dir: Some(root),
            file: None,
        });
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, node);
        let mut ids = HashMap::new();
        ids.insert(backing_ino, (ROOT, root_iv));
        NodeTable {
            nodes: RwLock::new(nodes),
            ids: Mutex::new(ids),
            next: AtomicU64::new(2),
            io: Mutex::new(HashMap::new()),
            watcher: std::sync::OnceLock::new(),
        }
    }

    /// Watches every directory node from now on, the ones known already included.
    pub fn set_watcher(&self, w: Arc<crate::watch::Watcher>) {
        let dirs: Vec<Arc<Node>> = self.nodes.read().values().filter(|n| n.dir.is_some()).cloned().collect();
        if self.watcher.set(w.clone()).is_ok() {
            dirs.iter().for_each(|n| w.watch(n));
        }
    }

    /// The node with id `id` (ESTALE-like ENOENT if the kernel refers to a forgotten node).
    pub fn get(&self, id: u64) -> io::Result<Arc<Node>> {
        self.nodes.read().get(&id).cloned().ok_or_else(enoent)
    }

    /// The node for backing inode `st_ino` with `identity`, found by `parent/on_disk`; made
    /// with `make_dir` (for directories) if it is new. Counts one kernel lookup.
    pub fn lookup(
        &self,
        parent: &Arc<Node>,
        on_disk: &str,
        st: &Stat,
        kind: EntryKind,
        identity: Identity,
        make_dir: impl FnOnce() -> io::Result<Option<DirState>>,
    ) -> io::Result<Arc<Node>> {
        let ino = st.st_ino;
        let id = self.id_for(ino, identity);
        if let Some(n) = self.nodes.read().get(&id).cloned() {
            n.lookups.fetch_add(1, Ordering::Relaxed);
            n.add_link(parent, on_disk);
            return Ok(n);
        }
        // New to the kernel: build it outside the table lock (opening a directory is I/O).
        let dir = if kind == EntryKind::Dir { make_dir()? } else { None };
        let node = Arc::new(Node {
            id,
            kind,
            identity,
            backing_ino: ino,
            lookups: AtomicU64::new(1),
            links: Mutex::new(vec![Link { parent: parent.clone(), on_disk: on_disk.to_string() }]),
            gone: Mutex::new(None),
            dir,
            file: (kind == EntryKind::File).then(|| {
                let f = FileState { io: self.io_of(ino, identity), ..FileState::default() };
                f.note_own(st);
                f
            }),
        });
        let mut nodes = self.nodes.write();
        if let Some(existing) = nodes.get(&id) {
            // Another thread made it meanwhile.
            existing.lookups.fetch_add(1, Ordering::Relaxed);
            existing.add_link(parent, on_disk);
            return Ok(existing.clone());
        }
        nodes.insert(id, node.clone());
        drop(nodes);
        if let (Some(w), true) = (self.watcher.get(), node.dir.is_some()) {
            w.watch(&node);
        }
        Ok(node)
    }

    /// The I/O state of backing file `ino` holding `identity`: the one a live node of it has
    /// (CIPHERDIR's watch may have given the inode a new node while the kernel still holds
    /// the old one, see `watch.rs`), or a new one. Another identity is another file (its
    /// entry binds something else): it gets its own.
    fn io_of(&self, ino: u64, identity: Identity) -> Arc<FileIo> {
        let mut m = self.io.lock();
        if let Some(io) = m.get(&ino).filter(|(ident, _)| *ident == identity).and_then(|(_, w)| w.upgrade()) {
            return io;
        }
        let io = Arc::new(FileIo::default());
        m.insert(ino, (identity, Arc::downgrade(&io)));
        io
    }

    /// The node id of backing inode `ino` holding `identity`: the one it has (also after the
    /// kernel forgot its node), or a new one, kept for it. READDIR gives it as the entry's
    /// inode number before any lookup, and the lookup that follows makes the node with it.
    pub fn id_for(&self, ino: u64, identity: Identity) -> u64 {
        let mut ids = self.ids.lock();
        match ids.get(&ino) {
            Some((id, ident)) if *ident == identity => *id,
            _ => {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                ids.insert(ino, (id, identity));
                id
            }
        }
    }

    /// Drops `n` kernel lookups of `id`; the node goes when none are left.
    pub fn forget(&self, id: u64, n: u64) {
        if id == ROOT {
            return;
        }
        let mut nodes = self.nodes.write();
        if let Some(node) = nodes.get(&id) {
            let prev = node.lookups.fetch_sub(n, Ordering::Relaxed);
            if prev <= n {
                let dir = node.dir.is_some();
                let gone = nodes.remove(&id);
                drop(nodes);
                if let (Some(w), true) = (self.watcher.get(), dir) {
                    w.unwatch(id);
                }
                // The I/O state goes with the last node of its inode (a handle may still
                // hold the node; a later lookup of the inode then replaces the dead entry).
                if let Some(ino) = gone.filter(|n| n.file.is_some()).map(|n| n.backing_ino) {
                    let mut io = self.io.lock();
                    if io.get(&ino).is_some_and(|(_, w)| w.strong_count() == 0) {
                        io.remove(&ino);
                    }
                }
            }
        }
    }

    /// The node id of backing inode `ino`, if known.
    pub fn id_of(&self, ino: u64) -> Option<u64> {
        self.ids.lock().get(&ino).map(|(id, _)| *id)
    }

    /// The backing inode `ino` is gone (last link removed): its number may be reused.
    pub fn backing_gone(&self, ino: u64) {
        self.ids.lock().remove(&ino);
    }
}
