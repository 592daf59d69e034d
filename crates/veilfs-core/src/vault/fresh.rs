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
    /// ([`rename_fresh_at`](Self::rename_fresh_at)): a regular file with one name, with a
    /// header (not empty) that carries a generation (a vault with block maps), moving into
    /// another directory, that is one of several versions of its file ID in `from` — a sync
    /// tool's conflict copy, or an entry whose file ID another file of `from` (not a hard link
    /// of it) also has. A rename within the directory keeps the ID: there the versions stay
    /// side by side and the conflict rule still tells them apart, whichever is newer.
    ///
    /// Lists `from` (no name is decrypted; each regular file's binding is opened once) unless
    /// the entry is a conflict copy or is not a candidate at all.
    pub fn needs_fresh_id(&self, from: &CipherDir, entry: &Entry, to: &CipherDir) -> Result<bool> {
        let candidate = self.ctx.block_map
            && entry.kind == EntryKind::File
            && entry.stat.st_nlink <= 1
            && entry.stat.st_size > 0
            && !same_dir(from, to);
        if !candidate {
            return Ok(false);
        }
        if matches!(ParsedEntry::parse(entry.on_disk.as_bytes()), ParsedEntry::Conflict(_)) {
            return Ok(true);
        }
        let raw = sys::read_dir_fd(from.fd()).ctx(|| format!("listing {}", from.path.display()))?;
        Ok(raw.iter().any(|r| self.is_other_version(from, entry, r)))
    }

    /// Whether the listed `r` of `dir` is another regular file than `entry` (not a name of
    /// its inode) whose entry binds the same file ID.
    fn is_other_version(&self, dir: &CipherDir, entry: &Entry, r: &sys::RawDirEntry) -> bool {
        if r.name == entry.on_disk.as_bytes() || r.ino == entry.stat.st_ino {
            return false;
        }
        if !matches!(r.d_type, libc::DT_REG | libc::DT_UNKNOWN) {
            return false;
        }
        let Ok(name) = std::str::from_utf8(&r.name) else { return false };
        let parsed = ParsedEntry::parse(r.name.as_slice());
        let binding = match &parsed {
            ParsedEntry::Conflict(c) => c.binding(),
            p => p.binding(),
        };
        let Some(binding) = binding else { return false };
        let Ok(d) = self.entry_d(dir, name) else { return false };
        if self.names.unbind(&dir.iv, &d, EntryKind::File, binding).ok() != Some(entry.identity) {
            return false;
        }
        // The binding opened for a regular file: check the object is one (and not the same).
        sys::fstatat(dir.fd(), &r.name)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_ino != entry.stat.st_ino)
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

/// Whether `a` and `b` are one directory (the same backing inode).
fn same_dir(a: &CipherDir, b: &CipherDir) -> bool {
    match (sys::fstat(a.fd()), sys::fstat(b.fd())) {
        (Ok(x), Ok(y)) => (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino),
        _ => a.path == b.path,
    }
}
