//! The writer's side of the stashes: the copy of a final block after the file's end
//! (docs/FORMAT.md §5.8) and the ring of inner-block records beside the file (§5.9), which
//! let a crash in the middle of an overwrite be read back whole.
//!
//! A full disk never refuses a write because a stash has no room, except where the stash is
//! the only thing that keeps fsynced bytes across a crash (a growing write with
//! `"ordered-growth"`).

use super::{CryptFile, InnerStash};
use crate::content::tail;
use crate::crash;
use crate::error::{Error, IoContext, Result};
use crate::stash;
use crate::sys;
use std::os::fd::AsFd;
use std::sync::Arc;

impl CryptFile {
    /// Removes this file's stash file, if this vault keeps them (missing is fine).
    pub(super) fn remove_stash(&self) {
        if let Some(dir) = &self.ctx.stashes {
            if let Err(e) = dir.remove(self.id()) {
                tracing::warn!("{}: cannot remove: {e}", dir.path_of(self.id()).display());
            }
        }
    }

    /// Ends the write session's inner-block stash: removes the file.
    pub(super) fn end_inner(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.fd.take().is_some() {
            self.remove_stash();
        }
        g.pos = 0;
    }

    /// Before a write of `nblocks` blocks that logs inner blocks (and before it holds
    /// `epoch`): when its records would run past the ring, waits for the writes in flight
    /// (their records are then no longer needed) and starts the ring again.
    pub(super) fn ring_room(&self, nblocks: u64) {
        let rec = (stash::RECORD_HEAD as u64 + self.ctx.layout.cipher_block()) * nblocks;
        let full = |g: &InnerStash| g.fd.is_some() && g.pos > 0 && g.pos + rec > stash::RING;
        if !full(&self.inner.lock().unwrap_or_else(|e| e.into_inner())) {
            return;
        }
        let _all = self.epoch.write().unwrap_or_else(|e| e.into_inner());
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if full(&g) {
            g.pos = 0;
        }
    }

    /// Logs the inner blocks `first..=upto` of a write (docs/FORMAT.md §5.9) before it goes
    /// out: `cts` holds their new ciphertexts (full blocks from `first` on). A hole this
    /// session made gets a hole record per run instead (a write-back flush filling a
    /// stream's holes out of order: one record per write, no copy). One `pwrite` to the
    /// stash, outside the lock (which only hands out the place and sequence numbers). A full
    /// disk is no reason to refuse the write: it goes on without the record (logged) — except
    /// when `strict` (the old final block of a growing write with `"ordered-growth"`, which a
    /// crash could otherwise lose, fsynced bytes and all): then any failure to log is the
    /// write's error, before a byte of the file is written.
    pub(super) fn log_inner(&self, first: u64, upto: u64, cts: &[u8], strict: bool) -> Result<()> {
        let Some(dir) = &self.ctx.stashes else {
            return match strict {
                true => Err(Error::io(&self.what, std::io::Error::from_raw_os_error(libc::EIO))),
                false => Ok(()),
            };
        };
        let cb = self.ctx.layout.cipher_block() as usize;
        let rec = stash::RECORD_HEAD + cb;
        let mut recs = Vec::with_capacity((upto - first + 1) as usize * rec);
        let mut hole_from = None;
        for n in first..=upto {
            if self.pending_hole(n) {
                hole_from.get_or_insert(n);
                continue;
            }
            if let Some(a) = hole_from.take() {
                stash::hole_record(&mut recs, a, n, cb);
            }
            let i = (n - first) as usize * cb;
            stash::block_record(&mut recs, n, &cts[i..i + cb]);
        }
        if let Some(a) = hole_from {
            stash::hole_record(&mut recs, a, upto + 1, cb);
        }
        let (fd, at) = {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if g.fd.is_none() {
                match dir.create(self.id()) {
                    Ok(fd) => g.fd = Some(Arc::new(fd)),
                    Err(e) if strict => {
                        return Err(Error::io(format!("creating {}", dir.path_of(self.id()).display()), e))
                    }
                    Err(e) => {
                        tracing::warn!("{}: cannot create ({e}); writing without it", dir.path_of(self.id()).display());
                        return Ok(());
                    }
                }
                g.pos = 0;
            }
            if g.pos + recs.len() as u64 > stash::READ_LIMIT {
                if strict {
                    let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
                    return Err(Error::io(format!("writing {}", dir.path_of(self.id()).display()), e));
                }
                // Only with dozens of writes in flight at once: no reader would look there.
                tracing::warn!("{}: stash full; writing blocks {first}..={upto} without it", self.what);
                return Ok(());
            }
            stash::number(&mut recs, rec, g.seq);
            g.seq += (recs.len() / rec) as u64;
            let at = g.pos;
            g.pos += recs.len() as u64;
            (g.fd.clone().expect("just set"), at)
        };
        // A write refused part-way leaves a cut record there, which no reader takes for one
        // (it does not authenticate).
        match sys::pwrite_all(fd.as_fd(), &recs, at) {
            Ok(()) => {}
            Err(e) if !strict && matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)) => {
                tracing::debug!("{}: no room to stash blocks {first}..={upto} ({e}); going on without", self.what);
                return Ok(());
            }
            Err(e) => return Err(Error::io(format!("writing {}", dir.path_of(self.id()).display()), e)),
        }
        crash::point!("file.inner_stashed");
        Ok(())
    }

    /// Writes a stash of block `n` (its ciphertext sealed as last, `ct`) at offset `at`,
    /// after the file's end (docs/FORMAT.md §5.8); returns whether it was written. Where the
    /// backing store has no room for it, the file is cut back to `at` and the step goes on
    /// without one (the crash window of a file without the feature, logged), so a full disk
    /// never refuses a write inside the file or a truncate that frees space.
    pub(super) fn write_stash(&self, n: u64, ct: &[u8], at: u64, end: u64) -> Result<bool> {
        match sys::pwrite_all(self.fd(), &tail::stash_bytes(n, ct), at) {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)) => {
                tracing::debug!("{}: no room to stash block {n} ({e}); going on without", self.what);
                sys::ftruncate(self.fd(), end).ctx(|| format!("truncating {}", self.what))?;
                return Ok(false);
            }
            Err(e) => return Err(Error::io(format!("writing {}", self.what), e)),
        }
        crash::point!("file.tail_stashed");
        Ok(true)
    }
}
