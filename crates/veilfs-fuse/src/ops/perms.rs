//! Where the ops apply the permission rules of `perm.rs` (a mount without
//! `default_permissions`, see there): the requester, the attributes a check reads, and the
//! ACCESS request. Each op calls these at the point Linux checks (search before a name is
//! resolved, write on the parent before an entry changes, …).

use super::*;
use crate::perm::{self, Who};

impl VeilFs {
    /// The requester of a request by `c`, when this mount checks permissions itself; `None`
    /// when the kernel does (`--allow-other`, `default_permissions`).
    pub(crate) fn who(&self, c: Caller) -> Option<Who> {
        self.opts.check_permissions.then(|| Who::new(c.uid, c.gid, c.pid))
    }

    /// The attributes a permission check of `node` reads: a directory's mode and owner
    /// ([`DirState::perm_stat`](crate::dirs::DirState::perm_stat): kept on a locked mount),
    /// any other object's as GETATTR finds them, a deleted one's as last seen.
    pub(super) fn perm_stat(&self, node: &Arc<Node>) -> io::Result<Stat> {
        if let Some(d) = &node.dir {
            return d.perm_stat();
        }
        match self.do_getattr(node, None) {
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) => node.gone_stat(|_| {}).ok_or(e),
            r => r,
        }
    }

    /// `mask` (of `perm::READ`, `WRITE`, `EXEC`) on `node` for `c`; returns the attributes
    /// read (`None` when the kernel checks).
    pub(crate) fn may(&self, c: Caller, node: &Arc<Node>, mask: u32) -> io::Result<Option<(Who, Stat)>> {
        let Some(who) = self.who(c) else { return Ok(None) };
        let st = self.perm_stat(node)?;
        perm::check(&who, &st, mask)?;
        Ok(Some((who, st)))
    }

    /// ACCESS (`access(2)`, `chdir(2)`): only sent without `default_permissions`. `mask` 0
    /// (`F_OK`) asks whether the object exists.
    pub(crate) fn do_access(&self, ino: u64, mask: u32, c: Caller) -> io::Result<()> {
        let node = self.nodes.get(ino)?;
        let mask = mask & (perm::READ | perm::WRITE | perm::EXEC);
        match self.who(c) {
            Some(who) => perm::check(&who, &self.perm_stat(&node)?, mask),
            None => Ok(()),
        }
    }
}
