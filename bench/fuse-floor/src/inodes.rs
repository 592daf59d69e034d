//! The inode table: FUSE node ids ↔ `O_PATH` descriptors of backing inodes.
//!
//! Every inode the kernel knows about (it has a positive lookup count) holds
//! one `O_PATH` descriptor. All operations on it use `*at()` syscalls relative
//! to that descriptor, so renames in the backing tree never invalidate it and
//! no path strings are stored or rebuilt. Directories' descriptors double as
//! the cached directory fds for lookups and creations beneath them.
//!
//! Node ids are the backing `st_ino`. fuser reports `FileAttr::ino` as the
//! node id, so this is also what `stat` shows inside the mount. Two exceptions
//! get synthetic ids: the backing root (always node id 1, as FUSE requires)
//! and inodes on another device than the backing root (a mount inside the
//! backing dir), whose inode numbers could collide. While an entry lives its
//! descriptor pins the backing inode, so the backing fs cannot hand the same
//! inode number to a new file meanwhile.
//!
//! Locking: one `RwLock` around the maps, held only for the hash lookup, never
//! across a syscall. Lookup counts are atomics so the hot "already known" path
//! needs only the shared lock.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

/// FUSE's fixed node id for the mount root.
pub const ROOT_ID: u64 = 1;

/// Synthetic node ids start here, far above any real inode number.
const SYNTHETIC_BASE: u64 = 1 << 62;

/// One backing inode known to the kernel.
#[derive(Debug)]
pub struct Inode {
    /// `O_PATH | O_NOFOLLOW` descriptor of the backing inode.
    fd: OwnedFd,
    /// Backing `(st_dev, st_ino)`, used to find the entry again.
    key: (u64, u64),
    /// Outstanding kernel lookups; the entry dies when this reaches zero.
    lookups: AtomicU64,
}

impl Inode {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
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

impl InodeTable {
    /// Creates the table holding the backing root (`fd`, stat `st`) as node 1.
    pub fn new(root_fd: OwnedFd, st: &libc::stat) -> Self {
        let key = (st.st_dev, st.st_ino);
        let root = Arc::new(Inode {
            fd: root_fd,
            key,
            // The root is never forgotten by the kernel; start above zero so a
            // stray FORGET can never remove it.
            lookups: AtomicU64::new(1 << 32),
        });
        let mut maps = Maps {
            next_synthetic: SYNTHETIC_BASE,
            ..Maps::default()
        };
        maps.by_id.insert(ROOT_ID, root);
        maps.synthetic.insert(key, ROOT_ID);
        InodeTable {
            maps: RwLock::new(maps),
            root_dev: st.st_dev,
        }
    }

    /// The node id of a backing inode, if it is in use or can use its st_ino.
    fn id_for(&self, maps: &Maps, key: (u64, u64)) -> Option<u64> {
        if let Some(&id) = maps.synthetic.get(&key) {
            return Some(id);
        }
        let (dev, ino) = key;
        if dev == self.root_dev && ino != ROOT_ID && ino < SYNTHETIC_BASE {
            Some(ino)
        } else {
            None
        }
    }

    /// The inode for a node id the kernel sent us.
    pub fn get(&self, id: u64) -> io::Result<Arc<Inode>> {
        self.maps
            .read()
            .by_id
            .get(&id)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))
    }

    /// If the backing inode is already known, counts one more lookup of it
    /// and returns its node id. This is the cheap path: no descriptor needed.
    pub fn lookup_known(&self, st: &libc::stat) -> Option<u64> {
        let maps = self.maps.read();
        let id = self.id_for(&maps, (st.st_dev, st.st_ino))?;
        let inode = maps.by_id.get(&id)?;
        inode.lookups.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    /// Registers a lookup of the inode behind `fd` (whose stat is `st`),
    /// inserting it if new; returns the node id. If another thread inserted
    /// the same inode first, `fd` is simply dropped.
    pub fn lookup_insert(&self, fd: OwnedFd, st: &libc::stat) -> u64 {
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
            inode.lookups.fetch_add(1, Ordering::Relaxed);
        } else {
            maps.by_id.insert(
                id,
                Arc::new(Inode {
                    fd,
                    key,
                    lookups: AtomicU64::new(1),
                }),
            );
        }
        id
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
            let dead = maps
                .by_id
                .get(&id)
                .is_some_and(|i| i.lookups.load(Ordering::Acquire) == 0);
            if dead {
                if let Some(inode) = maps.by_id.remove(&id) {
                    maps.synthetic.remove(&inode.key);
                }
            }
        }
    }

    /// Number of live entries (for diagnostics).
    #[allow(dead_code)]
    pub fn len(&self) -> usize {
        self.maps.read().by_id.len()
    }
}
