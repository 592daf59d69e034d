//! Namespace changes other than rename: CREATE, MKNOD, MKDIR, SYMLINK, LINK, UNLINK, RMDIR,
//! and READLINK; the on-disk steps are the core engine's `*_at` calls.

use super::*;
use veilfs_core::sys::Stat;

impl VeilFs {
    /// Registers a new entry in the parent's index and node table; returns its node.
    pub(super) fn created(
        &self,
        parent: &Arc<Node>,
        key: &NameKey,
        on_disk: &str,
        d_type: u8,
        name: &[u8],
    ) -> io::Result<(Arc<Node>, Stat)> {
        let dir = parent.dir()?;
        dir.update(|idx| {
            let plain = Decoded { name: name.to_vec(), d: key.d.clone() };
            idx.insert(key.key.clone(), IndexEntry::new(on_disk.to_string(), d_type, Some(plain)));
        });
        let st = Self::stat_entry(dir, on_disk)?;
        Ok((self.node_at(parent, &key.d, on_disk, &st)?, st))
    }

    /// CREATE (by `caller`): a new regular file, opened. Returns node, stat and handle.
    pub(crate) fn do_create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> io::Result<(Arc<Node>, Stat, u64)> {
        self.check_writable()?;
        let pnode = self.nodes.get(parent)?;
        let dir = pnode.dir()?;
        let checked = self.may(caller, &pnode, crate::perm::EXEC)?;
        let guard = dir.ops.lock();
        let (key, found) = self.find(dir, name)?;
        if found.is_some() {
            drop(guard);
            if flags & libc::O_EXCL != 0 {
                return Err(errno(libc::EEXIST));
            }
            let (node, st) = self.do_lookup(parent, name, caller)?;
            let (fh, _) = self.do_open(node.id, flags, caller)?;
            return Ok((node, st, fh));
        }
        if let Some((who, st)) = &checked {
            crate::perm::check(who, st, crate::perm::WRITE)?;
        }
        let (on_disk, _, crypt) = self.vault.create_file_at(&dir.cd, &key, mode).map_err(cerr)?;
        crypt.set_defer_sparse(!self.opts.shared_storage);
        crypt.set_session_until_settle(true);
        data::no_backing_atime(crypt.backing().as_fd());
        let crypt = Arc::new(crypt);
        let (node, st) = self.created(&pnode, &key, &on_disk, libc::DT_REG, name)?;
        drop(guard);
        let crypt = node.file()?.adopt(crypt);
        self.activity.open_files.fetch_add(1, Ordering::Relaxed);
        let fh = self.handles.add_file(OpenFile { node: node.clone(), crypt });
        Ok((node, st, fh))
    }

    /// Makes a new entry `name` in directory `parent`: under the directory's lock, refuses a
    /// name in use (EEXIST), lets `make` create the backing object (returning its on-disk name
    /// and `d_type`) and registers it. The object belongs to whoever the thread acts as
    /// ([`acting`](Self::acting)); `c` needs write and search permission on the parent.
    pub(super) fn make_entry(
        &self,
        parent: u64,
        name: &[u8],
        c: Caller,
        make: impl FnOnce(&DirState, &NameKey) -> io::Result<(String, u8)>,
    ) -> io::Result<(Arc<Node>, Stat)> {
        self.check_writable()?;
        let pnode = self.nodes.get(parent)?;
        let dir = pnode.dir()?;
        self.may(c, &pnode, crate::perm::WRITE | crate::perm::EXEC)?;
        let _g = dir.ops.lock();
        let (key, found) = self.find(dir, name)?;
        if found.is_some() {
            return Err(errno(libc::EEXIST));
        }
        let (on_disk, d_type) = make(dir, &key)?;
        self.created(&pnode, &key, &on_disk, d_type, name)
    }

    /// MKNOD (FIFOs, sockets, device nodes; regular files too).
    pub(crate) fn do_mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        c: Caller,
    ) -> io::Result<(Arc<Node>, Stat)> {
        let kind = EntryKind::from_mode(mode);
        if kind == EntryKind::Dir {
            return Err(errno(libc::EINVAL));
        }
        self.make_entry(parent, name, c, |dir, key| {
            if kind == EntryKind::File {
                let (on_disk, _, _) = self.vault.create_file_at(&dir.cd, key, mode).map_err(cerr)?;
                Ok((on_disk, libc::DT_REG))
            } else {
                let rdev = attr::rdev_from_fuse(rdev);
                let (on_disk, _) = self.vault.mknod_at(&dir.cd, key, mode, rdev).map_err(cerr)?;
                Ok((on_disk, dtype(kind)))
            }
        })
    }

    /// MKDIR.
    pub(crate) fn do_mkdir(&self, parent: u64, name: &[u8], mode: u32, c: Caller) -> io::Result<(Arc<Node>, Stat)> {
        self.make_entry(parent, name, c, |dir, key| {
            // A set-group-id directory passes the bit on, as local filesystems do.
            let mode = (mode & 0o7777) | (sys::fstat(dir.cd.fd())?.st_mode & libc::S_ISGID);
            let (on_disk, _sub) = self.vault.mkdir_at(&dir.cd, key, mode).map_err(cerr)?;
            Ok((on_disk, libc::DT_DIR))
        })
    }

    /// SYMLINK.
    pub(crate) fn do_symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        c: Caller,
    ) -> io::Result<(Arc<Node>, Stat)> {
        self.make_entry(parent, name, c, |dir, key| {
            let (on_disk, _) = self.vault.symlink_at(&dir.cd, key, target).map_err(cerr)?;
            Ok((on_disk, libc::DT_LNK))
        })
    }

    /// READLINK.
    pub(crate) fn do_readlink(&self, ino: u64) -> io::Result<Vec<u8>> {
        let node = self.nodes.get(ino)?;
        let l = node.link()?;
        let dir = l.parent.dir()?;
        self.vault.read_target(&dir.cd, &l.on_disk, &node.identity).map_err(cerr)
    }

    /// UNLINK and RMDIR (by `c`: search and write permission on the parent, and the
    /// sticky-bit rule).
    pub(crate) fn do_remove(&self, parent: u64, name: &[u8], is_dir: bool, c: Caller) -> io::Result<()> {
        self.check_writable()?;
        let pnode = self.nodes.get(parent)?;
        let dir = pnode.dir()?;
        let checked = self.may(c, &pnode, crate::perm::EXEC)?;
        let _g = dir.ops.lock();
        let (key, found) = self.find(dir, name)?;
        let on_disk = found.ok_or_else(|| errno(libc::ENOENT))?;
        let st = Self::stat_entry(dir, &on_disk)?;
        if let Some((who, pst)) = &checked {
            crate::perm::check(who, pst, crate::perm::WRITE)?;
            crate::perm::check_sticky(who, pst, &st)?;
        }
        let kind = EntryKind::from_mode(st.st_mode);
        match (is_dir, kind == EntryKind::Dir) {
            (true, false) => return Err(errno(libc::ENOTDIR)),
            (false, true) => return Err(errno(libc::EISDIR)),
            _ => {}
        }
        // A directory's identity (its IV) is needed to put it back if removal fails halfway;
        // a file's is not, so spare the SIV.
        let identity = if kind == EntryKind::Dir { self.identity(dir, &key.d, &on_disk, &st)?.1 } else { [0u8; 16] };
        self.vault.remove_entry(&dir.cd, &on_disk, kind, &identity).map_err(cerr)?;
        // The index knows whether another entry (a crash leftover) still uses the name.
        if dir.index(&self.vault, false)?.as_ref().and_then(|i| i.get(&key.key)).is_none_or(|e| e.others.is_empty()) {
            // A conflict copy of this long name (not in the index under its key) may still
            // read the side file: the vault's check lists the directory, so only where the
            // index has seen a copy (a listing per removal would make `rm -r` quadratic).
            if dir.may_have_copies() {
                self.vault.drop_side_file(&dir.cd, &key);
            } else {
                veilfs_core::vault::Vault::unlink_side_file(&dir.cd, &key);
            }
        }
        dir.update(|idx| {
            idx.remove(&key.key);
        });
        self.after_unlink(pnode.id, &on_disk, &st);
        Ok(())
    }

    /// Bookkeeping once `parent/on_disk` (backing `st` before removal) is gone.
    pub(super) fn after_unlink(&self, parent: u64, on_disk: &str, st: &Stat) {
        if let Some(d) = self.nodes.get(parent).ok().as_ref().and_then(|p| p.dir.as_ref()) {
            d.version_gone(st.st_ino, st.st_nlink);
        }
        if let Some(id) = self.nodes.id_of(st.st_ino) {
            if let Ok(n) = self.nodes.get(id) {
                let named = n.remove_link(parent, on_disk);
                // Gone only if this was its last name on disk, not merely the last one this
                // mount had looked up (other hard links may exist).
                if st.st_nlink <= 1 && n.dir.is_none() && !named {
                    n.set_gone(st);
                    // Still open: its write session ends now, so that no session log outlives
                    // the name (see `CryptFile::set_unlinked`).
                    if let Some(c) = n.file.as_ref().and_then(|f| f.opened()) {
                        match c.set_unlinked() {
                            Ok(true) => self.invalidate_attr(n.id),
                            Ok(false) => {}
                            Err(e) => tracing::error!("{e}"),
                        }
                    }
                }
            }
        }
        if st.st_nlink <= 1 || EntryKind::from_mode(st.st_mode) == EntryKind::Dir {
            self.nodes.backing_gone(st.st_ino);
        }
    }

    /// LINK.
    pub(crate) fn do_link(&self, ino: u64, newparent: u64, newname: &[u8], c: Caller) -> io::Result<(Arc<Node>, Stat)> {
        let node = self.nodes.get(ino)?;
        if node.kind == EntryKind::Dir {
            return Err(errno(libc::EPERM));
        }
        if let Some(who) = self.who(c) {
            crate::perm::check_link_source(&who, &self.perm_stat(&node)?, self.protected_hardlinks)?;
        }
        self.make_entry(newparent, newname, c, |dir, key| {
            let src = node.link()?;
            let from = &src.parent.dir()?.cd;
            let on_disk =
                self.vault.link_at(from, &src.on_disk, node.kind, &node.identity, &dir.cd, key).map_err(cerr)?;
            // A name with a file ID that is not new here: the census of versions is made again.
            dir.versions_changed();
            Ok((on_disk, dtype(node.kind)))
        })
    }
}

pub(super) fn dtype(k: EntryKind) -> u8 {
    match k {
        EntryKind::File => libc::DT_REG,
        EntryKind::Dir => libc::DT_DIR,
        EntryKind::Symlink => libc::DT_LNK,
        EntryKind::Fifo => libc::DT_FIFO,
        EntryKind::Socket => libc::DT_SOCK,
        EntryKind::CharDevice => libc::DT_CHR,
        EntryKind::BlockDevice => libc::DT_BLK,
    }
}
