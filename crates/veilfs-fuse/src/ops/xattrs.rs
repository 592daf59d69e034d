//! Extended attributes: GETXATTR, SETXATTR, LISTXATTR, REMOVEXATTR, encrypted and bound to
//! the object; core `XattrCipher` does every on-disk step (continuations included), on the
//! object's fd or a verified handle chosen here.

use super::*;

impl VeilFs {
    /// Runs an xattr call on `node`: directories and open files through their fd, anything
    /// else through a verified handle on the object its name holds now (a symlink itself
    /// through a path whose last component is not followed). With `caller`, acting as it
    /// ([`acting`](Self::acting)) on that last path.
    pub(super) fn with_xattr<T>(
        &self,
        node: &Node,
        caller: Option<Caller>,
        f: impl FnOnce(sys::XattrTarget<'_>) -> io::Result<T>,
    ) -> io::Result<T> {
        if let Some(d) = &node.dir {
            return f(sys::XattrTarget::Fd(d.cd.fd()));
        }
        if let Some(c) = self.open_crypt(node) {
            return f(sys::XattrTarget::Fd(c.backing().as_fd()));
        }
        let l = node.link()?;
        let handle = self.handle(node, &l)?;
        let _as = match caller {
            Some(c) => self.acting(c)?,
            None => None,
        };
        if node.kind == EntryKind::Symlink {
            let path = sys::proc_path(l.parent.dir()?.cd.fd(), Some(l.on_disk.as_bytes()))?;
            return f(sys::XattrTarget::NoFollow(&path));
        }
        f(sys::XattrTarget::Handle(handle.as_fd()))
    }

    /// The xattr rules of `perm::check_xattr` for `c` on `node` (a mount that makes them).
    fn may_xattr(&self, node: &Arc<Node>, name: &[u8], write: bool, c: Caller) -> io::Result<()> {
        match self.who(c) {
            Some(who) => crate::perm::check_xattr(&who, &self.perm_stat(node)?, name, write),
            None => Ok(()),
        }
    }

    /// GETXATTR: the plaintext value (read permission).
    ///
    /// A vault stores `user.` attributes only (SETXATTR of any other is EOPNOTSUPP), so a
    /// name outside that namespace is EOPNOTSUPP at once, without a look at the backing
    /// store: `ls -l` asks for `security.selinux` and `system.posix_acl_access` of every file
    /// it lists, and gives up on a filesystem that does not support them (GNU ls, cp and
    /// other gnulib users remember that per device). With ENODATA a warm `ls -lR` of a
    /// 38k-file tree cost 76k round trips to the daemon, more than everything else together.
    pub(crate) fn do_getxattr(&self, ino: u64, name: &[u8], c: Caller) -> io::Result<Vec<u8>> {
        if !name.starts_with(veilfs_core::xattr::USER_PREFIX) {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let node = self.nodes.get(ino)?;
        self.may_xattr(&node, name, false, c)?;
        let what = || self.cipher_path(&node);
        self.with_xattr(&node, None, |t| self.xattr.get(t, &node.identity, name).map_err(|e| xerr(e, what)))
    }

    /// SETXATTR (write permission).
    pub(crate) fn do_setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32, c: Caller) -> io::Result<()> {
        self.check_writable()?;
        let node = self.nodes.get(ino)?;
        self.may_xattr(&node, name, true, c)?;
        let what = || self.cipher_path(&node);
        self.with_xattr(&node, Some(c), |t| {
            self.xattr.set(t, &node.identity, name, value, flags).map_err(|e| xerr(e, what))
        })
    }

    /// LISTXATTR: NUL-separated plaintext names.
    pub(crate) fn do_listxattr(&self, ino: u64) -> io::Result<Vec<u8>> {
        let node = self.nodes.get(ino)?;
        let (names, bad) = self.with_xattr(&node, None, |t| self.xattr.list(t, &node.identity).map_err(cerr))?;
        for e in bad {
            tracing::error!("integrity error in an xattr of {}: {e}", self.cipher_path(&node));
        }
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    /// REMOVEXATTR (write permission).
    pub(crate) fn do_removexattr(&self, ino: u64, name: &[u8], c: Caller) -> io::Result<()> {
        self.check_writable()?;
        let node = self.nodes.get(ino)?;
        self.may_xattr(&node, name, true, c)?;
        let what = || self.cipher_path(&node);
        self.with_xattr(&node, Some(c), |t| self.xattr.remove(t, &node.identity, name).map_err(|e| xerr(e, what)))
    }
}

/// The errno of an attribute error; an integrity error is logged naming the ciphertext object.
fn xerr(e: veilfs_core::Error, what: impl FnOnce() -> String) -> io::Error {
    match e {
        veilfs_core::Error::Auth { what: w, detail } => cerr(veilfs_core::Error::auth(what(), format!("{w} {detail}"))),
        e => cerr(e),
    }
}
