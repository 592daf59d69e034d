//! Access times, as Linux's `relatime` keeps them (or never changed, with `noatime`; or at
//! every open that reads, with `strictatime`).
//!
//! The kernel leaves a FUSE file's access time to the filesystem (its inodes are `S_NOATIME`)
//! and hears nothing of reads served from the page cache: only READ requests reach us. So the
//! access time is kept here, by the rule of Linux's `relatime` (`relatime_need_update`): a
//! read updates it when it is not newer than the modification or change time, or is a day
//! old. An OPEN for reading checks the rule; when an update is due it has the kernel drop the
//! file's cached pages (no `FOPEN_KEEP_CACHE` for that open), so the read comes here;
//! otherwise the cache is kept. Writes and time changes make the next READ check again.
//!
//! Backing files are read with `O_NOATIME`, so the daemon's own reads (headers at open,
//! blocks around a write) move nothing. A due update is made by one read of the backing file
//! with `O_NOATIME` lifted, which has the backing filesystem move the access time — not by
//! `futimens`, which would move the change time too (and backup tools that compare change
//! times, restic or borg, would then see every read file as changed). So on a backing store
//! mounted `noatime` access times stay put.

use super::*;
use veilfs_core::sys::Stat;

/// Whether a read of a file with these times updates its access time (`relatime`).
pub(crate) fn relatime_due(st: &Stat, now: i64) -> bool {
    let atime = (st.st_atime, st.st_atime_nsec);
    (st.st_mtime, st.st_mtime_nsec) >= atime
        || (st.st_ctime, st.st_ctime_nsec) >= atime
        || now - st.st_atime >= 24 * 60 * 60
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl VeilFs {
    /// Whether reads change access times on this mount.
    fn keeps_atime(&self) -> bool {
        !self.opts.noatime && !self.opts.read_only
    }

    /// At an OPEN with read access of `crypt`: whether a read would update the access time.
    /// If so the next READ does, and the open must drop the cached pages so a READ comes.
    pub(crate) fn atime_due_at_open(&self, node: &Node, crypt: &CryptFile, flags: i32) -> bool {
        if !self.keeps_atime() || flags & libc::O_ACCMODE == libc::O_WRONLY {
            return false;
        }
        let due =
            self.opts.strictatime || sys::fstat(crypt.backing().as_fd()).is_ok_and(|st| relatime_due(&st, now_secs()));
        if due {
            if let Some(f) = &node.file {
                f.atime_due.store(true, Ordering::Relaxed);
            }
        }
        due
    }

    /// At a READ: updates the access time if it is due.
    pub(crate) fn atime_after_read(&self, f: &crate::inodes::FileState, crypt: &CryptFile) {
        if !self.keeps_atime() || !f.atime_due.swap(false, Ordering::Relaxed) {
            return;
        }
        let fd = crypt.backing().as_fd();
        let r = sys::fstat(fd).and_then(|st| {
            if !self.opts.strictatime && !relatime_due(&st, now_secs()) {
                return Ok(());
            }
            sys::read_for_atime(fd)
        });
        if let Err(e) = r {
            tracing::debug!("access time update: {e}");
        }
    }

    /// After a change of the content or times: the next READ checks the access time again.
    pub(crate) fn atime_recheck(&self, node: &Node) {
        if let Some(f) = &node.file {
            f.atime_due.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{relatime_due, Stat};

    fn st(atime: i64, mtime: i64, ctime: i64) -> Stat {
        Stat { st_atime: atime, st_mtime: mtime, st_ctime: ctime, ..Stat::default() }
    }

    #[test]
    fn relatime_rule() {
        let now = 1_000_000;
        assert!(relatime_due(&st(now - 10, now - 5, now - 20), now), "older than mtime");
        assert!(relatime_due(&st(now - 10, now - 20, now - 10), now), "equal to ctime");
        assert!(!relatime_due(&st(now - 10, now - 20, now - 20), now), "newer than both");
        assert!(relatime_due(&st(now - 86_400, now - 90_000, now - 90_000), now), "a day old");
    }
}
