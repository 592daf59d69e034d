//! Moving entries: rename (a new binding for the new name, written before the old name
//! goes), exchange (with its intent record, so that a crash between the two renames is
//! finished by the next open), and hard links.

use super::*;

impl Vault {
    /// The on-disk name `entry` gets as `new_name` in `to` (same identity, new binding).
    pub fn rebind(&self, to: &CipherDir, new_name: &[u8], entry: &Entry) -> Result<(NameKey, String)> {
        self.new_entry_name(to, new_name, entry.kind, &entry.identity)
    }

    /// Renames `entry` of `from` to `new_name` in `to`, replacing `replaced` (the entry of
    /// `new_name`, found by the caller) if given. See [`rename_at`](Self::rename_at); a
    /// version of a file that leaves its directory gets a fresh file ID
    /// ([`needs_fresh_id`](Self::needs_fresh_id)), which the returned entry carries.
    pub fn rename(
        &self,
        from: &CipherDir,
        entry: &Entry,
        to: &CipherDir,
        new_name: &[u8],
        replaced: Option<&Entry>,
    ) -> Result<Entry> {
        let key = self.names.name_key(&to.iv, new_name)?;
        let (on_disk, identity) = if self.needs_fresh_id(from, entry, to)? {
            self.rename_fresh_at(from, entry, to, &key, replaced)?
        } else {
            (self.rename_at(from, entry, to, &key, replaced)?, entry.identity)
        };
        let stat = sys::fstatat(to.fd(), on_disk.as_bytes()).ctx(|| to.child_path(&on_disk))?;
        Ok(Entry { name: new_name.to_vec(), on_disk, key, kind: entry.kind, identity, stat })
    }

    /// Renames `entry` of `from` to the name of `key` in `to`, replacing `replaced` (the entry
    /// of that name, found by the caller) if given; returns the new on-disk name. A directory
    /// replaces only an empty directory, a non-directory only a non-directory. The backing
    /// rename moves the object atomically under its new binding; the replaced entry is removed
    /// right after (a crash between leaves two entries for one name; the newer, verified one
    /// wins, F§10), and a long name's side file goes once no entry uses it. A symlink moving
    /// to another directory takes its target side file along (F§8.1).
    pub fn rename_at(
        &self,
        from: &CipherDir,
        entry: &Entry,
        to: &CipherDir,
        key: &NameKey,
        replaced: Option<&Entry>,
    ) -> Result<String> {
        if let Some(r) = replaced {
            let errno = |n| Err(Error::io(to.child_path(&r.on_disk), std::io::Error::from_raw_os_error(n)));
            match (entry.kind == EntryKind::Dir, r.kind == EntryKind::Dir) {
                (false, true) => return errno(libc::EISDIR),
                (true, false) => return errno(libc::ENOTDIR),
                (true, true) => drop(owner_access(to, &r.on_disk, || self.empty_dir(to, &r.on_disk, &r.identity))?),
                (false, false) => {}
            }
        }
        let on_disk = self.entry_name_for(to, key, entry.kind, &entry.identity)?;
        // The old name leaves with a tombstone record, the new one arrives with a "back"
        // record if one said it was deleted: docs/FORMAT.md §19. A rename onto its own name
        // changes nothing.
        let moves = !(from.path == to.path && entry.on_disk == on_disk);
        let tomb = if moves {
            self.clear_tombstone(to, &on_disk, entry.kind)?;
            self.tombstone_before_remove(from, &entry.on_disk, entry.kind)?
        } else {
            None
        };
        let side = self.carry_target_side(from, &entry.on_disk, entry.kind, to).inspect_err(|_| {
            self.take_back_tombstone(from, tomb);
        })?;
        if let Err(e) = sys::rename_noreplace(from.fd(), entry.on_disk.as_bytes(), to.fd(), on_disk.as_bytes()) {
            if let Some(side) = &side {
                self.drop_target_side(to, side);
            }
            self.take_back_tombstone(from, tomb);
            return Err(Error::io(to.child_path(&on_disk), e));
        }
        crash::point!("vault.rename");
        self.forget_removed(from, tomb);
        if let Some(side) = &side {
            self.drop_target_side(from, side);
        }
        if let Some(r) = replaced {
            if let Err(e) = self.remove_entry(to, &r.on_disk, r.kind, &r.identity) {
                tracing::error!("rename: could not remove the replaced entry {}: {e}", to.child_path(&r.on_disk));
            }
        }
        if !(from.path == to.path && entry.key.key == key.key) {
            self.drop_side_file(from, &entry.key);
        }
        Ok(on_disk)
    }

    /// Exchanges entries `a` of `a_dir` and `b` of `b_dir` (RENAME_EXCHANGE): each object
    /// takes the other's name, under a new binding. Returns the new on-disk names of `a`'s
    /// object (now in `b_dir`) and `b`'s (now in `a_dir`). Three renames on disk: `b`'s object
    /// waits under a temporary name `veilfs.tmp.<r>` while `a`'s takes its name. An intent
    /// record `veilfs.xchg.<r>` next to it, written first and removed last, names the
    /// steps, so the crash sweep finishes an interrupted exchange
    /// ([`finish_exchange`](Self::finish_exchange)): a crash leaves the old pair or, once the
    /// first rename is done, the new one (F§10). The record carries a MAC binding it to its
    /// name and both directories' IVs ([`crate::record`]).
    pub fn exchange_at(&self, a_dir: &CipherDir, a: &Entry, b_dir: &CipherDir, b: &Entry) -> Result<(String, String)> {
        let a_new = self.entry_name_for(b_dir, &b.key, a.kind, &a.identity)?;
        let b_new = self.entry_name_for(a_dir, &a.key, b.kind, &b.identity)?;
        let tmp = crate::names::temp_name();
        let journal = format!("{}{}", crate::names::XCHG_PREFIX, &tmp[crate::names::TEMP_PREFIX.len()..]);
        let rel = a_dir.path.strip_prefix(&self.root_path).unwrap_or(Path::new("")).to_string_lossy().into_owned();
        let intent = ExchangeIntent {
            a_dir: rel,
            a: a.on_disk.clone(),
            a_new: a_new.clone(),
            b_new: b_new.clone(),
            mac: [0; crate::record::RECORD_MAC_LEN],
        }
        .sealed(&self.ctx.keys, &journal, &b_dir.iv, &a_dir.iv);
        // Each old name leaves with a tombstone record, each new one arrives with a "back"
        // record if one said it was deleted.
        self.clear_tombstone(b_dir, &a_new, a.kind)?;
        self.clear_tombstone(a_dir, &b_new, b.kind)?;
        let a_tomb = self.tombstone_before_remove(a_dir, &a.on_disk, a.kind)?;
        let b_tomb = self.tombstone_before_remove(b_dir, &b.on_disk, b.kind)?;
        write_record(b_dir, &journal, &intent)?;
        let mv = |fd: &CipherDir, old: &str, td: &CipherDir, new: &str| {
            sys::rename_noreplace(fd.fd(), old.as_bytes(), td.fd(), new.as_bytes()).ctx(|| fd.child_path(old))
        };
        let undo_intent = |e| {
            let _ = sys::unlinkat(b_dir.fd(), journal.as_bytes(), false);
            e
        };
        let a_side = self.carry_target_side(a_dir, &a.on_disk, a.kind, b_dir).map_err(undo_intent)?;
        let b_side = self.carry_target_side(b_dir, &b.on_disk, b.kind, a_dir).map_err(undo_intent)?;
        mv(b_dir, &b.on_disk, b_dir, &tmp).map_err(undo_intent)?;
        crash::point!("vault.exchange");
        mv(a_dir, &a.on_disk, b_dir, &a_new)?;
        mv(b_dir, &tmp, a_dir, &b_new)?;
        self.forget_removed(a_dir, a_tomb);
        self.forget_removed(b_dir, b_tomb);
        sys::unlinkat(b_dir.fd(), journal.as_bytes(), false).ctx(|| b_dir.child_path(&journal))?;
        for (dir, side) in [(a_dir, a_side), (b_dir, b_side)] {
            if let Some(side) = side {
                self.drop_target_side(dir, &side);
            }
        }
        Ok((a_new, b_new))
    }

    /// Reads and verifies the exchange record `journal` of the directory `dir` (ciphertext
    /// path `dir_path`, below the vault root `root`): its form, then its MAC for its name, the
    /// IV of `dir` and the IV of the directory it names. Returns the record and that
    /// directory (opened below `root` one name at a time, never following a link). A record
    /// that fails is an integrity error naming its ciphertext file: damage, never an
    /// instruction.
    pub fn verified_exchange(
        &self,
        root: BorrowedFd<'_>,
        dir: BorrowedFd<'_>,
        dir_path: &Path,
        journal: &str,
    ) -> Result<(ExchangeIntent, OwnedFd)> {
        self.verified_exchange_iv(root, dir, dir_path, journal).map(|(r, a_dir, _)| (r, a_dir))
    }

    /// [`verified_exchange`](Self::verified_exchange), with the IV of the directory the record
    /// names (the one it verified under).
    fn verified_exchange_iv(
        &self,
        root: BorrowedFd<'_>,
        dir: BorrowedFd<'_>,
        dir_path: &Path,
        journal: &str,
    ) -> Result<(ExchangeIntent, OwnedFd, DirIv)> {
        let what = dir_path.join(journal).display().to_string();
        let r = read_record(dir, journal).map_err(|d| Error::auth(&what, d))?;
        let a_dir = sys::open_dir_below(root, &r.a_dir).map_err(|e| {
            Error::auth(&what, format!("names the directory {:?}, which cannot be opened ({e})", r.a_dir))
        })?;
        let (dir_ivs, a_ivs) = (self.record_ivs(root, dir), self.record_ivs(root, a_dir.as_fd()));
        let a_iv = dir_ivs
            .iter()
            .find_map(|d| a_ivs.iter().find(|a| r.verify(&self.ctx.keys, journal, d, a).is_ok()))
            .copied();
        let Some(a_iv) = a_iv else {
            return Err(Error::auth(what, RecordError::BadMac.to_string()));
        };
        Ok((r, a_dir, a_iv))
    }

    /// The IVs a record lying in or naming the directory `dir` may have been written under:
    /// the top directory's from the config (authenticated), any other's from its IV copy
    /// (F§7.1; with `iv-in-name`, every IV name it holds). The copy is not authenticated by
    /// itself, but a wrong one only makes the MAC fail: a record verifies only under the IVs
    /// it was written for, and the MAC cannot be made without the vault key.
    fn record_ivs(&self, root: BorrowedFd<'_>, dir: BorrowedFd<'_>) -> Vec<DirIv> {
        let same = |a: BorrowedFd<'_>, b: BorrowedFd<'_>| match (sys::fstat(a), sys::fstat(b)) {
            (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
            _ => false,
        };
        if same(root, dir) {
            return vec![self.config.root_iv().expect("checked at load")];
        }
        self.iv_copy.carried(dir)
    }

    /// Finishes the exchange whose intent record `journal` lies in directory `dir` (ciphertext
    /// path `dir_path`, opened below the vault root `root`), after a crash: if its first
    /// rename was done, makes the other two; then removes the record. Returns whether renames
    /// were made. Each step is a no-op when already done, so a crash during this too is
    /// finished by the next sweep.
    ///
    /// Nothing is done unless the record verifies ([`verified_exchange`](Self::verified_exchange)).
    /// The steps run with the rights of the two directories' owner ([`sys::as_owner_of`]):
    /// a privileged sweep acts as that user, and refuses (an error naming the record, which
    /// is left for `fsck`) when the directories belong to different users.
    pub fn finish_exchange(
        &self,
        root: BorrowedFd<'_>,
        dir: BorrowedFd<'_>,
        dir_path: &Path,
        journal: &str,
    ) -> Result<bool> {
        let (intent, a_dir, a_iv) = self.verified_exchange_iv(root, dir, dir_path, journal)?;
        let r = &journal[crate::names::XCHG_PREFIX.len()..];
        let tmp = format!("{}{r}", crate::names::TEMP_PREFIX);
        let what = || dir_path.join(journal).display().to_string();
        let exists = |d: BorrowedFd<'_>, n: &str| sys::fstatat(d, n.as_bytes()).is_ok();
        sys::as_owner_of(&[dir, a_dir.as_fd()], || {
            let moved = exists(dir, &tmp);
            if moved {
                if exists(a_dir.as_fd(), &intent.a) && !exists(dir, &intent.a_new) {
                    // The exchange recorded this name's removal before it began; a listing
                    // since may have taken the name, still there, for an unfinished removal
                    // and answered it: recorded again, as it leaves now (FORMAT §19).
                    self.record_removal_at(a_dir.as_fd(), &a_iv, &intent.a);
                    sys::rename_noreplace(a_dir.as_fd(), intent.a.as_bytes(), dir, intent.a_new.as_bytes())?;
                }
                sys::rename_noreplace(dir, tmp.as_bytes(), a_dir.as_fd(), intent.b_new.as_bytes())?;
            }
            sys::unlinkat(dir, journal.as_bytes(), false)?;
            Ok(moved)
        })
        .ctx(what)
    }

    /// Creates a hard link named by `key` in `to` to the object `src_on_disk` of `from` (of
    /// `kind`, with `identity`); the caller knows the name is free. Returns the new on-disk
    /// name.
    pub fn link_at(
        &self,
        from: &CipherDir,
        src_on_disk: &str,
        kind: EntryKind,
        identity: &Identity,
        to: &CipherDir,
        key: &NameKey,
    ) -> Result<String> {
        let on_disk = self.entry_name_for(to, key, kind, identity)?;
        self.clear_tombstone(to, &on_disk, kind)?;
        let side = self.carry_target_side(from, src_on_disk, kind, to)?;
        let link = || sys::linkat(from.fd(), src_on_disk.as_bytes(), to.fd(), on_disk.as_bytes());
        if let Err(e) = sys::in_dir_as_owner(from.fd(), sys::is_eacces, link) {
            if let Some(side) = &side {
                self.drop_target_side(to, side);
            }
            return Err(Error::io(to.child_path(&on_disk), e));
        }
        crash::point!("vault.link");
        Ok(on_disk)
    }

    /// Creates a hard link `new_name` in `to` to the file `entry` of `from`.
    pub fn link(&self, from: &CipherDir, entry: &Entry, to: &CipherDir, new_name: &[u8]) -> Result<Entry> {
        if entry.kind == EntryKind::Dir {
            return Err(Error::io(from.child_path(&entry.on_disk), std::io::Error::from_raw_os_error(libc::EPERM)));
        }
        let key = self.absent_key(to, new_name)?;
        let on_disk = self.link_at(from, &entry.on_disk, entry.kind, &entry.identity, to, &key)?;
        self.entry_after_create(to, new_name, key, on_disk, entry.kind, entry.identity)
    }
}

/// Writes an exchange's intent record `name` (F§10) into `dir`, new, not following links.
fn write_record(dir: &CipherDir, name: &str, r: &ExchangeIntent) -> Result<()> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    let fd = sys::openat(dir.fd(), name.as_bytes(), flags, 0o600).ctx(|| dir.child_path(name))?;
    sys::pwrite_all(fd.as_fd(), r.encode().as_bytes(), 0).ctx(|| dir.child_path(name))
}

/// Reads the record `name` of `dir`: a regular file (never a link, FIFO or device) of at most
/// [`MAX_RECORD_LEN`](crate::record::MAX_RECORD_LEN) bytes, parsed (not yet verified).
fn read_record(dir: BorrowedFd<'_>, name: &str) -> std::result::Result<ExchangeIntent, String> {
    let (fd, st) = sys::open_regular_at(dir, name.as_bytes(), libc::O_RDONLY).map_err(|e| match e.err() {
        Some(e) => format!("cannot be read: {e}"),
        None => "is not a regular file".to_string(),
    })?;
    if st.st_size as usize > crate::record::MAX_RECORD_LEN {
        return Err(RecordError::Malformed("too long".into()).to_string());
    }
    let mut buf = vec![0u8; st.st_size as usize];
    let n = sys::pread_full(fd.as_fd(), &mut buf, 0).map_err(|e| format!("cannot be read: {e}"))?;
    ExchangeIntent::parse(&buf[..n]).map_err(|e| e.to_string())
}
