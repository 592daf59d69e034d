//! Files with a block map (feature `"block-map"`, docs/FORMAT.md §5.10): the reader and a
//! first writer.
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
//! The writer commits every call: blocks, then the map blocks and nodes they change, then the
//! header with the new root and block count. A first write into an empty file writes its
//! header last, so a crash before it leaves an all-zero header, which reads as an empty file.
//! Other crashes between those steps leave an integrity error, not the file before or after:
//! the crash rules (UNSETTLED, stash records bound to the session) are the next step, and the
//! feature is named by no vault until they exist. The state assumes this handle is the file's
//! only writer while it is open.

use super::{with_scratch, CryptFile};
use crate::content::blockmap::{
    self as bm, group_count, group_of, group_start, node_count, span_first_group, Hash, HeaderV2, Leaf, MapLayout,
    HEADER_V2_LEN, HOLE_LEAF, LEAF_LEN,
};
use crate::error::{Error, IoContext, Result};
use crate::sys;
use std::collections::{BTreeMap, BTreeSet};

/// The verified map of an open file with a block map.
#[derive(Debug, Default)]
pub(super) struct MapState {
    /// The header on disk; `None` for an empty file (no header, or an all-zero one).
    hdr: Option<HeaderV2>,
    /// The ciphertext is not empty although the file is (an all-zero header, or a header of
    /// 0 blocks): a writer cuts it to 0 bytes first.
    stale: bool,
    /// The hash of every map block of the file, verified against the root (or computed by
    /// this writer).
    hashes: Vec<Hash>,
    /// The leaves of the map blocks read so far, by group, each verified against its hash.
    leaves: BTreeMap<u64, Vec<Leaf>>,
    /// The generation of the last header this handle read or wrote.
    generation: u64,
    /// This handle has started a write session (the header's generation was raised).
    session: bool,
    /// Holes (block ranges, half-open) this handle's writes past the end made and no write
    /// has filled since: where a write-back write the kernel acknowledged may have been
    /// refused (see [`CryptFile::drop_lost`]). Truncates' holes are not in it: their zeros
    /// were asked for.
    made_holes: Vec<(u64, u64)>,
}

impl MapState {
    fn blocks(&self) -> u64 {
        self.hdr.map_or(0, |h| h.blocks)
    }

    /// Sets the cached leaf of block `n` (its group's leaves, extended with holes as
    /// needed); returns its group.
    fn set_leaf(&mut self, n: u64, leaf: Leaf) -> u64 {
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
        self.made_holes = super::without_range(&self.made_holes, a, b);
    }
}

impl CryptFile {
    fn map_layout(&self) -> MapLayout {
        self.ctx.layout.into()
    }

    fn map_state(&self) -> std::sync::MutexGuard<'_, MapState> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn map_auth(&self, detail: impl Into<String>) -> Error {
        let e = Error::auth(&self.what, detail);
        tracing::error!("{e}");
        e
    }

    fn pread_exact(&self, len: u64, at: u64, what: &str) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        let got = sys::pread_full(self.fd(), &mut buf, at).ctx(|| format!("reading {}", self.what))?;
        if got < buf.len() {
            return Err(self.map_auth(format!("{what} is truncated")));
        }
        Ok(buf)
    }

    /// Reads and verifies the header, the block count against the ciphertext size, and the
    /// root against the nodes and the last span's map blocks (docs/FORMAT.md §5.10).
    pub(super) fn load_map(&self) -> Result<()> {
        let mut st = self.map_state();
        let generation = st.generation;
        *st = MapState { generation, ..MapState::default() };
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
        if h.is_unsettled() {
            return Err(self.map_auth("UNSETTLED in a file with a block map (its crash rules are not implemented)"));
        }
        if h.id != *self.codec.file_id() {
            return Err(self.map_auth(
                "content belongs to another file (its file ID does not match the name's binding: swapped or replaced)",
            ));
        }
        let ml = self.map_layout();
        ml.check_block_count(h.blocks).map_err(|e| self.map_auth(e.to_string()))?;
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        let (_, k) = ml.plain_size(c).map_err(|e| self.map_auth(e.to_string()))?;
        if k != h.blocks {
            return Err(self.map_auth(format!(
                "file has {k} blocks but its header commits to {} (cut, extended, or a header of another version)",
                h.blocks
            )));
        }
        let mut list = Vec::new();
        for j in 0..node_count(k) {
            let node = self.pread_exact(ml.node_len(j), ml.node_offset(j), &format!("node {j}"))?;
            st.hashes.extend(node.chunks(32).map(|c| <Hash>::try_from(c).expect("32 bytes")));
            list.push(bm::hash(&node));
        }
        for g in span_first_group(node_count(k))..group_count(k) {
            let bytes = self.pread_exact(ml.map_len(g, k), ml.map_offset(g), &format!("map block {g}"))?;
            let hash = bm::hash(&bytes);
            st.hashes.push(hash);
            list.push(hash);
            st.leaves.insert(g, leaves_of(&bytes));
        }
        let root = bm::root_from_list(&h.id, k, &list).expect("one hash per node and last-span map block");
        if root != h.root {
            st.hashes.clear();
            st.leaves.clear();
            return Err(self.map_auth(
                "block map does not match the header's root (a map block, node or header of another version)",
            ));
        }
        if k == 0 {
            st.stale = true;
        }
        st.generation = h.generation;
        st.hdr = Some(h);
        Ok(())
    }

    /// Plaintext size: from the ciphertext size, which must hold the header's block count.
    pub(super) fn plain_size_map(&self) -> Result<u64> {
        let st = self.map_state();
        let Some(h) = st.hdr else { return Ok(0) };
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        match self.map_layout().plain_size(c) {
            Ok((p, k)) if k == h.blocks => Ok(p),
            Ok((_, k)) => Err(self.map_auth(format!("file has {k} blocks but its header commits to {}", h.blocks))),
            Err(e) => Err(self.map_auth(e.to_string())),
        }
    }

    /// The leaf of block `n` (< the block count), reading and verifying its map block the
    /// first time.
    fn leaf(&self, st: &mut MapState, n: u64) -> Result<Leaf> {
        let g = group_of(n);
        if !st.leaves.contains_key(&g) {
            let ml = self.map_layout();
            let bytes = self.pread_exact(ml.map_len(g, st.blocks()), ml.map_offset(g), &format!("map block {g}"))?;
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
            let k = st.blocks();
            if l.block_count(size) != k {
                return Err(
                    self.map_auth(format!("file has {} blocks but its header commits to {k}", l.block_count(size)))
                );
            }
            (k, (first..=last).map(|n| self.leaf(&mut st, n)).collect::<Result<Vec<_>>>()?)
        };
        let mut done = 0usize;
        // One read per run of blocks inside a group (the groups' map blocks lie between).
        let mut a = first;
        while a <= last {
            let b = last.min(group_start(group_of(a) + 1) - 1);
            let start = ml.block_offset(a);
            let end = ml.block_offset(b) + l.block_len(b, size) + l.overhead;
            let ct = self.pread_exact(end - start, start, &format!("block {b}"))?;
            with_scratch(0, l.block_size as usize, |_, plain| -> Result<()> {
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

    /// [`write_at`](Self::write_at) for a file with a block map: the blocks, then the map
    /// blocks and nodes that changed, then the header (see the module's notes on crashes).
    pub(super) fn write_at_map(&self, data: &[u8], off: u64, size: u64) -> Result<u64> {
        self.write_map(data, off, size, false)
    }

    /// [`write_at_map`](Self::write_at_map); `zeros`: the write of a growing truncate, whose
    /// holes were asked for.
    fn write_map(&self, data: &[u8], off: u64, size: u64, zeros: bool) -> Result<u64> {
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let bs = l.block_size;
        let mut st = self.map_state();
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
        let new_size = size.max(off + data.len() as u64);
        let k_new = l.block_count(new_size);
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
        let cb = (bs + l.overhead) as usize;
        let mut buf: Vec<u8> = Vec::with_capacity((last - from + 1) as usize * cb);
        let mut spans: Vec<(u64, std::ops::Range<usize>)> = Vec::with_capacity((last - from + 1) as usize);
        let mut plain = vec![0u8; bs as usize];
        // The nonces of every block, drawn with one call to the random generator.
        let nl = self.codec.nonce_len();
        let mut nonces = vec![0u8; (last - from + 1) as usize * nl];
        crate::random::fill(&mut nonces);
        let mut nonces = nonces.chunks_exact(nl);
        let mut seal = |n: u64, last: bool, plain: &[u8], out: &mut [u8]| {
            out[..nl].copy_from_slice(nonces.next().expect("one nonce per block"));
            self.codec.seal_into_prefilled(n, last, plain, out);
        };
        if let Some(n) = reseal {
            plain.fill(0);
            self.read_block_map(&mut st, n, size, &mut plain)?;
            buf.resize(cb, 0);
            seal(n, false, &plain, &mut buf[..cb]);
            spans.push((n, 0..cb));
        }
        for n in first..=last {
            let bstart = n * bs;
            let blen = l.block_len(n, new_size) as usize;
            let (wfrom, wto) = (off.max(bstart), (off + data.len() as u64).min(bstart + blen as u64));
            let at = buf.len();
            buf.resize(at + blen + l.overhead as usize, 0);
            if wfrom == bstart && wto == bstart + blen as u64 {
                // Covered whole: sealed straight from the caller's data.
                let src = &data[(bstart - off) as usize..(bstart - off) as usize + blen];
                seal(n, n + 1 == k_new, src, &mut buf[at..]);
            } else {
                let pb = &mut plain[..blen];
                pb.fill(0);
                if n < k_old {
                    self.read_block_map(&mut st, n, size, pb)?;
                }
                pb[(wfrom - bstart) as usize..(wto - bstart) as usize]
                    .copy_from_slice(&data[(wfrom - off) as usize..(wto - off) as usize]);
                seal(n, n + 1 == k_new, pb, &mut buf[at..]);
            }
            spans.push((n, at..buf.len()));
        }
        // The leaves of the groups this write changes, loaded before anything is written.
        let mut g = group_of(from);
        while g < group_count(k_old) && group_start(g) <= last {
            self.leaf(&mut st, group_start(g))?;
            g += 1;
        }
        if let Err(e) = self.store_blocks(&mut st, &buf, &spans, k_old, k_new) {
            self.undo_map(&mut st, size, new_size, old_final.as_deref(), &buf, &spans);
            return Err(e);
        }
        st.fill_holes(first, last + 1);
        if first > k_old && !zeros {
            st.made_holes.push((k_old, first));
        }
        Ok(new_size)
    }

    /// The blocks of a write (`spans` in `buf`, one `pwrite` per run inside a group), then
    /// their leaves and the map and header of a file of `k_new` blocks.
    fn store_blocks(
        &self,
        st: &mut MapState,
        buf: &[u8],
        spans: &[(u64, std::ops::Range<usize>)],
        k_old: u64,
        k_new: u64,
    ) -> Result<()> {
        let ml = self.map_layout();
        let mut i = 0;
        while i < spans.len() {
            let g = group_of(spans[i].0);
            let mut j = i + 1;
            while j < spans.len() && group_of(spans[j].0) == g && spans[j].0 == spans[j - 1].0 + 1 {
                j += 1;
            }
            let bytes = &buf[spans[i].1.start..spans[j - 1].1.end];
            sys::pwrite_all(self.fd(), bytes, ml.block_offset(spans[i].0)).ctx(|| format!("writing {}", self.what))?;
            i = j;
        }
        let mut dirty = BTreeSet::new();
        for (n, r) in spans {
            dirty.insert(st.set_leaf(*n, bm::leaf_of(&buf[r.clone()]).expect("a sealed block has a tag")));
        }
        self.commit_map(st, k_old, k_new, dirty)
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
                let (generation, session) = (st.generation, st.session);
                *st = MapState { generation, session, ..MapState::default() };
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
            self.commit_map(st, k_old, k_old, dirty)
        })();
        if let Err(e) = res {
            tracing::error!("{}: could not undo a failed write, the file may be damaged: {e}", self.what);
        }
    }

    /// Writes the map blocks in `dirty` (whose cached leaves are the new ones), the nodes that
    /// change, and the header for a file of `k_new` blocks (it had `k_old`). Groups past the
    /// old end that no write touched are holes: their map block is zeros on disk already (the
    /// file was never longer than its old end since it was cut), so only their hash is needed.
    fn commit_map(&self, st: &mut MapState, k_old: u64, k_new: u64, mut dirty: BTreeSet<u64>) -> Result<()> {
        let ml = self.map_layout();
        let g_new = group_count(k_new);
        st.hashes.truncate(g_new as usize);
        st.leaves.retain(|g, _| *g < g_new);
        let old_groups = group_count(k_old);
        for g in old_groups.saturating_sub(1)..g_new {
            if g + 1 >= old_groups || st.leaves.contains_key(&g) {
                // The old last group grows with holes when the file does; new groups are new.
                if let Some(v) = st.leaves.get_mut(&g) {
                    let want = (ml.map_len(g, k_new) / LEAF_LEN) as usize;
                    if v.len() != want {
                        v.resize(want, HOLE_LEAF);
                        dirty.insert(g);
                    }
                }
            }
        }
        let mut zero_hash: Option<(u64, Hash)> = None;
        for g in 0..g_new {
            let len = ml.map_len(g, k_new);
            if let Some(v) = st.leaves.get(&g).filter(|_| dirty.contains(&g)) {
                let bytes = v.as_flattened();
                sys::pwrite_all(self.fd(), bytes, ml.map_offset(g)).ctx(|| format!("writing {}", self.what))?;
                let h = bm::hash(bytes);
                match st.hashes.get_mut(g as usize) {
                    Some(x) => *x = h,
                    None => st.hashes.push(h),
                }
            } else if g as usize >= st.hashes.len() {
                // A group of holes only, past the old end.
                let h = match zero_hash {
                    Some((l, h)) if l == len => h,
                    _ => bm::hash(&vec![0u8; len as usize]),
                };
                zero_hash = Some((len, h));
                st.hashes.push(h);
                dirty.insert(g);
            }
        }
        for j in 0..node_count(k_new) {
            let (a, b) = (span_first_group(j), span_first_group(j + 1));
            if j >= node_count(k_old) || dirty.range(a..b).next().is_some() {
                let node = bm::node_bytes(&st.hashes[a as usize..b as usize]);
                sys::pwrite_all(self.fd(), &node, ml.node_offset(j)).ctx(|| format!("writing {}", self.what))?;
            }
        }
        self.write_header_map(st, k_new)
    }

    /// The first block at or after `lost` of a hole this handle's writes made and did not
    /// fill (for [`drop_lost`](Self::drop_lost)): in a file with a block map a hole is a zero
    /// leaf, which reads as zeros as soon as it is written, so a write refused there must not
    /// stay inside the file.
    pub(super) fn made_hole_from(&self, lost: u64) -> Option<u64> {
        let st = self.map_state();
        st.made_holes.iter().filter(|&&(_, b)| b > lost).map(|&(a, _)| a.max(lost)).min()
    }

    fn write_header_map(&self, st: &mut MapState, k: u64) -> Result<()> {
        if !st.session {
            st.generation += 1;
            st.session = true;
        }
        let id = *self.codec.file_id();
        let root = bm::map_root(&id, k, &st.hashes).expect("one hash per group");
        // No client ID exists yet (it comes with layer 2): the writer field stays zero.
        let h = HeaderV2 { flags: 0, id, generation: st.generation, writer: [0; 8], blocks: k, root };
        sys::pwrite_all(self.fd(), &h.encode(&self.ctx.keys), 0).ctx(|| format!("writing header of {}", self.what))?;
        st.hdr = Some(h);
        Ok(())
    }

    /// [`truncate`](Self::truncate) for a file with a block map. Shrinking re-seals the new
    /// final block, writes its map block and the header, then cuts; growing writes the new
    /// final block's zeros through the write path (the blocks between become holes).
    pub(super) fn truncate_map(&self, new_size: u64, size: u64) -> Result<()> {
        let l = self.ctx.layout;
        if new_size == 0 {
            sys::ftruncate(self.fd(), 0).ctx(|| format!("truncating {}", self.what))?;
            let mut st = self.map_state();
            let (generation, session) = (st.generation, st.session);
            *st = MapState { generation, session, ..MapState::default() };
            return Ok(());
        }
        if new_size > size {
            let from = size.max((new_size - 1) / l.block_size * l.block_size);
            return self.write_map(&vec![0u8; (new_size - from) as usize], from, size, true).map(drop);
        }
        let ml = self.map_layout();
        let mut st = self.map_state();
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
        sys::pwrite_all(self.fd(), &ct, ml.block_offset(n)).ctx(|| format!("writing {}", self.what))?;
        let g = group_of(n);
        let v = st.leaves.get_mut(&g).expect("loaded by the read");
        v.truncate((n - group_start(g)) as usize + 1);
        v[(n - group_start(g)) as usize] = bm::leaf_of(&ct).expect("a sealed block has a tag");
        // The nodes of the spans before n's are unchanged, and n's span has none now.
        let k_old = st.blocks();
        self.commit_map(&mut st, k_old.min(k_new), k_new, BTreeSet::from([g]))?;
        st.fill_holes(k_new, u64::MAX);
        sys::ftruncate(self.fd(), ml.cipher_size(new_size)).ctx(|| format!("truncating {}", self.what))
    }
}

fn leaves_of(bytes: &[u8]) -> Vec<Leaf> {
    bytes.chunks_exact(LEAF_LEN as usize).map(|c| c.try_into().expect("16 bytes")).collect()
}
