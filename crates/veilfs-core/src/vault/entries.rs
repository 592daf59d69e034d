//! Making and removing entries: on-disk names and their identity bindings, long-name side
//! files, files (also written under a temporary name and committed whole), directories with
//! their IV copy, special files, and removal that checks what it removes is what the entry
//! binds.

use super::*;

impl Vault {
    /// Computes the on-disk name of a new entry `name` of `kind` with `identity` in `dir`,
    /// writing the long-name side file if needed.
    pub fn new_entry_name(
        &self,
        dir: &CipherDir,
        name: &[u8],
        kind: EntryKind,
        identity: &Identity,
    ) -> Result<(NameKey, String)> {
        let key = self.names.name_key(&dir.iv, name)?;
        let on_disk = self.entry_name_for(dir, &key, kind, identity)?;
        Ok((key, on_disk))
    }

    /// The on-disk name for an already computed `key`, writing its side file if it is long.
    pub fn entry_name_for(
        &self,
        dir: &CipherDir,
        key: &NameKey,
        kind: EntryKind,
        identity: &Identity,
    ) -> Result<String> {
        let s = self.names.bind(&dir.iv, &key.d, kind, identity);
        if let (Some(side), Some(contents)) = (&key.side_file, key.side_file_contents()) {
            match sys::write_new_file(dir.fd(), side.as_bytes(), contents.as_bytes(), 0o400) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io(dir.child_path(side), e)),
            }
            crash::point!("vault.side_file");
        }
        Ok(key.entry_name(&s))
    }

    /// Removes the on-disk entry `on_disk` of `dir`. A directory must hold nothing but its IV
    /// file; it is moved aside before its IV copy goes, so a crash never leaves a live
    /// directory without one. A symlink's target side file goes after it, once no other
    /// symlink of `dir` uses it. Does not touch long-name side files.
    ///
    /// In a vault with `"versions"` the entry's tombstone record is appended first (and a
    /// "back" record after it if the removal fails), so that no other client takes the
    /// deletion for the storage's.
    pub fn remove_entry(&self, dir: &CipherDir, on_disk: &str, kind: EntryKind, identity: &Identity) -> Result<()> {
        let tomb = self.tombstone_before_remove(dir, on_disk, kind)?;
        let r = self.remove_untombed(dir, on_disk, kind, identity);
        match r {
            Ok(()) => self.forget_removed(dir, tomb),
            Err(_) => self.take_back_tombstone(dir, tomb),
        }
        r
    }

    /// [`remove_entry`](Self::remove_entry) without its tombstone.
    fn remove_untombed(&self, dir: &CipherDir, on_disk: &str, kind: EntryKind, identity: &Identity) -> Result<()> {
        // The path is only formatted for an error: removing is on the hot path of rm -rf.
        let what = || dir.child_path(on_disk);
        if kind == EntryKind::Symlink {
            let side = self.target_side(dir, on_disk);
            sys::unlinkat(dir.fd(), on_disk.as_bytes(), false).ctx(what)?;
            if let Some(side) = side {
                self.drop_target_side(dir, &side);
            }
            return Ok(());
        }
        if kind != EntryKind::Dir {
            return sys::unlinkat(dir.fd(), on_disk.as_bytes(), false).ctx(what);
        }
        owner_access(dir, on_disk, || self.remove_dir_entry(dir, on_disk, identity))
    }

    /// [`remove_entry`](Self::remove_entry) of a directory.
    fn remove_dir_entry(&self, dir: &CipherDir, on_disk: &str, identity: &Identity) -> Result<()> {
        let what = || dir.child_path(on_disk);
        let sub = self.empty_dir(dir, on_disk, identity)?;
        let tmp = crate::names::temp_name();
        sys::rename_noreplace(dir.fd(), on_disk.as_bytes(), dir.fd(), tmp.as_bytes()).ctx(what)?;
        crash::point!("vault.remove_temp");
        // The tombstone logs of entries deleted inside go with it (they vouch for deletions in
        // a directory that no longer exists), with the daemon's own rights as the IV copy.
        let _ = sys::privileged(|| {
            for r in sys::read_dir_fd(sub.as_fd())?.iter().filter(|r| crate::tombstone::is_log_name(&r.name)) {
                sys::unlinkat(sub.as_fd(), &r.name, false)?;
            }
            Ok::<(), std::io::Error>(())
        });
        // The IV copy goes with the daemon's own rights: the caller's right to remove the
        // directory covers it, but a directory without write permission would refuse it.
        if let Err(e) = sys::privileged(|| self.iv_copy.remove(sub.as_fd(), identity)) {
            // A directory whose mode denies its owner write access (see `owner_access`).
            if e.raw_os_error() == Some(libc::EACCES) {
                let _ = sys::rename_noreplace(dir.fd(), tmp.as_bytes(), dir.fd(), on_disk.as_bytes());
                return Err(Error::io(what(), e));
            }
        }
        if let Err(e) = sys::unlinkat(dir.fd(), tmp.as_bytes(), true) {
            // Something appeared inside meanwhile: put it back as it was.
            let _ = sys::privileged(|| self.iv_copy.write(sub.as_fd(), identity));
            let _ = sys::rename_noreplace(dir.fd(), tmp.as_bytes(), dir.fd(), on_disk.as_bytes());
            return Err(Error::io(what(), e));
        }
        // What this client remembered of the directory's entries goes with it.
        self.forget_tombstones(identity);
        if let Some(k) = &self.ctx.known {
            let all: Vec<_> = k.entries(identity).into_iter().collect();
            k.update_entries(identity, &[], &all);
        }
        Ok(())
    }

    /// Removes the long-name side file of `key` if no entry uses it any more (lists `dir`).
    pub fn drop_side_file(&self, dir: &CipherDir, key: &NameKey) {
        if key.side_file.is_some() {
            let still_used = sys::read_dir_fd(dir.fd())
                .map(|raw| {
                    // A conflict copy of a long name reads its original's side file too.
                    raw.iter().any(|r| match ParsedEntry::parse(&r.name) {
                        ParsedEntry::Conflict(c) => c.entry().key() == Some(key.key.as_str()),
                        p => p.key() == Some(key.key.as_str()),
                    })
                })
                .unwrap_or(true);
            if !still_used {
                Self::unlink_side_file(dir, key);
            }
        }
    }

    /// Removes the long-name side file of `key`, if it has one, for a caller that knows no
    /// other entry uses it (the mount, from its index). Best effort: an orphaned side file is
    /// harmless and `fsck --repair` removes it.
    pub fn unlink_side_file(dir: &CipherDir, key: &NameKey) {
        if let Some(side) = &key.side_file {
            crash::point!("vault.remove_side");
            let _ = sys::unlinkat(dir.fd(), side.as_bytes(), false);
        }
    }

    /// The [`Entry`] of an object just made as `on_disk` in `dir` (one `fstatat`).
    pub(crate) fn entry_after_create(
        &self,
        dir: &CipherDir,
        name: &[u8],
        key: NameKey,
        on_disk: String,
        kind: EntryKind,
        identity: Identity,
    ) -> Result<Entry> {
        let stat = sys::fstatat(dir.fd(), on_disk.as_bytes()).ctx(|| dir.child_path(&on_disk))?;
        Ok(Entry { name: name.to_vec(), on_disk, key, kind, identity, stat })
    }

    /// Creates an empty regular file `name` (fails if the name exists) and opens it.
    pub fn create_file(&self, dir: &CipherDir, name: &[u8], mode: u32) -> Result<(Entry, CryptFile)> {
        let key = self.absent_key(dir, name)?;
        let (on_disk, id, file) = self.create_file_at(dir, &key, mode)?;
        Ok((self.entry_after_create(dir, name, key, on_disk, EntryKind::File, id)?, file))
    }

    /// Creates an empty regular file under `key` in `dir` (the caller knows the name is free:
    /// the mount holds the directory's lock and index) and opens it. Returns its on-disk name,
    /// identity and open file.
    pub fn create_file_at(&self, dir: &CipherDir, key: &NameKey, mode: u32) -> Result<(String, Identity, CryptFile)> {
        let id: Identity = crate::random::bytes();
        let on_disk = self.entry_name_for(dir, key, EntryKind::File, &id)?;
        let what = dir.child_path(&on_disk);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let fd = sys::openat(dir.fd(), on_disk.as_bytes(), flags, mode & 0o7777).ctx(|| what.clone())?;
        crash::point!("vault.create");
        let file = CryptFile::open(sys::into_file(fd), self.ctx.clone(), id, what)?;
        Ok((on_disk, id, file))
    }

    /// Starts a regular file that becomes entry `name` of `dir` only once complete: it is
    /// written under an internal name (`veilfs.part.<random>`, F§7.2), which no listing
    /// shows, and [`commit_partial`](Self::commit_partial) renames it into place. So an
    /// interrupted writer (`veilfs import`) never leaves a cut-off file under its final name,
    /// where it would look complete. The returned entry names the partial file but has `name`'s
    /// key, so its attributes can be set ([`set_attrs`](Self::set_attrs),
    /// [`set_xattr`](Self::set_xattr)) before it appears.
    pub fn create_partial(&self, dir: &CipherDir, name: &[u8], mode: u32) -> Result<PartialFile> {
        let key = self.names.name_key(&dir.iv, name)?;
        let id: Identity = crate::random::bytes();
        let on_disk = crate::names::part_name();
        let what = dir.child_path(&on_disk);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let fd = sys::openat(dir.fd(), on_disk.as_bytes(), flags, mode & 0o7777).ctx(|| what.clone())?;
        let stat = sys::fstat(fd.as_fd()).ctx(|| what.clone())?;
        let file = CryptFile::open(sys::into_file(fd), self.ctx.clone(), id, what)?;
        // Nobody else knows the file until it is committed, which settles it: one write
        // session for the whole file, not one per write (docs/FORMAT.md §5.10).
        file.set_session_until_settle(true);
        let entry = Entry { name: name.to_vec(), on_disk, key, kind: EntryKind::File, identity: id, stat };
        Ok(PartialFile { entry, file })
    }

    /// Puts a complete partial file in place under its name, replacing `replaced` (the
    /// existing entry of that name, found by the caller) if given; fails with EEXIST if
    /// another entry has taken the name meanwhile. See [`rename_at`](Self::rename_at).
    pub fn commit_partial(&self, dir: &CipherDir, p: PartialFile, replaced: Option<&Entry>) -> Result<Entry> {
        let PartialFile { entry, file } = p;
        // Settled before it has its name: under it, the file is never read by a log.
        file.settle()?;
        drop(file);
        let on_disk = self.rename_at(dir, &entry, dir, &entry.key, replaced)?;
        let stat = sys::fstatat(dir.fd(), on_disk.as_bytes()).ctx(|| dir.child_path(&on_disk))?;
        Ok(Entry { on_disk, stat, ..entry })
    }

    /// Removes a partial file that will not be completed.
    pub fn discard_partial(&self, dir: &CipherDir, p: PartialFile) -> Result<()> {
        p.file.discard_session();
        drop(p.file);
        sys::unlinkat(dir.fd(), p.entry.on_disk.as_bytes(), false).ctx(|| dir.child_path(&p.entry.on_disk))
    }

    /// Removes the partial files an interrupted writer left in `dir` (only under the vault
    /// lock, where no other writer can be making one); returns how many.
    pub fn remove_partials(&self, dir: &CipherDir) -> Result<usize> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        let mut n = 0;
        for r in raw.iter().filter(|r| r.name.starts_with(crate::names::PART_PREFIX.as_bytes())) {
            let what = || dir.child_path(&String::from_utf8_lossy(&r.name));
            let st = sys::fstatat(dir.fd(), &r.name).ctx(what)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                self.remove_partials_stash(dir, &r.name);
                sys::unlinkat(dir.fd(), &r.name, false).ctx(what)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Removes the stash (a block-map file's session log, or v1 inner-block records) that an
    /// interrupted writer of the partial file `name` left, so that no leftover outlives the
    /// file (fsck would report it). The file ID comes from the partial's header, used only if
    /// it authenticates; a header copied there from another file makes this remove that
    /// file's stash, which whoever can write the ciphertext can do anyway. Best effort.
    fn remove_partials_stash(&self, dir: &CipherDir, name: &[u8]) {
        let Some(stashes) = &self.ctx.stashes else { return };
        let Ok((fd, _)) = sys::open_regular_at(dir.fd(), name, libc::O_RDONLY) else { return };
        let mut buf = [0u8; crate::content::blockmap::HEADER_V2_LEN];
        let Ok(got) = sys::pread_full(fd.as_fd(), &mut buf, 0) else { return };
        let id = if self.ctx.block_map {
            crate::content::blockmap::HeaderV2::decode(&buf[..got], &self.ctx.keys).ok().map(|h| h.id)
        } else {
            let v1 = &buf[..got.min(crate::content::header::HEADER_LEN)];
            crate::content::header::FileHeader::decode(v1, &self.ctx.keys, "partial").ok().map(|h| h.id)
        };
        if let Some(id) = id {
            let _ = stashes.remove(&id);
        }
    }

    /// The key of `name` in `dir`, or EEXIST if an entry has that name (lists the directory).
    pub(crate) fn absent_key(&self, dir: &CipherDir, name: &[u8]) -> Result<NameKey> {
        if self.lookup(dir, name)?.is_some() {
            return Err(Error::io(
                format!("{}/{}", dir.path.display(), String::from_utf8_lossy(name)),
                std::io::Error::from_raw_os_error(libc::EEXIST),
            ));
        }
        self.names.name_key(&dir.iv, name)
    }

    /// Opens the directory `on_disk` of `dir`, whose entry promises IV `iv`, and checks it
    /// holds nothing but its IV copy and tombstone logs (ENOTEMPTY otherwise): before it is removed
    /// or replaced.
    pub fn empty_dir(&self, dir: &CipherDir, on_disk: &str, iv: &DirIv) -> Result<OwnedFd> {
        let what = || dir.child_path(on_disk);
        let sub = sys::open_dir_at(dir.fd(), on_disk.as_bytes()).ctx(what)?;
        let raw = sys::read_dir_fd(sub.as_fd()).ctx(what)?;
        let copy = self.iv_copy.name(iv);
        if raw.iter().any(|r| {
            r.name != b"." && r.name != b".." && r.name != copy.as_bytes() && !crate::tombstone::is_log_name(&r.name)
        }) {
            return Err(Error::io(what(), std::io::Error::from_raw_os_error(libc::ENOTEMPTY)));
        }
        Ok(sub)
    }

    /// The kind and identity the entry `on_disk` of `dir` (with `D` = `d`, backing `st`)
    /// promises: its binding, verified against the backing object (see
    /// [`verified_identity`](Self::verified_identity)). An integrity error names the entry.
    pub fn unbind_entry(&self, dir: &CipherDir, d: &[u8], on_disk: &str, st: &Stat) -> Result<(EntryKind, Identity)> {
        let what = || dir.child_path(on_disk);
        let parsed = ParsedEntry::parse(on_disk.as_bytes());
        // A conflict copy promises what its original entry promised (`d`: that name's `D`).
        let binding = match &parsed {
            ParsedEntry::Conflict(c) => c.binding(),
            p => p.binding(),
        };
        let binding = binding.ok_or_else(|| Error::auth(what(), "is not a veilfs entry name"))?;
        self.verified_identity(&dir.iv, d, binding, st).map_err(|e| relabel(e, &what()))
    }

    /// The one check of an entry's binding against its backing object, for every front end
    /// (listing, lookup, the mount, fsck): the kind comes from the backing `st_mode`, the
    /// binding `s_b64` must open for it, and a device must still have the device number its
    /// identity carries (vaults with `special-kinds`, docs/FORMAT.md §9).
    pub fn verified_identity(&self, iv: &DirIv, d: &[u8], s_b64: &str, st: &Stat) -> Result<(EntryKind, Identity)> {
        let kind = EntryKind::from_mode(st.st_mode);
        let identity = self.names.unbind(iv, d, kind, s_b64)?;
        self.names.check_device(kind, &identity, st.st_rdev)?;
        Ok((kind, identity))
    }

    /// Checks that the backing object `st`, met again by a handle that holds `kind` and
    /// `identity` from an earlier verification, is still of that kind and, for a device, that
    /// number. `what` names it in the integrity error.
    pub fn check_object(&self, kind: EntryKind, identity: &Identity, st: &Stat, what: &str) -> Result<()> {
        if EntryKind::from_mode(st.st_mode) != kind {
            return Err(Error::auth(
                what,
                format!("is {} where its entry names another kind", sys::type_name(st.st_mode)),
            ));
        }
        self.names.check_device(kind, identity, st.st_rdev).map_err(|e| relabel(e, what))
    }

    /// `D` of the entry `on_disk` of `dir`, read from its name or, for a long name, its side
    /// file (checked against the name's hash and for canonical form). For listings.
    pub fn entry_d(&self, dir: &CipherDir, on_disk: &str) -> Result<Vec<u8>> {
        let parsed = ParsedEntry::parse(on_disk.as_bytes());
        // A conflict copy's `D` is its original name's.
        let parsed = match &parsed {
            ParsedEntry::Conflict(c) => c.entry(),
            p => p.clone(),
        };
        self.names
            .entry_d(&parsed, |side| Self::read_side_file(dir, side))
            .map_err(|e| relabel(e, &dir.child_path(on_disk)))
    }

    /// Creates directory `name` with its IV copy, atomically: it appears under its final
    /// name only once its IV copy exists.
    pub fn mkdir(&self, dir: &CipherDir, name: &[u8], mode: u32) -> Result<(Entry, CipherDir)> {
        let key = self.absent_key(dir, name)?;
        let (on_disk, sub) = self.mkdir_at(dir, &key, mode)?;
        Ok((self.entry_after_create(dir, name, key, on_disk, EntryKind::Dir, sub.iv)?, sub))
    }

    /// [`mkdir`](Self::mkdir) without the existence check (the caller knows the name is free).
    pub fn mkdir_unchecked(&self, dir: &CipherDir, name: &[u8], mode: u32) -> Result<(Entry, CipherDir)> {
        let key = self.names.name_key(&dir.iv, name)?;
        let (on_disk, sub) = self.mkdir_at(dir, &key, mode)?;
        Ok((self.entry_after_create(dir, name, key, on_disk, EntryKind::Dir, sub.iv)?, sub))
    }

    /// Creates a directory under `key` in `dir` (the caller knows the name is free), made
    /// under a temporary name and renamed into place once its IV copy is written.
    pub fn mkdir_at(&self, dir: &CipherDir, key: &NameKey, mode: u32) -> Result<(String, CipherDir)> {
        let iv: DirIv = crate::random::bytes();
        let on_disk = self.entry_name_for(dir, key, EntryKind::Dir, &iv)?;
        let tmp = crate::names::temp_name();
        // Made with its final mode when that lets its owner write the IV copy into it (the
        // usual case; a set-group-id parent's group and bit are inherited as usual); else
        // made private and given its mode through its own fd once the IV copy is in.
        let mode = mode & 0o7777;
        let direct = mode & 0o700 == 0o700;
        sys::mkdirat(dir.fd(), tmp.as_bytes(), if direct { mode } else { 0o700 }).ctx(|| dir.child_path(&tmp))?;
        crash::point!("vault.mkdir_temp");
        let result = (|| {
            let fd = sys::open_dir_at(dir.fd(), tmp.as_bytes()).ctx(|| dir.child_path(&tmp))?;
            self.iv_copy.write(fd.as_fd(), &iv).ctx(|| dir.child_path(&tmp))?;
            crash::point!("vault.mkdir_diriv");
            if !direct {
                sys::chmod_fd(fd.as_fd(), mode).ctx(|| dir.child_path(&tmp))?;
            }
            sys::rename_noreplace(dir.fd(), tmp.as_bytes(), dir.fd(), on_disk.as_bytes())
                .ctx(|| dir.child_path(&on_disk))?;
            Ok(fd)
        })();
        match result {
            Ok(fd) => {
                let path = dir.path.join(&on_disk);
                Ok((on_disk, CipherDir { fd, iv, path }))
            }
            Err(e) => {
                let _ = sys::unlinkat(dir.fd(), format!("{tmp}/{}", self.iv_copy.name(&iv)).as_bytes(), false);
                let _ = sys::unlinkat(dir.fd(), tmp.as_bytes(), true);
                Err(e)
            }
        }
    }

    /// Creates a FIFO, socket or device node.
    pub fn mknod(&self, dir: &CipherDir, name: &[u8], mode: u32, rdev: libc::dev_t) -> Result<Entry> {
        let key = self.absent_key(dir, name)?;
        let (on_disk, id) = self.mknod_at(dir, &key, mode, rdev)?;
        self.entry_after_create(dir, name, key, on_disk, EntryKind::from_mode(mode), id)
    }

    /// Creates a FIFO, socket or device node under `key` in `dir` (the caller knows the name
    /// is free). A device's identity carries `rdev` ([`NameCipher::new_identity`]); a number
    /// that mknod(2) would cut to 32 bits is refused (EINVAL), as the node would not be the
    /// device asked for.
    pub fn mknod_at(&self, dir: &CipherDir, key: &NameKey, mode: u32, rdev: libc::dev_t) -> Result<(String, Identity)> {
        let kind = EntryKind::from_mode(mode);
        if !kind.is_special() || (kind.is_device() && u32::try_from(rdev).is_err()) {
            return Err(Error::io(dir.child_path(&key.key), std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let id = self.names.new_identity(kind, rdev);
        let on_disk = self.entry_name_for(dir, key, kind, &id)?;
        sys::mknodat(dir.fd(), on_disk.as_bytes(), mode, rdev).ctx(|| dir.child_path(&on_disk))?;
        Ok((on_disk, id))
    }

    /// Removes `entry` (a directory must be empty but for its IV copy).
    pub fn remove(&self, dir: &CipherDir, entry: &Entry) -> Result<()> {
        self.remove_entry(dir, &entry.on_disk, entry.kind, &entry.identity)?;
        self.drop_side_file(dir, &entry.key);
        Ok(())
    }
}
