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
    /// Nothing before a torn final block opens: the file is empty.
    Empty,
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
/// `sparse`: the header has SPARSE. `None` when no rule applies (an integrity error).
pub fn resolve(l: &Layout, codec: &BlockCodec, c: u64, sparse: bool, read: ReadAt, what: &str) -> Result<Option<Tail>> {
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
    if let Some((len, rule)) = opens_as_end(codec, l, f, &slot(f)?, &mut plain, what) {
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
    // R3: drop the torn final block; walk back over holes (SPARSE only) and at most one
    // other block that does not open (a torn stash) to the block that ends the file.
    let mut skipped = false;
    let mut j = f;
    while j > 0 {
        j -= 1;
        let b = slot(j)?;
        if b.iter().all(|&x| x == 0) {
            if sparse {
                continue;
            }
        } else if let Some((len, _)) = opens_as_end(codec, l, j, &b, &mut plain, what) {
            return Ok(Some(found(j, len, &plain, TailRule::Dropped)));
        }
        if skipped {
            return Ok(None);
        }
        skipped = true;
    }
    Ok(Some(Tail { size: 0, last: None, rule: TailRule::Empty }))
}

/// Whether the stored bytes `b` of slot `j` open as a block that can end the file: as the
/// last block; if full, as an inner block; or as a shorter last block followed only by
/// zeros. Returns the plaintext length (in `plain`) and `Settled` for the first case.
fn opens_as_end(
    codec: &BlockCodec,
    l: &Layout,
    j: u64,
    b: &[u8],
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
    if b.len() as u64 == l.cipher_block() {
        if let Ok(len) = codec.open_into(j, false, b, plain, what) {
            return Some((len, TailRule::FinalRecovered));
        }
    }
    let z = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    (z.max(o + 1)..b.len())
        .find_map(|len| codec.open_into(j, true, &b[..len], plain, what).ok())
        .map(|len| (len, TailRule::FinalRecovered))
}
