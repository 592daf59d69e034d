//! The file API: positional read, write and truncate of plaintext over a ciphertext file.
//!
//! [`CryptFile`] is `Sync` and takes `&self` everywhere so a filesystem can run requests on
//! one file in parallel. The contract with the caller (the FUSE layer keeps it with per-file
//! range locks): calls that touch the same blocks, or that change the plaintext size, must not
//! overlap; the caller passes the current plaintext size so the size can be cached instead of
//! re-read with `fstat` on every request.

use crate::content::block::BlockCodec;
use crate::content::header::{FileHeader, FileId, FLAG_SPARSE, HEADER_LEN};
use crate::content::{ContentCipher, Layout};
use crate::crash;
use crate::error::{Error, IoContext, Result};
use crate::keys::SubKeys;
use crate::sys;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// What every file of a vault shares: cipher, geometry and keys.
#[derive(Clone, Debug)]
pub struct ContentCtx {
    /// The content AEAD.
    pub cipher: ContentCipher,
    /// Block geometry.
    pub layout: Layout,
    /// The vault's subkeys.
    pub keys: Arc<SubKeys>,
}

impl ContentCtx {
    /// A context for `cipher` with `block_size`-byte blocks.
    pub fn new(cipher: ContentCipher, block_size: u32, keys: Arc<SubKeys>) -> Self {
        ContentCtx { cipher, layout: Layout::new(block_size.into(), cipher.overhead() as u64), keys }
    }
}

thread_local! {
    /// Per-thread scratch buffers (ciphertext, plaintext block), so requests do not allocate.
    static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` with two scratch buffers of at least `a` and `b` bytes (contents unspecified).
fn with_scratch<R>(a: usize, b: usize, f: impl FnOnce(&mut [u8], &mut [u8]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut g) => {
            let (x, y) = &mut *g;
            if x.len() < a {
                x.resize(a, 0);
            }
            if y.len() < b {
                y.resize(b, 0);
            }
            f(&mut x[..a], &mut y[..b])
        }
        // Re-entered (a read inside a write on the same thread): use fresh buffers.
        Err(_) => f(&mut vec![0u8; a], &mut vec![0u8; b]),
    })
}

const HDR_UNKNOWN: u8 = 0;
const HDR_ABSENT: u8 = 1;
const HDR_PLAIN: u8 = 2;
const HDR_SPARSE: u8 = 3;

/// An open plaintext view of one ciphertext file.
#[derive(Debug)]
pub struct CryptFile {
    file: File,
    ctx: ContentCtx,
    codec: BlockCodec,
    /// Header state on disk: absent (0-byte file), present, present with SPARSE.
    header: AtomicU8,
    /// Ciphertext path or description, for error messages and logs.
    what: String,
    /// Whether a new hole only becomes SPARSE in the header at [`settle`](Self::settle).
    defer_sparse: AtomicBool,
    /// Holes (block ranges, half-open) made by writes past the end that the header does not
    /// yet declare; see [`set_defer_sparse`](Self::set_defer_sparse).
    pending: Mutex<Vec<(u64, u64)>>,
    /// `pending` is not empty (a lock-free check for the common case).
    has_pending: AtomicBool,
}

impl CryptFile {
    /// Opens `file` whose directory entry promises identity `id`; checks the header (if any)
    /// carries that identity. `what` names the file in errors (the ciphertext path).
    pub fn open(file: File, ctx: ContentCtx, id: FileId, what: String) -> Result<Self> {
        let codec = BlockCodec::new(ctx.cipher, &ctx.keys, id);
        let f = CryptFile {
            file,
            ctx,
            codec,
            header: AtomicU8::new(HDR_UNKNOWN),
            what,
            defer_sparse: AtomicBool::new(false),
            pending: Mutex::new(Vec::new()),
            has_pending: AtomicBool::new(false),
        };
        f.load_header()?;
        Ok(f)
    }

    /// Defers marking the file SPARSE when a write leaves a hole until [`settle`](Self::settle)
    /// (also run by [`sync`](Self::sync)), in case later writes fill the hole first.
    ///
    /// Why: with a write-back cache the kernel sends the 1 MiB writes of one stream to several
    /// worker threads at once, so a write often arrives before the one just below it. Without
    /// deferral such a file would be marked SPARSE for good, and in a SPARSE file an all-zero
    /// block reads as zeros instead of failing authentication. Until settled, the holes are
    /// known in memory only: a crash before `settle` leaves them unreadable (authentication
    /// errors), never silently zero. Only for a single process owning the file (the mount
    /// without shared storage).
    pub fn set_defer_sparse(&self, on: bool) {
        self.defer_sparse.store(on, Ordering::Relaxed);
    }

    /// Writes the SPARSE flag if holes made by earlier writes are still unfilled (see
    /// [`set_defer_sparse`](Self::set_defer_sparse)). Run on the last close and before syncing.
    pub fn settle(&self) -> Result<()> {
        if !self.has_pending.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !p.is_empty() && self.header_state() != HDR_SPARSE {
            crash::point!("file.settle_sparse");
            self.write_header(true)?;
        }
        p.clear();
        self.has_pending.store(false, Ordering::Release);
        Ok(())
    }

    fn deferring(&self) -> bool {
        self.defer_sparse.load(Ordering::Relaxed)
    }

    /// Whether block `n` is a hole not yet declared in the header.
    fn pending_hole(&self, n: u64) -> bool {
        self.has_pending.load(Ordering::Acquire)
            && self.pending.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|&(a, b)| a <= n && n < b)
    }

    /// Records blocks `a..b` as undeclared holes.
    fn add_pending(&self, a: u64, b: u64) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.push((a, b));
        self.has_pending.store(true, Ordering::Release);
    }

    /// Forgets undeclared holes in blocks `a..b` (written, or cut off by a truncate).
    fn fill_pending(&self, a: u64, b: u64) {
        if !self.has_pending.load(Ordering::Acquire) {
            return;
        }
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(p.len() + 1);
        for &(x, y) in p.iter() {
            if y <= a || b <= x {
                out.push((x, y));
                continue;
            }
            if x < a {
                out.push((x, a));
            }
            if b < y {
                out.push((b, y));
            }
        }
        *p = out;
        self.has_pending.store(!p.is_empty(), Ordering::Release);
    }

    /// The backing file.
    pub fn backing(&self) -> &File {
        &self.file
    }

    /// The file ID this file must carry.
    pub fn id(&self) -> &FileId {
        self.codec.file_id()
    }

    /// The vault's content context.
    pub fn ctx(&self) -> &ContentCtx {
        &self.ctx
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn load_header(&self) -> Result<u8> {
        let mut buf = [0u8; HEADER_LEN];
        let n = sys::pread_full(self.fd(), &mut buf, 0).ctx(|| format!("reading header of {}", self.what))?;
        let state = if n == 0 {
            HDR_ABSENT
        } else {
            let h = FileHeader::decode(&buf[..n], &self.ctx.keys, &self.what)?;
            if h.id != *self.codec.file_id() {
                return Err(Error::auth(
                    &self.what,
                    "content belongs to another file (its file ID does not match the name's binding: swapped or replaced)",
                ));
            }
            if h.is_sparse() {
                HDR_SPARSE
            } else {
                HDR_PLAIN
            }
        };
        self.header.store(state, Ordering::Release);
        Ok(state)
    }

    /// Authenticates the header (and that it carries this file's ID) without reading any
    /// block: for fsck, on a file whose ciphertext is a header alone (an empty file).
    pub fn verify_header(&self) -> Result<()> {
        self.load_header().map(drop)
    }

    fn header_state(&self) -> u8 {
        self.header.load(Ordering::Acquire)
    }

    /// Plaintext size from the backing file's size.
    pub fn plain_size(&self) -> Result<u64> {
        let len = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        self.ctx.layout.plain_size(len).map_err(|e| match e {
            Error::Auth { detail, .. } => Error::auth(&self.what, detail),
            e => e,
        })
    }

    fn header_bytes(&self, sparse: bool) -> [u8; HEADER_LEN] {
        FileHeader { flags: if sparse { FLAG_SPARSE } else { 0 }, id: *self.codec.file_id() }.encode(&self.ctx.keys)
    }

    fn write_header(&self, sparse: bool) -> Result<()> {
        sys::pwrite_all(self.fd(), &self.header_bytes(sparse), 0).ctx(|| format!("writing header of {}", self.what))?;
        self.header.store(if sparse { HDR_SPARSE } else { HDR_PLAIN }, Ordering::Release);
        Ok(())
    }

    /// Decrypts block `n` (whose ciphertext is `ct`) into `out`; `last` tells whether it is the
    /// file's last block. In a sparse file an all-zero ciphertext block is a hole.
    fn open_block(&self, n: u64, last: bool, ct: &[u8], out: &mut [u8]) -> Result<usize> {
        if !last
            && (self.header_state() == HDR_SPARSE || self.has_pending.load(Ordering::Acquire))
            && ct.iter().all(|&b| b == 0)
            && (self.header_state() == HDR_SPARSE || self.pending_hole(n))
        {
            let len = ct.len() - self.codec.overhead();
            out[..len].fill(0);
            return Ok(len);
        }
        self.codec.open_into(n, last, ct, out, &self.what).inspect_err(|e| tracing::error!("{e}"))
    }

    /// Reads the whole file in order, 1 MiB at a time, handing each authenticated piece to
    /// `sink`; returns the bytes read. Stops at the first integrity error (or `sink`'s error):
    /// nothing unauthenticated is ever handed out. For the offline readers (cat, export, fsck).
    pub fn stream<E: From<Error>>(
        &self,
        mut sink: impl FnMut(&[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<u64, E> {
        let size = self.plain_size()?;
        let mut buf = vec![0u8; (1 << 20).min(size as usize).max(1)];
        let mut off = 0u64;
        while off < size {
            let n = self.read_at(&mut buf, off, size)?;
            if n == 0 {
                break;
            }
            sink(&buf[..n])?;
            off += n as u64;
        }
        Ok(off)
    }

    /// Recovers what still authenticates of a damaged file, block by block, for
    /// `fsck --repair` and `export --salvage` (issue 12: recovery keeps what is intact). `sink(data)` receives the
    /// salvaged plaintext in order. A block that does not authenticate becomes `B` zero bytes
    /// and a lost range in the result; failing blocks at the end (a tail a crash tore or cut)
    /// are dropped, so the salvage ends with the last block that authenticates. A final block
    /// that fails as the last one but authenticates as an inner block (a crash after the old
    /// final block was re-sealed, before the blocks after it were written) is kept whole, and
    /// an inner block sealed as a full last block (the reverse) too. All-zero blocks that are
    /// not holes by the header (holes a crash left undeclared, FORMAT.md §5.5) are zeros and
    /// reported as lost, since they cannot be told from zeroed data. The header must verify:
    /// without it nothing is trusted and the error is returned.
    pub fn salvage(&self, mut sink: impl FnMut(&[u8]) -> Result<()>) -> Result<Salvaged> {
        let l = self.ctx.layout;
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        let mut out = Salvaged::default();
        if c <= l.header() {
            return Ok(out);
        }
        self.load_header()?;
        let blocks = (c - l.header()).div_ceil(l.cipher_block());
        let (bs, cb, o) = (l.block_size as usize, l.cipher_block() as usize, l.overhead as usize);
        let mut ct = vec![0u8; cb];
        let mut plain = vec![0u8; bs];
        // Zero blocks owed to the sink: written only once a later block authenticates.
        let mut pending_zeros = 0u64;
        for n in 0..blocks {
            let got =
                sys::pread_full(self.fd(), &mut ct, l.block_offset(n)).ctx(|| format!("reading {}", self.what))?;
            let region = &ct[..got];
            let is_final = n + 1 == blocks;
            let quiet = |last: bool, p: &mut [u8]| self.codec.open_into(n, last, region, p, &self.what).ok();
            let opened = if region.len() <= o {
                None
            } else if self.header_state() == HDR_SPARSE && !is_final && region.iter().all(|&b| b == 0) {
                plain.fill(0);
                Some(bs)
            } else {
                quiet(is_final, &mut plain)
                    .or_else(|| (region.len() == cb).then(|| quiet(!is_final, &mut plain)).flatten())
            };
            // A shrinking truncate cut short (FORMAT.md §5.7): the new final block, shorter
            // and sealed as last, sits at the start of an old inner block's place. Found by
            // trying each length (in the error path only: a few milliseconds); the file ends
            // there, whatever old blocks still follow.
            let short_last = match opened {
                None if !is_final && region.len() == cb => (1..bs)
                    .rev()
                    .find_map(|len| self.codec.open_into(n, true, &region[..len + o], &mut plain, &self.what).ok()),
                _ => None,
            };
            let ends_here = short_last.is_some();
            match opened.or(short_last) {
                Some(len) => {
                    for _ in 0..pending_zeros {
                        sink(&vec![0u8; bs])?;
                    }
                    pending_zeros = 0;
                    sink(&plain[..len])?;
                    out.kept += len as u64;
                    if ends_here {
                        break;
                    }
                }
                None => {
                    let start = n * l.block_size;
                    match out.lost.last_mut() {
                        Some((_, end)) if *end == start => *end += l.block_size,
                        _ => out.lost.push((start, start + l.block_size)),
                    }
                    pending_zeros += 1;
                }
            }
        }
        // Trailing failures are cut off, not zero-filled; no range reaches past the old size.
        let old_size = l.plain_size_lenient(c);
        out.lost.iter_mut().for_each(|(a, b)| *b = (*b).min(old_size).max(*a));
        Ok(out)
    }

    /// Reads up to `buf.len()` bytes at `off` from a file of `size` plaintext bytes.
    pub fn read_at(&self, buf: &mut [u8], off: u64, size: u64) -> Result<usize> {
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let len = (buf.len() as u64).min(size - off);
        let l = self.ctx.layout;
        let (first, last) = l.blocks_touched(off, len).expect("non-empty");
        let file_last = (size - 1) / l.block_size;
        let ct_start = l.block_offset(first);
        let ct_end = l.block_offset(last) + l.block_len(last, size) + l.overhead;
        with_scratch((ct_end - ct_start) as usize, l.block_size as usize, |ct, plain| {
            let got = sys::pread_full(self.fd(), ct, ct_start).ctx(|| format!("reading {}", self.what))?;
            if got < ct.len() {
                return Err(Error::auth(
                    &self.what,
                    format!(
                        "file is shorter than its size says (truncated at block {})",
                        first + (got as u64) / l.cipher_block()
                    ),
                ));
            }
            // Blocks wanted whole are decrypted straight into the caller's buffer; the (at most
            // two) partly wanted ones through `plain`.
            let mut whole: Vec<(u64, &[u8], &mut [u8])> = Vec::new();
            let mut rest: &mut [u8] = &mut buf[..len as usize];
            for n in first..=last {
                let blen = l.block_len(n, size);
                let cs = (l.block_offset(n) - ct_start) as usize;
                let block_ct = &ct[cs..cs + (blen + l.overhead) as usize];
                let bstart = n * l.block_size;
                let from = (off.max(bstart) - bstart) as usize;
                let to = ((off + len).min(bstart + blen) - bstart) as usize;
                let (dst, tail) = std::mem::take(&mut rest).split_at_mut(to - from);
                rest = tail;
                if from == 0 && to == blen as usize {
                    whole.push((n, block_ct, dst));
                } else {
                    self.open_block(n, n == file_last, block_ct, plain)?;
                    dst.copy_from_slice(&plain[from..to]);
                }
            }
            let open =
                |(n, ct, dst): &mut (u64, &[u8], &mut [u8])| self.open_block(*n, *n == file_last, ct, dst).map(drop);
            whole.iter_mut().try_for_each(open)?;
            let done = len as usize;
            Ok(done)
        })
    }

    /// Reads and decrypts whole block `n` of a file of `size` bytes into `out` (zero-extended
    /// to `out.len()` by the caller's choice); returns its plaintext length.
    fn read_block(&self, n: u64, size: u64, out: &mut [u8]) -> Result<usize> {
        let l = self.ctx.layout;
        if l.block_len(n, size) == 0 {
            return Ok(0);
        }
        let ct = self.read_block_ct(n, size)?;
        self.open_block(n, n == (size - 1) / l.block_size, &ct, out)
    }

    /// The on-disk ciphertext of block `n` (which must exist) of a file of `size` bytes.
    fn read_block_ct(&self, n: u64, size: u64) -> Result<Vec<u8>> {
        let l = self.ctx.layout;
        let mut ct = vec![0u8; (l.block_len(n, size) + l.overhead) as usize];
        let got = sys::pread_full(self.fd(), &mut ct, l.block_offset(n)).ctx(|| format!("reading {}", self.what))?;
        if got < ct.len() {
            return Err(Error::auth(&self.what, format!("block {n} is truncated")));
        }
        Ok(ct)
    }

    /// Whether the file may have holes (SPARSE, or holes not yet declared).
    fn may_have_holes(&self) -> bool {
        self.header_state() == HDR_SPARSE || self.has_pending.load(Ordering::Acquire)
    }

    /// Allocates backing space for ciphertext `[off, off + len)` ahead of a write into blocks
    /// that may be holes, so a full disk fails here, before a byte is written, instead of in
    /// the middle of a block: a hole half overwritten is neither zeros nor a valid block.
    /// Backing filesystems without `fallocate` are written to as before. (For truncate; the
    /// hot write path repairs afterwards instead, see [`zero_torn_hole`](Self::zero_torn_hole).)
    fn reserve_holes(&self, off: u64, len: u64) -> Result<()> {
        if len == 0 || !self.may_have_holes() {
            return Ok(());
        }
        match sys::fallocate(self.fd(), libc::FALLOC_FL_KEEP_SIZE, off, len) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)) => Ok(()),
            r => r.ctx(|| format!("writing {}", self.what)),
        }
    }

    /// After a write into ciphertext `[from, to)` was refused part-way for want of space, puts
    /// back the hole it stopped in. The write went out in order, so the first hole at or after
    /// `from` is where it stopped; the block around that point was a hole (a written block is
    /// allocated whole), so the part of it before that point goes back to zeros, which lie in
    /// space just allocated. Blocks before it hold their new content, blocks after it are
    /// untouched. Nothing is done when no hole is found there (a copy-on-write filesystem
    /// refusing to overwrite data): data is never turned into zeros.
    fn zero_torn_hole(&self, from: u64, to: u64) {
        let l = self.ctx.layout;
        let Ok(x) = sys::seek_hole(self.fd(), from) else { return };
        if x >= to || x < l.header() {
            return;
        }
        let start = l.block_offset((x - l.header()) / l.cipher_block());
        if start < x {
            let zeros = vec![0u8; (x - start) as usize];
            if let Err(e) = sys::pwrite_all(self.fd(), &zeros, start) {
                tracing::error!(
                    "{}: could not undo a failed write into a hole, the file may be damaged: {e}",
                    self.what
                );
            }
        }
    }

    /// Puts a file back as it was before a failed grow or truncate: cut to `csize` ciphertext
    /// bytes, and block `old.0` (its old last block, whose old ciphertext is `old.1`) written
    /// back in place. Cutting first frees the space; the old block then lies in space it held
    /// before, so restoring it does not allocate. Best effort: a failure is logged.
    fn undo(&self, csize: Option<u64>, old: Option<&(u64, Vec<u8>)>) {
        let l = self.ctx.layout;
        let res = csize.map_or(Ok(()), |c| sys::ftruncate(self.fd(), c)).and_then(|()| match old {
            Some((n, ct)) => sys::pwrite_all(self.fd(), ct, l.block_offset(*n)),
            None => Ok(()),
        });
        match res {
            Ok(()) if csize == Some(0) => self.header.store(HDR_ABSENT, Ordering::Release),
            Ok(()) => {}
            Err(e) => tracing::error!("{}: could not undo a failed write, the file may be damaged: {e}", self.what),
        }
    }

    /// Writes `data` at `off` into a file of `size` plaintext bytes; returns the new size.
    ///
    /// A write the backing store refuses (a full disk, a quota) leaves the file as it was:
    /// every block still authenticates and the size is the old one (blocks the write replaces
    /// inside the old size may already hold their new content). Two steps make that so:
    /// - a hole inside the old size that a full disk refused part-way is zeroed again
    ///   ([`zero_torn_hole`](Self::zero_torn_hole));
    /// - a write that grows the file keeps the old last block's ciphertext, and if any part of
    ///   the grow fails (the old last block re-sealed as an inner block, a new block cut off by
    ///   ENOSPC after a short `pwrite`), the file is cut back to its old length and that block
    ///   written back ([`undo`](Self::undo)).
    ///
    /// On the success path this costs no extra system call (the old last block is read anyway
    /// to re-seal it), except one read of it when a growing write replaces it whole.
    pub fn write_at(&self, data: &[u8], off: u64, size: u64) -> Result<u64> {
        if data.is_empty() {
            return Ok(size);
        }
        let l = self.ctx.layout;
        let end = off + data.len() as u64;
        let (first, last) = l.blocks_touched(off, data.len() as u64).expect("non-empty");
        let csize = l.cipher_size(size);
        // Holes inside the old size that a full disk refused part-way are zeroed again.
        let holes = self.may_have_holes();
        let repair = |e: &Error| {
            let full = matches!(e, Error::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)));
            if holes && full {
                self.zero_torn_hole(l.block_offset(first), csize.min(l.block_offset(last + 1)));
            }
        };
        if end <= size {
            return self.write_blocks(data, off, size, None).inspect_err(repair);
        }
        // In a grow the old last block is always touched: re-sealed as an inner block, or
        // rewritten longer.
        let old = match size {
            0 => None,
            _ => Some(((size - 1) / l.block_size, self.read_block_ct((size - 1) / l.block_size, size)?)),
        };
        self.write_blocks(data, off, size, old.as_ref()).inspect_err(|e| {
            repair(e);
            self.undo(Some(csize), old.as_ref())
        })
    }

    /// [`write_at`](Self::write_at) without the undo; `old` is the old last block and its
    /// ciphertext when the write grows the file.
    fn write_blocks(&self, data: &[u8], off: u64, size: u64, old: Option<&(u64, Vec<u8>)>) -> Result<u64> {
        let l = self.ctx.layout;
        // Block `n` of the old file, decrypted from the copy kept for undo when it is the old
        // last block (one read less).
        let read_old = |n: u64, out: &mut [u8]| match old {
            Some((o, ct)) if *o == n => self.open_block(n, true, ct, out),
            _ => self.read_block(n, size, out),
        };
        let bs = l.block_size;
        let new_size = size.max(off + data.len() as u64);
        let (first, last) = l.blocks_touched(off, data.len() as u64).expect("non-empty");
        let new_last = (new_size - 1) / bs;
        // Blocks strictly between the old end and this write stay holes.
        let old_blocks = l.block_count(size);
        let leaves_holes = first > old_blocks;
        // A new file's header goes out with its first block in one write when they are
        // adjacent, so a crash cannot leave a header without data.
        let mut header_with_data = None;
        match self.header_state() {
            HDR_ABSENT | HDR_UNKNOWN if size == 0 && first == 0 => header_with_data = Some(self.header_bytes(false)),
            HDR_ABSENT | HDR_UNKNOWN if size == 0 => {
                self.write_header(leaves_holes && !self.deferring())?;
                crash::point!("file.header_alone");
            }
            HDR_PLAIN if leaves_holes && !self.deferring() => self.write_header(true)?,
            _ => {}
        }
        let new_holes = leaves_holes && self.deferring() && self.header_state() != HDR_SPARSE;
        // The old last block loses its "last" flag (and is zero-extended: inner blocks are
        // full) when the write starts beyond it. Next to the write it goes out in the same
        // system call; beyond a hole, on its own.
        let mut prefix: Vec<u8> = Vec::new();
        let mut write_off = l.block_offset(first);
        if let Some(h) = header_with_data {
            prefix.extend_from_slice(&h);
            write_off = 0;
        } else if size > 0 {
            let old_last = (size - 1) / bs;
            if old_last < first {
                let mut blk = vec![0u8; bs as usize];
                read_old(old_last, &mut blk)?;
                let mut old = vec![0u8; (bs + l.overhead) as usize];
                self.codec.seal_into(old_last, false, &blk, &mut old);
                if old_last + 1 == first {
                    prefix = old;
                    write_off = l.block_offset(old_last);
                } else {
                    sys::pwrite_all(self.fd(), &old, l.block_offset(old_last))
                        .ctx(|| format!("writing {}", self.what))?;
                    crash::point!("file.reseal_alone");
                }
            }
        }
        // Encrypt every touched block into one buffer and write it with one system call.
        let ct_start = l.block_offset(first);
        let ct_len = (l.block_offset(last) + l.block_len(last, new_size) + l.overhead - ct_start) as usize;
        let nl = self.codec.nonce_len();
        let nblocks = (last - first + 1) as usize;
        let cb = l.cipher_block() as usize;
        with_scratch(prefix.len() + ct_len, bs as usize + nblocks * nl, |buf, scratch| -> Result<()> {
            buf[..prefix.len()].copy_from_slice(&prefix);
            let (plain, nonces) = scratch.split_at_mut(bs as usize);
            crate::random::fill(nonces);
            let ct = &mut buf[prefix.len()..];
            // Blocks the write covers whole are encrypted straight from the caller's data; the
            // (at most two) partly covered ones need a read-modify-write and go first. (Sealing
            // the whole blocks on several cores with rayon was measured: no faster on 2 cores,
            // where the kernel's copies already keep the other core busy.)
            let mut whole: Vec<(u64, &mut [u8])> = Vec::with_capacity(nblocks);
            for (i, out) in ct.chunks_mut(cb).enumerate() {
                let n = first + i as u64;
                out[..nl].copy_from_slice(&nonces[i * nl..(i + 1) * nl]);
                let bstart = n * bs;
                let blen = l.block_len(n, new_size) as usize;
                let wfrom = off.max(bstart);
                let wto = (off + data.len() as u64).min(bstart + blen as u64);
                if wfrom == bstart && wto == bstart + blen as u64 {
                    whole.push((n, out));
                    continue;
                }
                let covers_old = wfrom == bstart && (wto - bstart) >= l.block_len(n, size);
                let pb = &mut plain[..blen];
                if !covers_old && bstart < size {
                    let got = read_old(n, pb)?;
                    pb[got..].fill(0);
                } else {
                    pb.fill(0);
                }
                pb[(wfrom - bstart) as usize..(wto - bstart) as usize]
                    .copy_from_slice(&data[(wfrom - off) as usize..(wto - off) as usize]);
                self.codec.seal_into_prefilled(n, n == new_last, pb, out);
            }
            let seal = |(n, out): &mut (u64, &mut [u8])| {
                let src = (*n * bs - off) as usize;
                let len = out.len() - l.overhead as usize;
                self.codec.seal_into_prefilled(*n, *n == new_last, &data[src..src + len], out);
            };
            whole.iter_mut().for_each(seal);
            crash::torn!("file.torn_write", self.fd(), buf, write_off);
            sys::pwrite_all(self.fd(), buf, write_off).ctx(|| format!("writing {}", self.what))
        })?;
        crash::point!("file.after_write");
        if header_with_data.is_some() {
            self.header.store(HDR_PLAIN, Ordering::Release);
        }
        self.fill_pending(first, last + 1);
        if new_holes {
            self.add_pending(old_blocks, first);
        }
        Ok(new_size)
    }

    /// Changes the plaintext size of a file of `size` bytes to `new_size`.
    pub fn truncate(&self, new_size: u64, size: u64) -> Result<()> {
        let l = self.ctx.layout;
        if new_size == size {
            return Ok(());
        }
        if new_size == 0 {
            sys::ftruncate(self.fd(), 0).ctx(|| format!("truncating {}", self.what))?;
            self.header.store(HDR_ABSENT, Ordering::Release);
            self.fill_pending(0, u64::MAX);
            return Ok(());
        }
        if new_size > size {
            // Growing: write the zeros of the new last block; the blocks in between become
            // holes (or are zero-filled by the write when they share a block with old data).
            let new_last_start = (new_size - 1) / l.block_size * l.block_size;
            let from = size.max(new_last_start);
            let zeros = vec![0u8; (new_size - from) as usize];
            self.write_at(&zeros, from, size)?;
            return Ok(());
        }
        // Shrinking: re-seal the new last block (shorter, and flagged last), then cut. If
        // either step fails, the block's old ciphertext goes back (a hole is allocated first,
        // so a full disk fails before the block is half written).
        let n = (new_size - 1) / l.block_size;
        let old = self.read_block_ct(n, size)?;
        let mut blk = vec![0u8; l.block_size as usize];
        self.open_block(n, n == (size - 1) / l.block_size, &old, &mut blk)?;
        let blen = l.block_len(n, new_size) as usize;
        let mut ct = vec![0u8; blen + l.overhead as usize];
        self.codec.seal_into(n, true, &blk[..blen], &mut ct);
        self.reserve_holes(l.block_offset(n), ct.len() as u64)?;
        let old = (n, old);
        sys::pwrite_all(self.fd(), &ct, l.block_offset(n))
            .ctx(|| format!("writing {}", self.what))
            .and_then(|()| {
                crash::point!("file.shrink_resealed");
                sys::ftruncate(self.fd(), l.cipher_size(new_size)).ctx(|| format!("truncating {}", self.what))
            })
            .inspect_err(|_| self.undo(None, Some(&old)))?;
        self.fill_pending(n, u64::MAX);
        Ok(())
    }

    /// Flushes data and metadata to stable storage (`fdatasync` when `data_only`).
    pub fn sync(&self, data_only: bool) -> Result<()> {
        self.settle()?;
        let r = if data_only { sys::fdatasync(self.fd()) } else { sys::fsync(self.fd()) };
        r.ctx(|| format!("syncing {}", self.what))
    }
}

/// What [`CryptFile::salvage`] kept and lost.
#[derive(Debug, Default, Clone)]
pub struct Salvaged {
    /// Plaintext bytes that authenticated (the salvaged file's size, less zero-filled gaps).
    pub kept: u64,
    /// Plaintext ranges that did not authenticate (zero-filled inside, cut off at the end).
    pub lost: Vec<(u64, u64)>,
}
