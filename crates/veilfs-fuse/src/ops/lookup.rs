//! LOOKUP and GETATTR: from a plaintext name to a node, through the directory index; several
//! on-disk entries for one name are resolved by verifying their bindings.

use super::*;
use veilfs_core::sys::Stat;

impl VeilFs {
    /// The lookup key of `name` in `dir` and its on-disk entry, if it exists.
    pub(super) fn find(&self, dir: &DirState, name: &[u8]) -> io::Result<(NameKey, Option<String>)> {
        let key = self.names.name_key(&dir.cd.iv, name).map_err(cerr)?;
        let found = dir
            .index(&self.vault, self.opts.shared_storage)?
            .as_ref()
            .and_then(|i| i.get(&key.key).map(|e| (e.on_disk.clone(), e.others.clone())));
        let found = match found {
            Some((on_disk, others)) if others.is_empty() => Some(on_disk),
            Some((on_disk, others)) => Some(self.resolve(dir, &key.d, on_disk, others)?),
            None => None,
        };
        Ok((key, found))
    }

    /// Of several on-disk entries for one name, the one that is the entry: among those whose
    /// binding verifies, the newest (a crash during a rename over an existing name leaves the
    /// old one behind). A forged entry never hides the real one. With none verifying, the
    /// first (its use then fails with an integrity error naming it).
    pub(crate) fn resolve(&self, dir: &DirState, d: &[u8], first: String, others: Vec<String>) -> io::Result<String> {
        let mut best: Option<((i64, i64), String)> = None;
        for on_disk in std::iter::once(first.clone()).chain(others) {
            let Ok(st) = Self::stat_entry(dir, &on_disk) else { continue };
            if self.identity(dir, d, &on_disk, &st).is_err() {
                continue;
            }
            let ctime = (st.st_ctime, st.st_ctime_nsec);
            if best.as_ref().is_none_or(|(c, _)| ctime > *c) {
                best = Some((ctime, on_disk));
            }
        }
        Ok(best.map_or(first, |(_, on_disk)| on_disk))
    }

    /// The backing stat of entry `on_disk` of `dir` ([`Vault::stat_entry`]: also where the
    /// directory's mode denies its owner search, which a listing (mode 0600), an open fd or
    /// another hard link gets past on Linux).
    pub(super) fn stat_entry(dir: &DirState, on_disk: &str) -> io::Result<Stat> {
        Vault::stat_entry(&dir.cd, on_disk.as_bytes()).map_err(cerr)
    }

    /// [`stat_entry`](Self::stat_entry) of an entry of `parent` (whose state is `dir`), for
    /// an answer the kernel caches: the owner's grant that the engine may need moves the change
    /// time of `parent`, which the kernel is then told.
    pub(super) fn stat_entry_of(&self, parent: &Node, dir: &DirState, on_disk: &str) -> io::Result<Stat> {
        self.telling_grants(&[parent.id], || Self::stat_entry(dir, on_disk))
    }

    /// Runs `f`, an engine step that may grant the owner's rights for a moment (a daemon that
    /// is not root, see `veilfs_core::sys::with_owner_rwx`), and if a grant was made meanwhile
    /// tells the kernel that the attributes of `inos` changed (their change time moved; a
    /// locked mount lets the kernel keep attributes for long).
    pub(super) fn telling_grants<T>(&self, inos: &[u64], f: impl FnOnce() -> T) -> T {
        if self.euid == 0 {
            return f();
        }
        let before = sys::grants();
        let r = f();
        if sys::grants() != before {
            inos.iter().for_each(|&ino| self.invalidate_attr(ino));
        }
        r
    }

    /// The identity `on_disk` (in `dir`, with `D` = `d`, backing type from `st`) promises.
    pub(super) fn identity(
        &self,
        dir: &DirState,
        d: &[u8],
        on_disk: &str,
        st: &Stat,
    ) -> io::Result<(EntryKind, Identity)> {
        // Put back after a client deleted it (the listing found its valid tombstone): refused
        // like any integrity error, wherever a node is made (LOOKUP, READDIRPLUS). Removing
        // it again needs no node and works.
        if dir.is_resurrected(on_disk) {
            tracing::error!("{}", Vault::resurrected_error(&dir.cd, on_disk));
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        match self.vault.unbind_entry(&dir.cd, d, on_disk, st) {
            Ok(found) => Ok(found),
            // The index keeps a conflict copy under the name it is shown as, whose `D` is not
            // the one its binding is for: that is the `D` of the name it copies, which its own
            // on-disk name carries (with a tool's part that is base64url, the reading whose
            // `D` decrypts). For an entry under its own key the two are the same, so nothing
            // else gets past here.
            Err(e) => match self.vault.copy_d(&dir.cd, on_disk) {
                Ok(own) if own != d => self.vault.unbind_entry(&dir.cd, &own, on_disk, st).map_err(cerr),
                _ => Err(cerr(e)),
            },
        }
    }

    /// The node of entry `on_disk` of `parent` (counts one kernel lookup).
    pub(super) fn node_at(&self, parent: &Arc<Node>, d: &[u8], on_disk: &str, st: &Stat) -> io::Result<Arc<Node>> {
        let dir = parent.dir()?;
        let (kind, identity) = self.identity(dir, d, on_disk, st)?;
        self.nodes.lookup(parent, on_disk, st, kind, identity, || {
            // Every directory this mount uses was checked here first: its IV copy names
            // the IV its entry promises (not one copied from another directory, not a FIFO;
            // with `iv-in-name` one fstatat, F§7.1).
            let cd = self.vault.open_subdir(&dir.cd, on_disk, identity).map_err(cerr)?;
            Ok(Some(DirState::new(cd, self.opts.shared_storage)))
        })
    }

    /// LOOKUP (by `c`, who needs search permission on the parent).
    pub(crate) fn do_lookup(&self, parent: u64, name: &[u8], c: Caller) -> io::Result<(Arc<Node>, Stat)> {
        let parent = self.nodes.get(parent)?;
        let dir = parent.dir()?;
        self.may(c, &parent, crate::perm::EXEC)?;
        let (key, found) = self.find(dir, name)?;
        let on_disk = found.ok_or_else(|| errno(libc::ENOENT))?;
        let st = match self.stat_entry_of(&parent, dir, &on_disk) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // Changed behind our back (shared storage): forget the stale index.
                dir.drop_index();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let node = self.node_at(&parent, &key.d, &on_disk, &st)?;
        let st = self.after_owner_grant(&parent, dir, &on_disk, st);
        Ok((node, st))
    }

    /// A daemon that is not root opens a directory whose mode denies its owner with the
    /// owner's rights granted for a moment (`veilfs_core::sys::with_owner_rwx`), which moves
    /// the change times of that directory and of `parent`: the entry's `st` is taken again and
    /// the kernel drops the parent's attributes.
    pub(super) fn after_owner_grant(&self, parent: &Node, dir: &DirState, on_disk: &str, st: Stat) -> Stat {
        if self.euid == 0 || st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_mode & 0o700 == 0o700 {
            return st;
        }
        self.invalidate_attr(parent.id);
        sys::fstatat(dir.cd.fd(), on_disk.as_bytes()).unwrap_or(st)
    }

    /// The backing `stat` of `node` (through an open handle's fd when given).
    pub(crate) fn do_getattr(&self, node: &Arc<Node>, fh: Option<u64>) -> io::Result<Stat> {
        if let Some(h) = self.handles.file_opt(fh) {
            return sys::fstat(h.crypt.backing().as_fd());
        }
        if let Some(d) = &node.dir {
            return sys::fstat(d.cd.fd());
        }
        if let Some(c) = node.file.as_ref().and_then(|f| f.opened()) {
            return sys::fstat(c.backing().as_fd());
        }
        let found = node.find_link(|l| {
            let dir = l.parent.dir.as_ref()?;
            let st = Self::stat_entry(dir, &l.on_disk).ok()?;
            Some((dir.cd.child_path(&l.on_disk), st))
        });
        // A deleted, closed object stays ESTALE here (answering with its last attributes made
        // stress-ng's inotify IN_DELETE_SELF check time out); only SETATTR uses them.
        let (what, st) = found.ok_or_else(|| errno(libc::ESTALE))?;
        // What is under the name now must still be what the entry promised: a device node
        // replaced by one of another type or number is an integrity error, not new attributes.
        self.vault.check_object(node.kind, &node.identity, &st, &what).map_err(cerr)?;
        Ok(st)
    }
}
