//! Size changes: truncate (shrinking re-seals the new final block, then cuts; growing writes
//! the new final block's zeros through the write path) and `fallocate`.

use super::{CryptFile, HDR_ABSENT};
use crate::crash;
use crate::error::{Error, IoContext, Result};
use crate::sys;
use std::sync::atomic::Ordering;

impl CryptFile {
    /// Changes the plaintext size of a file of `size` bytes to `new_size`.
    pub fn truncate(&self, new_size: u64, size: u64) -> Result<()> {
        if new_size == size {
            return Ok(());
        }
        self.keeping_setid(|| self.truncate_now(new_size, size))?;
        self.sized_to.store(new_size, Ordering::Release);
        Ok(())
    }

    pub(super) fn truncate_now(&self, new_size: u64, size: u64) -> Result<()> {
        if self.ctx.block_map {
            return self.truncate_map(new_size, size);
        }
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
                true => self.truncate_now(end, size).map(|()| {
                    self.sized_to.store(end, Ordering::Release);
                    end
                }),
                false => Ok(size),
            }
        })
    }
}
