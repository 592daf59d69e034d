//! OPENDIR and READDIR(PLUS): a snapshot of the directory index, names decrypted once.

use super::*;
use veilfs_core::sys::Stat;

impl VeilFs {
    /// OPENDIR (by `c`, who needs read permission).
    pub(crate) fn do_opendir(&self, ino: u64, c: Caller) -> io::Result<u64> {
        let node = self.nodes.get(ino)?;
        node.dir()?;
        self.may(c, &node, crate::perm::READ)?;
        Ok(self.handles.add_dir(node))
    }

    /// The listing of an open directory (taken at the first READDIR).
    pub(crate) fn snapshot(&self, fh: u64) -> io::Result<(Arc<Node>, Arc<Vec<SnapEntry>>)> {
        let h = self.handles.dir(fh)?;
        let mut g = h.entries.lock();
        if let Some(s) = g.as_ref() {
            return Ok((h.node.clone(), s.clone()));
        }
        let dir = h.node.dir()?;
        if self.opts.shared_storage {
            dir.rebuild()?;
        }
        let idx = dir.index(false)?;
        let mut out = Vec::with_capacity(idx.as_ref().map_or(0, |i| i.len()));
        for e in idx.as_ref().expect("built").values() {
            let plain = self.decoded(dir, e);
            if let Some(p) = plain {
                let on_disk = if e.others.is_empty() {
                    e.on_disk.clone()
                } else {
                    self.resolve(dir, &p.d, e.on_disk.clone(), e.others.clone())?
                };
                out.push(SnapEntry { name: p.name.clone(), on_disk, d: p.d.clone(), d_type: e.d_type });
            }
        }
        let s = Arc::new(out);
        *g = Some(s.clone());
        Ok((h.node.clone(), s))
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
