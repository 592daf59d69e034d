//! Open file and directory handles.

use crate::dirs::SnapEntry;
use crate::inodes::Node;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use veilfs_core::CryptFile;

/// An open regular file.
#[derive(Debug)]
pub struct OpenFile {
    /// Its node.
    pub node: Arc<Node>,
    /// The inode's shared open file.
    pub crypt: Arc<CryptFile>,
}

/// An open directory (shared storage only; elsewhere there is no OPENDIR): the listing is
/// taken at the first READDIR and served from it.
#[derive(Debug)]
pub struct OpenDir {
    /// Its node.
    pub node: Arc<Node>,
    /// The snapshot, once taken.
    pub entries: Mutex<Option<Arc<Vec<SnapEntry>>>>,
}

/// Handle tables. Directory handles carry bit 63 so they never collide with file handles.
#[derive(Debug, Default)]
pub struct Handles {
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, Arc<OpenDir>>>,
    next: AtomicU64,
}

const DIR_BIT: u64 = 1 << 63;

fn ebadf() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

impl Handles {
    /// Registers an open file.
    pub fn add_file(&self, f: OpenFile) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.files.lock().insert(fh, Arc::new(f));
        fh
    }

    /// The open file `fh`.
    pub fn file(&self, fh: u64) -> io::Result<Arc<OpenFile>> {
        self.files.lock().get(&fh).cloned().ok_or_else(ebadf)
    }

    /// The open file `fh`, if `fh` is a file handle.
    pub fn file_opt(&self, fh: Option<u64>) -> Option<Arc<OpenFile>> {
        fh.filter(|f| f & DIR_BIT == 0).and_then(|f| self.files.lock().get(&f).cloned())
    }

    /// Removes file handle `fh`.
    pub fn remove_file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.files.lock().remove(&fh)
    }

    /// Every open file handle (for the unmount).
    pub fn open_files(&self) -> Vec<Arc<OpenFile>> {
        self.files.lock().values().cloned().collect()
    }

    /// Registers an open directory.
    pub fn add_dir(&self, node: Arc<Node>) -> u64 {
        let fh = (self.next.fetch_add(1, Ordering::Relaxed) + 1) | DIR_BIT;
        self.dirs.lock().insert(fh, Arc::new(OpenDir { node, entries: Mutex::new(None) }));
        fh
    }

    /// The open directory `fh`.
    pub fn dir(&self, fh: u64) -> io::Result<Arc<OpenDir>> {
        self.dirs.lock().get(&fh).cloned().ok_or_else(ebadf)
    }

    /// Removes directory handle `fh`.
    pub fn remove_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }
}
