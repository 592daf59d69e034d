//! The read path: positional reads of plaintext, block by block through the AEAD.
//!
//! Every block handed out has authenticated (or is a hole the header, or this session's
//! bookkeeping, declares); a block that fails is an integrity error, logged once, never data.
//! A file read by the crash rules (`recover`) takes its final block from the rule's view, and
//! an inner block torn by a crash from the stash that kept it.

use super::{with_scratch, CryptFile, HDR_SPARSE};
use crate::error::{Error, IoContext, Result};
use crate::sys;
use std::sync::atomic::Ordering;

impl CryptFile {
    /// Decrypts block `n` (whose ciphertext is `ct`) into `out`; `last` tells whether it is the
    /// file's last block. In a sparse file an all-zero ciphertext block is a hole.
    pub(super) fn open_block(&self, n: u64, last: bool, ct: &[u8], out: &mut [u8]) -> Result<usize> {
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
    pub(super) fn view_block(&self, n: u64, out: &mut [u8]) -> Option<usize> {
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

    /// Reads up to `buf.len()` bytes at `off` from a file of `size` plaintext bytes.
    pub fn read_at(&self, buf: &mut [u8], off: u64, size: u64) -> Result<usize> {
        if self.ctx.block_map {
            return self.read_at_map(buf, off, size);
        }
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
    pub(super) fn read_block(&self, n: u64, size: u64, out: &mut [u8]) -> Result<usize> {
        let l = self.ctx.layout;
        if l.block_len(n, size) == 0 {
            return Ok(0);
        }
        let ct = self.read_block_ct(n, size)?;
        self.open_block(n, n == (size - 1) / l.block_size, &ct, out)
    }

    /// The on-disk ciphertext of block `n` (which must exist) of a file of `size` bytes.
    pub(super) fn read_block_ct(&self, n: u64, size: u64) -> Result<Vec<u8>> {
        let l = self.ctx.layout;
        let mut ct = vec![0u8; (l.block_len(n, size) + l.overhead) as usize];
        let got = sys::pread_full(self.fd(), &mut ct, l.block_offset(n)).ctx(|| format!("reading {}", self.what))?;
        if got < ct.len() {
            return Err(Error::auth(&self.what, format!("block {n} is truncated")));
        }
        Ok(ct)
    }
}
