//! Per-directory state: the open ciphertext directory, its IV, and an index from lookup key
//! to on-disk entry name.
//!
//! An on-disk name ends with the entry's identity binding, which a lookup cannot compute
//! from the plaintext name; so each directory is listed once into an index (key → name) and
//! kept current by this mount's own changes. In shared-storage mode the index is rebuilt
//! whenever the backing directory's change time moved since it was built, and also while that
//! time is too close to the last look to tell a later change from an earlier one (see
//! [`Stamp`]).

use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::OnceLock;
use veilfs_core::{sys, CipherDir, FileVersions, Vault};

/// One entry of a directory listing snapshot.
#[derive(Debug, Clone)]
pub struct SnapEntry {
    /// Plaintext name.
    pub name: Vec<u8>,
    /// On-disk name.
    pub on_disk: String,
    /// `D` of the name (verified).
    pub d: Vec<u8>,
    /// `d_type` from the backing listing.
    pub d_type: u8,
    /// The READDIR offset of the entry after this one (see `VeilFs::listing`).
    pub cookie: u64,
}

/// One entry of a directory index.
#[derive(Debug)]
pub struct IndexEntry {
    /// The full on-disk name.
    pub on_disk: String,
    /// `d_type` from the listing (may be `DT_UNKNOWN`; updated by our own creations).
    pub d_type: u8,
    /// The decrypted plaintext name and `D`, once someone needed them (`None` inside:
    /// undecryptable). Keeping `D` spares READDIRPLUS and lookups a re-decode of the name.
    pub plain: OnceLock<Option<Decoded>>,
    /// Other on-disk entries with the same key (only after a crash during a rename over an
    /// existing name, or forged). Which one is the entry is decided by verifying bindings
    /// when it is used (see `VeilFs::resolve`), never by this listing.
    pub others: Vec<String>,
}

/// A verified entry name: plaintext and `D` (the name's SIV ciphertext).
#[derive(Debug, Clone)]
pub struct Decoded {
    /// Plaintext name.
    pub name: Vec<u8>,
    /// `D`, already checked to be in canonical form.
    pub d: Vec<u8>,
}

impl IndexEntry {
    /// A fresh entry.
    pub fn new(on_disk: String, d_type: u8, plain: Option<Decoded>) -> Self {
        let cell = OnceLock::new();
        if let Some(p) = plain {
            let _ = cell.set(Some(p));
        }
        IndexEntry { on_disk, d_type, plain: cell, others: Vec::new() }
    }
}

/// key → entry for one directory.
pub type Index = HashMap<String, IndexEntry>;

/// A directory node's state.
#[derive(Debug)]
pub struct DirState {
    /// The open ciphertext directory and its IV.
    pub cd: CipherDir,
    index: RwLock<Option<Index>>,
    /// The backing directory's ctime when the index was built (shared-storage checks).
    stamp: Mutex<Stamp>,
    /// Serializes changes of this directory (create, unlink, rename, ...).
    pub ops: Mutex<()>,
    /// Others may change the backing directory (shared storage): keep `stamp` current.
    shared: bool,
    /// The listing READDIR serves without a directory handle (no OPENDIR: see
    /// `VeilFs::listing`), from the start of a listing until a READDIR reaches its end.
    pub listing: Mutex<Option<Arc<Vec<SnapEntry>>>>,
    /// The mode and owner a permission check reads, kept on a mount that is the only writer
    /// (see [`perm_stat`](Self::perm_stat)).
    perm: Mutex<PermCache>,
    /// Whether the last index built held a conflict copy: only then can removing a long name
    /// leave a copy that still reads its side file (see [`Self::may_have_copies`]).
    copies: std::sync::atomic::AtomicBool,
    /// On-disk names of entries the last listing found resurrected (present while a valid
    /// tombstone says a client deleted them, `veilfs_core::tombstone`): refused with EIO.
    resurrected: Mutex<Vec<String>>,
    /// Which file IDs several regular files of the directory bind (the versions of a
    /// conflict; [`Vault::file_versions`]), made at the first move of a file out of the
    /// directory and kept as current as the index: forgotten with it, and kept by this
    /// mount's own changes (see [`versions`](Self::versions)). So moving every file out of a
    /// large directory lists it once, not once per file.
    versions: Mutex<Option<FileVersions>>,
}

/// What [`DirState::perm_stat`] keeps: `st_mode`, `st_uid`, `st_gid`, and a generation that
/// [`DirState::forget_perm`] moves, so a `fstat` taken before a change is never kept after it.
#[derive(Debug, Default)]
struct PermCache {
    generation: u64,
    kept: Option<(u32, u32, u32)>,
}

fn ctime_of(cd: &CipherDir) -> io::Result<(i64, i64)> {
    let st = sys::fstat(cd.fd())?;
    Ok((st.st_ctime, st.st_ctime_nsec))
}

/// What a shared-storage index was built from: the backing directory's change time, and when
/// (this machine's clock, before that time was read and the directory listed) we looked.
///
/// An unchanged change time proves nothing changed only if a later change would have moved
/// it. A file system with whole-second times (sshfs: SFTP has no fractions; also FAT,
/// some NFS servers) gives a change in the same second the same time, so a file another
/// machine makes in the second of our look would stay out of the index until the next
/// change. As git does with its "racy" index entries, a time that is not older than the
/// look by more than its granularity is not trusted: the index is rebuilt at each use until
/// the look is later than the directory's last change by that much. Whole-second times are
/// recognised by their zero nanoseconds; they are given one second for the granularity and one
/// more for the two machines' clocks. File systems with nanosecond times are trusted as
/// before, at no extra cost.
#[derive(Debug, Clone, Copy, Default)]
struct Stamp {
    ctime: (i64, i64),
    /// Nanoseconds since the epoch at the look.
    look: i128,
}

/// How much older than the look a whole-second change time must be to be trusted.
const COARSE_MARGIN_NS: i128 = 2_000_000_000;

fn now_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

impl Stamp {
    /// Whether the index built at this stamp is current, the directory's change time being
    /// `ctime` now.
    fn trusts(&self, ctime: (i64, i64)) -> bool {
        if ctime != self.ctime {
            return false;
        }
        let (secs, nsec) = ctime;
        nsec != 0 || i128::from(secs) * 1_000_000_000 + COARSE_MARGIN_NS <= self.look
    }
}

impl DirState {
    /// State for an open, verified directory; `shared` when other mounts may change it.
    pub fn new(cd: CipherDir, shared: bool) -> Self {
        DirState {
            cd,
            index: RwLock::new(None),
            stamp: Mutex::new(Stamp::default()),
            ops: Mutex::new(()),
            shared,
            listing: Mutex::new(None),
            perm: Mutex::new(PermCache::default()),
            copies: std::sync::atomic::AtomicBool::new(false),
            resurrected: Mutex::new(Vec::new()),
            versions: Mutex::new(None),
        }
    }

    /// `f` of the directory's census of versions ([`Vault::file_versions`]), made now if it is
    /// not kept (hold `ops`).
    pub fn versions<T>(&self, vault: &Vault, f: impl FnOnce(&FileVersions) -> T) -> io::Result<T> {
        let mut g = self.versions.lock();
        if g.is_none() {
            *g = Some(vault.file_versions(&self.cd).map_err(|e| match e {
                veilfs_core::Error::Io { source, .. } => source,
                e => io::Error::from_raw_os_error(e.errno()),
            })?);
        }
        Ok(f(g.as_ref().expect("just made")))
    }

    /// The census after the regular file of backing inode `ino` (with `nlink` links before)
    /// lost a name in this directory: that inode is no version here any more when it was
    /// its last link; with other links (which may lie here too) the census is made again.
    pub fn version_gone(&self, ino: u64, nlink: u64) {
        let mut g = self.versions.lock();
        if let Some(v) = g.as_mut().filter(|v| v.counts(ino)) {
            if nlink <= 1 {
                v.forget(ino);
            } else {
                *g = None;
            }
        }
    }

    /// Forgets the census: an object came in with a file ID it keeps (a rename from another
    /// directory, an exchange, a hard link), which may be another version of one here.
    pub fn versions_changed(&self) {
        *self.versions.lock() = None;
    }

    /// Whether the directory held a conflict copy when its index was last built (true until
    /// it is built). Removing a long name lists the directory for copies that read its side
    /// file only then: a listing per removal made emptying a large directory quadratic.
    pub fn may_have_copies(&self) -> bool {
        self.index.read().is_none() || self.copies.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The attributes a permission check of this directory reads: only `st_mode`, `st_uid`
    /// and `st_gid` are filled in. A mount that is the only writer of CIPHERDIR (the vault
    /// lock) keeps them from the first `fstat` until [`forget_perm`](Self::forget_perm),
    /// which every change of this directory's mode or owner through the mount calls; this
    /// spares a `fstat` per LOOKUP, CREATE and UNLINK. A `--shared-storage` mount reads them
    /// each time. A mode read while the daemon granted its owner `rwx` for a moment
    /// (`sys::with_owner_rwx`, a daemon that is not root) is used once and not kept.
    pub fn perm_stat(&self) -> io::Result<sys::Stat> {
        let only = |(st_mode, st_uid, st_gid)| sys::Stat { st_mode, st_uid, st_gid, ..Default::default() };
        if self.shared {
            return sys::fstat(self.cd.fd()).map(|st| only((st.st_mode, st.st_uid, st.st_gid)));
        }
        let generation = {
            let c = self.perm.lock();
            if let Some(kept) = c.kept {
                return Ok(only(kept));
            }
            c.generation
        };
        let grants = sys::grants_settled();
        let st = sys::fstat(self.cd.fd())?;
        let kept = (st.st_mode, st.st_uid, st.st_gid);
        if grants.is_some() && sys::grants_settled() == grants {
            let mut c = self.perm.lock();
            if c.generation == generation {
                c.kept = Some(kept);
            }
        }
        Ok(only(kept))
    }

    /// After a change of this directory's mode or owner: the next permission check reads them
    /// again.
    pub fn forget_perm(&self) {
        let mut c = self.perm.lock();
        c.generation += 1;
        c.kept = None;
    }

    /// Lists the backing directory into a fresh index. Two entries for one key (made on two
    /// machines of a synced vault, left by a crash during a rename over an existing name, or
    /// forged) are both kept under the key, where the newer that verifies is the entry; a
    /// conflict copy that verifies (a sync tool's, or the older of two such entries) goes
    /// under the key of the name it is shown as, with that name and its original `D` known.
    /// Names the listing decrypted on the way are kept, so READDIR does not decrypt them again.
    fn build(&self, vault: &Vault) -> io::Result<Index> {
        let listing = vault.keyed_entries_and_copies(&self.cd).map_err(|e| match e {
            veilfs_core::Error::Io { source, .. } => source,
            e => io::Error::from_raw_os_error(e.errno()),
        })?;
        // A deletion by a non-client is logged once per listing that finds it (the entry is
        // not there to refuse, and the directory is not refused: a sync may deliver a
        // deletion's tombstone after the deletion, and the entries still there are fine).
        Vault::log_verdicts(&self.cd, &listing.verdicts);
        *self.resurrected.lock() = listing.verdicts.resurrected;
        let (entries, copies, mut names) = (listing.entries, listing.copies, listing.names);
        let mut idx: Index = HashMap::with_capacity(entries.len());
        for (key, on_disk, d_type) in entries {
            if let Some(prev) = idx.get_mut(&key) {
                prev.others.push(on_disk);
                continue;
            }
            let plain = names.remove(&on_disk).map(|(name, d)| Decoded { name, d });
            idx.insert(key, IndexEntry::new(on_disk, d_type, plain));
        }
        self.copies.store(!copies.is_empty(), std::sync::atomic::Ordering::Release);
        for c in copies {
            let d_type = ((c.entry.stat.st_mode & libc::S_IFMT) >> 12) as u8;
            let plain = Decoded { name: c.entry.name, d: c.d };
            idx.insert(c.entry.key.key, IndexEntry::new(c.entry.on_disk, d_type, Some(plain)));
        }
        Ok(idx)
    }

    /// Whether the entry `on_disk` was found resurrected by the last listing.
    pub fn is_resurrected(&self, on_disk: &str) -> bool {
        let r = self.resurrected.lock();
        !r.is_empty() && r.iter().any(|n| n == on_disk)
    }

    /// The index, built on first use; with `revalidate`, rebuilt if the backing directory
    /// changed since (shared storage).
    pub fn index(&self, vault: &Vault, revalidate: bool) -> io::Result<RwLockReadGuard<'_, Option<Index>>> {
        {
            let g = self.index.read();
            if g.is_some() && (!revalidate || self.stamp.lock().trusts(ctime_of(&self.cd)?)) {
                return Ok(g);
            }
        }
        self.rebuild(vault)?;
        Ok(self.index.read())
    }

    /// Rebuilds the index from the backing directory.
    pub fn rebuild(&self, vault: &Vault) -> io::Result<()> {
        let mut w = self.index.write();
        let look = now_ns();
        let ctime = ctime_of(&self.cd)?;
        *w = Some(self.build(vault)?);
        *self.stamp.lock() = Stamp { ctime, look };
        self.versions_changed();
        Ok(())
    }

    /// Applies a change made by this mount (hold `ops`).
    pub fn update(&self, f: impl FnOnce(&mut Index)) {
        let mut w = self.index.write();
        if let Some(idx) = w.as_mut() {
            f(idx);
        }
        drop(w);
        // Only shared storage compares the stamp; otherwise spare the fstat. The look stays
        // that of the last listing: a whole-second time our own change moved into the second
        // of now is not trusted until a listing after it.
        if self.shared {
            if let Ok(s) = ctime_of(&self.cd) {
                self.stamp.lock().ctime = s;
            }
        }
    }

    /// The index as it is, without building it (`None`: not built).
    pub fn peek(&self) -> RwLockReadGuard<'_, Option<Index>> {
        self.index.read()
    }

    /// Forgets the index (memory pressure, or it may be stale).
    pub fn drop_index(&self) {
        *self.index.write() = None;
        self.versions_changed();
    }
}

#[cfg(test)]
mod tests {
    use super::Stamp;

    /// A whole-second change time is trusted only once the look is two seconds past it; a
    /// nanosecond one whenever it did not move; a moved one never.
    #[test]
    fn whole_second_change_times_near_the_look_are_not_trusted() {
        let s = |secs: i64, nsec: i64, look_s: f64| Stamp { ctime: (secs, nsec), look: (look_s * 1e9) as i128 };
        assert!(!s(100, 0, 100.5).trusts((100, 0)));
        assert!(!s(100, 0, 101.9).trusts((100, 0)));
        assert!(s(100, 0, 102.0).trusts((100, 0)));
        assert!(!s(100, 0, 105.0).trusts((101, 0)));
        assert!(s(100, 7, 100.0).trusts((100, 7)));
        assert!(!s(100, 7, 100.0).trusts((100, 8)));
    }
}
