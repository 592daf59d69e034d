//! Salvage: what still authenticates of a damaged file, block by block, for `fsck --repair`
//! and `export --salvage`. Reads only; the caller decides what to do with the result.

use super::{CryptFile, HDR_SPARSE, HDR_ZERO};
use crate::error::{IoContext, Result};
use crate::sys;

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
    pub fn salvage(&self, mut sink: impl FnMut(&[u8]) -> Result<()>) -> Result<Salvaged> {
        if self.ctx.block_map {
            // Salvage by the block map's rules is not written yet: a file that reads whole is
            // kept whole, and an integrity error is returned as it is.
            let kept = self.stream(&mut sink)?;
            return Ok(Salvaged { kept, lost: Vec::new() });
        }
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
}

/// What [`CryptFile::salvage`] kept and lost.
#[derive(Debug, Default, Clone)]
pub struct Salvaged {
    /// Plaintext bytes that authenticated (the salvaged file's size, less zero-filled gaps).
    pub kept: u64,
    /// Plaintext ranges that did not authenticate (zero-filled inside, cut off at the end).
    pub lost: Vec<(u64, u64)>,
}
