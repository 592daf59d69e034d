//! The write path: positional writes, growth past the end, and the undo of a write the
//! backing store refused.
//!
//! Each write encrypts every block it touches into one buffer and writes it with one system
//! call; the (at most two) partly covered blocks are read, changed and re-sealed. The order
//! of the steps is what the crash rules of docs/FORMAT.md §5.7-§5.9 need, and a full disk
//! leaves the file as it was (see `write_at`).

use super::{with_scratch, CryptFile, HDR_ABSENT, HDR_PLAIN, HDR_SPARSE, HDR_UNKNOWN};
use crate::content::tail;
use crate::crash;
use crate::error::{Error, IoContext, Result};
use crate::sys;
use std::sync::atomic::Ordering;

impl CryptFile {
    /// Whether the file may have holes (SPARSE, or holes not yet declared).
    pub(super) fn may_have_holes(&self) -> bool {
        self.header_state() == HDR_SPARSE || self.has_pending.load(Ordering::Acquire)
    }

    /// Allocates backing space for ciphertext `[off, off + len)` ahead of a write into blocks
    /// that may be holes, so a full disk fails here, before a byte is written, instead of in
    /// the middle of a block: a hole half overwritten is neither zeros nor a valid block.
    /// Backing filesystems without `fallocate` are written to as before. (For truncate; the
    /// hot write path repairs afterwards instead, see [`zero_torn_hole`](Self::zero_torn_hole).)
    pub(super) fn reserve_holes(&self, off: u64, len: u64) -> Result<()> {
        if len == 0 || !self.may_have_holes() {
            return Ok(());
        }
        match sys::fallocate(self.fd(), libc::FALLOC_FL_KEEP_SIZE, off, len) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)) => Ok(()),
            r => r.ctx(|| format!("writing {}", self.what)),
        }
    }

    /// After a write into ciphertext `[from, to)` was refused part-way for want of space, puts
    /// back the hole it stopped in. The write went out in order, so the first hole at or after
    /// `from` is where it stopped; the block around that point was a hole (a written block is
    /// allocated whole), so the part of it before that point goes back to zeros, which lie in
    /// space just allocated. Blocks before it hold their new content, blocks after it are
    /// untouched. Nothing is done when no hole is found there (a copy-on-write filesystem
    /// refusing to overwrite data): data is never turned into zeros.
    pub(super) fn zero_torn_hole(&self, from: u64, to: u64) {
        let l = self.ctx.layout;
        let Ok(x) = sys::seek_hole(self.fd(), from) else { return };
        if x >= to || x < l.header() {
            return;
        }
        let start = l.block_offset((x - l.header()) / l.cipher_block());
        if start < x {
            let zeros = vec![0u8; (x - start) as usize];
            if let Err(e) = sys::pwrite_all(self.fd(), &zeros, start) {
                tracing::error!(
                    "{}: could not undo a failed write into a hole, the file may be damaged: {e}",
                    self.what
                );
            }
        }
    }

    /// Puts a file back as it was before a failed grow or truncate: cut to `csize` ciphertext
    /// bytes, and block `old.0` (its old last block, whose old ciphertext is `old.1`) written
    /// back in place. Cutting first frees the space; the old block then lies in space it held
    /// before, so restoring it does not allocate. Best effort: a failure is logged.
    pub(super) fn undo(&self, csize: Option<u64>, old: Option<&(u64, Vec<u8>)>) {
        let l = self.ctx.layout;
        let res = csize.map_or(Ok(()), |c| sys::ftruncate(self.fd(), c)).and_then(|()| match old {
            Some((n, ct)) => sys::pwrite_all(self.fd(), ct, l.block_offset(*n)),
            None => Ok(()),
        });
        match res {
            Ok(()) if csize == Some(0) => self.header.store(HDR_ABSENT, Ordering::Release),
            Ok(()) => {}
            Err(e) => tracing::error!("{}: could not undo a failed write, the file may be damaged: {e}", self.what),
        }
    }

    /// Writes `data` at `off` into a file of `size` plaintext bytes; returns the new size.
    ///
    /// A write the backing store refuses (a full disk, a quota) leaves the file as it was:
    /// every block still authenticates and the size is the old one (blocks the write replaces
    /// inside the old size may already hold their new content). Two steps make that so:
    /// - a hole inside the old size that a full disk refused part-way is zeroed again
    ///   ([`zero_torn_hole`](Self::zero_torn_hole));
    /// - a write that grows the file keeps the old last block's ciphertext, and if any part of
    ///   the grow fails (the old last block re-sealed as an inner block, a new block cut off by
    ///   ENOSPC after a short `pwrite`), the file is cut back to its old length and that block
    ///   written back ([`undo`](Self::undo)).
    ///
    /// On the success path this costs no extra system call (the old last block is read anyway
    /// to re-seal it), except one read of it when a growing write replaces it whole.
    ///
    /// With UNSETTLED (docs/FORMAT.md §5.8) a write that changes the final block first sets
    /// the flag (once per write session), and when that block may hold fsynced bytes, first
    /// stashes its old ciphertext after the end: a crash in the `pwrite` that rewrites it
    /// then leaves the stash to read it from.
    pub fn write_at(&self, data: &[u8], off: u64, size: u64) -> Result<u64> {
        if data.is_empty() {
            return Ok(size);
        }
        match self.ctx.block_map {
            true => self.keeping_setid(|| self.write_at_map(data, off, size)),
            false => self.keeping_setid(|| self.write_at_now(data, off, size)),
        }
    }

    pub(super) fn write_at_now(&self, data: &[u8], off: u64, size: u64) -> Result<u64> {
        self.recover_tail()?;
        let l = self.ctx.layout;
        let end = off + data.len() as u64;
        let (first, last) = l.blocks_touched(off, data.len() as u64).expect("non-empty");
        let csize = l.cipher_size(size);
        let old_last = size.saturating_sub(1) / l.block_size;
        let touches_tail = size == 0 || end > size || last >= old_last;
        let ordered = self.ordered_writer();
        // The write reaches past the old final block (which becomes an inner block).
        let grows = size > 0 && last > old_last;
        // Inner blocks overwritten in place are logged first (docs/FORMAT.md §5.9), and the
        // session is not settled until they are written. With "ordered-growth" a growing
        // write logs the old final block's new inner ciphertext as well, and must.
        let inner = self.unsettled_ok() && self.ctx.stashes.is_some() && size > 0 && first < old_last;
        let log = if ordered && grows {
            Some((first.min(old_last), old_last, true))
        } else {
            inner.then(|| (first, last.min(old_last - 1), false))
        };
        if touches_tail || inner {
            self.ensure_unsettled()?;
        }
        if let Some((from, upto, _)) = log {
            self.ring_room(upto - from + 1);
        }
        let _epoch = log.is_some().then(|| self.epoch.read().unwrap_or_else(|e| e.into_inner()));
        // The final block rewritten in place is stashed first: always with "ordered-growth"
        // (a torn rewrite has no other end to fall back to), else when it may hold fsynced
        // bytes. A growing write needs no stash with "ordered-growth": its record covers it.
        let stash = self.unsettled_ok()
            && size > 0
            && touches_tail
            && if ordered { !grows } else { old_last * l.block_size < self.durable.load(Ordering::Acquire) };
        // Holes inside the old size that a full disk refused part-way are zeroed again.
        let holes = self.may_have_holes();
        let repair = |e: &Error| {
            let full = matches!(e, Error::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)));
            if holes && full {
                self.zero_torn_hole(l.block_offset(first), csize.min(l.block_offset(last + 1)));
            }
        };
        if end <= size && !stash {
            return self.write_blocks(data, off, size, None, false, log).inspect_err(repair);
        }
        // In a grow the old last block is always touched: re-sealed as an inner block, or
        // rewritten longer.
        let old = match size {
            0 => None,
            _ => Some((old_last, self.read_block_ct(old_last, size)?)),
        };
        self.write_blocks(data, off, size, old.as_ref(), stash, log).inspect_err(|e| {
            repair(e);
            self.undo(Some(csize), old.as_ref())
        })
    }

    /// Whether this writer grows files in the order of `"ordered-growth"` (docs/FORMAT.md
    /// §5.7): the vault has it, this writer marks tail changes with UNSETTLED, and it has the
    /// stash the old final block's record goes to.
    pub(super) fn ordered_writer(&self) -> bool {
        self.unsettled_ok() && self.ctx.ordered() && self.ctx.stashes.is_some()
    }

    /// [`write_at`](Self::write_at) without the undo; `old` is the old last block and its
    /// ciphertext when the write grows the file (or stashes it); `stash`: write a stash of it
    /// first, and remove it once the block is rewritten; `log`: log blocks `from..=upto` in
    /// the inner-block stash before they are written (`strict`: or fail the write).
    ///
    /// With `"ordered-growth"` (docs/FORMAT.md §5.7) a first write goes out before the header,
    /// and a growing write logs the old final block's new inner ciphertext, writes the new
    /// blocks, and only then that block (with any inner blocks before it) in place: at every
    /// step a block sealed as last ends the file.
    pub(super) fn write_blocks(
        &self,
        data: &[u8],
        off: u64,
        size: u64,
        old: Option<&(u64, Vec<u8>)>,
        stash: bool,
        log: Option<(u64, u64, bool)>,
    ) -> Result<u64> {
        let l = self.ctx.layout;
        // Block `n` of the old file, decrypted from the copy kept for undo when it is the old
        // last block (one read less).
        let read_old = |n: u64, out: &mut [u8]| match old {
            Some((o, ct)) if *o == n => self.open_block(n, true, ct, out),
            _ => self.read_block(n, size, out),
        };
        let bs = l.block_size;
        let new_size = size.max(off + data.len() as u64);
        let (first, last) = l.blocks_touched(off, data.len() as u64).expect("non-empty");
        let new_last = (new_size - 1) / bs;
        // Blocks strictly between the old end and this write stay holes.
        let old_blocks = l.block_count(size);
        let leaves_holes = first > old_blocks;
        // A new file's header goes out with its first block in one write when they are
        // adjacent, so a crash cannot leave a header without data.
        let mut header_with_data = None;
        // With "ordered-growth" it goes out after the blocks (a crash before it leaves an
        // all-zero header: an empty file); the SPARSE it carries.
        let mut header_after = None;
        let ordered = self.ordered_writer();
        // With UNSETTLED, SPARSE goes out before the hole is made (provisionally: settle
        // clears it if the hole is filled first); without, only when not deferred.
        let unsettled = self.unsettled_ok();
        let eager_sparse = leaves_holes && (!self.deferring() || unsettled);
        if ordered && size == 0 && matches!(self.header_state(), HDR_PLAIN | HDR_SPARSE) {
            // A header alone (an empty file): gone first, so that the header is written last.
            sys::ftruncate(self.fd(), 0).ctx(|| format!("truncating {}", self.what))?;
            self.header.store(HDR_ABSENT, Ordering::Release);
            self.unsettled.store(false, Ordering::Release);
        }
        let settled_sparse = self.header_state() == HDR_SPARSE && !self.provisional_sparse.load(Ordering::Acquire);
        match self.header_state() {
            HDR_ABSENT | HDR_UNKNOWN if size == 0 && ordered => {
                self.provisional_sparse.store(eager_sparse && unsettled, Ordering::Release);
                header_after = Some(eager_sparse);
            }
            HDR_ABSENT | HDR_UNKNOWN if size == 0 && first == 0 => {
                header_with_data = Some(self.header_bytes(false, unsettled))
            }
            HDR_ABSENT | HDR_UNKNOWN if size == 0 => {
                self.provisional_sparse.store(eager_sparse && unsettled, Ordering::Release);
                self.write_header(eager_sparse, unsettled)?;
                crash::point!("file.header_alone");
            }
            HDR_PLAIN if eager_sparse => {
                let _g = self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner());
                self.provisional_sparse.store(unsettled, Ordering::Release);
                self.write_header(true, self.unsettled.load(Ordering::Acquire))?;
            }
            _ => {}
        }
        let new_holes = leaves_holes && self.deferring() && !settled_sparse;
        let stashed = match old {
            Some((n, ct)) if stash && self.write_stash(*n, ct, l.block_offset(n + 1), l.cipher_size(size))? => {
                Some(l.block_offset(n + 1) + (ct.len() + tail::STASH_TRAILER) as u64)
            }
            _ => None,
        };
        // The old last block loses its "last" flag (and is zero-extended: inner blocks are
        // full) when the write starts beyond it. Next to the write it goes out in the same
        // system call; beyond a hole, on its own (with "ordered-growth", after the write).
        let mut prefix: Vec<u8> = Vec::new();
        let mut reseal_after: Option<Vec<u8>> = None;
        let mut write_off = l.block_offset(first);
        if let Some(h) = header_with_data {
            prefix.extend_from_slice(&h);
            write_off = 0;
        } else if size > 0 {
            let old_last = (size - 1) / bs;
            if old_last < first {
                let mut blk = vec![0u8; bs as usize];
                read_old(old_last, &mut blk)?;
                let mut old = vec![0u8; (bs + l.overhead) as usize];
                self.codec.seal_into(old_last, false, &blk, &mut old);
                if old_last + 1 == first {
                    prefix = old;
                    write_off = l.block_offset(old_last);
                } else if ordered {
                    reseal_after = Some(old);
                } else {
                    sys::pwrite_all(self.fd(), &old, l.block_offset(old_last))
                        .ctx(|| format!("writing {}", self.what))?;
                    crash::point!("file.reseal_alone");
                    // The stash lies where a hole goes: the re-sealed block now holds it all.
                    if stashed.is_some() {
                        sys::ftruncate(self.fd(), l.block_offset(old_last + 1))
                            .ctx(|| format!("truncating {}", self.what))?;
                    }
                }
            }
        }
        // Encrypt every touched block into one buffer and write it with one system call.
        let ct_start = l.block_offset(first);
        let ct_len = (l.block_offset(last) + l.block_len(last, new_size) + l.overhead - ct_start) as usize;
        let nl = self.codec.nonce_len();
        let nblocks = (last - first + 1) as usize;
        let cb = l.cipher_block() as usize;
        with_scratch(prefix.len() + ct_len, bs as usize + nblocks * nl, |buf, scratch| -> Result<()> {
            buf[..prefix.len()].copy_from_slice(&prefix);
            let (plain, nonces) = scratch.split_at_mut(bs as usize);
            crate::random::fill(nonces);
            let ct = &mut buf[prefix.len()..];
            // Blocks the write covers whole are encrypted straight from the caller's data; the
            // (at most two) partly covered ones need a read-modify-write and go first. (Sealing
            // the whole blocks on several cores with rayon was measured: no faster on 2 cores,
            // where the kernel's copies already keep the other core busy.)
            let mut whole: Vec<(u64, &mut [u8])> = Vec::with_capacity(nblocks);
            for (i, out) in ct.chunks_mut(cb).enumerate() {
                let n = first + i as u64;
                out[..nl].copy_from_slice(&nonces[i * nl..(i + 1) * nl]);
                let bstart = n * bs;
                let blen = l.block_len(n, new_size) as usize;
                let wfrom = off.max(bstart);
                let wto = (off + data.len() as u64).min(bstart + blen as u64);
                if wfrom == bstart && wto == bstart + blen as u64 {
                    whole.push((n, out));
                    continue;
                }
                let covers_old = wfrom == bstart && (wto - bstart) >= l.block_len(n, size);
                let pb = &mut plain[..blen];
                if !covers_old && bstart < size {
                    let got = read_old(n, pb)?;
                    pb[got..].fill(0);
                } else {
                    pb.fill(0);
                }
                pb[(wfrom - bstart) as usize..(wto - bstart) as usize]
                    .copy_from_slice(&data[(wfrom - off) as usize..(wto - off) as usize]);
                self.codec.seal_into_prefilled(n, n == new_last, pb, out);
            }
            let seal = |(n, out): &mut (u64, &mut [u8])| {
                let src = (*n * bs - off) as usize;
                let len = out.len() - l.overhead as usize;
                self.codec.seal_into_prefilled(*n, *n == new_last, &data[src..src + len], out);
            };
            whole.iter_mut().for_each(seal);
            if let Some((from, upto, strict)) = log {
                let at = l.block_offset(from);
                let cts = match at.checked_sub(write_off) {
                    Some(i) => &buf[i as usize..],
                    None => reseal_after.as_deref().expect("the old last block, re-sealed"),
                };
                self.log_inner(from, upto, cts, strict)?;
                if strict {
                    crash::point!("file.growth_logged");
                }
            }
            let writing =
                |b: &[u8], at: u64| sys::pwrite_all(self.fd(), b, at).ctx(|| format!("writing {}", self.what));
            if ordered && size > 0 && last >= old_blocks {
                // The new blocks first (the old final block, still sealed as last, ends the
                // file until they are all written), then the blocks before them in place.
                let split = (l.block_offset(old_blocks).max(write_off) - write_off) as usize;
                let (before, new) = buf.split_at(split);
                crash::torn!("file.torn_write", self.fd(), new, write_off + split as u64);
                writing(new, write_off + split as u64)?;
                crash::point!("file.grown");
                if !before.is_empty() {
                    crash::torn!("file.torn_reseal", self.fd(), before, write_off);
                    writing(before, write_off)?;
                }
                return Ok(());
            }
            if first + 1 < l.block_count(size) {
                crash::torn!("file.torn_inner", self.fd(), buf, write_off);
            }
            crash::torn!("file.torn_write", self.fd(), buf, write_off);
            writing(buf, write_off)
        })?;
        if let Some(old) = &reseal_after {
            let at = l.block_offset((size - 1) / bs);
            crash::torn!("file.torn_reseal", self.fd(), old, at);
            sys::pwrite_all(self.fd(), old, at).ctx(|| format!("writing {}", self.what))?;
            crash::point!("file.reseal_alone");
        }
        crash::point!("file.after_write");
        if let Some(sparse) = header_after {
            crash::point!("file.before_header");
            self.write_header(sparse, unsettled)?;
        }
        if header_with_data.is_some() {
            self.header.store(HDR_PLAIN, Ordering::Release);
            self.unsettled.store(unsettled, Ordering::Release);
        }
        // What is left of the stash after the file's new end goes.
        let new_csize = l.cipher_size(new_size);
        if stashed.is_some_and(|e| e > new_csize) {
            sys::ftruncate(self.fd(), new_csize).ctx(|| format!("truncating {}", self.what))?;
        }
        self.fill_pending(first, last + 1);
        if new_holes {
            self.add_pending(old_blocks, first);
        }
        Ok(new_size)
    }
}
