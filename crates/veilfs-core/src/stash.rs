//! Inner-block stashes (docs/FORMAT.md §5.9): the copy a writer keeps of each inner block it
//! overwrites in place, written just before the block, so a crash that tears the overwrite
//! (a `pwrite` cut short between two pages, and a 4 KiB block's ciphertext always straddles
//! a page boundary) leaves a copy of the block to read instead of an integrity error.
//!
//! One stash file per content file, in the vault's top directory:
//! `veilfs.S.<base64url(file ID)>`, a sequence of fixed-size records, each
//! `u64be(n) ‖ u64be(seq) ‖ the ciphertext of block n being written` (a full inner block),
//! or, for blocks `a..b` that were holes when a write began to fill them,
//! `u64be(2^63 | a) ‖ u64be(seq) ‖ u64be(b) ‖ zeros`. `seq` grows with every record, and
//! the writer reuses the file as a ring of a few MiB: a record is needed only until its
//! block is written. A file found UNSETTLED reads a block that does not authenticate from
//! the record with the highest `seq` that speaks of it and authenticates as that block of
//! that file, so a planted or stale stash can at most give back another version of the
//! block (what a copy of old ciphertext gives an attacker anyway, docs/SECURITY.md).

use crate::content::header::FileId;
use crate::names::{b64_encode, RESERVED_PREFIX};
use crate::sys;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Prefix of a stash file's name.
pub const STASH_PREFIX: &str = "veilfs.S.";

/// Bytes before each record's payload: the block number and the sequence number.
pub const RECORD_HEAD: usize = 16;

/// How far a writer fills its stash before it starts again at the beginning.
pub const RING: u64 = 8 << 20;

/// How much of a stash a reader looks at: the ring and writes in flight when it started
/// again, with room for many threads (a writer never goes past it).
pub const READ_LIMIT: u64 = 8 * RING;

/// The top bit of a record's first field: a hole record (blocks `a..b` were holes).
pub const HOLE_BIT: u64 = 1 << 63;

const _: () = assert!(STASH_PREFIX.len() > RESERVED_PREFIX.len());

/// The stash file's name for the file with identity `id`.
pub fn stash_name(id: &FileId) -> String {
    format!("{STASH_PREFIX}{}", b64_encode(id))
}

/// The file ID a stash file's name carries (`None` for any other name).
pub fn stash_id(name: &[u8]) -> Option<FileId> {
    let rest = name.strip_prefix(STASH_PREFIX.as_bytes())?;
    crate::names::b64_decode(std::str::from_utf8(rest).ok()?)?.try_into().ok()
}

/// Where a vault keeps its stashes: its top directory.
#[derive(Debug)]
pub struct StashDir {
    path: PathBuf,
}

impl StashDir {
    /// The stashes of the vault whose top directory is `root`.
    pub fn new(root: &Path) -> Self {
        StashDir { path: root.to_path_buf() }
    }

    /// The path of `id`'s stash, for messages.
    pub fn path_of(&self, id: &FileId) -> PathBuf {
        self.path.join(stash_name(id))
    }

    fn dir(&self) -> io::Result<OwnedFd> {
        sys::open_dir_path(&self.path)
    }

    // Each step runs with the daemon's own ids (`sys::privileged`): a stash is the format's
    // internal file, in a directory the user a request acts for may not be able to write.

    /// Creates `id`'s stash, empty, for appending. Whatever had the name goes first (a stale
    /// stash, or anything planted there: unlinked, never opened, so a planted link, FIFO or
    /// hard link to another file is never written through); a directory there is refused.
    pub fn create(&self, id: &FileId) -> io::Result<OwnedFd> {
        sys::privileged(|| self.create_now(id))
    }

    fn create_now(&self, id: &FileId) -> io::Result<OwnedFd> {
        let dir = self.dir()?;
        let name = stash_name(id);
        unlink(dir.as_fd(), &name)?;
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        sys::openat(dir.as_fd(), name.as_bytes(), flags, 0o600)
    }

    /// Opens `id`'s stash if there is one (a regular file: anything else at the name is
    /// ignored, with a warning) and lists its whole records of `record` bytes for blocks below
    /// `blocks`, from its first [`READ_LIMIT`] bytes (a planted giant stash costs no more).
    pub fn open(&self, id: &FileId, record: usize, blocks: u64) -> io::Result<Option<Found>> {
        sys::privileged(|| self.open_now(id, record, blocks))
    }

    fn open_now(&self, id: &FileId, record: usize, blocks: u64) -> io::Result<Option<Found>> {
        let dir = self.dir()?;
        let fd = match sys::open_regular_at(dir.as_fd(), stash_name(id).as_bytes(), libc::O_RDONLY) {
            Ok((fd, _)) => fd,
            Err(Err(e)) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(Err(e)) => return Err(e),
            Err(Ok(mode)) => {
                tracing::warn!(
                    "{}: a {} where a stash belongs; ignored",
                    self.path_of(id).display(),
                    sys::type_name(mode)
                );
                return Ok(None);
            }
        };
        let len = sys::fstat(fd.as_fd())?.st_size as u64;
        let mut records = Records::default();
        let mut head = [0u8; RECORD_HEAD + 8];
        // A record cut short (a crash while it was appended) is ignored: the block it was
        // for was not touched yet.
        for i in 0..(len.min(READ_LIMIT) / record as u64) {
            let off = i * record as u64;
            if sys::pread_full(fd.as_fd(), &mut head, off)? != head.len() {
                continue;
            }
            records.note(&head, off, blocks);
        }
        Ok(Some(Found { fd, records }))
    }

    /// Reads `id`'s stash whole, up to [`READ_LIMIT`] bytes, if there is one (a regular file;
    /// anything else at the name is ignored): for the session log of a file with a block map
    /// (`maplog`), whose records are not of one size.
    pub fn read(&self, id: &FileId) -> io::Result<Option<Vec<u8>>> {
        sys::privileged(|| {
            let dir = self.dir()?;
            let fd = match sys::open_regular_at(dir.as_fd(), stash_name(id).as_bytes(), libc::O_RDONLY) {
                Ok((fd, _)) => fd,
                Err(Err(e)) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
                Err(Err(e)) => return Err(e),
                Err(Ok(_)) => return Ok(None),
            };
            let len = sys::fstat(fd.as_fd())?.st_size as u64;
            let mut buf = vec![0u8; len.min(READ_LIMIT) as usize];
            let got = sys::pread_full(fd.as_fd(), &mut buf, 0)?;
            buf.truncate(got);
            Ok(Some(buf))
        })
    }

    /// Opens `id`'s existing stash (a regular file) for writing: to append to a session log
    /// a crash left (`maplog`). `None` when there is none.
    pub fn open_rw(&self, id: &FileId) -> io::Result<Option<OwnedFd>> {
        sys::privileged(|| {
            let dir = self.dir()?;
            match sys::open_regular_at(dir.as_fd(), stash_name(id).as_bytes(), libc::O_RDWR) {
                Ok((fd, _)) => Ok(Some(fd)),
                Err(Err(e)) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
                Err(Err(e)) => Err(e),
                Err(Ok(_)) => Ok(None),
            }
        })
    }

    /// Removes `id`'s stash (missing is fine).
    pub fn remove(&self, id: &FileId) -> io::Result<()> {
        sys::privileged(|| unlink(self.dir()?.as_fd(), &stash_name(id)))
    }
}

/// Unlinks `name` in `dir`; a missing name is fine.
fn unlink(dir: std::os::fd::BorrowedFd<'_>, name: &str) -> io::Result<()> {
    match sys::unlinkat(dir, name.as_bytes(), false) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

/// A stash found beside a file a crash left UNSETTLED.
#[derive(Debug)]
pub struct Found {
    /// The stash file.
    pub fd: OwnedFd,
    records: Records,
}

/// The records of a stash, indexed by the blocks they speak of. Nothing in a record is
/// trusted: a block record's ciphertext is used only if it authenticates as that block of
/// that file, and a block number at or past the file's end is dropped here.
#[derive(Debug, Default)]
pub struct Records {
    /// For each block number, its records (sequence number, offset of the ciphertext).
    at: HashMap<u64, Vec<(u64, u64)>>,
    /// Hole records: (sequence number, first block, end block).
    holes: Vec<(u64, u64, u64)>,
}

impl Records {
    /// Notes the record at offset `off` of a stash whose first 24 bytes are `head`, for a
    /// file of `blocks` blocks.
    fn note(&mut self, head: &[u8; RECORD_HEAD + 8], off: u64, blocks: u64) {
        let be = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
        let (x, seq) = (be(&head[..8]), be(&head[8..16]));
        if x & HOLE_BIT != 0 {
            let (a, b) = (x & !HOLE_BIT, be(&head[16..]).min(blocks));
            if a < b {
                self.holes.push((seq, a, b));
            }
        } else if x < blocks {
            self.at.entry(x).or_default().push((seq, off + RECORD_HEAD as u64));
        }
    }

    /// Indexes the whole records of `record` bytes each in `bytes` (the first
    /// [`READ_LIMIT`] bytes of a stash, as [`StashDir::open`] reads them) for a file of
    /// `blocks` blocks. For fuzzing and tests: the reader does the same through `pread`.
    pub fn parse(bytes: &[u8], record: usize, blocks: u64) -> Records {
        let mut r = Records::default();
        if record < RECORD_HEAD + 8 {
            return r;
        }
        let bytes = &bytes[..bytes.len().min(READ_LIMIT as usize)];
        for (i, rec) in bytes.chunks_exact(record).enumerate() {
            r.note(rec[..RECORD_HEAD + 8].try_into().expect("24 bytes"), (i * record) as u64, blocks);
        }
        r
    }

    /// What the records say of block `n`, newest first.
    pub fn of(&self, n: u64) -> Vec<Kept> {
        let mut v: Vec<(u64, Kept)> =
            self.at.get(&n).into_iter().flatten().map(|&(i, off)| (i, Kept::Block(off))).collect();
        v.extend(self.holes.iter().filter(|&&(_, a, b)| a <= n && n < b).map(|&(i, _, _)| (i, Kept::Hole)));
        v.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        v.into_iter().map(|(_, k)| k).collect()
    }

    /// The blocks some record speaks of, as sorted, disjoint, non-adjacent ranges
    /// `[a, b)`. Ranges, never a list of blocks: one hole record may speak of every block of a
    /// large sparse file, and a planted stash holds thousands of such records, so a list
    /// could need terabytes where these take at most one pair per record.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.at.keys().map(|&n| (n, n + 1)).collect();
        v.extend(self.holes.iter().map(|&(_, a, b)| (a, b)));
        v.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (a, b) in v {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        merged
    }
}

/// What one record says of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Its ciphertext as it was, at this offset of the stash.
    Block(u64),
    /// It was a hole.
    Hole,
}

impl Found {
    /// What the records say of block `n`, newest first.
    pub fn of(&self, n: u64) -> Vec<Kept> {
        self.records.of(n)
    }

    /// The blocks some record speaks of, as ranges (see [`Records::ranges`]).
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.records.ranges()
    }
}

/// Appends a record for block `n` whose ciphertext (a full inner block) is `ct` to `v`,
/// with sequence number 0 (see [`number`]).
pub fn block_record(v: &mut Vec<u8>, n: u64, ct: &[u8]) {
    v.extend_from_slice(&n.to_be_bytes());
    v.extend_from_slice(&0u64.to_be_bytes());
    v.extend_from_slice(ct);
}

/// Appends a hole record for blocks `a..b` (records of `cb`-byte blocks) to `v`, with
/// sequence number 0 (see [`number`]).
pub fn hole_record(v: &mut Vec<u8>, a: u64, b: u64, cb: usize) {
    let start = v.len();
    v.extend_from_slice(&(HOLE_BIT | a).to_be_bytes());
    v.extend_from_slice(&0u64.to_be_bytes());
    v.extend_from_slice(&b.to_be_bytes());
    v.resize(start + RECORD_HEAD + cb, 0);
}

/// Gives the records in `v` (each `record` bytes) the sequence numbers `first, first + 1, …`.
pub fn number(v: &mut [u8], record: usize, first: u64) {
    for (i, r) in v.chunks_mut(record).enumerate() {
        r[8..16].copy_from_slice(&(first + i as u64).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_internal() {
        let id = [7u8; 16];
        let name = stash_name(&id);
        assert!(name.starts_with("veilfs.S."));
        assert_eq!(stash_id(name.as_bytes()), Some(id));
        assert_eq!(stash_id(b"veilfs.S.short"), None);
        assert_eq!(stash_id(b"veilfs.T.AAAAAAAAAAAAAAAAAAAAAA"), None);
        assert!(matches!(crate::names::ParsedEntry::parse(name.as_bytes()), crate::names::ParsedEntry::Internal));
    }

    #[test]
    fn records_are_number_seq_then_payload() {
        let mut r = Vec::new();
        block_record(&mut r, 1, &[0xaa; 8]);
        hole_record(&mut r, 300, 302, 8);
        number(&mut r, 24, 7);
        assert_eq!(r.len(), 2 * 24);
        assert_eq!(&r[..16], &[&1u64.to_be_bytes()[..], &7u64.to_be_bytes()].concat()[..]);
        let hole = [&(HOLE_BIT | 300).to_be_bytes()[..], &8u64.to_be_bytes(), &302u64.to_be_bytes()].concat();
        assert_eq!(&r[24..48], &hole[..]);
    }

    #[test]
    fn open_lists_whole_records_newest_by_sequence_and_ignores_a_cut_one() {
        let d = tempfile::tempdir().unwrap();
        let s = StashDir::new(d.path());
        let id = [3u8; 16];
        assert!(s.open(&id, 24, 100).unwrap().is_none());
        let fd = s.create(&id).unwrap();
        let mut r = Vec::new();
        for n in [5, 9, 5, 100] {
            block_record(&mut r, n, &[1u8; 8]);
        }
        hole_record(&mut r, 4, 7, 8);
        // Sequence numbers as after the ring started again: the first record is the newest.
        number(&mut r, 24, 1);
        r[8..16].copy_from_slice(&50u64.to_be_bytes());
        r.extend_from_slice(&[0, 0, 0]);
        sys::pwrite_all(fd.as_fd(), &r, 0).unwrap();
        let f = s.open(&id, 24, 100).unwrap().unwrap();
        assert_eq!(f.of(5), vec![Kept::Block(16), Kept::Hole, Kept::Block(64)], "newest first");
        assert_eq!(f.of(9), vec![Kept::Block(40)]);
        assert_eq!(f.of(4), vec![Kept::Hole]);
        assert_eq!(f.of(7), vec![]);
        assert_eq!(f.ranges(), vec![(4, 7), (9, 10)], "a block past the file's end is not listed");
        // A second session starts from an empty stash.
        let fd2 = s.create(&id).unwrap();
        assert_eq!(sys::fstat(fd2.as_fd()).unwrap().st_size, 0);
        s.remove(&id).unwrap();
        s.remove(&id).unwrap();
        assert!(s.open(&id, 24, 100).unwrap().is_none());
    }

    #[test]
    fn planted_fifo_or_link_is_never_opened_or_written_through() {
        let d = tempfile::tempdir().unwrap();
        let s = StashDir::new(d.path());
        let id = [4u8; 16];
        let dir = sys::open_dir_path(d.path()).unwrap();
        let name = stash_name(&id);
        sys::mknodat(dir.as_fd(), name.as_bytes(), libc::S_IFIFO | 0o644, 0).unwrap();
        assert!(s.open(&id, 24, 10).unwrap().is_none(), "a FIFO is not read (and does not block)");
        s.create(&id).unwrap();
        assert_eq!(sys::fstatat(dir.as_fd(), name.as_bytes()).unwrap().st_mode & libc::S_IFMT, libc::S_IFREG);
        // A hard link to a victim file: replaced, the victim untouched.
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        s.remove(&id).unwrap();
        std::fs::hard_link(&victim, s.path_of(&id)).unwrap();
        let fd = s.create(&id).unwrap();
        sys::pwrite_all(fd.as_fd(), b"stash", 0).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        // A symlink: replaced, not followed.
        s.remove(&id).unwrap();
        std::os::unix::fs::symlink(&victim, s.path_of(&id)).unwrap();
        assert!(s.open(&id, 24, 10).unwrap().is_none());
        s.create(&id).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }

    /// A planted stash of hole records each speaking of every block of a huge sparse file
    /// costs one range, not a list of its blocks.
    #[test]
    fn hole_records_over_a_huge_file_stay_ranges() {
        let cb = 8usize;
        let mut bytes = Vec::new();
        for i in 0..2000u64 {
            hole_record(&mut bytes, i, 1 << 40, cb);
        }
        let r = Records::parse(&bytes, RECORD_HEAD + cb, 1 << 40);
        assert_eq!(r.ranges(), vec![(0, 1 << 40)]);
    }
}
