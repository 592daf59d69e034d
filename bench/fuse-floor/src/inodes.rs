//! The inode table: FUSE node ids ↔ backing inodes.
//!
//! The kernel keeps every inode it has looked up (until memory pressure or
//! unmount), so this table grows to the size of the working set: a kernel
//! tree is ~80k inodes. Holding a descriptor per inode would hit
//! RLIMIT_NOFILE (hard-capped at 20000 on our CI machines, where the daemon
//! lacks CAP_SYS_RESOURCE), so only **directories** hold a descriptor — an
//! `O_PATH` fd, which is also the dirfd every `*at()` call for a child uses
//! and which survives renames of the directory. Everything else is addressed
//! as (parent directory inode, name), the names being recorded from the
//! lookups, creations, links and renames that pass through this mount and
//! dropped on unlink/rename. Before acting on a name, callers check via
//! `fstatat` that it still leads to the same `(st_dev, st_ino)` (see
//! `FloorFs::locate`), so a stale name yields ESTALE instead of touching
//! another file.
//!
//! Node ids are the backing `st_ino`. fuser reports `FileAttr::ino` as the
//! node id, so this is also what `stat` shows inside the mount. Two
//! exceptions get synthetic ids: the backing root (always node id 1, as FUSE
//! requires) and inodes on another device than the backing root (a mount
//! inside the backing dir), whose inode numbers could collide.
//!
//! Locking: one `RwLock` around the maps, held only for hash lookups, never
//! across a syscall; lookup counts are atomics so the hot "already known"
//! path needs only the shared lock. A non-directory's name list has its own
//! small mutex. Lock order: table, then a name list.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

/// FUSE's fixed node id for the mount root.
pub const ROOT_ID: u64 = 1;

/// Synthetic node ids start here, far above any real inode number.
const SYNTHETIC_BASE: u64 = 1 << 62;

/// Hard links a non-directory remembers names for; more is never needed by
/// the workloads this serves and keeps a pathological case bounded.
const MAX_NAMES: usize = 16;

/// A name a non-directory is reachable by: `parent`'s dirfd plus `name`.
///
/// Names compare by the parent's backing key, not by `Arc` identity: a
/// directory the kernel forgot and looked up again gets a new `Inode`.
#[derive(Debug, Clone)]
pub struct Name {
    pub parent: Arc<Inode>,
    pub name: CString,
}

/// How an inode is reached in the backing tree.
#[derive(Debug)]
enum Reach {
    /// Directories: `O_PATH | O_DIRECTORY` descriptor.
    Dir(OwnedFd),
    /// Everything else: the names it is currently known by.
    Names(Mutex<Vec<Name>>),
}

/// One backing inode known to the kernel.
#[derive(Debug)]
pub struct Inode {
    reach: Reach,
    /// Backing `(st_dev, st_ino)`, used to find the entry again and to verify
    /// that a name still leads here.
    key: (u64, u64),
    /// Outstanding kernel lookups; the entry dies when this reaches zero.
    lookups: AtomicU64,
}

impl Inode {
    /// The directory's descriptor, or ENOTDIR.
    pub fn dir_fd(&self) -> io::Result<BorrowedFd<'_>> {
        match &self.reach {
            Reach::Dir(fd) => Ok(fd.as_fd()),
            Reach::Names(_) => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }

    /// The names of a non-directory (empty for a directory).
    pub fn names(&self) -> Vec<Name> {
        match &self.reach {
            Reach::Dir(_) => Vec::new(),
            Reach::Names(names) => names.lock().clone(),
        }
    }

    /// Whether `st` describes this inode.
    pub fn is(&self, st: &libc::stat) -> bool {
        self.key == (st.st_dev, st.st_ino)
    }

    fn add_name(&self, parent: &Arc<Inode>, name: &CStr) {
        if let Reach::Names(names) = &self.reach {
            let mut names = names.lock();
            if !names.iter().any(|n| Arc::ptr_eq(&n.parent, parent) && n.name.as_c_str() == name) {
                if names.len() == MAX_NAMES {
                    names.remove(0);
                }
                names.push(Name { parent: parent.clone(), name: name.to_owned() });
            }
        }
    }

    fn remove_name(&self, parent: &Arc<Inode>, name: &CStr) {
        if let Reach::Names(names) = &self.reach {
            names.lock().retain(|n| !(Arc::ptr_eq(&n.parent, parent) && n.name.as_c_str() == name));
        }
    }
}

#[derive(Debug, Default)]
struct Maps {
    by_id: HashMap<u64, Arc<Inode>>,
    /// Node ids of inodes that do not use their own `st_ino` as node id.
    synthetic: HashMap<(u64, u64), u64>,
    next_synthetic: u64,
}

/// Thread-safe map from node id to [`Inode`].
#[derive(Debug)]
pub struct InodeTable {
    maps: RwLock<Maps>,
    root_dev: u64,
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

impl InodeTable {
    /// Creates the table holding the backing root (`fd`, stat `st`) as node 1.
    pub fn new(root_fd: OwnedFd, st: &libc::stat) -> Self {
        let key = (st.st_dev, st.st_ino);
        let root = Arc::new(Inode {
            reach: Reach::Dir(root_fd),
            key,
            // The kernel never forgets the root; start high so a stray FORGET
            // can never remove it.
            lookups: AtomicU64::new(1 << 32),
        });
        let mut maps = Maps { next_synthetic: SYNTHETIC_BASE, ..Maps::default() };
        maps.by_id.insert(ROOT_ID, root);
        maps.synthetic.insert(key, ROOT_ID);
        InodeTable { maps: RwLock::new(maps), root_dev: st.st_dev }
    }

    /// The node id of a backing inode, if in use or if it can use its st_ino.
    fn id_for(&self, maps: &Maps, key: (u64, u64)) -> Option<u64> {
        if let Some(&id) = maps.synthetic.get(&key) {
            return Some(id);
        }
        let (dev, ino) = key;
        (dev == self.root_dev && ino != ROOT_ID && ino < SYNTHETIC_BASE).then_some(ino)
    }

    /// The inode for a node id the kernel sent us.
    pub fn get(&self, id: u64) -> io::Result<Arc<Inode>> {
        self.maps.read().by_id.get(&id).cloned().ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))
    }

    /// The inode a backing stat describes, if the kernel knows it.
    pub fn find(&self, st: &libc::stat) -> Option<Arc<Inode>> {
        let maps = self.maps.read();
        let id = self.id_for(&maps, (st.st_dev, st.st_ino))?;
        maps.by_id.get(&id).cloned()
    }

    /// If the backing inode `st` (found as `parent/name`) is already known,
    /// counts one more lookup, remembers the name, and returns its node id.
    /// This is the cheap path: no descriptor, shared lock only.
    pub fn lookup_known(&self, st: &libc::stat, parent: &Arc<Inode>, name: &CStr) -> Option<u64> {
        let maps = self.maps.read();
        let id = self.id_for(&maps, (st.st_dev, st.st_ino))?;
        let inode = maps.by_id.get(&id)?;
        inode.lookups.fetch_add(1, Ordering::Relaxed);
        inode.add_name(parent, name);
        Some(id)
    }

    /// Registers a lookup of a backing inode not (yet) in the table: `st` is
    /// its stat, `dir_fd` its O_PATH descriptor if it is a directory (the
    /// caller opens it), `parent/name` where it was found. Returns the node id.
    pub fn lookup_insert(
        &self,
        st: &libc::stat,
        dir_fd: Option<OwnedFd>,
        parent: &Arc<Inode>,
        name: &CStr,
    ) -> io::Result<u64> {
        let key = (st.st_dev, st.st_ino);
        let mut maps = self.maps.write();
        let id = match self.id_for(&maps, key) {
            Some(id) => id,
            None => {
                let id = maps.next_synthetic;
                maps.next_synthetic += 1;
                maps.synthetic.insert(key, id);
                id
            }
        };
        if let Some(inode) = maps.by_id.get(&id) {
            // Another thread inserted it meanwhile; `dir_fd` is just dropped.
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            inode.add_name(parent, name);
            return Ok(id);
        }
        let reach = match (is_dir(st), dir_fd) {
            (true, Some(fd)) => Reach::Dir(fd),
            (true, None) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            (false, _) => Reach::Names(Mutex::new(vec![Name { parent: parent.clone(), name: name.to_owned() }])),
        };
        maps.by_id.insert(id, Arc::new(Inode { reach, key, lookups: AtomicU64::new(1) }));
        Ok(id)
    }

    /// Drops `n` kernel lookups of `id` (FORGET), freeing the entry at zero.
    pub fn forget(&self, id: u64, n: u64) {
        let now_zero = {
            let maps = self.maps.read();
            match maps.by_id.get(&id) {
                Some(inode) => inode.lookups.fetch_sub(n, Ordering::AcqRel) == n,
                None => false,
            }
        };
        if now_zero {
            let mut maps = self.maps.write();
            // Re-check: a concurrent lookup may have revived the entry.
            let dead = maps.by_id.get(&id).is_some_and(|i| i.lookups.load(Ordering::Acquire) == 0);
            if dead {
                if let Some(inode) = maps.by_id.remove(&id) {
                    maps.synthetic.remove(&inode.key);
                }
            }
        }
    }

    /// `parent/name` no longer leads to the inode `st` (unlinked, or renamed
    /// over): forget that name.
    pub fn name_removed(&self, st: &libc::stat, parent: &Arc<Inode>, name: &CStr) {
        if let Some(inode) = self.find(st) {
            inode.remove_name(parent, name);
        }
    }

    /// The inode `st` moved from `from/from_name` to `to/to_name`.
    pub fn name_moved(&self, st: &libc::stat, from: &Arc<Inode>, from_name: &CStr, to: &Arc<Inode>, to_name: &CStr) {
        if let Some(inode) = self.find(st) {
            inode.remove_name(from, from_name);
            inode.add_name(to, to_name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn open_dir(path: &str) -> (OwnedFd, libc::stat) {
        let fd: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(path)
            .unwrap()
            .into();
        let st = crate::sys::fstat(fd.as_fd()).unwrap();
        (fd, st)
    }

    fn file_stat(dev: u64, ino: u64) -> libc::stat {
        let (_, mut st) = open_dir("/");
        st.st_dev = dev;
        st.st_ino = ino;
        st.st_mode = libc::S_IFREG | 0o644;
        st
    }

    #[test]
    fn lookup_counting_and_names() {
        let (fd, st) = open_dir("/");
        let table = InodeTable::new(fd, &st);
        let root = table.get(ROOT_ID).unwrap();
        let f = file_stat(st.st_dev, 4242);
        assert_eq!(table.lookup_known(&f, &root, c"a"), None);
        let id = table.lookup_insert(&f, None, &root, c"a").unwrap();
        assert_eq!(id, 4242);
        // A second name (hard link) is remembered alongside the first.
        assert_eq!(table.lookup_known(&f, &root, c"b"), Some(id));
        assert_eq!(table.get(id).unwrap().names().len(), 2);
        table.name_removed(&f, &root, c"a");
        let names = table.get(id).unwrap().names();
        assert_eq!(names.len(), 1);
        assert_eq!(names[0].name.as_c_str(), c"b");
        table.name_moved(&f, &root, c"b", &root, c"c");
        assert_eq!(table.get(id).unwrap().names()[0].name.as_c_str(), c"c");
        // Two lookups: the first forget keeps it, the second frees it.
        table.forget(id, 1);
        assert!(table.get(id).is_ok());
        table.forget(id, 1);
        assert!(table.get(id).is_err());
    }

    #[test]
    fn foreign_device_gets_synthetic_id() {
        let (fd, st) = open_dir("/");
        let table = InodeTable::new(fd, &st);
        let root = table.get(ROOT_ID).unwrap();
        let f = file_stat(st.st_dev.wrapping_add(1), 4242);
        let id = table.lookup_insert(&f, None, &root, c"x").unwrap();
        assert!(id >= SYNTHETIC_BASE);
        assert_eq!(table.lookup_known(&f, &root, c"x"), Some(id));
    }
}
