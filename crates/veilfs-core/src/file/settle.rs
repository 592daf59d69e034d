//! The write session's bookkeeping and its end.
//!
//! While this process owns a file it defers declaring holes (several write-back workers write
//! one stream out of order) and, with `"unsettled-tails"`, marks tail changes with UNSETTLED;
//! settling (the last close, fsync) writes the header that describes the file as it is and
//! ends the session. The rules are on `set_defer_sparse`.

use super::{without_range, CryptFile, HDR_ABSENT, HDR_PLAIN, HDR_SPARSE, HDR_UNKNOWN};
use crate::crash;
use crate::error::{IoContext, Result};
use crate::sys;
use std::sync::atomic::Ordering;

impl CryptFile {
    /// Whether this writer marks tail changes with UNSETTLED: the vault has the feature and
    /// this process owns the file (see [`set_defer_sparse`](Self::set_defer_sparse)).
    pub(super) fn unsettled_ok(&self) -> bool {
        self.ctx.unsettled_tails && self.deferring()
    }

    /// Sets UNSETTLED in the header before the first change of the file's tail of a write
    /// session (a no-op when set, or when the header is absent: the first write's header
    /// carries the flag).
    pub(super) fn ensure_unsettled(&self) -> Result<()> {
        if !self.unsettled_ok() || self.unsettled.load(Ordering::Acquire) {
            return Ok(());
        }
        let _g = self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner());
        match self.header_state() {
            _ if self.unsettled.load(Ordering::Acquire) => Ok(()),
            HDR_ABSENT | HDR_UNKNOWN => Ok(()),
            s => self.write_header(s == HDR_SPARSE, true),
        }
    }

    /// Defers marking the file SPARSE when a write leaves a hole until [`settle`](Self::settle)
    /// (also run by [`sync`](Self::sync)), in case later writes fill the hole first.
    ///
    /// Why: with a write-back cache the kernel sends the 1 MiB writes of one stream to several
    /// worker threads at once, so a write often arrives before the one just below it. Without
    /// deferral such a file would be marked SPARSE for good, and in a SPARSE file an all-zero
    /// block reads as zeros instead of failing authentication. Until settled, the holes are
    /// known in memory only: a crash before `settle` leaves them unreadable (authentication
    /// errors), never silently zero. Only for a single process owning the file (the mount
    /// without shared storage).
    ///
    /// In a vault with `"unsettled-tails"` the same switch makes this writer set UNSETTLED
    /// before it changes the file's tail, and write SPARSE (provisionally) before a write
    /// makes a hole: a crash then leaves holes that read as zeros and a tail the crash rules
    /// read (docs/FORMAT.md §5.8). [`settle`](Self::settle) clears both when they are no
    /// longer needed.
    pub fn set_defer_sparse(&self, on: bool) {
        self.defer_sparse.store(on, Ordering::Relaxed);
    }

    /// Promises that whoever holds this handle ends its writes with [`settle`](Self::settle)
    /// (directly or through [`sync`](Self::sync)): at an fsync, at the last close, or before
    /// a partial file gets its name. A file with a block map then keeps one write session
    /// (its log, the UNSETTLED header) across calls and ends it there, instead of a session
    /// per call (a new log, two headers, a commit record, a map block and node per write).
    /// Implied by [`set_defer_sparse`](Self::set_defer_sparse)`(true)`; unlike it, it changes
    /// nothing for a file without a block map, so a writer that is not the file's only user
    /// (a `--shared-storage` mount) can set it too: meanwhile another reader reads the file by
    /// its session's log, as after a crash (docs/FORMAT.md §5.10).
    pub fn set_session_until_settle(&self, on: bool) {
        self.session_until_settle.store(on, Ordering::Relaxed);
    }

    /// Tells a file with a block map that its last name is gone while it is open: its write
    /// session ends now (its log goes), and every later write is a session of its own, whose
    /// log goes before the write returns. A session keeps its log until it is settled, but
    /// nothing settles a file without a name before its last close, and nothing ever reads
    /// that log: a crash leaves no file to recover (or one under a name no reader opens, as
    /// sshfs's `.fuse_hidden*`). Meanwhile the log sat beside the other files as if a crash
    /// had left it, and fsck reported it. Returns whether it wrote the header, as
    /// [`settle`](Self::settle). Does nothing for a file without a block map.
    pub fn set_unlinked(&self) -> Result<bool> {
        if !self.ctx.block_map {
            return Ok(false);
        }
        self.unlinked.store(true, Ordering::Relaxed);
        self.settle()
    }

    /// Settles the header: writes SPARSE if holes made by earlier writes are still unfilled
    /// (see [`set_defer_sparse`](Self::set_defer_sparse)), or clears a provisional SPARSE whose
    /// holes were all filled, and clears UNSETTLED. Run on the last close and by
    /// [`sync`](Self::sync). Returns whether it wrote the header (which moves the backing
    /// file's modification and change times: a mount tells the kernel).
    pub fn settle(&self) -> Result<bool> {
        if self.ctx.block_map {
            return self.keeping_setid(|| self.end_map_session());
        }
        let flagged = self.unsettled.load(Ordering::Acquire) || self.provisional_sparse.load(Ordering::Acquire);
        if !self.has_pending.load(Ordering::Acquire) && !flagged {
            return Ok(false);
        }
        let _e = self.epoch.write().unwrap_or_else(|e| e.into_inner());
        self.keeping_setid(|| self.settle_now())
    }

    /// Records that a write of bytes from `off` on failed after its application had been
    /// told it succeeded: the kernel's write-back of cached pages, whose errors reach the
    /// application only at its next `fsync` or `close`. See [`drop_lost`](Self::drop_lost).
    pub fn lost_write(&self, off: u64) {
        self.lost_from.fetch_min(self.ctx.layout.block_of(off), Ordering::AcqRel);
    }

    /// At the last close, after [`lost_write`](Self::lost_write): cuts the file at its first
    /// undeclared hole at or after the first lost write. Returns the file's plaintext size
    /// (cut or not) when a write was lost, `None` when none was: the caller's cached view of
    /// the file (its size, its pages) then holds data that was never stored.
    ///
    /// Why the cut: the write-back cache sends one stream's writes from several threads, so
    /// on a full disk a write often fails while one beyond it succeeds. The failed range is
    /// then a hole not yet declared, and [`settle`](Self::settle) would declare it: a run of
    /// zeros that authenticates, where the application wrote data. Cutting there instead
    /// leaves a file that is a true prefix of what was written. Nothing confirmed is lost:
    /// the application was told of the failure at its `fsync` or `close`, and an `fsync`
    /// that succeeded settled (declared) the holes before it, so none of them is still
    /// undeclared. Never below the size the session's last truncate or `fallocate` set.
    pub fn drop_lost(&self) -> Result<Option<u64>> {
        let lost = self.lost_from.swap(u64::MAX, Ordering::AcqRel);
        if lost == u64::MAX {
            return Ok(None);
        }
        let _e = self.epoch.write().unwrap_or_else(|e| e.into_inner());
        let size = self.plain_size()?;
        let cut = if self.ctx.block_map {
            self.made_hole_from(lost)
        } else {
            let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.iter().filter(|&&(_, b)| b > lost).map(|&(a, _)| a.max(lost)).min()
        };
        // A size set by truncate or fallocate was confirmed: below it, unstored data reads
        // as the zeros that size change promised (as in any sparse file).
        let floor = self.sized_to.load(Ordering::Acquire);
        let from = lost * self.ctx.layout.block_size;
        let what = &self.what;
        let Some(new_size) = cut.map(|b| (b * self.ctx.layout.block_size).max(floor)).filter(|&n| n < size) else {
            tracing::warn!(
                "{what}: writes from byte {from} on were refused after the application was told they \
                 succeeded (no space?); {size} bytes stored"
            );
            return Ok(Some(size));
        };
        self.keeping_setid(|| self.truncate_now(new_size, size))?;
        tracing::warn!(
            "{what}: writes from byte {from} on were refused after the application was told they succeeded \
             (no space?); cut from {size} to {new_size} bytes, so that no unwritten range reads as zeros"
        );
        Ok(Some(new_size))
    }

    pub(super) fn settle_now(&self) -> Result<bool> {
        let _g = self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let state = self.header_state();
        let present = state == HDR_PLAIN || state == HDR_SPARSE;
        let provisional = self.provisional_sparse.load(Ordering::Acquire);
        let sparse = (state == HDR_SPARSE && !(provisional && p.is_empty())) || (!provisional && !p.is_empty());
        let write = present && (self.unsettled.load(Ordering::Acquire) || sparse != (state == HDR_SPARSE));
        if write {
            crash::point!("file.settle_sparse");
            // Bookkeeping, not a change of content: the file keeps the modification time that
            // its last write, or a utimensat(2) since (one that came before this last close's
            // RELEASE, which the kernel sends in the background), gave it.
            let before = sys::fstat(self.fd()).ok();
            self.write_header(sparse, false)?;
            if let Some(st) = before {
                self.put_back_mtime(&st);
            }
        }
        self.provisional_sparse.store(false, Ordering::Release);
        p.clear();
        self.has_pending.store(false, Ordering::Release);
        drop(p);
        // The session ends: its inner-block stash goes (docs/FORMAT.md §5.9).
        if !self.unsettled.load(Ordering::Acquire) && !self.has_view.load(Ordering::Acquire) {
            self.end_inner();
        }
        Ok(write)
    }

    /// Sets the backing file's modification time back to `before`'s (a header write of the
    /// daemon's own moved it). Best effort: a failure leaves the time of that write.
    pub(super) fn put_back_mtime(&self, before: &sys::Stat) {
        let omit = libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT };
        let mtime = libc::timespec { tv_sec: before.st_mtime, tv_nsec: before.st_mtime_nsec };
        if let Err(e) = sys::futimens(self.fd(), &[omit, mtime]) {
            tracing::debug!("{}: modification time not put back after settling: {e}", self.what);
        }
    }

    /// Holds off [`settle`](Self::settle)'s header write while the caller sets the backing
    /// file's times, so that settling never puts back a time read before them.
    pub fn times_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.hdr_lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn deferring(&self) -> bool {
        self.defer_sparse.load(Ordering::Relaxed)
    }

    /// Whether a write session of a file with a block map stays open until
    /// [`settle`](Self::settle) (see [`set_session_until_settle`](Self::set_session_until_settle)).
    pub(super) fn session_kept(&self) -> bool {
        !self.unlinked.load(Ordering::Relaxed)
            && (self.deferring() || self.session_until_settle.load(Ordering::Relaxed))
    }

    /// Whether block `n` is a hole not yet declared in the header.
    pub(super) fn pending_hole(&self, n: u64) -> bool {
        self.has_pending.load(Ordering::Acquire)
            && self.pending.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|&(a, b)| a <= n && n < b)
    }

    /// Records blocks `a..b` as undeclared holes.
    pub(super) fn add_pending(&self, a: u64, b: u64) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.push((a, b));
        self.has_pending.store(true, Ordering::Release);
    }

    /// Forgets undeclared holes in blocks `a..b` (written, or cut off by a truncate).
    pub(super) fn fill_pending(&self, a: u64, b: u64) {
        if !self.has_pending.load(Ordering::Acquire) {
            return;
        }
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        *p = without_range(&p, a, b);
        self.has_pending.store(!p.is_empty(), Ordering::Release);
    }

    /// Flushes data and metadata to stable storage (`fdatasync` when `data_only`).
    ///
    /// Holes are declared before the flush. UNSETTLED is cleared after it: the flush makes
    /// a complete tail durable first, so a crash after a sync never needs the crash rules for
    /// what it flushed (the cleared header reaches the disk with the next flush). Returns
    /// whether the header was written (see [`settle`](Self::settle)).
    pub fn sync(&self, data_only: bool) -> Result<bool> {
        // A file with a block map ends its session before the flush, so that the flush makes
        // the settled header durable with the data (its log is never flushed).
        let before = (self.ctx.block_map || !self.unsettled_ok()) && self.settle()?;
        let r = if data_only { sys::fdatasync(self.fd()) } else { sys::fsync(self.fd()) };
        r.ctx(|| format!("syncing {}", self.what))?;
        let len = self.file.metadata().ctx(|| format!("stat {}", self.what))?.len();
        self.durable.fetch_max(self.ctx.plain_size_lenient(len), Ordering::AcqRel);
        Ok(self.settle()? || before)
    }
}
