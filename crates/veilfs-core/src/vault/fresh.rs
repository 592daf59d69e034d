//! A version of a file that leaves its directory becomes a file of its own, with a fresh
//! file ID.
//!
//! Why: a sync tool that saw one file changed on two machines keeps both versions in one
//! directory, under the name and as a conflict copy, with the same file ID and different
//! generations. A client that saw the newer generation lets the older version through only
//! because the directory shows a version at least as new beside it (`Vault::open_crypt`,
//! docs/SECURITY.md §4.2a). Moved into another directory, the older version would keep its
//! file ID, lose that neighbour, and read as rolled back: a false alarm for a user who only
//! put a conflict copy aside. So such a move rewrites the file under a new ID: the content's
//! header, map and blocks bind the ID (their AAD), and the entry's binding does too, so it
//! is a copy of the content, O(size), acceptable for conflict copies, which are rare.
//!
//! The copy is written under a partial name (`veilfs.part.<r>`, which no listing shows) in
//! the target directory, settled and flushed with the original's owner, mode, attributes
//! and times, renamed into place, and only then is the original removed. A crash leaves the
//! original alone (and a partial that `fsck --repair` removes), or both versions (the move
//! not finished: a duplicate, never a loss).
//!
//! The rule, and what is decided by it, is docs/FORMAT.md §6.7.

use super::*;

impl Vault {
    /// Whether renaming `entry` of `from` into `to` gives it a fresh file ID
    /// ([`rename_fresh_at`](Self::rename_fresh_at)): a [candidate](Self::fresh_id_candidate)
    /// that is one of several versions of its file ID in `from` — a sync tool's conflict
    /// copy, or an entry whose file ID another regular file of `from` (not a hard link of it)
    /// also binds ([`file_versions`](Self::file_versions), which lists `from`: a caller that
    /// moves many files keeps that census itself, as the mount does).
    pub fn needs_fresh_id(&self, from: &CipherDir, entry: &Entry, to: &CipherDir) -> Result<bool> {
        if !self.fresh_id_candidate(from, entry, to) {
            return Ok(false);
        }
        Ok(Self::is_conflict_copy(entry) || self.file_versions(from)?.has_other(entry))
    }

    /// Whether `entry` is a sync tool's conflict copy (by its on-disk name): one of several
    /// versions of its file ID by construction.
    pub fn is_conflict_copy(entry: &Entry) -> bool {
        matches!(ParsedEntry::parse(entry.on_disk.as_bytes()), ParsedEntry::Conflict(_))
    }

    /// Whether a rename of `entry` of `from` into `to` could need a fresh file ID, by what the
    /// entry and the two directories show alone: a regular file with one name, with a header
    /// (not empty) that carries a generation (a vault with block maps), moving into another
    /// directory. A rename within the directory keeps the ID: there the versions stay side by
    /// side and the conflict rule still tells them apart, whichever is newer (a fresh ID would
    /// cost a copy and, for a renamed copy that is the newer version, leave the older one
    /// alone with the old ID: a false alarm). A file with several links moves as one file.
    pub fn fresh_id_candidate(&self, from: &CipherDir, entry: &Entry, to: &CipherDir) -> bool {
        self.ctx.block_map
            && entry.kind == EntryKind::File
            && entry.stat.st_nlink <= 1
            && entry.stat.st_size > 0
            && !same_dir(from, to)
    }

    /// The census of `dir`: which file IDs two or more regular files of it (other inodes, not
    /// hard links) bind. One listing; each regular file's binding is opened (no name is
    /// decrypted), and only the files of a shared ID are looked at further.
    pub fn file_versions(&self, dir: &CipherDir) -> Result<FileVersions> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        let mut by_id: HashMap<Identity, Vec<&[u8]>> = HashMap::new();
        for r in raw.iter().filter(|r| matches!(r.d_type, libc::DT_REG | libc::DT_UNKNOWN)) {
            if let Some(id) = self.file_identity(dir, &r.name) {
                by_id.entry(id).or_default().push(&r.name);
            }
        }
        let mut groups = HashMap::new();
        for (id, names) in by_id.into_iter().filter(|(_, n)| n.len() > 1) {
            let mut inos: Vec<u64> = names
                .iter()
                .filter_map(|n| sys::fstatat(dir.fd(), n).ok())
                .filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
                .map(|st| st.st_ino)
                .collect();
            inos.sort_unstable();
            inos.dedup();
            if inos.len() > 1 {
                groups.insert(id, inos);
            }
        }
        Ok(FileVersions { groups })
    }

    /// The file ID the entry `name` of `dir` binds if it is a regular file's (`None` for
    /// anything else, and for a name that does not verify).
    fn file_identity(&self, dir: &CipherDir, name: &[u8]) -> Option<Identity> {
        let name = std::str::from_utf8(name).ok()?;
        let parsed = ParsedEntry::parse(name.as_bytes());
        let binding = match &parsed {
            ParsedEntry::Conflict(c) => c.binding(),
            p => p.binding(),
        }?;
        let d = self.entry_d(dir, name).ok()?;
        self.names.unbind(&dir.iv, &d, EntryKind::File, binding).ok()
    }

    /// Moves the regular file `entry` of `from` to the name of `key` in `to` as a file of its
    /// own: its plaintext, owner, mode, extended attributes and times are copied into a new
    /// file with a fresh file ID, which takes the name (replacing `replaced`, the entry of that
    /// name found by the caller, if given); then `entry` is removed. Returns the new on-disk
    /// name and file ID. See the module docs for why and [`needs_fresh_id`](Self::needs_fresh_id)
    /// for when.
    ///
    /// The original is read as every reader reads it ([`open_file`](Self::open_file)): a
    /// version older than this client saw moves only while a version at least as new lies
    /// beside it (a conflict); a file rolled back with none is refused
    /// ([`Error::Rollback`]) and never gets a new ID that would hide it.
    pub fn rename_fresh_at(
        &self,
        from: &CipherDir,
        entry: &Entry,
        to: &CipherDir,
        key: &NameKey,
        replaced: Option<&Entry>,
    ) -> Result<(String, Identity)> {
        if let Some(r) = replaced.filter(|r| r.kind == EntryKind::Dir) {
            return Err(Error::io(to.child_path(&r.on_disk), std::io::Error::from_raw_os_error(libc::EISDIR)));
        }
        let id: Identity = crate::random::bytes();
        let tmp = self.write_fresh_copy(from, entry, to, &id)?;
        // The new name binds a fresh file ID, so no tombstone can name it (FORMAT §19): it
        // needs no "back" record. The two names that leave get theirs from `remove_entry`.
        let placed = self.entry_name_for(to, key, EntryKind::File, &id).and_then(|on_disk| {
            sys::rename_noreplace(to.fd(), tmp.as_bytes(), to.fd(), on_disk.as_bytes())
                .ctx(|| to.child_path(&on_disk))?;
            Ok(on_disk)
        });
        let on_disk = match placed {
            Ok(on_disk) => on_disk,
            Err(e) => {
                let _ = sys::unlinkat(to.fd(), tmp.as_bytes(), false);
                return Err(e);
            }
        };
        sys::fsync(to.fd()).ctx(|| format!("syncing {}", to.path.display()))?;
        if let Some(r) = replaced {
            if let Err(e) = self.remove_entry(to, &r.on_disk, r.kind, &r.identity) {
                tracing::error!("rename: could not remove the replaced entry {}: {e}", to.child_path(&r.on_disk));
            }
        }
        // The copy is in place and flushed: the original goes. Failing here leaves both
        // versions, each a file of its own, which is what the user sees and may remove.
        self.remove_entry(from, &entry.on_disk, entry.kind, &entry.identity)?;
        self.drop_side_file(from, &entry.key);
        Ok((on_disk, id))
    }

    /// Writes the plaintext of `entry` of `from` into a new file of `to` with file ID `id`,
    /// under a partial name, settled and flushed, with the original's owner, mode, extended
    /// attributes (re-encrypted for the new ID, F§11) and times. Returns the partial name.
    fn write_fresh_copy(&self, from: &CipherDir, entry: &Entry, to: &CipherDir, id: &Identity) -> Result<String> {
        let src = self.open_file(from, entry, libc::O_RDONLY)?;
        let src_what = from.child_path(&entry.on_disk);
        let size = src.plain_size()?;
        let attrs = self.xattrs(from, entry)?;
        let tmp = crate::names::part_name();
        let what = to.child_path(&tmp);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let fd = sys::openat(to.fd(), tmp.as_bytes(), flags, 0o600).ctx(|| what.clone())?;
        let bs = self.ctx.layout.block_size as usize;
        let xattrs = |sfd: BorrowedFd<'_>, dfd: BorrowedFd<'_>| {
            // Attributes of other namespaces as stored; the vault's own (`user.*`) are bound
            // to the file ID, so they are written again under the new one.
            crate::upgrade::copy_xattrs(sfd, dfd, &|n| !n.starts_with(b"user."))
                .ctx(|| format!("{src_what}: copying extended attributes"))?;
            let cipher = self.xattr_cipher();
            for (name, value) in &attrs {
                cipher.set(sys::XattrTarget::Fd(dfd), id, name, value, 0).map_err(|e| relabel_io(e, &what))?;
            }
            Ok(())
        };
        let r = CryptFile::open(sys::into_file(fd), self.ctx.clone(), *id, what.clone()).and_then(|dst| {
            // Nobody else knows the file until it has its name: one write session for it all.
            dst.set_session_until_settle(true);
            let r = crate::upgrade::copy_plain(&src, &dst, size, bs, &src_what)
                .and_then(|()| crate::upgrade::finish_copy(&src, &dst, &src_what, &what, &xattrs));
            if r.is_err() {
                dst.discard_session();
            }
            r
        });
        match r {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = sys::unlinkat(to.fd(), tmp.as_bytes(), false);
                Err(e)
            }
        }
    }
}

/// Which file IDs of one directory two or more regular files bind (the versions of a
/// conflict), with their inodes; every other file ID is left out. See
/// [`Vault::file_versions`].
#[derive(Clone, Debug, Default)]
pub struct FileVersions {
    groups: HashMap<Identity, Vec<u64>>,
}

impl FileVersions {
    /// Whether another regular file than `entry` (another inode) binds its file ID.
    pub fn has_other(&self, entry: &Entry) -> bool {
        self.groups.get(&entry.identity).is_some_and(|inos| inos.iter().any(|&i| i != entry.stat.st_ino))
    }

    /// Whether the inode `ino` is one of the versions counted.
    pub fn counts(&self, ino: u64) -> bool {
        self.groups.values().any(|inos| inos.contains(&ino))
    }

    /// The census once the inode `ino` is gone from the directory (moved away or removed,
    /// its last name there).
    pub fn forget(&mut self, ino: u64) {
        for inos in self.groups.values_mut() {
            inos.retain(|&i| i != ino);
        }
        self.groups.retain(|_, inos| inos.len() > 1);
    }
}

/// Whether `a` and `b` are one directory (the same backing inode).
fn same_dir(a: &CipherDir, b: &CipherDir) -> bool {
    match (sys::fstat(a.fd()), sys::fstat(b.fd())) {
        (Ok(x), Ok(y)) => (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino),
        _ => a.path == b.path,
    }
}
