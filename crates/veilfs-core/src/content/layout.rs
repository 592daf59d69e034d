//! Offset math between plaintext and ciphertext (pure functions, property-tested).
//!
//! With block size `B`, per-block overhead `O` (nonce + tag) and header length `H`:
//! a file of `p > 0` plaintext bytes is `H + floor(p/B)·(B+O) + (p mod B > 0 ? p mod B + O : 0)`
//! ciphertext bytes, and an empty file is 0 bytes (no header). Every other size (a cut-off
//! header, a header without blocks, a last block no longer than its overhead) can only come
//! from truncation or damage. Plaintext block `n` starts at ciphertext offset `H + n·(B+O)`.

use super::header::HEADER_LEN;
use crate::error::{Error, Result};

/// The block geometry of a vault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Plaintext bytes per block.
    pub block_size: u64,
    /// Ciphertext bytes added per block (nonce + tag).
    pub overhead: u64,
}

impl Layout {
    /// A layout for `block_size` plaintext bytes and `overhead` extra bytes per block.
    pub const fn new(block_size: u64, overhead: u64) -> Self {
        Layout { block_size, overhead }
    }

    /// Bytes of one full ciphertext block.
    pub const fn cipher_block(&self) -> u64 {
        self.block_size + self.overhead
    }

    /// Header length.
    pub const fn header(&self) -> u64 {
        HEADER_LEN as u64
    }

    /// Number of blocks holding `plain_size` bytes.
    pub const fn block_count(&self, plain_size: u64) -> u64 {
        plain_size.div_ceil(self.block_size)
    }

    /// Ciphertext size of a file of `plain_size` bytes.
    pub fn cipher_size(&self, plain_size: u64) -> u64 {
        if plain_size == 0 {
            return 0;
        }
        let full = plain_size / self.block_size;
        let rem = plain_size % self.block_size;
        self.header() + full * self.cipher_block() + if rem > 0 { rem + self.overhead } else { 0 }
    }

    /// Plaintext size of a ciphertext file of `cipher_size` bytes, or an error if no valid
    /// file has that size (a cut-off header or a last block shorter than its overhead).
    pub fn plain_size(&self, cipher_size: u64) -> Result<u64> {
        // A header alone is an empty file (docs/FORMAT.md §5.3): what a crash between a
        // first write's header and its blocks leaves, no more to an attacker than a cut to 0.
        if cipher_size == 0 || cipher_size == self.header() {
            return Ok(0);
        }
        if cipher_size < self.header() {
            return Err(Error::auth(
                "file",
                format!("ciphertext of {cipher_size} bytes has no complete block after the header (truncated file)"),
            ));
        }
        let body = cipher_size - self.header();
        let blocks = body.div_ceil(self.cipher_block());
        let last = body - blocks.saturating_sub(1) * self.cipher_block();
        if blocks > 0 && last <= self.overhead {
            return Err(Error::auth("file", format!("last block of {last} bytes is too short (truncated file)")));
        }
        Ok(body - blocks * self.overhead)
    }

    /// Like [`plain_size`](Self::plain_size) but never fails: a damaged size is rounded down to
    /// what could still be read. For `stat`, where an error would hide the file.
    pub fn plain_size_lenient(&self, cipher_size: u64) -> u64 {
        if cipher_size <= self.header() {
            return 0;
        }
        let body = cipher_size - self.header();
        let blocks = body.div_ceil(self.cipher_block());
        let last = body - blocks.saturating_sub(1) * self.cipher_block();
        let full_blocks = blocks - 1;
        full_blocks * self.block_size + last.saturating_sub(self.overhead)
    }

    /// The most plaintext one file can hold in `cipher_bytes` bytes of ciphertext: the largest
    /// `p` with `cipher_size(p) <= cipher_bytes` (one header, and each block's overhead). For
    /// `statfs`, which reports the backing store's free space in plaintext bytes.
    pub fn plain_capacity(&self, cipher_bytes: u64) -> u64 {
        let Some(body) = cipher_bytes.checked_sub(self.header()) else { return 0 };
        let full = body / self.cipher_block();
        full * self.block_size + (body % self.cipher_block()).saturating_sub(self.overhead)
    }

    /// Ciphertext offset of plaintext block `n`.
    pub const fn block_offset(&self, n: u64) -> u64 {
        HEADER_LEN as u64 + n * (self.block_size + self.overhead)
    }

    /// The block index holding plaintext offset `off`.
    pub const fn block_of(&self, off: u64) -> u64 {
        off / self.block_size
    }

    /// Blocks touched by the plaintext range `[off, off+len)`: `(first, last_inclusive)`,
    /// or `None` for an empty range.
    pub fn blocks_touched(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        if len == 0 {
            return None;
        }
        Some((off / self.block_size, (off + len - 1) / self.block_size))
    }

    /// Plaintext length of block `n` in a file of `plain_size` bytes (0 if past the end).
    pub fn block_len(&self, n: u64, plain_size: u64) -> u64 {
        let start = n * self.block_size;
        if start >= plain_size {
            0
        } else {
            (plain_size - start).min(self.block_size)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: Layout = Layout::new(4096, 28);

    #[test]
    fn sizes_at_edges() {
        assert_eq!(L.cipher_size(0), 0);
        assert_eq!(L.cipher_size(1), 36 + 1 + 28);
        assert_eq!(L.cipher_size(4096), 36 + 4124);
        assert_eq!(L.cipher_size(4097), 36 + 4124 + 29);
        assert_eq!(L.plain_size(0).unwrap(), 0);
        assert_eq!(
            L.plain_size(36).unwrap(),
            0,
            "a header alone is an empty file (a crash after a first write's header)"
        );
        assert!(L.plain_size(35).is_err(), "a cut-off header is a truncated file");
        assert!(L.plain_size(36 + 28).is_err(), "a block with no payload is invalid");
        assert!(L.plain_size(36 + 4124 + 10).is_err());
    }

    #[test]
    fn overhead_below_one_percent_for_large_files() {
        for layout in [Layout::new(4096, 28), Layout::new(4096, 40)] {
            let p = 1u64 << 30;
            let c = layout.cipher_size(p);
            assert!((c - p) as f64 / p as f64 <= 0.01, "{layout:?}: {c}");
        }
    }

    proptest! {
        #[test]
        fn size_round_trip(p in 0u64..(1 << 40), bs_log in 9u32..17, nonce in prop::sample::select(vec![12u64, 24])) {
            let l = Layout::new(1 << bs_log, nonce + 16);
            prop_assert_eq!(l.plain_size(l.cipher_size(p)).unwrap(), p);
            prop_assert_eq!(l.plain_size_lenient(l.cipher_size(p)), p);
        }

        #[test]
        fn every_small_size_round_trips(p in 0u64..(5 * 4096)) {
            prop_assert_eq!(L.plain_size(L.cipher_size(p)).unwrap(), p);
        }

        #[test]
        fn invalid_sizes_are_rejected_or_consistent(c in 0u64..(1 << 24)) {
            // Every ciphertext size either maps to a plaintext size that maps back, or is invalid.
            if let Ok(p) = L.plain_size(c) {
                prop_assert_eq!(L.cipher_size(p), c);
            }
            prop_assert!(L.plain_size_lenient(c) <= L.plain_size(c).unwrap_or(u64::MAX));
        }

        #[test]
        fn plain_capacity_is_the_largest_file_that_fits(c in 0u64..(1 << 40), bs_log in 9u32..17, nonce in prop::sample::select(vec![12u64, 24])) {
            let l = Layout::new(1 << bs_log, nonce + 16);
            let p = l.plain_capacity(c);
            prop_assert!(l.cipher_size(p) <= c);
            prop_assert!(l.cipher_size(p + 1) > c);
        }

        #[test]
        fn blocks_touched_cover_range(off in 0u64..(1 << 30), len in 1u64..(1 << 21)) {
            let (a, b) = L.blocks_touched(off, len).unwrap();
            prop_assert!(a * L.block_size <= off);
            prop_assert!((b + 1) * L.block_size >= off + len);
            prop_assert!(b * L.block_size < off + len);
            prop_assert_eq!(L.block_offset(a), 36 + a * 4124);
        }
    }
}
