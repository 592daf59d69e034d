//! Extended attributes: GETXATTR, SETXATTR, LISTXATTR, REMOVEXATTR, encrypted and bound to
//! the object (core `XattrCipher`), through the object's fd or a verified handle.

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

    /// GETXATTR: the plaintext value.
    pub(crate) fn do_getxattr(&self, ino: u64, name: &[u8]) -> io::Result<Vec<u8>> {
        let node = self.nodes.get(ino)?;
        let Ok(stored) = self.xattr.encrypt_name(&node.identity, name) else {
            return Err(errno(libc::ENODATA));
        };
        let cap = 65536 + self.xattr.value_overhead();
        let buf = self.with_xattr(&node, None, |t| {
            let mut b = vec![0u8; cap];
            let n = t.get(stored.as_bytes(), &mut b)?;
            b.truncate(n);
            Ok(b)
        })?;
        self.xattr.decrypt_value(&node.identity, &stored, &buf).map_err(cerr)
    }

    /// SETXATTR.
    pub(crate) fn do_setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32, c: Caller) -> io::Result<()> {
        self.check_writable()?;
        let node = self.nodes.get(ino)?;
        let stored = self.xattr.encrypt_name(&node.identity, name).map_err(cerr)?;
        let blob = self.xattr.encrypt_value(&node.identity, &stored, value);
        // Stored names are longer than plaintext ones: refuse a new attribute whose name
        // would push the list past the kernel's 64 KiB listxattr limit, instead of letting
        // every later listxattr fail.
        const XATTR_LIST_MAX: usize = 65536;
        self.with_xattr(&node, Some(c), |t| {
            if t.list(&mut [])? + stored.len() + 1 > XATTR_LIST_MAX && t.get(stored.as_bytes(), &mut []).is_err() {
                return Err(errno(libc::ENOSPC));
            }
            t.set(stored.as_bytes(), &blob, flags)?;
            veilfs_core::crash::at("vault.xattr");
            Ok(())
        })
    }

    /// LISTXATTR: NUL-separated plaintext names.
    pub(crate) fn do_listxattr(&self, ino: u64) -> io::Result<Vec<u8>> {
        let node = self.nodes.get(ino)?;
        let raw = self.with_xattr(&node, None, |t| t.list_all())?;
        let mut out = Vec::new();
        for stored in raw.split(|&b| b == 0).filter(|s| !s.is_empty()) {
            match self.xattr.decrypt_name(&node.identity, stored) {
                Some(Ok(plain)) => {
                    out.extend_from_slice(&plain);
                    out.push(0);
                }
                Some(Err(e)) => tracing::error!("integrity error in an xattr of {}: {e}", self.cipher_path(&node)),
                None => {}
            }
        }
        Ok(out)
    }

    /// REMOVEXATTR.
    pub(crate) fn do_removexattr(&self, ino: u64, name: &[u8], c: Caller) -> io::Result<()> {
        self.check_writable()?;
        let node = self.nodes.get(ino)?;
        let stored = self.xattr.encrypt_name(&node.identity, name).map_err(|_| errno(libc::ENODATA))?;
        self.with_xattr(&node, Some(c), |t| t.remove(stored.as_bytes()))
    }
}
