//! Where a file whose header carries UNSETTLED ends (docs/FORMAT.md §5.8).
//!
//! Why: changing a file's tail (a grow, a shrink, a rewrite of the final block) takes more
//! than one system call, or one `pwrite` that a fatal signal cuts short between pages. A crash
//! in between leaves a final block that does not open as the last block. While the flag is
//! set, these rules find the block that ends the file instead of failing, looking only at the
//! end of the file: the final block as it is, a stashed copy of a block (the writer puts one
//! after the end before it rewrites a block that may hold fsynced bytes), or the blocks before
//! a torn final one. Every block the rules return authenticated; the relaxation is only that
//! the file may end earlier than its size says, at a block that was once written as its end.
//!
//! With `"ordered-growth"` a file ends only at a block sealed as last: a full inner block
//! (which says nothing about which write session sealed it) no longer counts as an end, so a
//! header copied while the file was UNSETTLED and put back after it settled cannot cut the
//! file at a block boundary. The writer grows a file so that a block sealed as last always
//! remains (docs/FORMAT.md §5.7); the walk back over a torn final block passes complete inner
//! blocks (the new blocks of a growing write torn later) to reach it.

use super::block::BlockCodec;
use super::Layout;
use crate::error::Result;

/// Length of the block number after a stashed block (`u64be`).
pub const STASH_TRAILER: usize = 8;

/// Which rule found the end of an unsettled file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailRule {
    /// The final block opens as the last block: nothing to recover.
    Settled,
    /// The final block opens as an inner block, or as a shorter last block followed by zeros.
    FinalRecovered,
    /// A stashed copy of a block at the end of the file ends it.
    Stash,
    /// The torn final block (with holes before it, or a torn stash) is dropped: a prefix.
    Dropped,
    /// Nothing before a torn final block opens: the file is empty (without
    /// `"ordered-growth"`; with it this is an integrity error).
    Empty,
    /// The header is all zeros: a first write cut before its header (`"ordered-growth"`).
    NoHeader,
    /// A file with a block map whose write session did not end: read by the header's map
    /// and what the session's log vouches for (docs/FORMAT.md §5.10).
    MapSession,
    /// A file with a block map whose write session committed but whose map or header was not
    /// all written: read by the commit record's map.
    MapCommitted,
}

impl TailRule {
    /// A short description for logs and fsck.
    pub fn describe(self) -> &'static str {
        match self {
            TailRule::Settled => "complete",
            TailRule::FinalRecovered => "final block re-sealed by an unfinished write",
            TailRule::Stash => "ends with the copy a writer kept of its final block",
            TailRule::Dropped => "a torn final block dropped (a prefix)",
            TailRule::Empty => "a torn first write dropped (empty)",
            TailRule::NoHeader => "a first write cut before its header (empty)",
            TailRule::MapSession => "a write session cut short, read by its log",
            TailRule::MapCommitted => "a write session committed, its map not all written",
        }
    }
}

/// Where an unsettled file ends.
#[derive(Clone, Debug)]
pub struct Tail {
    /// The plaintext size by the rules.
    pub size: u64,
    /// The block that ends the file and its plaintext, unless that block is read from its
    /// own place as the last block (rule `Settled`, or an empty file).
    pub last: Option<(u64, Vec<u8>)>,
    /// The rule that decided.
    pub rule: TailRule,
}

/// A stash of block `n` whose ciphertext (sealed as last) is `ct`: `ct ‖ u64be(n)`.
pub fn stash_bytes(n: u64, ct: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(ct.len() + STASH_TRAILER);
    v.extend_from_slice(ct);
    v.extend_from_slice(&n.to_be_bytes());
    v
}

/// Reads ciphertext at an offset into a buffer, returning the bytes read (short at the end).
pub type ReadAt<'a> = &'a dyn Fn(u64, &mut [u8]) -> Result<usize>;

/// Finds the end of an unsettled file of `c` ciphertext bytes (`c` > header length).
/// `sparse`: the header has SPARSE. `ordered`: the vault has `"ordered-growth"` (a full inner
/// block does not end the file; the walk back passes such blocks, and passing block 0 is an
/// error). `None` when no rule applies (an integrity error).
pub fn resolve(
    l: &Layout,
    codec: &BlockCodec,
    c: u64,
    sparse: bool,
    ordered: bool,
    read: ReadAt,
    what: &str,
) -> Result<Option<Tail>> {
    let (cb, o, bs) = (l.cipher_block(), l.overhead as usize, l.block_size);
    let body = c - l.header();
    let f = (body - 1) / cb;
    let slot = |j: u64| -> Result<Vec<u8>> {
        let len = if j == f { body - f * cb } else { cb };
        let mut b = vec![0u8; len as usize];
        let got = read(l.block_offset(j), &mut b)?;
        b.truncate(got);
        Ok(b)
    };
    let mut plain = vec![0u8; cb as usize];
    let found = |j: u64, len: usize, plain: &[u8], rule| Tail {
        size: j * bs + len as u64,
        last: Some((j, plain[..len].to_vec())),
        rule,
    };
    // R1: the final block as it is.
    if let Some((len, rule)) = opens_as_end(codec, l, f, &slot(f)?, ordered, &mut plain, what) {
        if rule == TailRule::Settled {
            return Ok(Some(Tail { size: f * bs + len as u64, last: None, rule }));
        }
        return Ok(Some(found(f, len, &plain, rule)));
    }
    // R2: a stash, `ct ‖ u64be(t)`, starting at the slot that holds byte c − 9.
    if body > (o + STASH_TRAILER) as u64 {
        let mut tr = [0u8; STASH_TRAILER];
        read(c - STASH_TRAILER as u64, &mut tr)?;
        let t = u64::from_be_bytes(tr);
        let s = (c - STASH_TRAILER as u64 - 1 - l.header()) / cb;
        if t < s {
            let start = l.block_offset(s);
            let mut region = vec![0u8; (c - STASH_TRAILER as u64 - start) as usize];
            let got = read(start, &mut region)?;
            if got == region.len() && got > o {
                if let Ok(len) = codec.open_into(t, true, &region, &mut plain, what) {
                    return Ok(Some(found(t, len, &plain, TailRule::Stash)));
                }
            }
        }
    }
    // R3: drop the torn final block; walk back over holes (SPARSE only), over complete inner
    // blocks (with "ordered-growth": the new blocks of a growing write torn further on) and
    // at most one other block that does not open (a torn stash) to the block that ends it.
    let mut skipped = false;
    let mut j = f;
    while j > 0 {
        j -= 1;
        let b = slot(j)?;
        if b.iter().all(|&x| x == 0) {
            if sparse {
                continue;
            }
        } else if let Some((len, _)) = opens_as_end(codec, l, j, &b, ordered, &mut plain, what) {
            return Ok(Some(found(j, len, &plain, TailRule::Dropped)));
        } else if ordered && b.len() as u64 == cb && codec.open_into(j, false, &b, &mut plain, what).is_ok() {
            continue;
        }
        if skipped {
            return Ok(None);
        }
        skipped = true;
    }
    // With "ordered-growth" every state a writer leaves keeps a block sealed as last (a first
    // write's blocks go out before its header): nothing ending the file is tampering.
    if ordered {
        return Ok(None);
    }
    Ok(Some(Tail { size: 0, last: None, rule: TailRule::Empty }))
}

/// Whether the stored bytes `b` of slot `j` open as a block that can end the file: as the
/// last block; if full and not `ordered`, as an inner block; or as a shorter last block
/// followed only by zeros. Returns the plaintext length (in `plain`) and `Settled` for the
/// first case.
fn opens_as_end(
    codec: &BlockCodec,
    l: &Layout,
    j: u64,
    b: &[u8],
    ordered: bool,
    plain: &mut [u8],
    what: &str,
) -> Option<(usize, TailRule)> {
    let o = l.overhead as usize;
    if b.len() <= o || b.iter().all(|&x| x == 0) {
        return None;
    }
    if let Ok(len) = codec.open_into(j, true, b, plain, what) {
        return Some((len, TailRule::Settled));
    }
    if !ordered && b.len() as u64 == l.cipher_block() {
        if let Ok(len) = codec.open_into(j, false, b, plain, what) {
            return Some((len, TailRule::FinalRecovered));
        }
    }
    let z = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    (z.max(o + 1)..b.len())
        .find_map(|len| codec.open_into(j, true, &b[..len], plain, what).ok())
        .map(|len| (len, TailRule::FinalRecovered))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::ContentCipher;
    use crate::keys::MasterKey;

    const B: u64 = 512;

    /// A file's geometry, codec and a ciphertext body under construction (the header's 36
    /// bytes are zeros: `resolve` never reads them).
    struct F {
        l: Layout,
        codec: BlockCodec,
        c: Vec<u8>,
    }

    impl F {
        fn new() -> F {
            let keys = MasterKey::from_bytes([7; 32]).subkeys();
            let cipher = ContentCipher::Aes256Gcm;
            let l = Layout::new(B, cipher.overhead() as u64);
            F { l, codec: BlockCodec::new(cipher, &keys, [9; 16]), c: vec![0; 36] }
        }
        /// Block `n` sealed with `last`, holding `len` bytes of `n as u8 + 1`.
        fn block(&self, n: u64, last: bool, len: usize) -> Vec<u8> {
            let mut out = vec![0u8; len + self.l.overhead as usize];
            self.codec.seal_into(n, last, &vec![n as u8 + 1; len], &mut out);
            out
        }
        /// Puts `b` at slot `n` (growing the file as needed).
        fn put(&mut self, n: u64, b: &[u8]) -> &mut Self {
            let at = self.l.block_offset(n) as usize;
            if self.c.len() < at + b.len() {
                self.c.resize(at + b.len(), 0);
            }
            self.c[at..at + b.len()].copy_from_slice(b);
            self
        }
        /// A settled file of `k` blocks, the last `len` bytes long.
        fn settled(k: u64, len: usize) -> F {
            let mut f = F::new();
            for n in 0..k {
                let b = if n + 1 == k { f.block(n, true, len) } else { f.block(n, false, B as usize) };
                f.put(n, &b);
            }
            f
        }
        fn resolve(&self, sparse: bool, ordered: bool) -> Option<Tail> {
            let read = |off: u64, buf: &mut [u8]| -> Result<usize> {
                let from = (off as usize).min(self.c.len());
                let n = buf.len().min(self.c.len() - from);
                buf[..n].copy_from_slice(&self.c[from..from + n]);
                Ok(n)
            };
            resolve(&self.l, &self.codec, self.c.len() as u64, sparse, ordered, &read, "t").unwrap()
        }
    }

    #[test]
    fn a_full_inner_block_ends_a_file_only_without_ordered_growth() {
        // A settled file of 4 blocks cut after block 1 (a replayed UNSETTLED header would
        // make a reader look at it by these rules).
        let mut f = F::settled(4, 100);
        f.c.truncate(f.l.block_offset(2) as usize);
        let old = f.resolve(false, false).expect("old rules: case (b)");
        assert_eq!((old.size, old.rule), (2 * B, TailRule::FinalRecovered));
        assert!(f.resolve(false, true).is_none(), "ordered: no block sealed as last, an integrity error");
        // The same with SPARSE, and with a torn slot after it.
        assert!(f.resolve(true, true).is_none());
        f.put(2, &[1u8; 40]);
        assert!(f.resolve(false, true).is_none());
    }

    #[test]
    fn the_walk_back_passes_complete_inner_blocks_to_an_older_last_block() {
        // Block 1 was the last (200 bytes); a growing write wrote blocks 2, 3 (inner) and was
        // torn in block 4; block 1 is still sealed as last (its inner copy is in the stash).
        let mut f = F::settled(2, 200);
        let (b2, b3) = (f.block(2, false, B as usize), f.block(3, false, B as usize));
        f.put(2, &b2).put(3, &b3).put(4, &[5u8; 300]);
        for ordered in [false, true] {
            let t = f.resolve(false, ordered).expect("reads");
            assert_eq!(t.rule, TailRule::Dropped);
            // Without the feature the walk stops at block 3, a full inner block.
            assert_eq!(t.size, if ordered { B + 200 } else { 4 * B }, "ordered: {ordered}");
        }
        // With holes between (SPARSE): the walk passes them as well.
        let mut g = F::settled(2, 200);
        let b5 = g.block(5, false, B as usize);
        g.put(5, &b5).put(6, &[5u8; 300]);
        assert_eq!(g.resolve(true, true).map(|t| t.size), Some(B + 200));
        assert!(g.resolve(false, true).is_none(), "zeros are not holes without SPARSE");
    }

    #[test]
    fn passing_slot_0_is_an_error_with_ordered_growth_and_empty_without() {
        // Two complete inner blocks and a torn third: nothing sealed as last.
        let mut f = F::new();
        let (b0, b1) = (f.block(0, false, B as usize), f.block(1, false, B as usize));
        f.put(0, &b0).put(1, &b1).put(2, &[3u8; 100]);
        assert!(f.resolve(false, true).is_none());
        // Without the feature: the walk stops at block 1 (case b).
        assert_eq!(f.resolve(false, false).map(|t| t.size), Some(2 * B));
        // A torn first block alone: empty without the feature, an error with it.
        let mut g = F::new();
        g.put(0, &[3u8; 100]);
        assert_eq!(g.resolve(false, false).map(|t| t.rule), Some(TailRule::Empty));
        assert!(g.resolve(false, true).is_none());
    }

    #[test]
    fn ordered_growth_keeps_rules_1_and_2_and_the_short_last_block_followed_by_zeros() {
        // Rule 1 (a): the final block sealed as last.
        let f = F::settled(3, 10);
        assert_eq!(f.resolve(false, true).map(|t| (t.size, t.rule)), Some((2 * B + 10, TailRule::Settled)));
        // Rule 1 (c): a shorter last block followed by zeros (the old final block of a
        // growing write, before the new blocks came).
        let mut g = F::settled(3, 10);
        g.c.resize(g.l.block_offset(3) as usize, 0);
        assert_eq!(g.resolve(false, true).map(|t| (t.size, t.rule)), Some((2 * B + 10, TailRule::FinalRecovered)));
        // Rule 2: a stash of block 1 after the end, block 1 torn in place.
        let mut h = F::settled(3, 10);
        let stash = stash_bytes(1, &h.block(1, true, 300));
        let end = h.l.block_offset(3) as usize;
        h.c.resize(end, 0);
        h.c.extend_from_slice(&stash);
        h.put(1, &[0xee; 200]);
        assert_eq!(h.resolve(false, true).map(|t| (t.size, t.rule)), Some((B + 300, TailRule::Stash)));
    }
}
