//! Files with a block map (feature `"block-map"`, docs/FORMAT.md §5.10): the reader and the
//! writer.
//!
//! Why a path of its own: a v1 block authenticates its position and "last or not", not its
//! version, so an older copy of a block, an older header with a newer body, or an older final
//! block after a truncate all open. Here the header (v2) commits, through the map root, to
//! the tag of every block; the reader checks each block's tag against its leaf before the
//! AEAD opens it, so any of those is an integrity error like other tampering.
//!
//! The state is per open file ([`MapState`]): the header, the hash of every map block
//! (verified against the root when the file is opened: one node per full span and the map
//! blocks of the last span) and the map blocks read so far (each verified against its hash
//! when first read). A hole is a block whose leaf is 16 zero bytes: it reads as zeros
//! whatever its bytes on disk, and SPARSE means nothing in these files (writers leave it 0).
//!
//! The writer works in write sessions (`mapsession`): blocks go out in place as they are
//! written, the map stays in memory, and the session's end writes the changed map blocks and
//! nodes and then the settled header. A first write into an empty file needs no session: it
//! writes its header last, so a crash before it leaves an all-zero header, an empty file. The
//! state assumes this handle is the file's only writer while it is open.

use super::mapsession::{CommitPlan, Found, Session};
use super::{with_scratch, CryptFile};
use crate::content::blockmap::{
    self as bm, group_count, group_of, group_start, node_count, span_first_group, Hash, HeaderV2, Leaf, MapLayout,
    HEADER_V2_LEN, HOLE_LEAF, LEAF_LEN,
};
use crate::error::{Error, IoContext, Result};
use crate::known::Seen;
use crate::maplog::{Log, NODE_BIT};
use crate::sys;
use std::collections::{BTreeMap, BTreeSet};

/// What [`CryptFile::read_root`] reads: every map block's hash the root's list gives, the
/// leaves of the last span's map blocks, and the root.
pub(super) type RootList = (Vec<Hash>, BTreeMap<u64, Vec<Leaf>>, Hash);

/// The verified map of an open file with a block map.
#[derive(Debug, Default)]
pub(super) struct MapState {
    /// The header on disk; `None` for an empty file (no header, or an all-zero one).
    pub(super) hdr: Option<HeaderV2>,
    /// The file's block count as this handle sees it (in a session, ahead of the header's).
    pub(super) k: u64,
    /// The file's plaintext size as this handle sees it.
    pub(super) size: u64,
    /// The ciphertext is not empty although the file is (an all-zero header, or a header of
    /// 0 blocks): a writer cuts it to 0 bytes first.
    pub(super) stale: bool,
    /// The hash of every map block of the file, verified against the root (or computed by
    /// this writer).
    pub(super) hashes: Vec<Hash>,
    /// The leaves of the map blocks read so far, by group, each verified against its hash.
    pub(super) leaves: BTreeMap<u64, Vec<Leaf>>,
    /// The generation of the last header this handle read or wrote.
    pub(super) generation: u64,
    /// The block count of the map on disk (the last commit's): nodes of spans at or past its
    /// last are new.
    pub(super) k_base: u64,
    /// Groups whose map block bytes changed since the last commit (to be written).
    pub(super) write: BTreeSet<u64>,
    /// Groups whose hash changed since the last commit (their nodes are written).
    pub(super) changed: BTreeSet<u64>,
    /// What the next commit may write, as the writes since the last one reserved it.
    pub(super) plan: CommitPlan,
    /// Writes in place that logged their blocks and have not yet set their leaves (they
    /// write the blocks without this lock, see [`CryptFile::write_in_place`]), and the
    /// callers waiting for there to be none. [`reset`](Self::reset) keeps both.
    pub(super) in_flight: u32,
    pub(super) idle_waiters: u32,
    /// Writes in place waiting for an earlier one's records to be out (`write_records`).
    pub(super) log_waiters: u32,
    /// The write session this handle has open (`mapsession`).
    pub(super) session: Option<Session>,
    /// The file as a crashed (or still running) session left it, read by its log until it
    /// is settled (`mapsession`).
    pub(super) found: Option<Found>,
    /// Holes (block ranges, half-open) this handle's writes past the end made and no write
    /// has filled since: where a write-back write the kernel acknowledged may have been
    /// refused (see [`CryptFile::drop_lost`]). Truncates' holes are not in it: their zeros
    /// were asked for.
    pub(super) made_holes: Vec<(u64, u64)>,
}

impl MapState {
    pub(super) fn blocks(&self) -> u64 {
        self.k
    }

    /// The block count the map on disk is read with: the header's while a found session is
    /// read without its commit record, else the file's.
    fn map_count(&self) -> u64 {
        match &self.found {
            Some(f) if f.commit.is_none() => f.k0,
            _ => self.k,
        }
    }

    /// Sets the cached leaf of block `n` (its group's leaves, extended with holes as
    /// needed); returns its group.
    pub(super) fn set_leaf(&mut self, n: u64, leaf: Leaf) -> u64 {
        let g = group_of(n);
        let v = self.leaves.entry(g).or_default();
        let at = (n - group_start(g)) as usize;
        if v.len() <= at {
            v.resize(at + 1, HOLE_LEAF);
        }
        v[at] = leaf;
        g
    }

    /// Forgets the holes in blocks `a..b` (written, or cut off).
    fn fill_holes(&mut self, a: u64, b: u64) {
        if self.made_holes.is_empty() {
            return;
        }
        self.made_holes = super::without_range(&self.made_holes, a, b);
    }

    /// Back to an empty file, keeping the generation (and the count of writes in flight and
    /// of their waiters, which are not the file's).
    pub(super) fn reset(&mut self) {
        let (generation, in_flight, idle_waiters, log_waiters) =
            (self.generation, self.in_flight, self.idle_waiters, self.log_waiters);
        *self = MapState { generation, in_flight, idle_waiters, log_waiters, ..MapState::default() };
    }
}

impl CryptFile {
    pub(super) fn map_layout(&self) -> MapLayout {
        self.ctx.layout.into()
    }

    /// The map, for reading it or for a write in place (which leaves the session open and the
    /// file's size as it is).
    pub(super) fn map_state(&self) -> std::sync::MutexGuard<'_, MapState> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The map once no write in place is in flight, for everything else that changes it:
    /// starting or ending a session, a write that changes the size, a truncate, loading. A
    /// write in flight has its records in the log and its leaves not yet in the map, so a
    /// commit meanwhile would leave its block unmatched by its leaf; while a caller waits
    /// here, new writes take this way too, so that a stream of them cannot starve it.
    pub(super) fn map_state_idle(&self) -> std::sync::MutexGuard<'_, MapState> {
        let mut st = self.map_state();
        if st.in_flight > 0 {
            st.idle_waiters += 1;
            st = self.map_idle.wait_while(st, |st| st.in_flight > 0).unwrap_or_else(|e| e.into_inner());
            st.idle_waiters -= 1;
        }
        st
    }

    pub(super) fn map_auth(&self, detail: impl Into<String>) -> Error {
        let e = Error::auth(&self.what, detail);
        tracing::error!("{e}");
        e
    }

    /// EFBIG if a file of `k` blocks is beyond what this implementation writes or reads
    /// ([`MapLayout::max_written_blocks`]): its map in memory and its nodes on disk would
    /// grow without bound (a sparse file of an absurd size exhausted the daemon's memory).
    pub(super) fn check_map_size(&self, k: u64) -> Result<()> {
        let max = self.map_layout().max_written_blocks();
        if k > max {
            return Err(Error::io(
                format!("{}: {k} blocks, beyond the {max} of a file with a block map", self.what),
                std::io::Error::from_raw_os_error(libc::EFBIG),
            ));
        }
        Ok(())
    }

    pub(super) fn pread_exact(&self, len: u64, at: u64, what: &str) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        let got = sys::pread_full(self.fd(), &mut buf, at).ctx(|| format!("reading {}", self.what))?;
        if got < buf.len() {
            return Err(self.map_auth(format!("{what} is truncated")));
        }
        Ok(buf)
    }

    /// The bytes of map block `g` (or, with `NODE_BIT`, a node) of `len` bytes at `off`: from
    /// the newest map record before the commit `overlay` names, else from the file.
    fn map_bytes(&self, a: u64, len: u64, off: u64, overlay: Option<(&Log, u64)>) -> Result<Vec<u8>> {
        if let Some(b) = overlay.and_then(|(log, seq)| log.map_bytes(a, len, seq)) {
            return Ok(b.to_vec());
        }
        let what = match a {
            a if a >= NODE_BIT => format!("node {}", a - NODE_BIT),
            g => format!("map block {g}"),
        };
        self.pread_exact(len, off, &what)
    }

    /// Reads the root's list for a file of `k` blocks (its nodes and the map blocks of its
    /// last span, through `overlay`): the hash of every map block it gives, the leaves of the
    /// last span's, and the root they make.
    pub(super) fn read_root(&self, k: u64, overlay: Option<(&Log, u64)>) -> Result<RootList> {
        let ml = self.map_layout();
        let (mut hashes, mut leaves, mut list) = (Vec::new(), BTreeMap::new(), Vec::new());
        for j in 0..node_count(k) {
            let node = self.map_bytes(NODE_BIT + j, ml.node_len(j), ml.node_offset(j), overlay)?;
            hashes.extend(node.chunks(32).map(|c| <Hash>::try_from(c).expect("32 bytes")));
            list.push(bm::hash(&node));
        }
        for g in span_first_group(node_count(k))..group_count(k) {
            let bytes = self.map_bytes(g, ml.map_len(g, k), ml.map_offset(g), overlay)?;
            let hash = bm::hash(&bytes);
            hashes.push(hash);
            list.push(hash);
            leaves.insert(g, leaves_of(&bytes));
        }
        let root =
            bm::root_from_list(self.codec.file_id(), k, &list).expect("one hash per node and last-span map block");
        Ok((hashes, leaves, root))
    }

    /// Reads and verifies the header, the block count against the ciphertext size, and the
    /// root against the nodes and the last span's map blocks (docs/FORMAT.md §5.10). A header
    /// with UNSETTLED is read by its session's log (`mapsession`).
    pub(super) fn load_map(&self) -> Result<()> {
        let mut st = self.map_state_idle();
        st.reset();
        let mut buf = [0u8; HEADER_V2_LEN];
        let n = sys::pread_full(self.fd(), &mut buf, 0).ctx(|| format!("reading header of {}", self.what))?;
        if n == 0 {
            return Ok(());
        }
        if n == HEADER_V2_LEN && buf.iter().all(|&b| b == 0) {
            // A first write cut before its header (which goes out last): an empty file.
            st.stale = true;
            return Ok(());
        }
        let h = HeaderV2::decode(&buf[..n], &self.ctx.keys).map_err(|e| e.into_error(&self.what))?;
        if h.id != *self.codec.file_id() {
            return Err(self.map_auth(
                "content belongs to another file (its file ID does not match the name's binding: swapped or replaced)",
            ));
        }
        if let Some(known) = self.ctx.known.as_ref().filter(|_| !self.ctx.defer_known) {
            // The header authenticated and is this file's: an older generation than this
            // client saw is a whole-file rollback; a newer one another client's edit.
            known.check_file(&h.id, Seen { generation: h.generation, writer: h.writer }, &self.what)?;
        }
        let ml = self.map_layout();
        ml.check_block_count(h.blocks).map_err(|e| self.map_auth(e.to_string()))?;
        self.check_map_size(h.blocks)?;
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        if h.is_unsettled() {
            return self.load_session(&mut st, h);
        }
        let (p, k) = ml.plain_size(c).map_err(|e| self.map_auth(e.to_string()))?;
        if k != h.blocks {
            return Err(self.map_auth(format!(
                "file has {k} blocks but its header commits to {} (cut, extended, or a header of another version)",
                h.blocks
            )));
        }
        let (hashes, leaves, root) = self.read_root(k, None)?;
        if root != h.root {
            return Err(self.map_auth(
                "block map does not match the header's root (a map block, node or header of another version)",
            ));
        }
        if k == 0 {
            st.stale = true;
        }
        (st.hashes, st.leaves) = (hashes, leaves);
        (st.k, st.size, st.k_base, st.generation) = (k, p, k, h.generation);
        st.hdr = Some(h);
        Ok(())
    }

    /// Plaintext size: this handle's (a found session's as its log reads; else from the
    /// ciphertext size, which must hold the block count).
    pub(super) fn plain_size_map(&self) -> Result<u64> {
        let st = self.map_state();
        if st.found.is_some() {
            return Ok(st.size);
        }
        if st.hdr.is_none() {
            return Ok(0);
        }
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        match self.map_layout().plain_size(c) {
            Ok((p, k)) if k == st.k => Ok(p),
            Ok((_, k)) => Err(self.map_auth(format!("file has {k} blocks but its header commits to {}", st.k))),
            Err(e) => Err(self.map_auth(e.to_string())),
        }
    }

    /// The leaf of block `n` (< the block count the map is read with), reading and verifying
    /// its map block the first time (through the commit record's map records, for a found
    /// session read by its commit).
    pub(super) fn leaf(&self, st: &mut MapState, n: u64) -> Result<Leaf> {
        let g = group_of(n);
        if !st.leaves.contains_key(&g) {
            let ml = self.map_layout();
            let len = ml.map_len(g, st.map_count());
            let overlay = st.found.as_ref().and_then(|f| f.commit.map(|seq| (&f.log, seq)));
            let bytes = self.map_bytes(g, len, ml.map_offset(g), overlay)?;
            if bm::hash(&bytes) != st.hashes[g as usize] {
                return Err(self.map_auth(format!(
                    "map block {g} does not match the header's root (a map block of another version)"
                )));
            }
            st.leaves.insert(g, leaves_of(&bytes));
        }
        Ok(st.leaves[&g][(n - group_start(g)) as usize])
    }

    /// Opens block `n` of a file of `k` blocks from its stored ciphertext `ct` into `out`,
    /// after checking its tag is the leaf the map commits to. A zero leaf is a hole.
    fn open_mapped(&self, n: u64, k: u64, leaf: &Leaf, ct: &[u8], out: &mut [u8]) -> Result<usize> {
        let len = ct.len() - self.codec.overhead();
        if *leaf == HOLE_LEAF {
            if n + 1 == k {
                return Err(self.map_auth(format!("block {n}, the final block, is a hole in the map")));
            }
            out[..len].fill(0);
            return Ok(len);
        }
        if bm::leaf_of(ct).as_ref() != Some(leaf) {
            return Err(self.map_auth(format!(
                "block {n} is not the version the header commits to (an older or other copy of it)"
            )));
        }
        self.codec.open_into(n, n + 1 == k, ct, out, &self.what).inspect_err(|e| tracing::error!("{e}"))
    }

    /// [`read_at`](Self::read_at) for a file with a block map.
    pub(super) fn read_at_map(&self, buf: &mut [u8], off: u64, size: u64) -> Result<usize> {
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let len = (buf.len() as u64).min(size - off);
        let (first, last) = l.blocks_touched(off, len).expect("non-empty");
        let (k, leaves) = {
            let mut st = self.map_state();
            if st.found.is_some() {
                return self.read_found(&mut st, buf, off, len);
            }
            let k = st.blocks();
            if l.block_count(size) != k {
                return Err(
                    self.map_auth(format!("file has {} blocks but its header commits to {k}", l.block_count(size)))
                );
            }
            // A group's leaves at a time (one map lookup per group, not two per block).
            let mut leaves = Vec::with_capacity((last - first + 1) as usize);
            let mut n = first;
            while n <= last {
                let g = group_of(n);
                let end = last.min(group_start(g + 1) - 1);
                self.leaf(&mut st, n)?;
                let s = group_start(g);
                leaves.extend_from_slice(&st.leaves[&g][(n - s) as usize..=(end - s) as usize]);
                n = end + 1;
            }
            (k, leaves)
        };
        let mut done = 0usize;
        // One read per run of blocks inside a group (the groups' map blocks lie between).
        let mut a = first;
        while a <= last {
            let b = last.min(group_start(group_of(a) + 1) - 1);
            let start = ml.block_offset(a);
            let end = ml.block_offset(b) + l.block_len(b, size) + l.overhead;
            // Into the thread's scratch buffer, as the v1 reader does: a fresh zeroed buffer per
            // call costs a memset of the whole read.
            with_scratch((end - start) as usize, l.block_size as usize, |ct, plain| -> Result<()> {
                let got = sys::pread_full(self.fd(), ct, start).ctx(|| format!("reading {}", self.what))?;
                if got < ct.len() {
                    return Err(self.map_auth(format!("block {b} is truncated")));
                }
                for n in a..=b {
                    let blen = l.block_len(n, size);
                    let cs = (ml.block_offset(n) - start) as usize;
                    let bct = &ct[cs..cs + (blen + l.overhead) as usize];
                    let bstart = n * l.block_size;
                    let from = (off.max(bstart) - bstart) as usize;
                    let to = ((off + len).min(bstart + blen) - bstart) as usize;
                    let leaf = &leaves[(n - first) as usize];
                    if from == 0 && to == blen as usize {
                        // Wanted whole: straight into the caller's buffer.
                        self.open_mapped(n, k, leaf, bct, &mut buf[done..done + to])?;
                    } else {
                        self.open_mapped(n, k, leaf, bct, plain)?;
                        buf[done..done + to - from].copy_from_slice(&plain[from..to]);
                    }
                    done += to - from;
                }
                Ok(())
            })?;
            a = b + 1;
        }
        Ok(done)
    }

    /// The authenticated plaintext of block `n` of the file as it is (`size` bytes), in `out`.
    fn read_block_map(&self, st: &mut MapState, n: u64, size: u64, out: &mut [u8]) -> Result<usize> {
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let leaf = self.leaf(st, n)?;
        let ct = self.pread_exact(l.block_len(n, size) + l.overhead, ml.block_offset(n), &format!("block {n}"))?;
        self.open_mapped(n, st.blocks(), &leaf, &ct, out)
    }

    /// [`write_at`](Self::write_at) for a file with a block map: in a write session (see
    /// `mapsession`), the blocks in place, the map in memory.
    pub(super) fn write_at_map(&self, data: &[u8], off: u64, size: u64) -> Result<u64> {
        let mut size = size;
        for (i, piece) in data.chunks(crate::maplog::WRITE_PIECE).enumerate() {
            size = self.write_map(piece, off + (i * crate::maplog::WRITE_PIECE) as u64, size, false)?;
        }
        Ok(size)
    }

    /// [`write_at_map`](Self::write_at_map); `zeros`: the write of a growing truncate, whose
    /// holes were asked for.
    fn write_map(&self, data: &[u8], off: u64, size: u64, zeros: bool) -> Result<u64> {
        if !zeros && self.write_in_place(data, off, size)? {
            return Ok(size);
        }
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let bs = l.block_size;
        let mut st = self.map_state_idle();
        self.settle_found(&mut st)?;
        let k_old = st.blocks();
        if l.block_count(size) != k_old {
            return Err(
                self.map_auth(format!("file has {} blocks but its header commits to {k_old}", l.block_count(size)))
            );
        }
        if st.stale {
            sys::ftruncate(self.fd(), 0).ctx(|| format!("truncating {}", self.what))?;
            st.stale = false;
        }
        let new_size = off.checked_add(data.len() as u64).map_or(u64::MAX, |end| size.max(end));
        let k_new = l.block_count(new_size);
        self.check_map_size(k_new)?;
        let (first, last) = l.blocks_touched(off, data.len() as u64).expect("non-empty");
        // The old final block becomes an inner block (zero-padded, re-sealed) when the write
        // starts past it.
        let reseal = (k_old > 0 && k_old - 1 < first).then(|| k_old - 1);
        let from = reseal.unwrap_or(first);
        // A write that grows the file keeps the old final block's ciphertext, to put it back
        // if the backing store refuses part of the growth (see `undo_map`).
        let old_final = match k_old {
            k if k > 0 && new_size > size => Some(self.pread_exact(
                l.block_len(k - 1, size) + l.overhead,
                ml.block_offset(k - 1),
                &format!("block {}", k - 1),
            )?),
            _ => None,
        };
        // Every changed block, sealed into one buffer in order; `spans` says where each is.
        // Blocks before the last one written are whole. The re-sealed old final block and the
        // written ones need not be adjacent: the blocks between are holes and sealed nowhere,
        // so they count for nothing here (counting them made a write far past the end ask
        // for gigabytes, which the thread's sealing buffer then kept).
        let cb = (bs + l.overhead) as usize;
        let sealed = (last - first + 1) as usize + usize::from(reseal.is_some());
        let total = (sealed - 1) * cb + (l.block_len(last, new_size) + l.overhead) as usize;
        let mut sealing = super::take_sealing(total);
        let buf = &mut sealing[..total];
        let mut at = 0usize;
        let mut spans: Vec<(u64, std::ops::Range<usize>)> = Vec::with_capacity(sealed);
        let mut plain = vec![0u8; bs as usize];
        // The nonces of every block, drawn with one call to the random generator.
        let nl = self.codec.nonce_len();
        let mut nonces = vec![0u8; sealed * nl];
        crate::random::fill(&mut nonces);
        let mut nonces = nonces.chunks_exact(nl);
        let mut seal = |n: u64, last: bool, plain: &[u8], out: &mut [u8]| {
            out[..nl].copy_from_slice(nonces.next().expect("one nonce per block"));
            self.codec.seal_into_prefilled(n, last, plain, out);
        };
        if let Some(n) = reseal {
            plain.fill(0);
            match &old_final {
                // The old final block, read once for both (`old_final` is always it here).
                Some(ct) => {
                    let leaf = self.leaf(&mut st, n)?;
                    self.open_mapped(n, k_old, &leaf, ct, &mut plain)?;
                }
                None => drop(self.read_block_map(&mut st, n, size, &mut plain)?),
            }
            seal(n, false, &plain, &mut buf[..cb]);
            spans.push((n, 0..cb));
            at = cb;
        }
        for n in first..=last {
            let bstart = n * bs;
            let blen = l.block_len(n, new_size) as usize;
            let (wfrom, wto) = (off.max(bstart), (off + data.len() as u64).min(bstart + blen as u64));
            let end = at + blen + l.overhead as usize;
            if wfrom == bstart && wto == bstart + blen as u64 {
                // Covered whole: sealed straight from the caller's data.
                let src = &data[(bstart - off) as usize..(bstart - off) as usize + blen];
                seal(n, n + 1 == k_new, src, &mut buf[at..end]);
            } else {
                let pb = &mut plain[..blen];
                pb.fill(0);
                if n < k_old {
                    self.read_block_map(&mut st, n, size, pb)?;
                }
                pb[(wfrom - bstart) as usize..(wto - bstart) as usize]
                    .copy_from_slice(&data[(wfrom - off) as usize..(wto - off) as usize]);
                seal(n, n + 1 == k_new, pb, &mut buf[at..end]);
            }
            spans.push((n, at..end));
            at = end;
        }
        debug_assert_eq!(at, total);
        // The leaves of the groups this write changes, loaded before anything is written.
        let mut g = group_of(from);
        while g < group_count(k_old) && group_start(g) <= last {
            self.leaf(&mut st, group_start(g))?;
            g += 1;
        }
        // A file with blocks is changed in a session, whose log vouches for what this write
        // puts in place; a first write needs none (its header goes out last). What the
        // session's end writes is allocated first: a full disk refuses this write here.
        let logged = k_old > 0;
        let log_bytes = 48 + spans.iter().filter(|(n, _)| *n < k_old).map(|(_, r)| 96 + r.len() as u64).sum::<u64>();
        self.reserve_write(&mut st, spans.iter().map(|(n, _)| *n), k_old, k_new, log_bytes)?;
        if logged {
            self.log_write(&mut st, buf, &spans, k_old, (new_size != size).then_some(new_size))?;
        }
        if let Err(e) = self.store_blocks(&mut st, buf, &spans, k_old, k_new) {
            self.undo_map(&mut st, size, new_size, old_final.as_deref(), buf, &spans);
            return Err(e);
        }
        super::put_sealing(sealing);
        st.size = new_size;
        st.fill_holes(first, last + 1);
        if first > k_old && !zeros {
            st.made_holes.push((k_old, first));
        }
        if !logged {
            self.finish_map(&mut st, None)?;
        } else if !self.session_kept() {
            // Without a caller that settles at close or sync, every call is a session. The
            // write itself is done: a commit the backing store refuses leaves the session
            // open (its log reads the file as written) for the next settle or writer.
            if let Err(e) = self.finish_map(&mut st, None) {
                tracing::warn!("{}: write session not ended: {e}", self.what);
            }
        }
        Ok(new_size)
    }

    /// The blocks of a write (`spans` in `buf`; see [`put_blocks`](Self::put_blocks)), then
    /// their leaves and the map of a file of `k_new` blocks, in memory.
    fn store_blocks(
        &self,
        st: &mut MapState,
        buf: &[u8],
        spans: &[(u64, std::ops::Range<usize>)],
        k_old: u64,
        k_new: u64,
    ) -> Result<()> {
        self.put_blocks(buf, spans, k_old)?;
        self.set_leaves(st, buf, spans, k_old, k_new);
        Ok(())
    }

    /// Writes the blocks of a write into a file of `k_old` blocks (`spans` in `buf`, one
    /// `pwrite` per run inside a group): the blocks past the old end first, then those in
    /// place (so that until the old final block is re-sealed as an inner block, it still ends
    /// the file).
    fn put_blocks(&self, buf: &[u8], spans: &[(u64, std::ops::Range<usize>)], k_old: u64) -> Result<()> {
        let ml = self.map_layout();
        let split = spans.iter().position(|(n, _)| *n >= k_old).unwrap_or(spans.len());
        for (pi, part) in [&spans[split..], &spans[..split]].into_iter().enumerate() {
            let mut i = 0;
            while i < part.len() {
                let g = group_of(part[i].0);
                let mut j = i + 1;
                while j < part.len() && group_of(part[j].0) == g && part[j].0 == part[j - 1].0 + 1 {
                    j += 1;
                }
                let bytes = &buf[part[i].1.start..part[j - 1].1.end];
                let at = ml.block_offset(part[i].0);
                if part[i].0 < k_old {
                    crate::crash::torn!("map.torn_block", self.fd(), bytes, at);
                }
                sys::pwrite_all(self.fd(), bytes, at).ctx(|| format!("writing {}", self.what))?;
                i = j;
            }
            if pi == 0 && split > 0 && !part.is_empty() {
                // The new blocks are out, the blocks in place (the old final one) not yet.
                crate::crash::point!("map.grown");
            }
        }
        crate::crash::point!("map.blocks_written");
        Ok(())
    }

    /// The leaves of the blocks of a write (`spans` in `buf`), whose groups' leaves are
    /// loaded, and the map of a file of `k_new` blocks (it had `k_old`), in memory.
    fn set_leaves(
        &self,
        st: &mut MapState,
        buf: &[u8],
        spans: &[(u64, std::ops::Range<usize>)],
        k_old: u64,
        k_new: u64,
    ) {
        // A group's leaves at a time (one map lookup per group, not one per block).
        let mut dirty = BTreeSet::new();
        let mut i = 0;
        while i < spans.len() {
            let g = group_of(spans[i].0);
            let v = st.leaves.entry(g).or_default();
            while let Some((n, r)) = spans.get(i).filter(|(n, _)| group_of(*n) == g) {
                let at = (n - group_start(g)) as usize;
                if v.len() <= at {
                    v.resize(at + 1, HOLE_LEAF);
                }
                v[at] = bm::leaf_of(&buf[r.clone()]).expect("a sealed block has a tag");
                i += 1;
            }
            dirty.insert(g);
        }
        st.k = k_new;
        self.stage_map(st, k_old, k_new, dirty);
    }

    /// A write of whole blocks inside the file while its session is open (what the kernel's
    /// write-back sends for random overwrites): sealed before the map lock is taken, its
    /// log records and its blocks written without it, so that writes of one file from
    /// several threads overlap. Under the lock: the room it needs and its place in the log,
    /// then (after the blocks) its leaves. Its blocks go out only once every record before
    /// its own is in the log (`write_records`); a commit waits for such writes to be done
    /// ([`map_state_idle`]), and the log keeps a write's copy records until its blocks are
    /// out (`append_log`, `place_records`). Returns `false`, having changed nothing, for any
    /// other write, which goes the general way.
    ///
    /// Overlapping writes are the caller's to order, as for files without a block map (the
    /// mount's range locks): a write does not read what it replaces, so two at once over one
    /// block leave either one.
    ///
    /// [`map_state_idle`]: Self::map_state_idle
    fn write_in_place(&self, data: &[u8], off: u64, size: u64) -> Result<bool> {
        let l = self.ctx.layout;
        let bs = l.block_size;
        let end = off + data.len() as u64;
        if end > size || !off.is_multiple_of(bs) || (!end.is_multiple_of(bs) && end != size) || !self.session_kept() {
            return Ok(false);
        }
        let k = l.block_count(size);
        let (first, last) = l.blocks_touched(off, data.len() as u64).expect("non-empty");
        // Sealed straight from the caller's data, the nonces drawn with one call.
        let cb = (bs + l.overhead) as usize;
        let total = (last - first) as usize * cb + (l.block_len(last, size) + l.overhead) as usize;
        let mut sealing = super::take_sealing(total);
        let buf = &mut sealing[..total];
        let nl = self.codec.nonce_len();
        let mut nonces = vec![0u8; (last - first + 1) as usize * nl];
        crate::random::fill(&mut nonces);
        let mut spans: Vec<(u64, std::ops::Range<usize>)> = Vec::with_capacity((last - first + 1) as usize);
        for (i, n) in (first..=last).enumerate() {
            let blen = l.block_len(n, size) as usize;
            let (at, src) = (i * cb, (n - first) as usize * bs as usize);
            let out = &mut buf[at..at + blen + l.overhead as usize];
            out[..nl].copy_from_slice(&nonces[i * nl..(i + 1) * nl]);
            self.codec.seal_into_prefilled(n, n + 1 == k, &data[src..src + blen], out);
            spans.push((n, at..at + out.len()));
        }
        let buf = &*buf;
        let mut st = self.map_state();
        let open = st.session.as_ref().is_some_and(|s| s.next_record(st.in_flight > 0) <= crate::maplog::CHECKPOINT);
        if !open || st.found.is_some() || st.stale || st.blocks() != k || st.idle_waiters > 0 {
            // No session (its first write starts it), one to end first, or a commit waiting.
            drop(st);
            super::put_sealing(sealing);
            return Ok(false);
        }
        for g in group_of(first)..=group_of(last) {
            self.leaf(&mut st, group_start(g).max(first))?;
        }
        let log_bytes = spans.iter().map(|(_, r)| 96 + r.len() as u64).sum::<u64>();
        self.reserve_write(&mut st, spans.iter().map(|(n, _)| *n), k, k, log_bytes)?;
        let placed = self.place_records(&mut st, &spans);
        drop(st);
        if let Err(e) = self.write_records(placed, buf, &spans) {
            self.landed(&mut self.map_state());
            return Err(e);
        }
        let put = self.put_blocks(buf, &spans, k);
        let mut st = self.map_state();
        self.landed(&mut st);
        if let Err(e) = put {
            drop(st);
            let mut st = self.map_state_idle();
            self.undo_map(&mut st, size, size, None, buf, &spans);
            return Err(e);
        }
        self.set_leaves(&mut st, buf, &spans, k, k);
        st.fill_holes(first, last + 1);
        drop(st);
        super::put_sealing(sealing);
        Ok(true)
    }

    /// Puts a file back as it was before a write the backing store refused (a full disk, a
    /// quota) — as `write::undo` does for v1 files, and more, since here a block that does
    /// not match its leaf is an error: cut back to the old size, the old final block written
    /// back (it lies in space it held before), then the map and header committed for the old
    /// block count with the new leaves of the blocks of `spans` inside the old size whose new
    /// tag is on disk. A refused `pwrite` stores a prefix of its bytes, so a block whose tag
    /// (its last bytes) went out is whole; blocks in place are never refused for space, so
    /// only the old final block (written back) and holes can be torn, and a hole keeps its
    /// zero leaf, so whatever part of it was written is not read. Best effort: a failure is
    /// logged.
    fn undo_map(
        &self,
        st: &mut MapState,
        size: u64,
        new_size: u64,
        old_final: Option<&[u8]>,
        buf: &[u8],
        spans: &[(u64, std::ops::Range<usize>)],
    ) {
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let k_old = l.block_count(size);
        let res = (|| -> Result<()> {
            if new_size > size {
                sys::ftruncate(self.fd(), ml.cipher_size(size)).ctx(|| format!("truncating {}", self.what))?;
            }
            if k_old == 0 {
                st.reset();
                return Ok(());
            }
            let mut dirty = BTreeSet::new();
            let restored = old_final.map(|_| k_old - 1);
            for (n, r) in spans.iter().filter(|(n, _)| *n < k_old && Some(*n) != restored) {
                let new = bm::leaf_of(&buf[r.clone()]).expect("a sealed block has a tag");
                let mut stored = HOLE_LEAF;
                let at = ml.block_offset(*n) + r.len() as u64 - LEAF_LEN;
                sys::pread_full(self.fd(), &mut stored, at).ctx(|| format!("reading {}", self.what))?;
                if stored == new {
                    dirty.insert(st.set_leaf(*n, new));
                }
            }
            if let Some(ct) = old_final {
                sys::pwrite_all(self.fd(), ct, ml.block_offset(k_old - 1)).ctx(|| format!("writing {}", self.what))?;
                dirty.insert(st.set_leaf(k_old - 1, bm::leaf_of(ct).expect("a stored block has a tag")));
            }
            (st.k, st.size) = (k_old, size);
            self.stage_map(st, k_old, k_old, dirty);
            self.finish_map(st, None)
        })();
        if let Err(e) = res {
            tracing::error!("{}: could not undo a failed write, the file may be damaged: {e}", self.what);
        }
    }

    /// Brings the map in memory to a file of `k_new` blocks (it had `k_old`) whose changed
    /// groups, with their new cached leaves, are `dirty`; notes what the next commit writes.
    /// The hashes of changed groups are stale until the commit's [`rehash`](Self::rehash):
    /// nothing reads them before (their leaves stay cached, so no map block of theirs is
    /// read and checked against them).
    /// Groups past the old end that no write touched are holes: their map block is zeros on
    /// disk already (the file was never longer than its old end since it was cut), so only
    /// their hash is needed.
    pub(super) fn stage_map(&self, st: &mut MapState, k_old: u64, k_new: u64, mut dirty: BTreeSet<u64>) {
        let ml = self.map_layout();
        let g_new = group_count(k_new);
        if (g_new as usize) < st.hashes.len() {
            // Groups cut off (only a shrink gets here: every write pays for this otherwise).
            st.hashes.truncate(g_new as usize);
            st.leaves.retain(|g, _| *g < g_new);
            st.write.retain(|g| *g < g_new);
            st.changed.retain(|g| *g < g_new);
            st.plan.cut(g_new);
        }
        let old_groups = group_count(k_old);
        for g in old_groups.saturating_sub(1)..g_new {
            // The old last group grows with holes when the file does; new groups are new.
            if let Some(v) = st.leaves.get_mut(&g) {
                let want = (ml.map_len(g, k_new) / LEAF_LEN) as usize;
                if v.len() != want {
                    v.resize(want, HOLE_LEAF);
                    dirty.insert(g);
                }
            }
        }
        // New groups: holes only, unless a write changed them (hashed at the commit).
        let mut zero_hash: Option<(u64, Hash)> = None;
        st.hashes.reserve_exact((g_new as usize).saturating_sub(st.hashes.len()));
        while (st.hashes.len() as u64) < g_new {
            let g = st.hashes.len() as u64;
            let len = ml.map_len(g, k_new);
            let h = match zero_hash {
                Some((l, h)) if l == len => h,
                _ => bm::hash(&vec![0u8; len as usize]),
            };
            zero_hash = Some((len, h));
            st.hashes.push(h);
            st.changed.insert(g);
        }
        // Changed groups are hashed once, at the commit (`rehash`), not at every write.
        for g in dirty.into_iter().filter(|g| *g < g_new && st.leaves.contains_key(g)) {
            st.write.insert(g);
            st.changed.insert(g);
        }
    }

    /// The hash of every group a write changed since the last commit, from its leaves.
    fn rehash(&self, st: &mut MapState) {
        for &g in &st.write {
            st.hashes[g as usize] = bm::hash(st.leaves[&g].as_flattened());
        }
    }

    /// What a commit writes: the changed map blocks, and the nodes that are new or whose span
    /// has a changed map block, each as (`a` of its map record, offset, bytes).
    pub(super) fn map_writes(&self, st: &mut MapState) -> Vec<(u64, u64, Vec<u8>)> {
        self.rehash(st);
        let ml = self.map_layout();
        let mut out = Vec::new();
        for &g in &st.write {
            out.push((g, ml.map_offset(g), st.leaves[&g].as_flattened().to_vec()));
        }
        for j in 0..node_count(st.k) {
            let (a, b) = (span_first_group(j), span_first_group(j + 1));
            if j >= node_count(st.k_base) || st.changed.range(a..b).next().is_some() {
                out.push((NODE_BIT + j, ml.node_offset(j), bm::node_bytes(&st.hashes[a as usize..b as usize])));
            }
        }
        out
    }

    /// Writes the header v2 of this handle's file: settled (the block count and the root of
    /// the map in memory), or UNSETTLED for a session that starts (the header's count and
    /// root as they are).
    pub(super) fn write_header_map(&self, st: &mut MapState, unsettled: bool) -> Result<()> {
        let id = *self.codec.file_id();
        let (blocks, root, flags) = match (unsettled, st.hdr) {
            (true, Some(h)) => (h.blocks, h.root, crate::content::header::FLAG_UNSETTLED),
            _ => (st.k, bm::map_root(&id, st.k, &st.hashes).expect("one hash per group"), 0),
        };
        // The writer is the first 8 bytes of this client's ID; zero for a caller without a
        // client state.
        let writer = self.ctx.known.as_ref().map_or([0; 8], |k| k.writer());
        let h = HeaderV2 { flags, id, generation: st.generation, writer, blocks, root };
        sys::pwrite_all(self.fd(), &h.encode(&self.ctx.keys), 0).ctx(|| format!("writing header of {}", self.what))?;
        if let Some(known) = &self.ctx.known {
            known.wrote_file(&id, Seen { generation: h.generation, writer });
        }
        st.hdr = Some(h);
        Ok(())
    }

    /// The generation the next header of this file gets: one above both what this handle read
    /// and what this client remembers (a file emptied to 0 bytes by a crash between its cut
    /// and its header has no generation on disk; starting over from 1 would look like a
    /// rollback to every client that saw more).
    pub(super) fn next_generation(&self, st: &MapState) -> u64 {
        let floor = self.ctx.known.as_ref().map_or(0, |k| k.floor(self.id()));
        st.generation.max(floor) + 1
    }

    /// The write-session generation of this block-map file's header as opened (`None` for a
    /// v1 file, or an empty one without a header).
    pub fn generation(&self) -> Option<u64> {
        let st = self.map_state();
        st.hdr.map(|h| h.generation)
    }

    /// The check against what this client remembers that an open with `defer_known` left
    /// for now: [`Error::Rollback`] for a header older than this client saw.
    pub fn check_known(&self) -> Result<()> {
        let hdr = self.map_state().hdr;
        match (&self.ctx.known, hdr) {
            (Some(known), Some(h)) => {
                known.check_file(&h.id, Seen { generation: h.generation, writer: h.writer }, &self.what)
            }
            _ => Ok(()),
        }
    }

    /// Drops this handle's link to what the client remembers: nothing it reads is checked or
    /// learnt, and what it writes is not remembered (a version shown beside a newer one).
    pub fn forget_known(&mut self) {
        self.ctx.known = None;
    }

    /// The first block at or after `lost` of a hole this handle's writes made and did not
    /// fill (for [`drop_lost`](Self::drop_lost)): in a file with a block map a hole is a zero
    /// leaf, which reads as zeros as soon as it is written, so a write refused there must not
    /// stay inside the file.
    pub(super) fn made_hole_from(&self, lost: u64) -> Option<u64> {
        let st = self.map_state();
        st.made_holes.iter().filter(|&&(_, b)| b > lost).map(|&(a, _)| a.max(lost)).min()
    }

    /// [`truncate`](Self::truncate) for a file with a block map. Shrinking logs and re-seals
    /// the new final block in place, then commits the session for the new size, cutting the
    /// file before the settled header (so no reader ever needs the cut map); growing writes
    /// the new final block's zeros through the write path (the blocks between become holes).
    pub(super) fn truncate_map(&self, new_size: u64, size: u64) -> Result<()> {
        let l = self.ctx.layout;
        if new_size == 0 {
            let mut st = self.map_state_idle();
            sys::ftruncate(self.fd(), 0).ctx(|| format!("truncating {}", self.what))?;
            if st.session.take().is_some() || st.found.take().is_some() {
                self.remove_stash();
            }
            st.reset();
            if st.generation > 0 {
                // A header of 0 blocks keeps the file's generation going up: a file emptied
                // and written again must not come back as generation 1, which every client
                // that saw more would take for a rollback.
                st.generation = self.next_generation(&st);
                self.write_header_map(&mut st, false)?;
                st.stale = true;
            }
            return Ok(());
        }
        if new_size > size {
            let from = size.max((new_size - 1) / l.block_size * l.block_size);
            return self.write_map(&vec![0u8; (new_size - from) as usize], from, size, true).map(drop);
        }
        let ml = self.map_layout();
        let mut st = self.map_state_idle();
        self.settle_found(&mut st)?;
        if l.block_count(size) != st.blocks() {
            return Err(self.map_auth("file size does not match its header's block count"));
        }
        let n = (new_size - 1) / l.block_size;
        let k_new = n + 1;
        let mut plain = vec![0u8; l.block_size as usize];
        self.read_block_map(&mut st, n, size, &mut plain)?;
        let blen = l.block_len(n, new_size) as usize;
        let mut ct = vec![0u8; blen + l.overhead as usize];
        self.codec.seal_into(n, true, &plain[..blen], &mut ct);
        let k = st.blocks();
        self.reserve_write(&mut st, std::iter::once(n), k, k, 48 + 96 + ct.len() as u64)?;
        self.log_block(&mut st, n, &ct, new_size)?;
        // What a refused commit puts back (below).
        let old_ct = self.pread_exact(l.block_len(n, size) + l.overhead, ml.block_offset(n), &format!("block {n}"))?;
        let saved = (
            st.hashes.clone(),
            st.leaves.clone(),
            st.write.clone(),
            st.changed.clone(),
            st.made_holes.clone(),
            st.plan.clone(),
        );
        crate::crash::torn!("map.torn_block", self.fd(), &ct, ml.block_offset(n));
        sys::pwrite_all(self.fd(), &ct, ml.block_offset(n)).ctx(|| format!("writing {}", self.what))?;
        crate::crash::point!("map.blocks_written");
        let g = group_of(n);
        let v = st.leaves.get_mut(&g).expect("loaded by the read");
        v.truncate((n - group_start(g)) as usize + 1);
        v[(n - group_start(g)) as usize] = bm::leaf_of(&ct).expect("a sealed block has a tag");
        let k_old = st.blocks();
        (st.k, st.size) = (k_new, new_size);
        self.stage_map(&mut st, k_old.min(k_new), k_new, BTreeSet::from([g]));
        st.fill_holes(k_new, u64::MAX);
        let log_end = st.session.as_ref().map(|s| s.log_end());
        let r = self.finish_map(&mut st, Some(ml.cipher_size(new_size)));
        if r.is_err() && st.session.as_ref().map(|s| s.log_end()) == log_end {
            // The backing store refused the commit record (a full disk, a quota; the log's
            // end did not move): the truncate did not happen. Block n goes back as it was (in its own space), and
            // the map in memory too; the session stays open.
            sys::pwrite_all(self.fd(), &old_ct, ml.block_offset(n)).ctx(|| format!("writing {}", self.what))?;
            (st.hashes, st.leaves, st.write, st.changed, st.made_holes, st.plan) = saved;
            (st.k, st.size) = (k_old, size);
        }
        r
    }
}

fn leaves_of(bytes: &[u8]) -> Vec<Leaf> {
    bytes.chunks_exact(LEAF_LEN as usize).map(|c| c.try_into().expect("16 bytes")).collect()
}
