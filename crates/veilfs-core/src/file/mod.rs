//! The file API: positional read, write and truncate of plaintext over a ciphertext file.
//!
//! [`CryptFile`] is `Sync` and takes `&self` everywhere so a filesystem can run requests on
//! one file in parallel. The contract with the caller (the FUSE layer keeps it with per-file
//! range locks): calls that touch the same blocks, or that change the plaintext size, must not
//! overlap; the caller passes the current plaintext size so the size can be cached instead of
//! re-read with `fstat` on every request.
//!
//! The type, its state and its header live here; the rest is split by concern, so a reader
//! finds "what happens on truncate" by file name:
//! - `read`: positional reads, block decryption, the whole-file stream;
//! - `write`: positional writes, growth, and undoing a write the backing store refused;
//! - `truncate`: size changes and `fallocate`;
//! - `settle`: the session's bookkeeping (UNSETTLED, deferred holes), settling and sync;
//! - `stashing`: the writer's side of the stashes (docs/FORMAT.md §5.8, §5.9);
//! - `recover`: a file found UNSETTLED at open — read by the crash rules, then rewritten;
//! - `salvage`: what still authenticates of a damaged file, for fsck and export;
//! - `mapped`: files with a block map (feature `"block-map"`): header v2, the map's reader
//!   and writer;
//! - `mapsession`: their write sessions, the session's log, and a file a session left
//!   UNSETTLED.

use crate::content::block::BlockCodec;
use crate::content::header::{FileHeader, FileId, FLAG_SPARSE, FLAG_UNSETTLED, HEADER_LEN};
use crate::content::tail::Tail;
use crate::content::{ContentCipher, Layout};
use crate::error::{Error, IoContext, Result};
use crate::keys::SubKeys;
use crate::setid::SetIdKeeper;
use crate::stash::{self, StashDir};
use crate::sys;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

mod mapped;
mod mapsession;
mod read;
mod recover;
mod salvage;
mod settle;
mod stashing;
mod truncate;
mod write;

pub use salvage::Salvaged;

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
    /// Feature `"block-map"`: files carry header v2 and a block map (docs/FORMAT.md §5.10),
    /// read and written by `mapped`; the v1 crash rules above do not apply to them.
    pub block_map: bool,
    /// What this client remembers of the vault (`crate::known`): every header v2 opened is
    /// checked against it, and every header written is remembered and carries its client ID.
    /// `None` for callers that did not ask for it (then no rollback is detected).
    pub known: Option<Arc<crate::known::Known>>,
    /// The check against `known` waits for [`CryptFile::check_known`] after the open instead
    /// of failing it: for a caller that tells a conflict from a rollback (`Vault::open_crypt`).
    pub defer_known: bool,
}

impl ContentCtx {
    /// A context for `cipher` with `block_size`-byte blocks (without `"unsettled-tails"`).
    pub fn new(cipher: ContentCipher, block_size: u32, keys: Arc<SubKeys>) -> Self {
        let layout = Layout::new(block_size.into(), cipher.overhead() as u64);
        ContentCtx {
            cipher,
            layout,
            keys,
            unsettled_tails: false,
            stashes: None,
            ordered_growth: false,
            block_map: false,
            known: None,
            defer_known: false,
        }
    }

    /// The same context with feature `"ordered-growth"` on or off (it counts only with
    /// `"unsettled-tails"`).
    pub fn with_ordered_growth(mut self, on: bool) -> Self {
        self.ordered_growth = on;
        self
    }

    /// The same context with feature `"block-map"` on or off.
    pub fn with_block_map(mut self, on: bool) -> Self {
        self.block_map = on;
        self
    }

    /// The plaintext size a ciphertext file of `cipher_size` bytes has, without reading it:
    /// for listings and attributes. An impossible size gives the size of the blocks it holds
    /// whole ([`Layout::plain_size_lenient`]); reading such a file is an integrity error. With
    /// `"block-map"` the size follows that layout (docs/FORMAT.md §5.10): an impossible one,
    /// or an all-zero header, gives 0.
    pub fn plain_size_lenient(&self, cipher_size: u64) -> u64 {
        match self.block_map {
            true => {
                crate::content::blockmap::MapLayout::from(self.layout).plain_size(cipher_size).map_or(0, |(p, _)| p)
            }
            false => self.layout.plain_size_lenient(cipher_size),
        }
    }

    /// The most plaintext one file can hold in `cipher_bytes` bytes of ciphertext, by the
    /// vault's layout (for `statfs`): with `"block-map"` its map data counts too.
    pub fn plain_capacity(&self, cipher_bytes: u64) -> u64 {
        match self.block_map {
            true => crate::content::blockmap::MapLayout::from(self.layout).plain_capacity(cipher_bytes),
            false => self.layout.plain_capacity(cipher_bytes),
        }
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
    /// Per-thread buffer for the sealed blocks of a write of a file with a block map (see
    /// [`take_sealing`]).
    static SEALING: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A buffer of at least `n` bytes (contents unspecified) for a write's sealed blocks: this
/// thread's, so that a write neither allocates nor zeroes one (a memset of the whole write);
/// hand it back with [`put_sealing`]. A nested or lost one only costs a fresh allocation.
fn take_sealing(n: usize) -> Vec<u8> {
    let mut v = SEALING.take();
    if v.len() < n {
        v.resize(n, 0);
    }
    v
}

fn put_sealing(v: Vec<u8>) {
    SEALING.set(v);
}

/// The block ranges `ranges` (half-open, `[x, y)`) with blocks `a..b` taken out: a range
/// inside it goes, one that overlaps it is cut, one that spans it is split in two.
fn without_range(ranges: &[(u64, u64)], a: u64, b: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for &(x, y) in ranges {
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
    out
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
    /// The caller ends every write session with [`settle`](Self::settle) (at its fsync, last
    /// close or commit): see [`set_session_until_settle`](Self::set_session_until_settle).
    session_until_settle: AtomicBool,
    /// The file's last name is gone while it is open: see [`set_unlinked`](Self::set_unlinked).
    unlinked: AtomicBool,
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
    /// The lowest block a write the kernel had already acknowledged to its application
    /// failed to store (`u64::MAX`: none); see [`lost_write`](Self::lost_write).
    lost_from: AtomicU64,
    /// The size the last truncate or `fallocate` of this process gave the file: asked for
    /// and confirmed, so [`drop_lost`](Self::drop_lost) never cuts below it.
    sized_to: AtomicU64,
    /// The block map of a file in a vault with `"block-map"` (see `mapped`).
    map: Mutex<mapped::MapState>,
    /// Signalled when the last write in place of a file with a block map is done (see
    /// [`map_state_idle`](Self::map_state_idle)).
    map_idle: Condvar,
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
        let f = Self::unloaded(file, ctx, id, what);
        if f.ctx.block_map {
            f.load_map()?;
        } else if f.load_header()? == HDR_ZERO {
            f.load_zero_view()?;
        } else if f.unsettled.load(Ordering::Acquire) {
            f.load_view()?;
        }
        let st = sys::fstat(f.fd()).ctx(|| format!("stat {}", f.what))?;
        f.setid.note(st.st_mode);
        let len = st.st_size as u64;
        let durable = f.plain_size().unwrap_or_else(|_| f.ctx.plain_size_lenient(len));
        f.durable.store(durable, Ordering::Release);
        Ok(f)
    }

    /// Opens `file` for [`salvage`](Self::salvage) alone: as [`open`](Self::open), except that
    /// a file with a block map is not loaded, since its map, its size or its session's log may
    /// be what is damaged (salvage reads and checks them itself, block by block). Such a
    /// handle is for salvage only: it reads as an empty file.
    pub fn open_for_salvage(file: File, ctx: ContentCtx, id: FileId, what: String) -> Result<Self> {
        match ctx.block_map {
            true => Ok(Self::unloaded(file, ctx, id, what)),
            false => Self::open(file, ctx, id, what),
        }
    }

    /// The handle of `file` before its header is read.
    fn unloaded(file: File, ctx: ContentCtx, id: FileId, what: String) -> Self {
        let codec = BlockCodec::new(ctx.cipher, &ctx.keys, id);
        CryptFile {
            file,
            ctx,
            codec,
            header: AtomicU8::new(HDR_UNKNOWN),
            what,
            defer_sparse: AtomicBool::new(false),
            session_until_settle: AtomicBool::new(false),
            unlinked: AtomicBool::new(false),
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
            lost_from: AtomicU64::new(u64::MAX),
            sized_to: AtomicU64::new(0),
            map: Mutex::new(mapped::MapState::default()),
            map_idle: Condvar::new(),
        }
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
        if self.ctx.block_map {
            return self.load_map();
        }
        self.load_header().map(drop)
    }

    fn header_state(&self) -> u8 {
        self.header.load(Ordering::Acquire)
    }

    /// Plaintext size from the backing file's size.
    pub fn plain_size(&self) -> Result<u64> {
        if self.ctx.block_map {
            return self.plain_size_map();
        }
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
