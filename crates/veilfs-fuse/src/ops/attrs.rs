//! SETATTR (through verified handles, acting as the caller) and STATFS.

use super::*;

impl VeilFs {
    /// SETATTR.
    pub(crate) fn do_setattr(&self, ino: u64, a: &SetAttr, fh: Option<u64>, caller: Caller) -> io::Result<FileAttr> {
        let node = self.nodes.get(ino)?;
        // A regular file's new times, size, mode and owner are the mount's own (see
        // `FileState::note_own`), noted before CIPHERDIR's watch may judge the change.
        let _setting = node.file.as_ref().map(|f| f.setting.lock());
        let r = self.setattr_node(&node, a, fh, caller);
        if let (Ok(_), Some(f)) = (&r, &node.file) {
            if !self.opts.shared_storage {
                if let Ok(st) = self.do_getattr(&node, fh) {
                    f.note_own(&st);
                }
            }
        }
        r
    }

    fn setattr_node(&self, node: &Arc<Node>, a: &SetAttr, fh: Option<u64>, caller: Caller) -> io::Result<FileAttr> {
        let node = node.clone();
        if a.changes_anything() {
            self.check_writable()?;
        }
        let a = &self.setattr_allowed(&node, a, fh, caller)?;
        let a = &self.touch_is_now(&node, a, caller)?;
        if let Some(size) = a.size {
            if node.kind == EntryKind::Dir {
                return Err(errno(libc::EISDIR));
            }
            match self.handles.file_opt(fh) {
                // The reply carries the new mode.
                Some(h) => self.resize(&node, &h.crypt, size, caller)?,
                None => {
                    let attr = self.truncate_by_name(&node, size, a, caller)?;
                    if a.mode.is_none() && a.uid.is_none() && a.gid.is_none() {
                        return Ok(attr);
                    }
                    let rest = SetAttr { size: None, atime: None, mtime: None, ..a.clone() };
                    return self.setattr_node(&node, &rest, None, caller);
                }
            }
        }
        // Directories and open files are changed through the fd this mount holds (verified
        // when opened; an open file keeps working once its names are gone). Anything else
        // through a verified handle on the object its name holds now, acting as the caller.
        if let Some(d) = &node.dir {
            let before = self.opts.check_permissions.then(|| sys::fstat(d.cd.fd())).transpose()?;
            let attr = self.set_on_fd(&node, d.cd.fd(), a);
            d.forget_perm();
            let attr = attr?;
            if let Some(old) = before {
                if access_may_be_lost(&old, a, 0o111) {
                    self.expire_children(&node, d);
                }
                if access_may_be_lost(&old, a, 0o444) {
                    self.expire_listing(node.id);
                }
            }
            return Ok(attr);
        }
        let open = self.handles.file_opt(fh).map(|h| h.crypt.clone()).or_else(|| self.open_crypt(&node));
        if let Some(c) = open {
            return self.set_on_fd(&node, c.backing().as_fd(), a);
        }
        let l = match node.link() {
            Ok(l) => l,
            Err(e) => {
                // Deleted and closed: the kernel may still flush the times of a file it
                // wrote through its cache. The changes have nowhere to go; answer with
                // the last attributes, changed as asked, like an unlinked local inode.
                return node.gone_stat(|st| a.apply_to(st)).map(|st| self.attr_of(&node, &st)).ok_or(e);
            }
        };
        if a.mode.is_some() && node.kind == EntryKind::Symlink {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let handle = self.handle(&node, &l)?;
        let _as = self.acting(caller)?;
        self.set_on_fd(&node, handle.as_fd(), a)
    }

    /// The permission checks of SETATTR for a mount that makes them (`perm::check_setattr`);
    /// returns `a` with the set-group-id bit dropped where Linux drops it.
    ///
    /// With the writeback cache the kernel keeps a regular file's mtime itself and sends it as
    /// a value, both for `utimensat(…, NULL)` (with the atime as "now") and for its own flush
    /// of the times (after writes, or the ctime change of an unlink: mtime and ctime alone).
    /// So an mtime alone on such a file is taken for the flush and not checked; a
    /// `utimensat` that sets only the mtime to a value is then not refused to a non-owner
    /// (docs/FUSE.md).
    fn setattr_allowed(&self, node: &Arc<Node>, a: &SetAttr, fh: Option<u64>, c: Caller) -> io::Result<SetAttr> {
        let Some(who) = self.who(c) else { return Ok(a.clone()) };
        let now = |t: Option<libc::timespec>| t.is_some_and(|t| t.tv_nsec == libc::UTIME_NOW);
        let wb_file = self.writeback && node.kind == EntryKind::File;
        let touch = now(a.atime) && (now(a.mtime) || (wb_file && a.mtime.is_some()));
        let flush = wb_file && a.atime.is_none() && a.mode.is_none() && a.uid.is_none() && a.gid.is_none();
        let change = crate::perm::Change {
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            truncate_by_name: a.size.is_some() && fh.is_none(),
            touch,
            set_times: !touch && !flush && (a.atime.is_some() || a.mtime.is_some()),
        };
        if change.mode.is_none()
            && change.uid.is_none()
            && change.gid.is_none()
            && !change.truncate_by_name
            && !change.touch
            && !change.set_times
        {
            return Ok(a.clone());
        }
        let st = self.perm_stat(node)?;
        let mode = crate::perm::check_setattr(&who, &st, &change)?;
        Ok(SetAttr { mode, ..a.clone() })
    }

    /// A "touch" by a caller that does not own the file: `utimensat(…, NULL)` (or both times
    /// `UTIME_NOW`) is allowed to anyone who may write the file, an explicit time only to its
    /// owner. With the writeback cache the kernel sends the modification time of such a touch
    /// as a value (its own clock), the access time as "now"; set as a value on the backing
    /// file by the caller it would be refused (EPERM). The permission check already passed as
    /// a touch (the kernel's with `default_permissions`, `setattr_allowed` otherwise: a
    /// non-owner gets no further), so both times are set to "now" on the backing file.
    fn touch_is_now(&self, node: &Arc<Node>, a: &SetAttr, c: Caller) -> io::Result<SetAttr> {
        let now = |t: Option<libc::timespec>| t.is_some_and(|t| t.tv_nsec == libc::UTIME_NOW);
        let shape =
            self.writeback && node.kind == EntryKind::File && now(a.atime) && a.mtime.is_some() && !now(a.mtime);
        if !shape || self.perm_stat(node)?.st_uid == c.uid {
            return Ok(a.clone());
        }
        let utime_now = libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW };
        Ok(SetAttr { mtime: Some(utime_now), ..a.clone() })
    }

    /// After a change of directory `ino`'s mode or owner that may take read permission away
    /// from someone, on a mount whose daemon checks permissions and that has no OPENDIR
    /// (`VeilFs::do_opendir`): the kernel serves a listing it has cached to any opener
    /// without asking, so that listing is dropped (the pages it is kept in), and the next
    /// `getdents` is a READDIR at offset 0, where the daemon checks read permission. Sent
    /// before the SETATTR is answered: the kernel takes only the listing's page locks, which
    /// no one holds while this SETATTR holds the directory's lock (`getdents` takes it too).
    fn expire_listing(&self, ino: u64) {
        if !self.opts.shared_storage {
            self.inval_inode(ino, 0, "listing");
        }
    }

    /// After a change of `dir`'s mode or owner that may take search permission away from
    /// someone, on a mount whose daemon checks permissions (no `default_permissions`): the
    /// kernel does not check search permission on the names it caches then, and a locked
    /// mount lets it cache them for long, so they are dropped from its cache; the next path
    /// walk through `dir` asks the daemon, which checks.
    ///
    /// Two steps. First `dir`'s own name is dropped from its parent: the kernel then drops
    /// every unused name cached under it, those it caches as absent too (a missing name
    /// would otherwise stay ENOENT where Linux says EACCES). This one is waited for, up to
    /// [`EXPIRE_WAIT`], before the SETATTR is answered, so that the caller's next call
    /// already sees it (the kernel takes the parent's lock, which the chmod does not hold;
    /// the bound covers an rmdir or rename that holds the parent's lock while it waits for
    /// `dir`'s, held by this chmod). Then each name in `dir` (those still in use: an open
    /// file's, a working directory's; and all of them for the mount's top directory, which
    /// has no parent), from another thread after the answer, open files' names first: the
    /// kernel takes `dir`'s lock for them, which this SETATTR holds. As with any invalidation
    /// of a directory's name, something mounted below `dir` is detached.
    fn expire_children(&self, node: &Node, dir: &DirState) {
        let Some(n) = self.notifier.get().cloned() else { return };
        // Names of files open in `dir` first: theirs are the names the first step leaves.
        let open: Vec<String> = self
            .handles
            .open_files()
            .iter()
            .flat_map(|h| h.node.links())
            .filter(|l| l.parent.id == node.id)
            .map(|l| l.on_disk)
            .collect();
        let mut names: Vec<(bool, Vec<u8>)> = match dir.index(&self.vault, false) {
            Ok(idx) => idx.as_ref().map_or_else(Vec::new, |idx| {
                idx.values()
                    .filter_map(|e| {
                        let is_open = std::iter::once(&e.on_disk).chain(&e.others).any(|o| open.contains(o));
                        Some((!is_open, self.decoded(dir, e)?.name.clone()))
                    })
                    .collect()
            }),
            Err(e) => {
                tracing::warn!("{}: cached names not dropped after a permission change: {e}", dir.cd.path.display());
                return;
            }
        };
        names.sort_by_key(|(later, _)| *later);
        let own = node.find_link(|l| {
            let parent = l.parent.dir.as_ref()?;
            let d = self.decode_d(parent, &l.on_disk).ok()?;
            Some((l.parent.id, self.names.decrypt_name(&parent.cd.iv, &d).ok()?))
        });
        let (done, first) = std::sync::mpsc::channel();
        let id = node.id;
        let inval = move |parent: u64, name: &[u8]| {
            if let Err(e) = n.inval_entry(fuser::INodeNo(parent), std::os::unix::ffi::OsStrExt::from_bytes(name)) {
                tracing::debug!("node {parent}: entry invalidation: {e}");
            }
        };
        std::thread::spawn(move || {
            if let Some((parent, name)) = own {
                inval(parent, &name);
            }
            let _ = done.send(());
            for (_, name) in names {
                inval(id, &name);
            }
        });
        let _ = first.recv_timeout(EXPIRE_WAIT);
    }

    /// truncate(2) by name: the file opened as the caller (whose write access the kernel
    /// checked), then changed like an ftruncate(2) through that open file, with the times that
    /// come along (the kernel's own, with the writeback cache). Returns the new attributes.
    fn truncate_by_name(&self, node: &Arc<Node>, size: u64, a: &SetAttr, caller: Caller) -> io::Result<FileAttr> {
        let crypt = {
            let _as = self.acting(caller)?;
            self.acquire(node)?
        };
        let r = self.resize(node, &crypt, size, caller).and_then(|()| {
            let times = SetAttr { atime: a.atime, mtime: a.mtime, ..SetAttr::default() };
            self.set_on_fd(node, crypt.backing().as_fd(), &times)
        });
        self.release_file(node);
        r
    }

    /// The ciphertext path of `node`, for log lines.
    pub(super) fn cipher_path(&self, node: &Node) -> String {
        match (&node.dir, node.link()) {
            (Some(d), _) => d.cd.path.display().to_string(),
            (None, Ok(l)) => l.parent.dir.as_ref().map_or(l.on_disk.clone(), |d| d.cd.child_path(&l.on_disk)),
            (None, Err(_)) => format!("a deleted file (node {})", node.id),
        }
    }

    /// A verified `O_PATH` handle on the object `node` names at `l` (see
    /// [`Vault::entry_handle`]): a swapped or planted object is an integrity error.
    pub(super) fn handle(&self, node: &Node, l: &crate::inodes::Link) -> io::Result<OwnedFd> {
        let dir = l.parent.dir()?;
        Vault::entry_handle(&dir.cd, &l.on_disk, node.kind, node.backing_ino).map(|(fd, _)| fd).map_err(cerr)
    }

    /// Applies `a`'s mode, owner and times to the object behind `fd` (a handle of `node`).
    pub(super) fn set_on_fd(&self, node: &Node, fd: std::os::fd::BorrowedFd<'_>, a: &SetAttr) -> io::Result<FileAttr> {
        if a.uid.is_some() || a.gid.is_some() {
            sys::chown_fd(fd, a.uid.unwrap_or(u32::MAX), a.gid.unwrap_or(u32::MAX))?;
        }
        if let Some(m) = a.mode {
            sys::chmod_fd(fd, m & 0o7777)?;
        }
        // The open file, if any: waited for while the last close settles it (that holds the
        // inode's open state), and kept from settling while the times change, since settling
        // puts back the modification time it read before its header write.
        let crypt = self.open_crypt(node);
        if a.atime.is_some() || a.mtime.is_some() {
            let _settling = crypt.as_ref().map(|c| c.times_guard());
            sys::utimens_fd(fd, &a.times())?;
            self.atime_recheck(node);
        }
        let st = sys::fstat(fd)?;
        // An open file remembers its mode (`CryptFile::mode`): a chmod, or a chown that
        // cleared set-id bits, through another handle must reach it.
        if let Some(c) = crypt {
            c.note_mode(st.st_mode);
        }
        Ok(self.attr_of(node, &st))
    }

    /// STATFS.
    ///
    /// Block counts are in plaintext: what one new file could hold in the backing store's
    /// space, net of its header and every block's overhead (docs/FORMAT.md §5.3), so that a
    /// `fallocate` of all the free space reported fits. Each further file costs another header
    /// and a partial block's overhead, and the backing filesystem rounds every file up to its
    /// own allocation unit; neither is predictable, so many small files fit less.
    pub(crate) fn do_statfs(&self) -> io::Result<sys::StatVfs> {
        let root = self.nodes.get(ROOT)?;
        let mut s = sys::fstatvfs(root.dir()?.cd.fd())?;
        let unit = (s.f_frsize as u64).max(1);
        let plain = |blocks: u64| self.ctx.plain_capacity(blocks.saturating_mul(unit)) / unit;
        (s.f_blocks, s.f_bfree, s.f_bavail) = (plain(s.f_blocks), plain(s.f_bfree), plain(s.f_bavail));
        Ok(s)
    }
}

/// How long a SETATTR that takes search permission away waits for the kernel to drop the
/// directory's name ([`VeilFs::expire_children`]).
const EXPIRE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether changing a directory of stat `old` as `a` asks may take a permission away from
/// someone: one of the mode's `bits` removed (0o111: search, 0o444: read), or a new owner or
/// group.
fn access_may_be_lost(old: &Stat, a: &SetAttr, bits: u32) -> bool {
    let lost = a.mode.is_some_and(|m| old.st_mode & bits & !m != 0);
    lost || a.uid.is_some_and(|u| u != old.st_uid) || a.gid.is_some_and(|g| g != old.st_gid)
}
