//! RENAME with replace, NOREPLACE and EXCHANGE; the on-disk steps are the core engine's
//! `rename_at`/`exchange_at` (and `rename_fresh_at` for a version of a file that leaves its
//! directory), this file keeps the index and node table current.

use super::*;
use crate::perm::{self, Who};
use veilfs_core::sys::Stat;

impl VeilFs {
    /// RENAME (flags: RENAME_NOREPLACE, RENAME_EXCHANGE) by `c`: see [`check_rename`](Self::check_rename).
    pub(crate) fn do_rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        c: Caller,
    ) -> io::Result<()> {
        self.check_writable()?;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(errno(libc::EINVAL));
        }
        let (from, to) = (self.nodes.get(parent)?, self.nodes.get(newparent)?);
        let (fd_, td) = (from.dir()?, to.dir()?);
        let (fcheck, tcheck) = (self.may(c, &from, perm::EXEC)?, self.may(c, &to, perm::EXEC)?);
        // Lock both directories, in node-id order so two renames cannot deadlock.
        let (_g1, _g2) = if from.id == to.id {
            (fd_.ops.lock(), None)
        } else if from.id < to.id {
            let a = fd_.ops.lock();
            (a, Some(td.ops.lock()))
        } else {
            let b = td.ops.lock();
            (fd_.ops.lock(), Some(b))
        };
        let (skey, sfound) = self.find(fd_, name)?;
        let s_on = sfound.ok_or_else(|| errno(libc::ENOENT))?;
        let sst = Self::stat_entry(fd_, &s_on)?;
        let (skind, sid) = self.identity(fd_, &skey.d, &s_on, &sst)?;
        let (dkey, dfound) = self.find(td, newname)?;
        let dst = match &dfound {
            Some(on) => {
                let st = Self::stat_entry(td, on)?;
                let (k, id) = self.identity(td, &dkey.d, on, &st)?;
                Some((on.clone(), st, k, id))
            }
            None => None,
        };
        if let (Some(f), Some(t)) = (&fcheck, &tcheck) {
            let moved = from.id != to.id;
            Self::check_rename(f, t, &sst, dst.as_ref().map(|d| &d.1), moved, flags & libc::RENAME_EXCHANGE != 0)?;
        }
        if flags & libc::RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(errno(libc::EEXIST));
        }
        if from.id == to.id && skey.key == dkey.key {
            return Ok(()); // rename onto itself
        }
        // Moving a directory into itself or below it.
        if skind == EntryKind::Dir && self.is_ancestor_or_self(&to, &sst) {
            return Err(errno(libc::EINVAL));
        }
        let src = Entry {
            name: name.to_vec(),
            on_disk: s_on.clone(),
            key: skey.clone(),
            kind: skind,
            identity: sid,
            stat: sst,
        };
        let dst = dst.map(|(on_disk, stat, kind, identity)| Entry {
            name: newname.to_vec(),
            on_disk,
            key: dkey.clone(),
            kind,
            identity,
            stat,
        });
        if flags & libc::RENAME_EXCHANGE != 0 {
            let dst = dst.ok_or_else(|| errno(libc::ENOENT))?;
            if dst.kind == EntryKind::Dir && self.is_ancestor_or_self(&from, &dst.stat) {
                return Err(errno(libc::EINVAL));
            }
            let (new_s, new_d) = self.vault.exchange_at(&fd_.cd, &src, &td.cd, &dst).map_err(cerr)?;
            fd_.update(|i| {
                let plain = Decoded { name: name.to_vec(), d: skey.d.clone() };
                i.insert(skey.key.clone(), IndexEntry::new(new_d.clone(), dtype(dst.kind), Some(plain)));
            });
            td.update(|i| {
                let plain = Decoded { name: newname.to_vec(), d: dkey.d.clone() };
                i.insert(dkey.key.clone(), IndexEntry::new(new_s.clone(), dtype(skind), Some(plain)));
            });
            self.relink(sst.st_ino, from.id, &s_on, &to, &new_s);
            self.relink(dst.stat.st_ino, to.id, &dst.on_disk, &from, &new_d);
            if from.id != to.id {
                fd_.versions_changed();
                td.versions_changed();
            }
            return Ok(());
        }
        if let Some(d) = &dst {
            if (d.stat.st_dev, d.stat.st_ino) == (sst.st_dev, sst.st_ino) {
                return Ok(()); // two links of one file: POSIX says do nothing
            }
        }
        // A version of a file leaving its directory becomes a file of its own (a copy under a
        // fresh file ID, veilfs_core's `rename_fresh_at`): a new backing inode.
        let fresh = from.id != to.id
            && self.vault.fresh_id_candidate(&fd_.cd, &src, &td.cd)
            && (Vault::is_conflict_copy(&src) || fd_.versions(&self.vault, |v| v.has_other(&src))?);
        let new_on = if fresh {
            self.vault.rename_fresh_at(&fd_.cd, &src, &td.cd, &dkey, dst.as_ref()).map_err(cerr)?.0
        } else {
            self.vault.rename_at(&fd_.cd, &src, &td.cd, &dkey, dst.as_ref()).map_err(cerr)?
        };
        if let Some(d) = &dst {
            self.after_unlink(to.id, &d.on_disk, &d.stat);
        }
        let plain = Some(Decoded { name: newname.to_vec(), d: dkey.d.clone() });
        if from.id == to.id {
            fd_.update(|i| {
                i.remove(&skey.key);
                i.insert(dkey.key.clone(), IndexEntry::new(new_on.clone(), dtype(skind), plain));
            });
        } else {
            fd_.update(|i| {
                i.remove(&skey.key);
            });
            td.update(|i| {
                i.insert(dkey.key.clone(), IndexEntry::new(new_on.clone(), dtype(skind), plain));
            });
        }
        if fresh {
            self.after_fresh_move(from.id, &s_on, &sst, to.id, newname);
        } else {
            self.relink(sst.st_ino, from.id, &s_on, &to, &new_on);
            if from.id != to.id && skind == EntryKind::File {
                fd_.version_gone(sst.st_ino, sst.st_nlink);
                td.versions_changed();
            }
        }
        Ok(())
    }

    /// After `from/s_on` (backing `sst`) was moved as a copy with a fresh file ID to
    /// `newname` of `to`: the old object is gone, as after an unlink (a handle still open on it
    /// keeps reading and writing the old version, as after a `mv` across file systems), and
    /// the kernel, which moved its inode to the new name, is told to drop that name, so that
    /// the next access looks it up and finds the new file. From another thread: the kernel
    /// takes the directory's lock for that, which this rename holds until it is answered.
    /// Until then the old node answers ESTALE (unless a handle holds it open), on which the
    /// kernel looks the name up again.
    fn after_fresh_move(&self, from: u64, s_on: &str, sst: &Stat, to: u64, newname: &[u8]) {
        self.after_unlink(from, s_on, sst);
        let Some(n) = self.notifier.get().cloned() else { return };
        let name = newname.to_vec();
        std::thread::spawn(move || {
            if let Err(e) = n.inval_entry(fuser::INodeNo(to), std::os::unix::ffi::OsStrExt::from_bytes(&name[..])) {
                tracing::debug!("node {to}: entry invalidation after a move with a fresh file ID: {e}");
            }
        });
    }

    /// Linux's rename checks (`may_delete`, `may_create`, `vfs_rename`), given both parents'
    /// checked attributes (`from`, `to`: search permission passed), the source's and the
    /// target's: write on both parents, the sticky-bit rule for both entries, and write on a
    /// directory that changes parent (its `..` changes), as on the target in an exchange.
    fn check_rename(
        (who, from): &(Who, Stat),
        (_, to): &(Who, Stat),
        src: &Stat,
        dst: Option<&Stat>,
        moved: bool,
        exchange: bool,
    ) -> io::Result<()> {
        perm::check(who, from, perm::WRITE)?;
        perm::check_sticky(who, from, src)?;
        perm::check(who, to, perm::WRITE)?;
        if let Some(d) = dst {
            perm::check_sticky(who, to, d)?;
        }
        let is_dir = |st: &Stat| st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if moved && is_dir(src) {
            perm::check(who, src, perm::WRITE)?;
        }
        match dst {
            Some(d) if moved && exchange && is_dir(d) => perm::check(who, d, perm::WRITE),
            _ => Ok(()),
        }
    }

    pub(super) fn relink(&self, backing_ino: u64, from: u64, old: &str, to: &Arc<Node>, new: &str) {
        if let Some(id) = self.nodes.id_of(backing_ino) {
            if let Ok(n) = self.nodes.get(id) {
                n.move_link(from, old, to, new);
            }
        }
    }

    /// True when the directory with backing stat `st` is `node` or one of its ancestors.
    pub(super) fn is_ancestor_or_self(&self, node: &Arc<Node>, st: &Stat) -> bool {
        let mut cur = node.clone();
        loop {
            if cur.backing_ino == st.st_ino {
                return true;
            }
            match cur.link() {
                Ok(l) => cur = l.parent,
                Err(_) => return false,
            }
        }
    }
}
