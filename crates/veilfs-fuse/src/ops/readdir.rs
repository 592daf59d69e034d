//! OPENDIR and READDIR(PLUS): a snapshot of the directory index, names decrypted once.

use super::*;
use veilfs_core::sys::Stat;

impl VeilFs {
    /// OPENDIR (by `c`, who needs read permission). Only a mount on shared storage keeps
    /// directory handles: elsewhere the answer to an OPENDIR the caller may make is ENOSYS,
    /// after which the kernel opens directories itself for the rest of the mount (no OPENDIR
    /// or RELEASEDIR round trips; its listing cache is kept, as `FOPEN_CACHE_DIR` with
    /// `FOPEN_KEEP_CACHE` asked before) and READDIR comes with no handle ([`Self::listing`]).
    pub(crate) fn do_opendir(&self, ino: u64, c: Caller) -> io::Result<u64> {
        let node = self.nodes.get(ino)?;
        node.dir()?;
        self.may(c, &node, crate::perm::READ)?;
        if !self.opts.shared_storage {
            return Err(errno(libc::ENOSYS));
        }
        Ok(self.handles.add_dir(node))
    }

    /// The listing a READDIR at `offset` of directory `ino` is served from, sorted by
    /// cookie, and where to start in it: the first entry whose cookie is above `offset`
    /// (0, 1: `.` and `..` first; 2: every entry).
    ///
    /// With a handle (`fh` ≠ 0, shared storage) it is the handle's snapshot, taken at its
    /// first READDIR. Without one, a listing starts at offset 0, where `c` needs read
    /// permission (the check OPENDIR made) and a fresh snapshot replaces the directory's
    /// last; later offsets continue in the newest snapshot of the directory, whichever
    /// listing took it, and the call that finds nothing left drops it. Offsets are cookies of
    /// the plaintext names (keyed per mount), not positions, so a listing resumed in a newer
    /// snapshot returns every entry that was there throughout exactly once; whether one added
    /// or removed meanwhile shows is open, as POSIX leaves it.
    pub(crate) fn listing(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        c: Caller,
    ) -> io::Result<(Arc<Node>, Arc<Vec<SnapEntry>>, usize)> {
        let start = |entries: &[SnapEntry]| {
            if offset <= 2 {
                0
            } else {
                entries.partition_point(|e| e.cookie <= offset)
            }
        };
        if fh != 0 {
            let h = self.handles.dir(fh)?;
            let mut g = h.entries.lock();
            let s = match g.as_ref() {
                Some(s) => s.clone(),
                None => {
                    let s = self.snapshot(&h.node)?;
                    *g = Some(s.clone());
                    s
                }
            };
            let from = start(&s);
            return Ok((h.node.clone(), s, from));
        }
        let node = self.nodes.get(ino)?;
        let dir = node.dir()?;
        let kept = if offset == 0 {
            self.may(c, &node, crate::perm::READ)?;
            None
        } else {
            dir.listing.lock().clone()
        };
        let s = match kept {
            Some(s) => s,
            None => {
                let s = self.snapshot(&node)?;
                *dir.listing.lock() = Some(s.clone());
                s
            }
        };
        let from = start(&s);
        if offset >= 2 && from == s.len() {
            dir.listing.lock().take();
        }
        Ok((node, s, from))
    }

    /// The entries of directory `node` now, names decrypted, sorted by cookie.
    fn snapshot(&self, node: &Node) -> io::Result<Arc<Vec<SnapEntry>>> {
        let dir = node.dir()?;
        if self.opts.shared_storage {
            dir.rebuild(&self.vault)?;
        }
        let idx = dir.index(&self.vault, false)?;
        let mut out = Vec::with_capacity(idx.as_ref().map_or(0, |i| i.len()));
        for e in idx.as_ref().expect("built").values() {
            let plain = self.decoded(dir, e);
            if let Some(p) = plain {
                let on_disk = if e.others.is_empty() {
                    e.on_disk.clone()
                } else {
                    self.resolve(dir, &p.d, e.on_disk.clone(), e.others.clone())?
                };
                let cookie = self.cookie(&p.name);
                out.push(SnapEntry { name: p.name.clone(), on_disk, d: p.d.clone(), d_type: e.d_type, cookie });
            }
        }
        out.sort_unstable_by_key(|e| e.cookie);
        Ok(Arc::new(out))
    }

    /// A READDIR offset for the entry named `name`: a hash keyed per mount (so names that
    /// collide cannot be planted), in 3..2^63 (0–2 are the start, `.` and `..`; the kernel's
    /// offsets are signed).
    fn cookie(&self, name: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        3 + self.cookie_keys.hash_one(name) % ((1 << 63) - 3)
    }

    /// The plaintext name and `D` of index entry `e` of `dir`, decrypted on first use and kept
    /// in the entry (`None`: undecryptable, logged once with the ciphertext name).
    pub(crate) fn decoded<'e>(&self, dir: &DirState, e: &'e IndexEntry) -> Option<&'e Decoded> {
        e.plain
            .get_or_init(|| match self.decode_d(dir, &e.on_disk) {
                Ok(d) => match self.names.decrypt_name(&dir.cd.iv, &d) {
                    Ok(name) => Some(Decoded { name, d }),
                    Err(err) => {
                        tracing::error!("integrity error in {}: {err}", dir.cd.child_path(&e.on_disk));
                        None
                    }
                },
                Err(err) => {
                    tracing::error!("{err}");
                    None
                }
            })
            .as_ref()
    }

    /// `D` of an on-disk entry (reading the side file of a long name).
    pub(crate) fn decode_d(&self, dir: &DirState, on_disk: &str) -> veilfs_core::Result<Vec<u8>> {
        self.vault.entry_d(&dir.cd, on_disk)
    }

    /// The inode number of a READDIR entry: the node id its LOOKUP gives (kept for its
    /// backing inode, see [`NodeTable::id_for`](crate::inodes::NodeTable::id_for)), so
    /// `d_ino` is `st_ino` as on a local filesystem. Costs one `fstatat` and the check of
    /// the entry's binding (which READDIRPLUS does as well).
    pub(crate) fn entry_ino(&self, parent: &Node, e: &SnapEntry) -> io::Result<u64> {
        let dir = parent.dir()?;
        let st = self.stat_entry_of(parent, dir, &e.on_disk)?;
        let (_, identity) = self.identity(dir, &e.d, &e.on_disk, &st)?;
        Ok(self.nodes.id_for(st.st_ino, identity))
    }

    /// One READDIRPLUS entry: its node (one lookup counted) and backing stat.
    pub(crate) fn plus_entry(&self, parent: &Arc<Node>, e: &SnapEntry) -> io::Result<(Arc<Node>, Stat)> {
        let dir = parent.dir()?;
        let st = self.stat_entry_of(parent, dir, &e.on_disk)?;
        let node = self.node_at(parent, &e.d, &e.on_disk, &st)?;
        Ok((node, self.after_owner_grant(parent, dir, &e.on_disk, st)))
    }
}
