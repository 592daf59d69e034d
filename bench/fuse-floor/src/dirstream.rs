//! Open directory handles: a buffered `getdents64` reader per OPENDIR.
//!
//! The kernel asks for directory entries in page-sized READDIR requests and
//! resumes each one at the `offset` of the last entry it accepted. We hand
//! the backing fs's own `d_off` cookies through as those offsets, so resuming
//! is free when the kernel continues where we stopped, and a `lseek` to the
//! cookie otherwise. Records are read 32 KiB at a time, so one `getdents64`
//! usually feeds several READDIR replies.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::inodes::Inode;
use crate::sys;

/// Set in every directory handle, so a directory `fh` can never be mistaken
/// for a file handle (a backing descriptor number, see `sys::handle_fd`).
pub const DIR_HANDLE_BIT: u64 = 1 << 63;

const BUF_SIZE: usize = 32 * 1024;

/// One raw directory entry, borrowed from the read buffer.
#[derive(Debug)]
pub struct DirEntry<'a> {
    pub ino: u64,
    /// Cookie to resume reading *after* this entry.
    pub next_offset: u64,
    pub d_type: u8,
    pub name: &'a [u8],
}

impl DirEntry<'_> {
    pub fn is_dot_or_dotdot(&self) -> bool {
        self.name == b"." || self.name == b".."
    }
}

/// What the consumer did with an entry handed to it by [`DirStream::read`].
#[derive(Debug, PartialEq, Eq)]
pub enum Take {
    /// Entry added to the reply (or deliberately skipped); move past it.
    Consumed,
    /// Reply buffer full: keep the entry for the next READDIR.
    Full,
}

#[derive(Debug)]
struct Cursor {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Offset (cookie) the kernel must send to continue right here.
    offset: u64,
}

/// An open backing directory and its read position.
#[derive(Debug)]
pub struct DirStream {
    /// The directory's inode: entries are looked up relative to it.
    inode: Arc<Inode>,
    fd: OwnedFd,
    cursor: Mutex<Cursor>,
}

/// Parses the `linux_dirent64` record at the start of `buf`.
/// Returns the entry and its record length.
fn parse(buf: &[u8]) -> Option<(DirEntry<'_>, usize)> {
    // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
    if buf.len() < 19 {
        return None;
    }
    let ino = u64::from_ne_bytes(buf[0..8].try_into().ok()?);
    let off = i64::from_ne_bytes(buf[8..16].try_into().ok()?);
    let reclen = u16::from_ne_bytes(buf[16..18].try_into().ok()?) as usize;
    let d_type = buf[18];
    if reclen < 19 || reclen > buf.len() {
        return None;
    }
    let raw_name = &buf[19..reclen];
    let len = raw_name.iter().position(|&b| b == 0)?;
    Some((DirEntry { ino, next_offset: off as u64, d_type, name: &raw_name[..len] }, reclen))
}

impl DirStream {
    pub fn new(inode: Arc<Inode>, fd: OwnedFd) -> Self {
        DirStream { inode, fd, cursor: Mutex::new(Cursor { buf: vec![0; BUF_SIZE], start: 0, end: 0, offset: 0 }) }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn inode(&self) -> &Arc<Inode> {
        &self.inode
    }

    /// Feeds entries from `offset` on to `take` until it reports [`Take::Full`]
    /// or the directory ends.
    pub fn read(&self, offset: u64, mut take: impl FnMut(&DirEntry<'_>) -> Take) -> io::Result<()> {
        let mut cur = self.cursor.lock();
        if offset != cur.offset {
            sys::lseek(self.fd.as_fd(), offset as i64, libc::SEEK_SET)?;
            cur.start = 0;
            cur.end = 0;
            cur.offset = offset;
        }
        loop {
            if cur.start >= cur.end {
                let n = sys::getdents64(self.fd.as_fd(), &mut cur.buf)?;
                if n == 0 {
                    return Ok(());
                }
                cur.start = 0;
                cur.end = n;
            }
            let (next_offset, reclen) = {
                let Some((entry, reclen)) = parse(&cur.buf[cur.start..cur.end]) else {
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                };
                if take(&entry) == Take::Full {
                    return Ok(());
                }
                (entry.next_offset, reclen)
            };
            cur.start += reclen;
            cur.offset = next_offset;
        }
    }
}

/// The table of open directory handles, keyed by the FUSE `fh`.
///
/// Directory handles carry a cursor, so unlike file handles they cannot be a
/// bare descriptor; the table lock is held only to clone the `Arc`.
#[derive(Debug, Default)]
pub struct DirHandles {
    map: Mutex<HashMap<u64, Arc<DirStream>>>,
    next: AtomicU64,
}

impl DirHandles {
    pub fn insert(&self, stream: DirStream) -> u64 {
        let fh = (self.next.fetch_add(1, Ordering::Relaxed) + 1) | DIR_HANDLE_BIT;
        self.map.lock().insert(fh, Arc::new(stream));
        fh
    }

    pub fn get(&self, fh: u64) -> io::Result<Arc<DirStream>> {
        self.map.lock().get(&fh).cloned().ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    pub fn remove(&self, fh: u64) {
        self.map.lock().remove(&fh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_record() {
        let mut rec = Vec::new();
        rec.extend_from_slice(&42u64.to_ne_bytes());
        rec.extend_from_slice(&7i64.to_ne_bytes());
        rec.extend_from_slice(&24u16.to_ne_bytes());
        rec.push(libc::DT_REG);
        rec.extend_from_slice(b"abc\0\0");
        let (e, len) = parse(&rec).unwrap();
        assert_eq!((e.ino, e.next_offset, e.d_type, e.name), (42, 7, libc::DT_REG, &b"abc"[..]));
        assert_eq!(len, 24);
    }
}
