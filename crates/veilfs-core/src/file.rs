//! The file API: positional read, write and truncate of plaintext over a ciphertext file.
//!
//! [`CryptFile`] is `Sync` and takes `&self` everywhere so a filesystem can run requests on
//! one file in parallel. The contract with the caller (the FUSE layer keeps it with per-file
//! range locks): calls that touch the same blocks, or that change the plaintext size, must not
//! overlap; the caller passes the current plaintext size so the size can be cached instead of
//! re-read with `fstat` on every request.

use crate::content::block::BlockCodec;
use crate::content::header::{FileHeader, FileId, FLAG_SPARSE, FLAG_UNSETTLED, HEADER_LEN};
use crate::content::tail::{self, Tail, TailRule};
use crate::content::{ContentCipher, Layout};
use crate::crash;
use crate::error::{Error, IoContext, Result};
use crate::keys::SubKeys;
use crate::setid::SetIdKeeper;
use crate::stash::{self, StashDir};
use crate::sys;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// What every file of a vault shares: cipher, geometry and keys.
#[derive(Clone, Debug)]
pub struct ContentCtx {
    /// The content AEAD.
    pub cipher: ContentCipher,
    /// Block geometry.
    pub layout: Layout,
    /// The vault's subkeys.
    pub keys: Arc<SubKeys>,
    /// Feature `"unsettled-tails"`: headers may carry UNSETTLED (docs/FORMAT.md §5.8).
    pub unsettled_tails: bool,
    /// Where inner-block stashes go (docs/FORMAT.md §5.9): the vault's top directory, in a
    /// vault with `"unsettled-tails"`.
    pub stashes: Option<Arc<StashDir>>,
    /// Feature `"ordered-growth"` (with `"unsettled-tails"`): an unsettled file ends only at a
    /// block sealed as last, an all-zero header reads as an empty file, and the writer grows a
    /// file in the order that keeps such an end (docs/FORMAT.md §5.7, §5.8). A writer needs
    /// `stashes` for it.
    pub ordered_growth: bool,
}

impl ContentCtx {
    /// A context for `cipher` with `block_size`-byte blocks (without `"unsettled-tails"`).
    pub fn new(cipher: ContentCipher, block_size: u32, keys: Arc<SubKeys>) -> Self {
        let layout = Layout::new(block_size.into(), cipher.overhead() as u64);
        ContentCtx { cipher, layout, keys, unsettled_tails: false, stashes: None, ordered_growth: false }
    }

    /// The same context with feature `"ordered-growth"` on or off (it counts only with
    /// `"unsettled-tails"`).
    pub fn with_ordered_growth(mut self, on: bool) -> Self {
        self.ordered_growth = on;
        self
    }

    /// Whether the crash rules of `"ordered-growth"` apply (docs/FORMAT.md §5.8).
    pub fn ordered(&self) -> bool {
        self.unsettled_tails && self.ordered_growth
    }

    /// The same context with feature `"unsettled-tails"` on or off.
    pub fn with_unsettled_tails(mut self, on: bool) -> Self {
        self.unsettled_tails = on;
        self
    }

    /// The same context keeping inner-block stashes in `root` (docs/FORMAT.md §5.9; only
    /// with `"unsettled-tails"`).
    pub fn with_stashes(mut self, root: &std::path::Path) -> Self {
        self.stashes = Some(Arc::new(StashDir::new(root)));
        self
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
/// What [`CryptFile::load_header`] returns (never stored) for an all-zero header in a vault
/// with `"ordered-growth"`: a first write cut before its header, an empty file.
const HDR_ZERO: u8 = 4;

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
    /// The header on disk carries UNSETTLED (docs/FORMAT.md §5.8).
    unsettled: AtomicBool,
    /// SPARSE was written for holes of this write session only (cleared at settle when they
    /// were all filled).
    provisional_sparse: AtomicBool,
    /// Plaintext bytes that may be on stable storage (the size at open or at the last sync,
    /// less what truncates cut): a rewrite of a final block holding any of them stashes a copy
    /// of the block first.
    durable: AtomicU64,
    /// Where the file ends by the crash rules, while it is read without being settled (a file
    /// found UNSETTLED at open, before [`recover_tail`](Self::recover_tail)).
    view: Mutex<Option<Tail>>,
    /// `view` is set.
    has_view: AtomicBool,
    /// Serializes header rewrites (flags set by writers, cleared by settle).
    hdr_lock: Mutex<()>,
    /// The backing file's mode, and its set-id bits kept through this process's changes.
    setid: SetIdKeeper,
    /// This write session's inner-block stash (docs/FORMAT.md §5.9).
    inner: Mutex<InnerStash>,
    /// A stash found beside the file at open, read while the file is read by the crash rules.
    found: Mutex<Option<stash::Found>>,
    /// `found` is set.
    has_found: AtomicBool,
    /// Held (shared) by a write from its stash to its in-place overwrite; settling takes it
    /// alone, so it never clears UNSETTLED and removes the stash between the two.
    epoch: RwLock<()>,
}

/// The writer's side of an inner-block stash: a ring of records.
#[derive(Debug, Default)]
struct InnerStash {
    /// The stash file, once this session stashed something.
    fd: Option<Arc<std::os::fd::OwnedFd>>,
    /// Where the next record goes.
    pos: u64,
    /// The next record's sequence number.
    seq: u64,
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
            unsettled: AtomicBool::new(false),
            provisional_sparse: AtomicBool::new(false),
            durable: AtomicU64::new(0),
            view: Mutex::new(None),
            has_view: AtomicBool::new(false),
            hdr_lock: Mutex::new(()),
            setid: SetIdKeeper::new(0),
            inner: Mutex::new(InnerStash::default()),
            found: Mutex::new(None),
            has_found: AtomicBool::new(false),
            epoch: RwLock::new(()),
        };
        if f.load_header()? == HDR_ZERO {
            f.load_zero_view()?;
        } else if f.unsettled.load(Ordering::Acquire) {
            f.load_view()?;
        }
        let st = sys::fstat(f.fd()).ctx(|| format!("stat {}", f.what))?;
        f.setid.note(st.st_mode);
        let len = st.st_size as u64;
        let durable = f.plain_size().unwrap_or_else(|_| f.ctx.layout.plain_size_lenient(len));
        f.durable.store(durable, Ordering::Release);
        Ok(f)
    }

    /// Finds where a file found UNSETTLED ends (docs/FORMAT.md §5.8) and reads it that way
    /// until [`recover_tail`](Self::recover_tail); logs a recovered crash once.
    fn load_view(&self) -> Result<()> {
        let l = self.ctx.layout;
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        let tail = if c <= l.header() {
            Tail { size: 0, last: None, rule: TailRule::Settled }
        } else {
            let read = |off: u64, buf: &mut [u8]| {
                sys::pread_full(self.fd(), buf, off).ctx(|| format!("reading {}", self.what))
            };
            let sparse = self.header_state() == HDR_SPARSE;
            tail::resolve(&l, &self.codec, c, sparse, self.ctx.ordered(), &read, &self.what)?.ok_or_else(|| {
                let e = Error::auth(&self.what, "unsettled file: no block at its end authenticates (damaged tail)");
                tracing::error!("{e}");
                e
            })?
        };
        if tail.rule != TailRule::Settled {
            tracing::warn!(
                "{}: recovered crash state ({}): reads as {} bytes",
                self.what,
                tail.rule.describe(),
                tail.size
            );
        }
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(tail);
        self.has_view.store(true, Ordering::Release);
        self.load_found(c);
        Ok(())
    }

    /// Reads a file whose header is all zeros (`"ordered-growth"`: a first write's blocks go
    /// out before its header, docs/FORMAT.md §5.8 rule 4) as empty until
    /// [`recover_tail`](Self::recover_tail) cuts it to 0 bytes.
    fn load_zero_view(&self) -> Result<()> {
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        let rule = TailRule::NoHeader;
        tracing::warn!("{}: recovered crash state ({}): reads as 0 bytes", self.what, rule.describe());
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(Tail { size: 0, last: None, rule });
        self.has_view.store(true, Ordering::Release);
        self.load_found(c);
        Ok(())
    }

    /// Opens the inner-block stash a crashed writer left for this file (docs/FORMAT.md §5.9),
    /// if any; `c` is the ciphertext size. A stash that cannot be read is logged and left.
    fn load_found(&self, c: u64) {
        let Some(dir) = &self.ctx.stashes else { return };
        let l = self.ctx.layout;
        let record = stash::RECORD_HEAD + l.cipher_block() as usize;
        let blocks = c.saturating_sub(l.header()).div_ceil(l.cipher_block());
        match dir.open(self.id(), record, blocks) {
            Ok(Some(f)) => {
                *self.found.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
                self.has_found.store(true, Ordering::Release);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("{}: cannot read: {e}", dir.path_of(self.id()).display()),
        }
    }

    /// Block `n`'s plaintext from the record of the found stash with the highest sequence
    /// number that gives it: a block record that authenticates as block `n` of this file, or
    /// (in a SPARSE file) a hole record.
    fn stashed_block(&self, n: u64, out: &mut [u8]) -> Option<usize> {
        if !self.has_found.load(Ordering::Acquire) {
            return None;
        }
        let g = self.found.lock().unwrap_or_else(|e| e.into_inner());
        let f = g.as_ref()?;
        let cb = self.ctx.layout.cipher_block() as usize;
        let sparse = self.header_state() == HDR_SPARSE;
        let hole = |out: &mut [u8]| {
            let len = cb - self.codec.overhead();
            out[..len].fill(0);
            Some(len)
        };
        let mut ct = vec![0u8; cb];
        for kept in f.of(n) {
            let off = match kept {
                stash::Kept::Hole if sparse => return hole(out),
                stash::Kept::Hole => continue,
                stash::Kept::Block(off) => off,
            };
            if !matches!(sys::pread_full(f.fd.as_fd(), &mut ct, off), Ok(got) if got == cb) {
                continue;
            }
            if let Ok(len) = self.codec.open_into(n, false, &ct, out, &self.what) {
                return Some(len);
            }
        }
        None
    }

    /// Puts back, from the found stash, every inner block below `blocks` that no longer
    /// authenticates (a torn overwrite); returns how many.
    fn restore_from_stash(&self, blocks: u64) -> Result<usize> {
        if !self.has_found.load(Ordering::Acquire) {
            return Ok(0);
        }
        let l = self.ctx.layout;
        let cb = l.cipher_block() as usize;
        let ranges: Vec<(u64, u64)> = {
            let g = self.found.lock().unwrap_or_else(|e| e.into_inner());
            g.as_ref().map(|f| f.ranges()).unwrap_or_default()
        };
        let (mut ct, mut plain) = (vec![0u8; cb], vec![0u8; l.block_size as usize]);
        let mut restored = 0;
        for (a, b) in ranges {
            // Inner blocks only: the final block is the end rules' business.
            let mut n = a;
            while n < b.min(blocks.saturating_sub(1)) {
                // What the backing file holds as a hole was never written, so no crash tore
                // it: skip to the next data (a hole record may span a whole sparse file).
                match sys::seek_data(self.fd(), l.block_offset(n)) {
                    Ok(off) if off >= l.block_offset(n + 1) => {
                        n = (off - l.block_offset(0)) / cb as u64;
                        continue;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
                    _ => {}
                }
                if self.restore_block(n, &mut ct, &mut plain)? {
                    restored += 1;
                }
                n += 1;
            }
        }
        Ok(restored)
    }

    /// Puts back inner block `n` from its newest record that authenticates, if the block
    /// itself does not (`ct`, `plain`: buffers of a cipher and a plain block); true if it did.
    fn restore_block(&self, n: u64, ct: &mut [u8], plain: &mut [u8]) -> Result<bool> {
        let l = self.ctx.layout;
        let got = sys::pread_full(self.fd(), ct, l.block_offset(n)).ctx(|| format!("reading {}", self.what))?;
        let hole = self.header_state() == HDR_SPARSE && ct[..got].iter().all(|&b| b == 0);
        if got == ct.len() && (hole || self.codec.open_into(n, false, ct, plain, &self.what).is_ok()) {
            return Ok(false);
        }
        let Some(len) = self.stashed_block(n, plain) else { return Ok(false) };
        let is_hole = self.header_state() == HDR_SPARSE && plain[..len].iter().all(|&b| b == 0);
        if is_hole {
            ct.fill(0);
        } else {
            self.codec.seal_into(n, false, &plain[..len], ct);
        }
        sys::pwrite_all(self.fd(), ct, l.block_offset(n)).ctx(|| format!("writing {}", self.what))?;
        tracing::warn!("{}: block {n} torn by a crash; written back from its record in the stash", self.what);
        Ok(true)
    }

    /// Removes the found stash (the file is settled).
    fn drop_found(&self) {
        if self.has_found.swap(false, Ordering::AcqRel) {
            *self.found.lock().unwrap_or_else(|e| e.into_inner()) = None;
            self.remove_stash();
        }
    }

    /// Removes this file's stash file, if this vault keeps them (missing is fine).
    fn remove_stash(&self) {
        if let Some(dir) = &self.ctx.stashes {
            if let Err(e) = dir.remove(self.id()) {
                tracing::warn!("{}: cannot remove: {e}", dir.path_of(self.id()).display());
            }
        }
    }

    /// Ends the write session's inner-block stash: removes the file.
    fn end_inner(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.fd.take().is_some() {
            self.remove_stash();
        }
        g.pos = 0;
    }

    /// Before a write of `nblocks` blocks that logs inner blocks (and before it holds
    /// `epoch`): when its records would run past the ring, waits for the writes in flight
    /// (their records are then no longer needed) and starts the ring again.
    fn ring_room(&self, nblocks: u64) {
        let rec = (stash::RECORD_HEAD as u64 + self.ctx.layout.cipher_block()) * nblocks;
        let full = |g: &InnerStash| g.fd.is_some() && g.pos > 0 && g.pos + rec > stash::RING;
        if !full(&self.inner.lock().unwrap_or_else(|e| e.into_inner())) {
            return;
        }
        let _all = self.epoch.write().unwrap_or_else(|e| e.into_inner());
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if full(&g) {
            g.pos = 0;
        }
    }

    /// Logs the inner blocks `first..=upto` of a write (docs/FORMAT.md §5.9) before it goes
    /// out: `cts` holds their new ciphertexts (full blocks from `first` on). A hole this
    /// session made gets a hole record per run instead (a write-back flush filling a
    /// stream's holes out of order: one record per write, no copy). One `pwrite` to the
    /// stash, outside the lock (which only hands out the place and sequence numbers). A full
    /// disk is no reason to refuse the write: it goes on without the record (logged) — except
    /// when `strict` (the old final block of a growing write with `"ordered-growth"`, which a
    /// crash could otherwise lose, fsynced bytes and all): then any failure to log is the
    /// write's error, before a byte of the file is written.
    fn log_inner(&self, first: u64, upto: u64, cts: &[u8], strict: bool) -> Result<()> {
        let Some(dir) = &self.ctx.stashes else {
            return match strict {
                true => Err(Error::io(&self.what, std::io::Error::from_raw_os_error(libc::EIO))),
                false => Ok(()),
            };
        };
        let cb = self.ctx.layout.cipher_block() as usize;
        let rec = stash::RECORD_HEAD + cb;
        let mut recs = Vec::with_capacity((upto - first + 1) as usize * rec);
        let mut hole_from = None;
        for n in first..=upto {
            if self.pending_hole(n) {
                hole_from.get_or_insert(n);
                continue;
            }
            if let Some(a) = hole_from.take() {
                stash::hole_record(&mut recs, a, n, cb);
            }
            let i = (n - first) as usize * cb;
            stash::block_record(&mut recs, n, &cts[i..i + cb]);
        }
        if let Some(a) = hole_from {
            stash::hole_record(&mut recs, a, upto + 1, cb);
        }
        let (fd, at) = {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if g.fd.is_none() {
                match dir.create(self.id()) {
                    Ok(fd) => g.fd = Some(Arc::new(fd)),
                    Err(e) if strict => {
                        return Err(Error::io(format!("creating {}", dir.path_of(self.id()).display()), e))
                    }
                    Err(e) => {
                        tracing::warn!("{}: cannot create ({e}); writing without it", dir.path_of(self.id()).display());
                        return Ok(());
                    }
                }
                g.pos = 0;
            }
            if g.pos + recs.len() as u64 > stash::READ_LIMIT {
                if strict {
                    let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
                    return Err(Error::io(format!("writing {}", dir.path_of(self.id()).display()), e));
                }
                // Only with dozens of writes in flight at once: no reader would look there.
                tracing::warn!("{}: stash full; writing blocks {first}..={upto} without it", self.what);
                return Ok(());
            }
            stash::number(&mut recs, rec, g.seq);
            g.seq += (recs.len() / rec) as u64;
            let at = g.pos;
            g.pos += recs.len() as u64;
            (g.fd.clone().expect("just set"), at)
        };
        // A write refused part-way leaves a cut record there, which no reader takes for one
        // (it does not authenticate).
        match sys::pwrite_all(fd.as_fd(), &recs, at) {
            Ok(()) => {}
            Err(e) if !strict && matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)) => {
                tracing::debug!("{}: no room to stash blocks {first}..={upto} ({e}); going on without", self.what);
                return Ok(());
            }
            Err(e) => return Err(Error::io(format!("writing {}", dir.path_of(self.id()).display()), e)),
        }
        crash::point!("file.inner_stashed");
        Ok(())
    }

    /// How a file found UNSETTLED at open ends (rule and plaintext size), while it is read
    /// by the crash rules; `None` for a settled file. For fsck.
    pub fn crash_state(&self) -> Option<(TailRule, u64)> {
        if !self.has_view.load(Ordering::Acquire) {
            return None;
        }
        self.view.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|t| (t.rule, t.size))
    }

    /// Settles a file found UNSETTLED at open: rewrites its tail as the crash rules read it
    /// (the block that ends it sealed as last, at its place, and the file cut after it) and
    /// clears the flag. Each step leaves a state the rules read the same way: the block is
    /// first stashed after the end, so a crash while it is rewritten in place loses nothing.
    /// Returns the rule that had applied, `None` when there was nothing to settle. Needs a
    /// writable file; run by the mount at open and by `fsck --repair`.
    pub fn recover_tail(&self) -> Result<Option<TailRule>> {
        if !self.has_view.load(Ordering::Acquire) {
            return Ok(None);
        }
        self.keeping_setid(|| self.recover_tail_now())
    }

    fn recover_tail_now(&self) -> Result<Option<TailRule>> {
        let _g = self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        let Some(t) = v.as_ref() else { return Ok(None) };
        // Torn inner blocks first (docs/FORMAT.md §5.9): the stash goes only once the header
        // no longer sends a reader to it.
        self.restore_from_stash(self.ctx.layout.block_count(t.size))?;
        self.rewrite_tail(t)?;
        self.drop_found();
        let rule = t.rule;
        *v = None;
        self.has_view.store(false, Ordering::Release);
        Ok(Some(rule))
    }

    fn rewrite_tail(&self, t: &Tail) -> Result<()> {
        let l = self.ctx.layout;
        let cut = |len: u64| sys::ftruncate(self.fd(), len).ctx(|| format!("truncating {}", self.what));
        if t.size == 0 {
            cut(0)?;
            self.header.store(HDR_ABSENT, Ordering::Release);
            self.unsettled.store(false, Ordering::Release);
            return Ok(());
        }
        if let Some((n, plain)) = &t.last {
            let mut ct = vec![0u8; plain.len() + l.overhead as usize];
            self.codec.seal_into(*n, true, plain, &mut ct);
            if t.rule != TailRule::Stash {
                // Drop what lies after the block (a torn block, holes): still read the same.
                cut(l.block_offset(n + 1))?;
                self.write_stash(*n, &ct, l.block_offset(n + 1), l.block_offset(n + 1))?;
            }
            sys::pwrite_all(self.fd(), &ct, l.block_offset(*n)).ctx(|| format!("writing {}", self.what))?;
            cut(l.cipher_size(t.size))?;
        }
        self.write_header(self.header_state() == HDR_SPARSE, false)
    }

    /// Writes a stash of block `n` (its ciphertext sealed as last, `ct`) at offset `at`,
    /// after the file's end (docs/FORMAT.md §5.8); returns whether it was written. Where the
    /// backing store has no room for it, the file is cut back to `at` and the step goes on
    /// without one (the crash window of a file without the feature, logged), so a full disk
    /// never refuses a write inside the file or a truncate that frees space.
    fn write_stash(&self, n: u64, ct: &[u8], at: u64, end: u64) -> Result<bool> {
        match sys::pwrite_all(self.fd(), &tail::stash_bytes(n, ct), at) {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)) => {
                tracing::debug!("{}: no room to stash block {n} ({e}); going on without", self.what);
                sys::ftruncate(self.fd(), end).ctx(|| format!("truncating {}", self.what))?;
                return Ok(false);
            }
            Err(e) => return Err(Error::io(format!("writing {}", self.what), e)),
        }
        crash::point!("file.tail_stashed");
        Ok(true)
    }

    /// Whether this writer marks tail changes with UNSETTLED: the vault has the feature and
    /// this process owns the file (see [`set_defer_sparse`](Self::set_defer_sparse)).
    fn unsettled_ok(&self) -> bool {
        self.ctx.unsettled_tails && self.deferring()
    }

    /// Sets UNSETTLED in the header before the first change of the file's tail of a write
    /// session (a no-op when set, or when the header is absent: the first write's header
    /// carries the flag).
    fn ensure_unsettled(&self) -> Result<()> {
        if !self.unsettled_ok() || self.unsettled.load(Ordering::Acquire) {
            return Ok(());
        }
        let _g = self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner());
        match self.header_state() {
            _ if self.unsettled.load(Ordering::Acquire) => Ok(()),
            HDR_ABSENT | HDR_UNKNOWN => Ok(()),
            s => self.write_header(s == HDR_SPARSE, true),
        }
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
    ///
    /// In a vault with `"unsettled-tails"` the same switch makes this writer set UNSETTLED
    /// before it changes the file's tail, and write SPARSE (provisionally) before a write
    /// makes a hole: a crash then leaves holes that read as zeros and a tail the crash rules
    /// read (docs/FORMAT.md §5.8). [`settle`](Self::settle) clears both when they are no
    /// longer needed.
    pub fn set_defer_sparse(&self, on: bool) {
        self.defer_sparse.store(on, Ordering::Relaxed);
    }

    /// Settles the header: writes SPARSE if holes made by earlier writes are still unfilled
    /// (see [`set_defer_sparse`](Self::set_defer_sparse)), or clears a provisional SPARSE whose
    /// holes were all filled, and clears UNSETTLED. Run on the last close and by
    /// [`sync`](Self::sync). Returns whether it wrote the header (which moves the backing
    /// file's modification and change times: a mount tells the kernel).
    pub fn settle(&self) -> Result<bool> {
        let flagged = self.unsettled.load(Ordering::Acquire) || self.provisional_sparse.load(Ordering::Acquire);
        if !self.has_pending.load(Ordering::Acquire) && !flagged {
            return Ok(false);
        }
        let _e = self.epoch.write().unwrap_or_else(|e| e.into_inner());
        self.keeping_setid(|| self.settle_now())
    }

    fn settle_now(&self) -> Result<bool> {
        let _g = self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let state = self.header_state();
        let present = state == HDR_PLAIN || state == HDR_SPARSE;
        let provisional = self.provisional_sparse.load(Ordering::Acquire);
        let sparse = (state == HDR_SPARSE && !(provisional && p.is_empty())) || (!provisional && !p.is_empty());
        let write = present && (self.unsettled.load(Ordering::Acquire) || sparse != (state == HDR_SPARSE));
        if write {
            crash::point!("file.settle_sparse");
            // Bookkeeping, not a change of content: the file keeps the modification time that
            // its last write, or a utimensat(2) since (one that came before this last close's
            // RELEASE, which the kernel sends in the background), gave it.
            let before = sys::fstat(self.fd()).ok();
            self.write_header(sparse, false)?;
            if let Some(st) = before {
                self.put_back_mtime(&st);
            }
        }
        self.provisional_sparse.store(false, Ordering::Release);
        p.clear();
        self.has_pending.store(false, Ordering::Release);
        drop(p);
        // The session ends: its inner-block stash goes (docs/FORMAT.md §5.9).
        if !self.unsettled.load(Ordering::Acquire) && !self.has_view.load(Ordering::Acquire) {
            self.end_inner();
        }
        Ok(write)
    }

    /// Sets the backing file's modification time back to `before`'s (a header write of the
    /// daemon's own moved it). Best effort: a failure leaves the time of that write.
    fn put_back_mtime(&self, before: &sys::Stat) {
        let omit = libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT };
        let mtime = libc::timespec { tv_sec: before.st_mtime, tv_nsec: before.st_mtime_nsec };
        if let Err(e) = sys::futimens(self.fd(), &[omit, mtime]) {
            tracing::debug!("{}: modification time not put back after settling: {e}", self.what);
        }
    }

    /// Holds off [`settle`](Self::settle)'s header write while the caller sets the backing
    /// file's times, so that settling never puts back a time read before them.
    pub fn times_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner())
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
        let zero = n == HEADER_LEN && self.ctx.ordered() && buf.iter().all(|&b| b == 0);
        let state = if n == 0 || zero {
            self.unsettled.store(false, Ordering::Release);
            HDR_ABSENT
        } else {
            let h = FileHeader::decode(&buf[..n], &self.ctx.keys, &self.what)?;
            if h.is_unsettled() && !self.ctx.unsettled_tails {
                return Err(Error::auth(
                    &self.what,
                    format!(
                        "unknown file header flags {:#x} (UNSETTLED in a vault without \"unsettled-tails\")",
                        h.flags
                    ),
                ));
            }
            self.unsettled.store(h.is_unsettled(), Ordering::Release);
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
        Ok(if zero { HDR_ZERO } else { state })
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
        if self.has_view.load(Ordering::Acquire) {
            if let Some(t) = self.view.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                return Ok(t.size);
            }
        }
        let len = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        self.ctx.layout.plain_size(len).map_err(|e| match e {
            Error::Auth { detail, .. } => Error::auth(&self.what, detail),
            e => e,
        })
    }

    fn header_bytes(&self, sparse: bool, unsettled: bool) -> [u8; HEADER_LEN] {
        let flags = if sparse { FLAG_SPARSE } else { 0 } | if unsettled { FLAG_UNSETTLED } else { 0 };
        FileHeader { flags, id: *self.codec.file_id() }.encode(&self.ctx.keys)
    }

    fn write_header(&self, sparse: bool, unsettled: bool) -> Result<()> {
        sys::pwrite_all(self.fd(), &self.header_bytes(sparse, unsettled), 0)
            .ctx(|| format!("writing header of {}", self.what))?;
        self.header.store(if sparse { HDR_SPARSE } else { HDR_PLAIN }, Ordering::Release);
        self.unsettled.store(unsettled, Ordering::Release);
        Ok(())
    }

    /// Decrypts block `n` (whose ciphertext is `ct`) into `out`; `last` tells whether it is the
    /// file's last block. In a sparse file an all-zero ciphertext block is a hole.
    fn open_block(&self, n: u64, last: bool, ct: &[u8], out: &mut [u8]) -> Result<usize> {
        if self.has_view.load(Ordering::Acquire) {
            if let Some(len) = self.view_block(n, out) {
                return Ok(len);
            }
        }
        if !last
            && (self.header_state() == HDR_SPARSE || self.has_pending.load(Ordering::Acquire))
            && ct.iter().all(|&b| b == 0)
            && (self.header_state() == HDR_SPARSE || self.pending_hole(n))
        {
            let len = ct.len() - self.codec.overhead();
            out[..len].fill(0);
            return Ok(len);
        }
        match self.codec.open_into(n, last, ct, out, &self.what) {
            Ok(len) => Ok(len),
            Err(e) => match (!last).then(|| self.stashed_block(n, out)).flatten() {
                Some(len) => Ok(len),
                None => {
                    tracing::error!("{e}");
                    Err(e)
                }
            },
        }
    }

    /// The plaintext of block `n` when the crash rules end the file with it.
    fn view_block(&self, n: u64, out: &mut [u8]) -> Option<usize> {
        let v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        let (m, plain) = v.as_ref()?.last.as_ref()?;
        (*m == n).then(|| {
            out[..plain.len()].copy_from_slice(plain);
            plain.len()
        })
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
    /// `fsck --repair` and `export --salvage` (recovery keeps what is intact). `sink(data)` receives the
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
        if c <= l.header() || self.load_header()? == HDR_ZERO {
            return Ok(out);
        }
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
                    .or_else(|| (!is_final).then(|| self.stashed_block(n, &mut plain)).flatten())
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
    ///
    /// With UNSETTLED (docs/FORMAT.md §5.8) a write that changes the final block first sets
    /// the flag (once per write session), and when that block may hold fsynced bytes, first
    /// stashes its old ciphertext after the end: a crash in the `pwrite` that rewrites it
    /// then leaves the stash to read it from.
    pub fn write_at(&self, data: &[u8], off: u64, size: u64) -> Result<u64> {
        if data.is_empty() {
            return Ok(size);
        }
        self.keeping_setid(|| self.write_at_now(data, off, size))
    }

    fn write_at_now(&self, data: &[u8], off: u64, size: u64) -> Result<u64> {
        self.recover_tail()?;
        let l = self.ctx.layout;
        let end = off + data.len() as u64;
        let (first, last) = l.blocks_touched(off, data.len() as u64).expect("non-empty");
        let csize = l.cipher_size(size);
        let old_last = size.saturating_sub(1) / l.block_size;
        let touches_tail = size == 0 || end > size || last >= old_last;
        let ordered = self.ordered_writer();
        // The write reaches past the old final block (which becomes an inner block).
        let grows = size > 0 && last > old_last;
        // Inner blocks overwritten in place are logged first (docs/FORMAT.md §5.9), and the
        // session is not settled until they are written. With "ordered-growth" a growing
        // write logs the old final block's new inner ciphertext as well, and must.
        let inner = self.unsettled_ok() && self.ctx.stashes.is_some() && size > 0 && first < old_last;
        let log = if ordered && grows {
            Some((first.min(old_last), old_last, true))
        } else {
            inner.then(|| (first, last.min(old_last - 1), false))
        };
        if touches_tail || inner {
            self.ensure_unsettled()?;
        }
        if let Some((from, upto, _)) = log {
            self.ring_room(upto - from + 1);
        }
        let _epoch = log.is_some().then(|| self.epoch.read().unwrap_or_else(|e| e.into_inner()));
        // The final block rewritten in place is stashed first: always with "ordered-growth"
        // (a torn rewrite has no other end to fall back to), else when it may hold fsynced
        // bytes. A growing write needs no stash with "ordered-growth": its record covers it.
        let stash = self.unsettled_ok()
            && size > 0
            && touches_tail
            && if ordered { !grows } else { old_last * l.block_size < self.durable.load(Ordering::Acquire) };
        // Holes inside the old size that a full disk refused part-way are zeroed again.
        let holes = self.may_have_holes();
        let repair = |e: &Error| {
            let full = matches!(e, Error::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)));
            if holes && full {
                self.zero_torn_hole(l.block_offset(first), csize.min(l.block_offset(last + 1)));
            }
        };
        if end <= size && !stash {
            return self.write_blocks(data, off, size, None, false, log).inspect_err(repair);
        }
        // In a grow the old last block is always touched: re-sealed as an inner block, or
        // rewritten longer.
        let old = match size {
            0 => None,
            _ => Some((old_last, self.read_block_ct(old_last, size)?)),
        };
        self.write_blocks(data, off, size, old.as_ref(), stash, log).inspect_err(|e| {
            repair(e);
            self.undo(Some(csize), old.as_ref())
        })
    }

    /// Whether this writer grows files in the order of `"ordered-growth"` (docs/FORMAT.md
    /// §5.7): the vault has it, this writer marks tail changes with UNSETTLED, and it has the
    /// stash the old final block's record goes to.
    fn ordered_writer(&self) -> bool {
        self.unsettled_ok() && self.ctx.ordered() && self.ctx.stashes.is_some()
    }

    /// [`write_at`](Self::write_at) without the undo; `old` is the old last block and its
    /// ciphertext when the write grows the file (or stashes it); `stash`: write a stash of it
    /// first, and remove it once the block is rewritten; `log`: log blocks `from..=upto` in
    /// the inner-block stash before they are written (`strict`: or fail the write).
    ///
    /// With `"ordered-growth"` (docs/FORMAT.md §5.7) a first write goes out before the header,
    /// and a growing write logs the old final block's new inner ciphertext, writes the new
    /// blocks, and only then that block (with any inner blocks before it) in place: at every
    /// step a block sealed as last ends the file.
    fn write_blocks(
        &self,
        data: &[u8],
        off: u64,
        size: u64,
        old: Option<&(u64, Vec<u8>)>,
        stash: bool,
        log: Option<(u64, u64, bool)>,
    ) -> Result<u64> {
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
        // With "ordered-growth" it goes out after the blocks (a crash before it leaves an
        // all-zero header: an empty file); the SPARSE it carries.
        let mut header_after = None;
        let ordered = self.ordered_writer();
        // With UNSETTLED, SPARSE goes out before the hole is made (provisionally: settle
        // clears it if the hole is filled first); without, only when not deferred.
        let unsettled = self.unsettled_ok();
        let eager_sparse = leaves_holes && (!self.deferring() || unsettled);
        if ordered && size == 0 && matches!(self.header_state(), HDR_PLAIN | HDR_SPARSE) {
            // A header alone (an empty file): gone first, so that the header is written last.
            sys::ftruncate(self.fd(), 0).ctx(|| format!("truncating {}", self.what))?;
            self.header.store(HDR_ABSENT, Ordering::Release);
            self.unsettled.store(false, Ordering::Release);
        }
        let settled_sparse = self.header_state() == HDR_SPARSE && !self.provisional_sparse.load(Ordering::Acquire);
        match self.header_state() {
            HDR_ABSENT | HDR_UNKNOWN if size == 0 && ordered => {
                self.provisional_sparse.store(eager_sparse && unsettled, Ordering::Release);
                header_after = Some(eager_sparse);
            }
            HDR_ABSENT | HDR_UNKNOWN if size == 0 && first == 0 => {
                header_with_data = Some(self.header_bytes(false, unsettled))
            }
            HDR_ABSENT | HDR_UNKNOWN if size == 0 => {
                self.provisional_sparse.store(eager_sparse && unsettled, Ordering::Release);
                self.write_header(eager_sparse, unsettled)?;
                crash::point!("file.header_alone");
            }
            HDR_PLAIN if eager_sparse => {
                let _g = self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner());
                self.provisional_sparse.store(unsettled, Ordering::Release);
                self.write_header(true, self.unsettled.load(Ordering::Acquire))?;
            }
            _ => {}
        }
        let new_holes = leaves_holes && self.deferring() && !settled_sparse;
        let stashed = match old {
            Some((n, ct)) if stash && self.write_stash(*n, ct, l.block_offset(n + 1), l.cipher_size(size))? => {
                Some(l.block_offset(n + 1) + (ct.len() + tail::STASH_TRAILER) as u64)
            }
            _ => None,
        };
        // The old last block loses its "last" flag (and is zero-extended: inner blocks are
        // full) when the write starts beyond it. Next to the write it goes out in the same
        // system call; beyond a hole, on its own (with "ordered-growth", after the write).
        let mut prefix: Vec<u8> = Vec::new();
        let mut reseal_after: Option<Vec<u8>> = None;
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
                } else if ordered {
                    reseal_after = Some(old);
                } else {
                    sys::pwrite_all(self.fd(), &old, l.block_offset(old_last))
                        .ctx(|| format!("writing {}", self.what))?;
                    crash::point!("file.reseal_alone");
                    // The stash lies where a hole goes: the re-sealed block now holds it all.
                    if stashed.is_some() {
                        sys::ftruncate(self.fd(), l.block_offset(old_last + 1))
                            .ctx(|| format!("truncating {}", self.what))?;
                    }
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
            if let Some((from, upto, strict)) = log {
                let at = l.block_offset(from);
                let cts = match at.checked_sub(write_off) {
                    Some(i) => &buf[i as usize..],
                    None => reseal_after.as_deref().expect("the old last block, re-sealed"),
                };
                self.log_inner(from, upto, cts, strict)?;
                if strict {
                    crash::point!("file.growth_logged");
                }
            }
            let writing =
                |b: &[u8], at: u64| sys::pwrite_all(self.fd(), b, at).ctx(|| format!("writing {}", self.what));
            if ordered && size > 0 && last >= old_blocks {
                // The new blocks first (the old final block, still sealed as last, ends the
                // file until they are all written), then the blocks before them in place.
                let split = (l.block_offset(old_blocks).max(write_off) - write_off) as usize;
                let (before, new) = buf.split_at(split);
                crash::torn!("file.torn_write", self.fd(), new, write_off + split as u64);
                writing(new, write_off + split as u64)?;
                crash::point!("file.grown");
                if !before.is_empty() {
                    crash::torn!("file.torn_reseal", self.fd(), before, write_off);
                    writing(before, write_off)?;
                }
                return Ok(());
            }
            if first + 1 < l.block_count(size) {
                crash::torn!("file.torn_inner", self.fd(), buf, write_off);
            }
            crash::torn!("file.torn_write", self.fd(), buf, write_off);
            writing(buf, write_off)
        })?;
        if let Some(old) = &reseal_after {
            let at = l.block_offset((size - 1) / bs);
            crash::torn!("file.torn_reseal", self.fd(), old, at);
            sys::pwrite_all(self.fd(), old, at).ctx(|| format!("writing {}", self.what))?;
            crash::point!("file.reseal_alone");
        }
        crash::point!("file.after_write");
        if let Some(sparse) = header_after {
            crash::point!("file.before_header");
            self.write_header(sparse, unsettled)?;
        }
        if header_with_data.is_some() {
            self.header.store(HDR_PLAIN, Ordering::Release);
            self.unsettled.store(unsettled, Ordering::Release);
        }
        // What is left of the stash after the file's new end goes.
        let new_csize = l.cipher_size(new_size);
        if stashed.is_some_and(|e| e > new_csize) {
            sys::ftruncate(self.fd(), new_csize).ctx(|| format!("truncating {}", self.what))?;
        }
        self.fill_pending(first, last + 1);
        if new_holes {
            self.add_pending(old_blocks, first);
        }
        Ok(new_size)
    }

    /// Changes the plaintext size of a file of `size` bytes to `new_size`.
    pub fn truncate(&self, new_size: u64, size: u64) -> Result<()> {
        if new_size == size {
            return Ok(());
        }
        self.keeping_setid(|| self.truncate_now(new_size, size))
    }

    fn truncate_now(&self, new_size: u64, size: u64) -> Result<()> {
        let l = self.ctx.layout;
        self.recover_tail()?;
        if new_size == 0 {
            sys::ftruncate(self.fd(), 0).ctx(|| format!("truncating {}", self.what))?;
            self.header.store(HDR_ABSENT, Ordering::Release);
            self.unsettled.store(false, Ordering::Release);
            self.provisional_sparse.store(false, Ordering::Release);
            self.durable.store(0, Ordering::Release);
            self.fill_pending(0, u64::MAX);
            self.end_inner();
            return Ok(());
        }
        if new_size > size {
            // Growing: write the zeros of the new last block; the blocks in between become
            // holes (or are zero-filled by the write when they share a block with old data).
            let new_last_start = (new_size - 1) / l.block_size * l.block_size;
            let from = size.max(new_last_start);
            let zeros = vec![0u8; (new_size - from) as usize];
            self.write_at_now(&zeros, from, size)?;
            return Ok(());
        }
        // Shrinking: re-seal the new last block (shorter, and flagged last), then cut. If
        // either step fails, the block's old ciphertext goes back (a hole is allocated first,
        // so a full disk fails before the block is half written). With UNSETTLED the new
        // block is first stashed after the old end, so a crash before the cut reads it there.
        self.ensure_unsettled()?;
        // Records of blocks cut off must never come back for blocks written there later: the
        // session's stash starts again (what it kept of the blocks that stay is already
        // written over, or is stashed again before it is).
        self.end_inner();
        let n = (new_size - 1) / l.block_size;
        let old = self.read_block_ct(n, size)?;
        let mut blk = vec![0u8; l.block_size as usize];
        self.open_block(n, n == (size - 1) / l.block_size, &old, &mut blk)?;
        let blen = l.block_len(n, new_size) as usize;
        let mut ct = vec![0u8; blen + l.overhead as usize];
        self.codec.seal_into(n, true, &blk[..blen], &mut ct);
        self.reserve_holes(l.block_offset(n), ct.len() as u64)?;
        let old = (n, old);
        let stash_at = l.block_offset(l.block_count(size));
        let csize = l.cipher_size(size);
        let stash = self.unsettled_ok() && self.write_stash(n, &ct, stash_at, csize)?;
        sys::pwrite_all(self.fd(), &ct, l.block_offset(n))
            .ctx(|| format!("writing {}", self.what))
            .and_then(|()| {
                crash::point!("file.shrink_resealed");
                sys::ftruncate(self.fd(), l.cipher_size(new_size)).ctx(|| format!("truncating {}", self.what))
            })
            .inspect_err(|_| self.undo(stash.then_some(csize), Some(&old)))?;
        self.fill_pending(n, u64::MAX);
        self.durable.fetch_min(new_size, Ordering::AcqRel);
        Ok(())
    }

    /// Flushes data and metadata to stable storage (`fdatasync` when `data_only`).
    ///
    /// Holes are declared before the flush. UNSETTLED is cleared after it: the flush makes
    /// a complete tail durable first, so a crash after a sync never needs the crash rules for
    /// what it flushed (the cleared header reaches the disk with the next flush). Returns
    /// whether the header was written (see [`settle`](Self::settle)).
    pub fn sync(&self, data_only: bool) -> Result<bool> {
        let before = !self.unsettled_ok() && self.settle()?;
        let r = if data_only { sys::fdatasync(self.fd()) } else { sys::fsync(self.fd()) };
        r.ctx(|| format!("syncing {}", self.what))?;
        let len = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        self.durable.fetch_max(self.ctx.layout.plain_size_lenient(len), Ordering::AcqRel);
        Ok(self.settle()? || before)
    }

    /// Reserves backing space for plaintext bytes `off..off + len` of a file of `size` bytes
    /// (`fallocate`), so later writes there cannot fail with ENOSPC; with `extend`, also
    /// makes the file `off + len` bytes long if that is longer. Returns the new size.
    pub fn allocate(&self, off: u64, len: u64, extend: bool, size: u64) -> Result<u64> {
        let l = self.ctx.layout;
        let end = off
            .checked_add(len)
            .ok_or_else(|| Error::io(&self.what, std::io::Error::from_raw_os_error(libc::EFBIG)))?;
        let start = l.block_offset(l.block_of(off));
        let cend = l.cipher_size(end);
        self.keeping_setid(|| {
            sys::fallocate(self.fd(), libc::FALLOC_FL_KEEP_SIZE, start, cend.saturating_sub(start))
                .ctx(|| format!("allocating {}", self.what))?;
            match extend && end > size {
                true => self.truncate_now(end, size).map(|()| end),
                false => Ok(size),
            }
        })
    }

    /// The backing file's mode bits (`st_mode & 0o7777`): remembered while this process is
    /// the file's only changer ([`set_defer_sparse`](Self::set_defer_sparse)), else read.
    pub fn mode(&self) -> Result<u32> {
        self.setid.mode(self.fd(), self.deferring()).ctx(|| format!("stat {}", self.what))
    }

    /// Records the mode the file was given through another handle (a chmod by name, or
    /// through the same inode's directory entry), or that the kernel reported.
    pub fn note_mode(&self, st_mode: u32) {
        self.setid.note(st_mode);
    }

    /// `fchmod` of the backing file, remembered (see [`mode`](Self::mode)).
    pub fn chmod(&self, mode: u32) -> Result<()> {
        sys::fchmod(self.fd(), mode & 0o7777).ctx(|| format!("chmod {}", self.what))?;
        self.setid.note(mode);
        Ok(())
    }

    /// Runs `f`, a change of the backing file, keeping the set-id bits the backing
    /// filesystem would clear because this process lacks `CAP_FSETID` (see `setid.rs`).
    fn keeping_setid<R>(&self, f: impl FnOnce() -> R) -> R {
        self.setid.keeping(self.fd(), self.deferring(), &self.what, f)
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
