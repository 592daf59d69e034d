//! Salvage: what still authenticates of a damaged file, block by block, for `fsck --repair`
//! and `export --salvage`. Reads only; the caller decides what to do with the result.
//!
//! Why a path of its own: the reader stops at the first integrity error (it never hands out
//! data that did not authenticate), so a file with one bad block would be lost whole. Salvage
//! keeps each block that authenticates by the rules of the file's format, turns the others
//! into zeros (or cuts them off at the end) and says which byte ranges those were. A v1 block
//! authenticates by its place alone; a block of a file with a block map must also be the
//! version the map commits to (docs/FORMAT.md §5.10, "Salvage").

use super::mapped::MapState;
use super::{CryptFile, HDR_SPARSE, HDR_ZERO};
use crate::content::blockmap::{group_of, HeaderV2, Leaf, HEADER_V2_LEN, HOLE_LEAF};
use crate::error::{Error, IoContext, Result};
use crate::sys;
use std::collections::BTreeSet;

impl CryptFile {
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
    ///
    /// A file with a block map is salvaged by the map's rules instead (see
    /// [`salvage_map`](Self::salvage_map)). Open it with
    /// [`open_for_salvage`](Self::open_for_salvage): [`open`](Self::open) refuses a file whose
    /// map does not verify.
    pub fn salvage(&self, mut sink: impl FnMut(&[u8]) -> Result<()>) -> Result<Salvaged> {
        if self.ctx.block_map {
            return self.salvage_map(&mut sink);
        }
        let l = self.ctx.layout;
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        if c <= l.header() || self.load_header()? == HDR_ZERO {
            return Ok(Salvaged::default());
        }
        let blocks = (c - l.header()).div_ceil(l.cipher_block());
        let (bs, cb, o) = (l.block_size as usize, l.cipher_block() as usize, l.overhead as usize);
        let mut ct = vec![0u8; cb];
        let mut plain = vec![0u8; bs];
        let mut out = Building::new(l.block_size, &mut sink);
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
                    out.keep(n, &plain[..len], false)?;
                    if ends_here {
                        break;
                    }
                }
                None => out.lose(n, false),
            }
        }
        // Trailing failures are cut off, not zero-filled; no range reaches past the old size.
        Ok(out.finish(l.plain_size_lenient(c)))
    }

    /// [`salvage`](Self::salvage) of a file with a block map (docs/FORMAT.md §5.10,
    /// "Salvage"). The header must verify and carry this file's ID, else its error is
    /// returned (as for v1). Then:
    ///
    /// - UNSETTLED, and its write session's log reads it (as a reader does: `mapsession`):
    ///   each block the session's rules accept is kept, the others are lost.
    /// - Otherwise by the header's map. If the map verifies against the root (its nodes and
    ///   the last span's map blocks; each earlier map block against its node when its blocks
    ///   are reached), a block is kept exactly when its stored tag is its leaf and it opens at
    ///   its place (sealed as last iff it is block `k − 1`); a hole by its leaf is kept as
    ///   zeros; a block that opens at its place but whose tag is not its leaf is an older
    ///   version put back (a rollback): lost, and listed in [`Salvaged::older`]. Blocks past
    ///   the header's count `k` are dropped; the final block's length comes from the file's
    ///   size, or, when that does not fit `k` (a cut, bytes appended), from where its leaf
    ///   lies.
    /// - Where the map does not verify (a damaged or cut map block or node, or a header of
    ///   another version: the root is one hash over the list, so a mismatch there leaves no
    ///   block checked; a damaged map block of an earlier span leaves its own group's blocks
    ///   only), a block that opens at its place is kept but listed in
    ///   [`Salvaged::unverified`]: it is this file's block at that place, possibly an older
    ///   version. The choice: the user recovering a file wants its data, and the AEAD still
    ///   proves each such block is this file's content at that place; what the map would add
    ///   (that it is the newest) is said, not hidden. Dropping them would lose, for one bad
    ///   map block, data nothing shows to be wrong.
    /// - UNSETTLED without a log that reads it (lost, or not of this session): by the
    ///   header's map as above, except that a block whose tag is not its leaf is kept as
    ///   unverified (the session may have written it), and blocks past `k` up to the file's
    ///   size are kept as unverified too (the session's growth, which only its log vouched
    ///   for).
    fn salvage_map(&self, sink: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<Salvaged> {
        let mut buf = [0u8; HEADER_V2_LEN];
        let got = sys::pread_full(self.fd(), &mut buf, 0).ctx(|| format!("reading header of {}", self.what))?;
        if got == 0 || (got == HEADER_V2_LEN && buf.iter().all(|&b| b == 0)) {
            return Ok(Salvaged::default());
        }
        let h = HeaderV2::decode(&buf[..got], &self.ctx.keys).map_err(|e| e.into_error(&self.what))?;
        if h.id != *self.codec.file_id() {
            return Err(Error::auth(
                &self.what,
                "content belongs to another file (its file ID does not match the name's binding: swapped or replaced)",
            ));
        }
        self.map_layout().check_block_count(h.blocks).map_err(|e| Error::auth(&self.what, e.to_string()))?;
        let mut st = self.map_state_idle();
        st.reset();
        if h.is_unsettled() {
            match self.load_session(&mut st, h) {
                Ok(()) => return self.salvage_found(&mut st, sink),
                Err(e) => tracing::warn!("{}: salvaged without its write session's log: {e}", self.what),
            }
            st.reset();
        }
        self.salvage_by_header(&mut st, h, sink)
    }

    /// A found session's file (loaded by `load_session`), block by block by its log's rules.
    fn salvage_found(&self, st: &mut MapState, sink: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<Salvaged> {
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let (k, size) = (st.k, st.size);
        let mut plain = vec![0u8; l.block_size as usize];
        let mut ct = vec![0u8; l.cipher_block() as usize];
        let mut out = Building::new(l.block_size, sink);
        for n in 0..k {
            match self.accept(st, n, &mut plain) {
                Ok((len, _)) => out.keep(n, &plain[..len], false)?,
                Err(Error::Auth { .. }) => {
                    let len = (l.block_len(n, size) + l.overhead) as usize;
                    let got = sys::pread_full(self.fd(), &mut ct[..len], ml.block_offset(n))
                        .ctx(|| format!("reading {}", self.what))?;
                    let older = self.opens_at_place(n, n + 1 == k, &ct[..got], &mut plain).is_some();
                    out.lose(n, older);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out.finish(size))
    }

    /// A settled file's blocks by the header's map (see [`salvage_map`](Self::salvage_map));
    /// a session's file whose log does not read it by that map too, with its unvouched blocks
    /// kept as unverified.
    fn salvage_by_header(
        &self,
        st: &mut MapState,
        h: HeaderV2,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<Salvaged> {
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        let (k, session) = (h.blocks, h.is_unsettled());
        let verified = match self.read_root(k, None) {
            Ok((hashes, leaves, root)) if root == h.root => {
                (st.hashes, st.leaves, st.k) = (hashes, leaves, k);
                true
            }
            _ => {
                tracing::warn!("{}: its block map does not verify: no block's version is checked", self.what);
                false
            }
        };
        // Blocks salvaged: the header's, and a session's growth past them (by the size).
        let mut scan = k;
        while session && ml.block_offset(scan) + l.overhead < c {
            scan += 1;
        }
        // The size, when the ciphertext's fits the blocks scanned; else the final block's
        // length is found from its contents.
        let size = ml.plain_size(c).ok().filter(|&(_, kk)| kk == scan).map(|(p, _)| p);
        let cb = l.cipher_block() as usize;
        let mut ct = vec![0u8; cb];
        let mut plain = vec![0u8; l.block_size as usize];
        let zeros = vec![0u8; l.block_size as usize];
        let mut bad_groups = BTreeSet::new();
        let mut out = Building::new(l.block_size, sink);
        for n in 0..scan {
            let is_final = n + 1 == scan;
            let g = group_of(n);
            // A map block of an earlier span that does not match its node leaves its own
            // group's blocks unchecked, and only those.
            let leaf = match verified && n < k && !bad_groups.contains(&g) {
                true => match self.leaf(st, n) {
                    Ok(lf) => Some(lf),
                    Err(_) => {
                        bad_groups.insert(g);
                        None
                    }
                },
                false => None,
            };
            let want = match (is_final, size) {
                (true, Some(p)) => (l.block_len(n, p) + l.overhead) as usize,
                _ => cb,
            };
            let got = sys::pread_full(self.fd(), &mut ct[..want], ml.block_offset(n))
                .ctx(|| format!("reading {}", self.what))?;
            let region = &ct[..got];
            match leaf {
                Some(HOLE_LEAF) if !is_final => out.keep(n, &zeros, false)?,
                Some(HOLE_LEAF) => out.lose(n, false),
                Some(lf) => match self.open_committed(n, is_final, &lf, region, &mut plain) {
                    Some((len, end)) => {
                        out.keep(n, &plain[..len], false)?;
                        if is_final {
                            out.out.trailing = c - (ml.block_offset(n) + end as u64);
                        }
                    }
                    None => match self.opens_at_place(n, is_final, region, &mut plain) {
                        Some(len) if session => out.keep(n, &plain[..len], true)?,
                        other => out.lose(n, other.is_some()),
                    },
                },
                None => match self.opens_at_place(n, is_final, region, &mut plain) {
                    Some(len) => out.keep(n, &plain[..len], true)?,
                    None => out.lose(n, false),
                },
            }
        }
        let old_size = size.unwrap_or(scan * l.block_size);
        Ok(out.finish(old_size))
    }

    /// Block `n` from `region` (its stored bytes, the final block's possibly with more after
    /// it) as the version whose tag is `leaf`, opened at its place; the final block's length
    /// is where its tag lies in `region`. Returns its plaintext length and where it ends in
    /// `region`.
    fn open_committed(
        &self,
        n: u64,
        is_final: bool,
        leaf: &Leaf,
        region: &[u8],
        out: &mut [u8],
    ) -> Option<(usize, usize)> {
        let o = self.codec.overhead();
        let ends: Vec<usize> = match is_final {
            true => (o + 1..=region.len()).rev().filter(|&e| region[e - 16..e] == *leaf).collect(),
            false => vec![region.len()].into_iter().filter(|&e| e > o && region[e - 16..e] == *leaf).collect(),
        };
        ends.into_iter()
            .find_map(|e| self.codec.open_into(n, is_final, &region[..e], out, &self.what).ok().map(|l| (l, e)))
    }

    /// Block `n` from `region` if it opens at its place in any version: as its position says,
    /// an inner block sealed as a full last one (an older final block), a final block sealed
    /// as inner (its place held one before the file was cut), or a final block of any
    /// shorter length (a cut or extended file). Not checked against the map.
    fn opens_at_place(&self, n: u64, is_final: bool, region: &[u8], out: &mut [u8]) -> Option<usize> {
        let o = self.codec.overhead();
        let cb = self.ctx.layout.cipher_block() as usize;
        if region.len() <= o {
            return None;
        }
        let try_open = |last: bool, r: &[u8], out: &mut [u8]| self.codec.open_into(n, last, r, out, &self.what).ok();
        if let Some(len) = try_open(is_final, region, out) {
            return Some(len);
        }
        if region.len() == cb {
            if let Some(len) = try_open(!is_final, region, out) {
                return Some(len);
            }
        }
        match is_final {
            true => (o + 1..region.len()).rev().find_map(|e| try_open(true, &region[..e], out)),
            false => None,
        }
    }
}

/// The salvaged file as it is handed to the sink, block by block: lost blocks inside it
/// become zeros once a later block is kept, lost blocks at its end are cut off.
struct Building<'a> {
    block_size: u64,
    out: Salvaged,
    /// Zero blocks owed to the sink: written only once a later block is kept.
    pending: u64,
    sink: &'a mut dyn FnMut(&[u8]) -> Result<()>,
}

impl<'a> Building<'a> {
    fn new(block_size: u64, sink: &'a mut dyn FnMut(&[u8]) -> Result<()>) -> Self {
        Building { block_size, out: Salvaged::default(), pending: 0, sink }
    }

    /// Block `n` is kept as `data`; `unverified`: not checked against a block map.
    fn keep(&mut self, n: u64, data: &[u8], unverified: bool) -> Result<()> {
        if self.pending > 0 {
            let zeros = vec![0u8; self.block_size as usize];
            for _ in 0..self.pending {
                (self.sink)(&zeros)?;
            }
            self.pending = 0;
        }
        (self.sink)(data)?;
        self.out.kept += data.len() as u64;
        if unverified {
            let start = n * self.block_size;
            push_range(&mut self.out.unverified, start, start + data.len() as u64);
        }
        Ok(())
    }

    /// Block `n` is lost; `older`: it opened at its place as another version than the map's.
    fn lose(&mut self, n: u64, older: bool) {
        let start = n * self.block_size;
        push_range(&mut self.out.lost, start, start + self.block_size);
        if older {
            push_range(&mut self.out.older, start, start + self.block_size);
        }
        self.pending += 1;
    }

    /// The result, no range reaching past `old_size` (the damaged file's size).
    fn finish(mut self, old_size: u64) -> Salvaged {
        for v in [&mut self.out.lost, &mut self.out.older] {
            v.iter_mut().for_each(|(a, b)| *b = (*b).min(old_size).max(*a));
        }
        self.out
    }
}

/// Appends `a..b` to the sorted ranges `v`, merged with the last one if they touch.
fn push_range(v: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    match v.last_mut() {
        Some((_, end)) if *end == a => *end = b,
        _ => v.push((a, b)),
    }
}

/// What [`CryptFile::salvage`] kept and lost.
#[derive(Debug, Default, Clone)]
pub struct Salvaged {
    /// Plaintext bytes that authenticated (the salvaged file's size, less zero-filled gaps).
    pub kept: u64,
    /// Plaintext ranges that did not authenticate (zero-filled inside, cut off at the end).
    pub lost: Vec<(u64, u64)>,
    /// Of `lost`, the ranges whose block opened at its place but is not the version the
    /// block map (or the write session's log) vouches for: an older copy put back, a
    /// rollback. Files with a block map only.
    pub older: Vec<(u64, u64)>,
    /// Kept ranges whose blocks opened at their place but could not be checked against the
    /// block map (a damaged or cut map, or an UNSETTLED file without its session's log):
    /// this file's content at that place, possibly an older version. Files with a block map
    /// only.
    pub unverified: Vec<(u64, u64)>,
    /// Ciphertext bytes after the end that the header's block count and the final block's
    /// leaf give (bytes appended to a file with a block map); 0 when none or not known.
    pub trailing: u64,
}

impl Salvaged {
    /// What a report adds to the lost ranges for a file with a block map: the older versions
    /// among them and the unverified kept ranges (empty when there are none).
    pub fn notes(&self) -> String {
        let list = |v: &[(u64, u64)]| v.iter().map(|(a, b)| format!("{a}..{b}")).collect::<Vec<_>>().join(", ");
        let mut s = String::new();
        if !self.older.is_empty() {
            s.push_str(&format!("; of those, an older version put back (a rollback): {}", list(&self.older)));
        }
        if !self.unverified.is_empty() {
            s.push_str(&format!(
                "; kept but not checked against the block map (possibly older versions): {}",
                list(&self.unverified)
            ));
        }
        s
    }
}
