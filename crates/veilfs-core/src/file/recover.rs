//! A file found UNSETTLED at open (a writer crashed in its session): read by the crash rules
//! of docs/FORMAT.md §5.8 until it is settled, with torn inner blocks read from the stash the
//! writer left (§5.9); then rewritten so that it reads the same without them.

use super::{CryptFile, HDR_ABSENT, HDR_SPARSE};
use crate::content::tail::{self, Tail, TailRule};
use crate::error::{Error, IoContext, Result};
use crate::stash;
use crate::sys;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

impl CryptFile {
    /// Finds where a file found UNSETTLED ends (docs/FORMAT.md §5.8) and reads it that way
    /// until [`recover_tail`](Self::recover_tail); logs a recovered crash once.
    pub(super) fn load_view(&self) -> Result<()> {
        let l = self.ctx.layout;
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        let tail = if c <= l.header() {
            Tail { size: 0, last: None, rule: TailRule::Settled }
        } else {
            let read = |off: u64, buf: &mut [u8]| {
                sys::pread_full(self.fd(), buf, off).ctx(|| format!("reading {}", self.what))
            };
            let sparse = self.header_state() == HDR_SPARSE;
            tail::resolve(&l, &self.codec, c, sparse, self.ctx.ordered(), &read, &self.what)?.ok_or_else(|| {
                let e = Error::auth(&self.what, "unsettled file: no block at its end authenticates (damaged tail)");
                tracing::error!("{e}");
                e
            })?
        };
        if tail.rule != TailRule::Settled {
            tracing::warn!(
                "{}: recovered crash state ({}): reads as {} bytes",
                self.what,
                tail.rule.describe(),
                tail.size
            );
        }
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(tail);
        self.has_view.store(true, Ordering::Release);
        self.load_found(c);
        Ok(())
    }

    /// Reads a file whose header is all zeros (`"ordered-growth"`: a first write's blocks go
    /// out before its header, docs/FORMAT.md §5.8 rule 4) as empty until
    /// [`recover_tail`](Self::recover_tail) cuts it to 0 bytes.
    pub(super) fn load_zero_view(&self) -> Result<()> {
        let c = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        let rule = TailRule::NoHeader;
        tracing::warn!("{}: recovered crash state ({}): reads as 0 bytes", self.what, rule.describe());
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(Tail { size: 0, last: None, rule });
        self.has_view.store(true, Ordering::Release);
        self.load_found(c);
        Ok(())
    }

    /// Opens the inner-block stash a crashed writer left for this file (docs/FORMAT.md §5.9),
    /// if any; `c` is the ciphertext size. A stash that cannot be read is logged and left.
    pub(super) fn load_found(&self, c: u64) {
        let Some(dir) = &self.ctx.stashes else { return };
        let l = self.ctx.layout;
        let record = stash::RECORD_HEAD + l.cipher_block() as usize;
        let blocks = c.saturating_sub(l.header()).div_ceil(l.cipher_block());
        match dir.open(self.id(), record, blocks) {
            Ok(Some(f)) => {
                *self.found.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
                self.has_found.store(true, Ordering::Release);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("{}: cannot read: {e}", dir.path_of(self.id()).display()),
        }
    }

    /// Block `n`'s plaintext from the record of the found stash with the highest sequence
    /// number that gives it: a block record that authenticates as block `n` of this file, or
    /// (in a SPARSE file) a hole record.
    pub(super) fn stashed_block(&self, n: u64, out: &mut [u8]) -> Option<usize> {
        if !self.has_found.load(Ordering::Acquire) {
            return None;
        }
        let g = self.found.lock().unwrap_or_else(|e| e.into_inner());
        let f = g.as_ref()?;
        let cb = self.ctx.layout.cipher_block() as usize;
        let sparse = self.header_state() == HDR_SPARSE;
        let hole = |out: &mut [u8]| {
            let len = cb - self.codec.overhead();
            out[..len].fill(0);
            Some(len)
        };
        let mut ct = vec![0u8; cb];
        for kept in f.of(n) {
            let off = match kept {
                stash::Kept::Hole if sparse => return hole(out),
                stash::Kept::Hole => continue,
                stash::Kept::Block(off) => off,
            };
            if !matches!(sys::pread_full(f.fd.as_fd(), &mut ct, off), Ok(got) if got == cb) {
                continue;
            }
            if let Ok(len) = self.codec.open_into(n, false, &ct, out, &self.what) {
                return Some(len);
            }
        }
        None
    }

    /// Puts back, from the found stash, every inner block below `blocks` that no longer
    /// authenticates (a torn overwrite); returns how many.
    pub(super) fn restore_from_stash(&self, blocks: u64) -> Result<usize> {
        if !self.has_found.load(Ordering::Acquire) {
            return Ok(0);
        }
        let l = self.ctx.layout;
        let cb = l.cipher_block() as usize;
        let ranges: Vec<(u64, u64)> = {
            let g = self.found.lock().unwrap_or_else(|e| e.into_inner());
            g.as_ref().map(|f| f.ranges()).unwrap_or_default()
        };
        let (mut ct, mut plain) = (vec![0u8; cb], vec![0u8; l.block_size as usize]);
        let mut restored = 0;
        for (a, b) in ranges {
            // Inner blocks only: the final block is the end rules' business.
            let mut n = a;
            while n < b.min(blocks.saturating_sub(1)) {
                // What the backing file holds as a hole was never written, so no crash tore
                // it: skip to the next data (a hole record may span a whole sparse file).
                match sys::seek_data(self.fd(), l.block_offset(n)) {
                    Ok(off) if off >= l.block_offset(n + 1) => {
                        n = (off - l.block_offset(0)) / cb as u64;
                        continue;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
                    _ => {}
                }
                if self.restore_block(n, &mut ct, &mut plain)? {
                    restored += 1;
                }
                n += 1;
            }
        }
        Ok(restored)
    }

    /// Puts back inner block `n` from its newest record that authenticates, if the block
    /// itself does not (`ct`, `plain`: buffers of a cipher and a plain block); true if it did.
    fn restore_block(&self, n: u64, ct: &mut [u8], plain: &mut [u8]) -> Result<bool> {
        let l = self.ctx.layout;
        let got = sys::pread_full(self.fd(), ct, l.block_offset(n)).ctx(|| format!("reading {}", self.what))?;
        let hole = self.header_state() == HDR_SPARSE && ct[..got].iter().all(|&b| b == 0);
        if got == ct.len() && (hole || self.codec.open_into(n, false, ct, plain, &self.what).is_ok()) {
            return Ok(false);
        }
        let Some(len) = self.stashed_block(n, plain) else { return Ok(false) };
        let is_hole = self.header_state() == HDR_SPARSE && plain[..len].iter().all(|&b| b == 0);
        if is_hole {
            ct.fill(0);
        } else {
            self.codec.seal_into(n, false, &plain[..len], ct);
        }
        sys::pwrite_all(self.fd(), ct, l.block_offset(n)).ctx(|| format!("writing {}", self.what))?;
        tracing::warn!("{}: block {n} torn by a crash; written back from its record in the stash", self.what);
        Ok(true)
    }

    /// Removes the found stash (the file is settled).
    pub(super) fn drop_found(&self) {
        if self.has_found.swap(false, Ordering::AcqRel) {
            *self.found.lock().unwrap_or_else(|e| e.into_inner()) = None;
            self.remove_stash();
        }
    }

    /// How a file found UNSETTLED at open ends (rule and plaintext size), while it is read
    /// by the crash rules; `None` for a settled file. For fsck.
    pub fn crash_state(&self) -> Option<(TailRule, u64)> {
        if self.ctx.block_map {
            return self.map_crash_state();
        }
        if !self.has_view.load(Ordering::Acquire) {
            return None;
        }
        self.view.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|t| (t.rule, t.size))
    }

    /// Settles a file found UNSETTLED at open: rewrites its tail as the crash rules read it
    /// (the block that ends it sealed as last, at its place, and the file cut after it) and
    /// clears the flag. Each step leaves a state the rules read the same way: the block is
    /// first stashed after the end, so a crash while it is rewritten in place loses nothing.
    /// Returns the rule that had applied, `None` when there was nothing to settle. Needs a
    /// writable file; run by the mount at open and by `fsck --repair`.
    pub fn recover_tail(&self) -> Result<Option<TailRule>> {
        if self.ctx.block_map {
            return self.keeping_setid(|| self.recover_map());
        }
        if !self.has_view.load(Ordering::Acquire) {
            return Ok(None);
        }
        self.keeping_setid(|| self.recover_tail_now())
    }

    pub(super) fn recover_tail_now(&self) -> Result<Option<TailRule>> {
        let _g = self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        let Some(t) = v.as_ref() else { return Ok(None) };
        // Torn inner blocks first (docs/FORMAT.md §5.9): the stash goes only once the header
        // no longer sends a reader to it.
        self.restore_from_stash(self.ctx.layout.block_count(t.size))?;
        self.rewrite_tail(t)?;
        self.drop_found();
        let rule = t.rule;
        *v = None;
        self.has_view.store(false, Ordering::Release);
        Ok(Some(rule))
    }

    pub(super) fn rewrite_tail(&self, t: &Tail) -> Result<()> {
        let l = self.ctx.layout;
        let cut = |len: u64| sys::ftruncate(self.fd(), len).ctx(|| format!("truncating {}", self.what));
        if t.size == 0 {
            cut(0)?;
            self.header.store(HDR_ABSENT, Ordering::Release);
            self.unsettled.store(false, Ordering::Release);
            return Ok(());
        }
        if let Some((n, plain)) = &t.last {
            let mut ct = vec![0u8; plain.len() + l.overhead as usize];
            self.codec.seal_into(*n, true, plain, &mut ct);
            if t.rule != TailRule::Stash {
                // Drop what lies after the block (a torn block, holes): still read the same.
                cut(l.block_offset(n + 1))?;
                self.write_stash(*n, &ct, l.block_offset(n + 1), l.block_offset(n + 1))?;
            }
            sys::pwrite_all(self.fd(), &ct, l.block_offset(*n)).ctx(|| format!("writing {}", self.what))?;
            cut(l.cipher_size(t.size))?;
        }
        self.write_header(self.header_state() == HDR_SPARSE, false)
    }
}
