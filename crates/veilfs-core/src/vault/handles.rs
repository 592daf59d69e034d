//! Opening what an entry names: its content (never following a link, the inode checked
//! against the entry's), a handle for its attributes, and its extended attributes (names and
//! values encrypted, leftovers of an interrupted rewrite found and removed).

use super::*;

impl Vault {
    /// Opens the regular file named by `entry` with `flags` (`O_RDONLY`, `O_RDWR`, ...).
    pub fn open_file(&self, parent: &CipherDir, entry: &Entry, flags: libc::c_int) -> Result<CryptFile> {
        let what = parent.child_path(&entry.on_disk);
        if entry.kind != EntryKind::File {
            return Err(Error::io(what, std::io::Error::from_raw_os_error(libc::EISDIR)));
        }
        // Writes need to read too (read-modify-write of partial blocks).
        let flags =
            if flags & libc::O_ACCMODE == libc::O_WRONLY { (flags & !libc::O_ACCMODE) | libc::O_RDWR } else { flags };
        let flags = flags & !(libc::O_APPEND | libc::O_TRUNC | libc::O_CREAT);
        let fd = Self::open_content(parent, &entry.on_disk, flags, entry.stat.st_ino)?;
        self.open_crypt(parent, &entry.on_disk, entry.identity, sys::into_file(fd))
    }

    /// The content layer over `file`, the backing file `on_disk` of `dir` whose entry promises
    /// `identity`: every front end opens a file's content this way. A header older than this
    /// client remembers (`crate::known`) is a rollback ([`Error::Rollback`]) — unless another
    /// version of the same file that the directory shows (a sync tool's conflict copy, the
    /// entry it copies, or such a copy renamed) is at least as new as the client remembers: then two
    /// clients changed the file at once and the sync tool kept both versions under two
    /// names (a conflict, never an alarm; both are shown; docs/SECURITY.md §4.2a). Such an
    /// older version is read without being checked, and the handle remembers nothing.
    pub fn open_crypt(
        &self,
        dir: &CipherDir,
        on_disk: &str,
        identity: Identity,
        file: std::fs::File,
    ) -> Result<CryptFile> {
        let mut ctx = self.ctx.clone();
        ctx.defer_known = true;
        let mut f = CryptFile::open(file, ctx, identity, dir.child_path(on_disk))?;
        match f.check_known() {
            Err(Error::Rollback { what, detail }) => {
                let floor = self.ctx.known.as_ref().map_or(0, |k| k.floor(&identity));
                if self.newest_other_version(dir, on_disk, identity).is_some_and(|g| g >= floor) {
                    f.forget_known();
                    return Ok(f);
                }
                Err(Error::Rollback { what, detail })
            }
            r => r.map(|()| f),
        }
    }

    /// The highest generation among the other versions of file `identity` that `dir` shows
    /// besides `on_disk`: its conflict copies, the entry they copy, and a copy renamed into an
    /// ordinary entry (it keeps the file ID). Only on the rollback path (it lists and decrypts
    /// the directory).
    fn newest_other_version(&self, dir: &CipherDir, on_disk: &str, identity: Identity) -> Option<u64> {
        let (entries, _) = self.list(dir).ok()?;
        let mut ctx = self.ctx.clone();
        ctx.known = None;
        entries
            .iter()
            .filter(|e| e.identity == identity && e.kind == EntryKind::File && e.on_disk != on_disk)
            .filter_map(|e| {
                let fd = Self::open_content(dir, &e.on_disk, libc::O_RDONLY, e.stat.st_ino).ok()?;
                CryptFile::open(sys::into_file(fd), ctx.clone(), identity, String::new()).ok()?.generation()
            })
            .max()
    }

    /// Opens the regular file of `entry` read-only for [`CryptFile::salvage`] alone (see
    /// [`CryptFile::open_for_salvage`]): a file whose block map does not verify still opens.
    pub fn open_for_salvage(&self, parent: &CipherDir, entry: &Entry) -> Result<CryptFile> {
        let what = parent.child_path(&entry.on_disk);
        if entry.kind != EntryKind::File {
            return Err(Error::io(what, std::io::Error::from_raw_os_error(libc::EISDIR)));
        }
        let fd = Self::open_content(parent, &entry.on_disk, libc::O_RDONLY, entry.stat.st_ino)?;
        CryptFile::open_for_salvage(sys::into_file(fd), self.ctx.clone(), entry.identity, what)
    }

    /// Opens the content of the regular file `on_disk` in `dir` with `flags`: never through a
    /// symlink, never blocking on a planted FIFO, and only if it is a regular file and (when
    /// `ino` is given) still the inode that was looked up. Anything else is an integrity error
    /// naming the ciphertext file: something was put where the entry's file belongs.
    ///
    /// A mode that denies the owner (a file of mode 0444 opened for writing by a writer that
    /// opened it before the chmod, 0200 opened for reading: the mount opens every file for
    /// reading and writing, since writes read partial blocks), or a directory that denies its
    /// owner search, is no reason to fail: the owner's rights are granted on both for the
    /// moment of the open (`owner_access`, docs/SECURITY.md §7a). The plaintext modes are the
    /// backing modes, and the kernel checked them before it asked.
    pub fn open_content(dir: &CipherDir, on_disk: &str, flags: libc::c_int, ino: u64) -> Result<OwnedFd> {
        owner_access(dir, on_disk, || Self::open_content_once(dir, on_disk, flags, ino))
    }

    /// One attempt of [`open_content`](Self::open_content), without granting anything.
    fn open_content_once(dir: &CipherDir, on_disk: &str, flags: libc::c_int, ino: u64) -> Result<OwnedFd> {
        match sys::open_regular_at(dir.fd(), on_disk.as_bytes(), flags) {
            Ok((fd, st)) if ino == 0 || st.st_ino == ino => Ok(fd),
            Ok(_) => Err(Error::auth(dir.child_path(on_disk), "was replaced by another file while in use")),
            Err(Ok(mode)) => Err(Error::auth(
                dir.child_path(on_disk),
                format!("is {} where its entry names a regular file", sys::type_name(mode)),
            )),
            Err(Err(e)) => Err(Error::io(dir.child_path(on_disk), e)),
        }
    }

    /// The backing `stat` of the object `on_disk` in `dir` (never following a link), also in a
    /// directory whose mode denies its owner search: the kernel reaches such an object through
    /// another hard link or an open fd, where the daemon has only names (see `in_dir`).
    pub fn stat_entry(dir: &CipherDir, on_disk: &[u8]) -> Result<Stat> {
        in_dir(dir, || sys::fstatat(dir.fd(), on_disk).ctx(|| dir.child_path(&String::from_utf8_lossy(on_disk))))
    }

    /// A verified `O_PATH` handle on the object of `entry` in `dir`: of the entry's kind and
    /// the inode the entry was listed with. Attribute changes act on this handle, so a link
    /// planted under the entry's name is never followed (docs/SECURITY.md §8).
    pub fn entry_handle(dir: &CipherDir, on_disk: &str, kind: EntryKind, ino: u64) -> Result<(OwnedFd, Stat)> {
        let what = || dir.child_path(on_disk);
        let (fd, st) = in_dir(dir, || sys::open_path_at(dir.fd(), on_disk.as_bytes()).ctx(what))?;
        if EntryKind::from_mode(st.st_mode) != kind {
            return Err(Error::auth(
                what(),
                format!("is {} where its entry names another kind", sys::type_name(st.st_mode)),
            ));
        }
        if ino != 0 && st.st_ino != ino {
            return Err(Error::auth(what(), "was replaced by another object while in use"));
        }
        Ok((fd, st))
    }

    /// Sets mode (not for symlinks), owner (`u32::MAX` keeps one) and times of `entry` in
    /// `dir` through a verified handle (see [`entry_handle`](Self::entry_handle)).
    pub fn set_attrs(
        &self,
        dir: &CipherDir,
        entry: &Entry,
        mode: Option<u32>,
        owner: Option<(u32, u32)>,
        times: Option<&[libc::timespec; 2]>,
    ) -> Result<()> {
        let what = || dir.child_path(&entry.on_disk);
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        if let Some((uid, gid)) = owner {
            sys::chown_fd(fd.as_fd(), uid, gid).ctx(what)?;
        }
        if let Some(m) = mode.filter(|_| entry.kind != EntryKind::Symlink) {
            sys::chmod_fd(fd.as_fd(), m & 0o7777).ctx(what)?;
        }
        if let Some(t) = times {
            sys::utimens_fd(fd.as_fd(), t).ctx(what)?;
        }
        Ok(())
    }

    /// The attribute cipher of this vault (with continuations if it has feature `overflow`).
    pub fn xattr_cipher(&self) -> crate::xattr::XattrCipher {
        crate::xattr::XattrCipher::new(&self.ctx.keys, self.ctx.cipher).with_overflow(self.config.has_overflow())
    }

    /// The plaintext `user.*` attributes of `entry` (none for a symlink), read through a
    /// verified handle. An attribute that fails authentication is an integrity error.
    pub fn xattrs(&self, dir: &CipherDir, entry: &Entry) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if entry.kind == EntryKind::Symlink {
            return Ok(Vec::new());
        }
        let what = || dir.child_path(&entry.on_disk);
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        let t = sys::XattrTarget::Handle(fd.as_fd());
        self.xattr_cipher().all(t, &entry.identity).map_err(|e| relabel_io(relabel(e, &what()), &what()))
    }

    /// Sets the plaintext `user.*` attribute `name` of `entry` (not a symlink) through a
    /// verified handle.
    pub fn set_xattr(&self, dir: &CipherDir, entry: &Entry, name: &[u8], value: &[u8]) -> Result<()> {
        let what = || dir.child_path(&entry.on_disk);
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        let t = sys::XattrTarget::Handle(fd.as_fd());
        self.xattr_cipher().set(t, &entry.identity, name, value, 0).map_err(|e| relabel_io(e, &what()))
    }

    /// Attribute continuations of `entry` that no value uses (crash leftovers, F§16.1).
    pub fn xattr_leftovers(&self, dir: &CipherDir, entry: &Entry) -> Result<Vec<String>> {
        if entry.kind == EntryKind::Symlink || !self.config.has_overflow() {
            return Ok(Vec::new());
        }
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        self.xattr_cipher()
            .unused_continuations(sys::XattrTarget::Handle(fd.as_fd()))
            .map_err(|e| relabel_io(e, &dir.child_path(&entry.on_disk)))
    }

    /// Removes the unused attribute continuation `name` of `entry` (see
    /// [`xattr_leftovers`](Self::xattr_leftovers)).
    pub fn remove_xattr_leftover(&self, dir: &CipherDir, entry: &Entry, name: &str) -> Result<()> {
        let what = || dir.child_path(&entry.on_disk);
        let (fd, _) = Self::entry_handle(dir, &entry.on_disk, entry.kind, entry.stat.st_ino)?;
        sys::XattrTarget::Handle(fd.as_fd()).remove(name.as_bytes()).ctx(what)
    }
}
