//! A plaintext tree outside the vault, walked by directory fds: the source of `veilfs import`
//! and the destination of `veilfs export` (and `export --salvage`).
//!
//! Run as root over a tree another user can write to, a path is a promise nobody keeps:
//! between a check and an act by path, that user can swap any directory or file of hers for a
//! symlink (to `/etc`, to root's files) or a FIFO. So only the top the caller names is opened
//! by path (following links there is the caller's own choice, as with `cp`); every name below
//! it is opened relative to a held directory fd with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, never following a link. What is read about an object (type, owner,
//! mode, times, size, link count, attributes, content) comes from the one object opened, by
//! `fstat` and reads of that fd; owner, mode, times and attributes are set on fds of objects
//! the command made itself (`O_CREAT | O_EXCL`, or checked by type right after `mknod`,
//! `symlink`) or opened without following; temporary files are made, renamed and removed
//! inside a directory fd the command holds. A swap then only changes which of the user's own
//! objects inside the tree are acted on, never reaches outside it (docs/SECURITY.md, "The
//! plaintext side of import and export").

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::sys::{self, Stat, XattrTarget};

/// The type bits of a `st_mode`.
pub fn kind(st: &Stat) -> u32 {
    st.st_mode & libc::S_IFMT
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// An open directory of the plaintext tree, with its path (for messages only: nothing is
/// ever done by it) and its names from the top (to find it again through fds).
#[derive(Debug)]
pub struct PlainDir {
    fd: OwnedFd,
    path: PathBuf,
    rel: Vec<Vec<u8>>,
}

impl PlainDir {
    /// Opens the directory `path` the caller named (by path, following links: the caller's
    /// choice); it is the top of the walk.
    pub fn open(path: &Path) -> io::Result<PlainDir> {
        Ok(PlainDir { fd: sys::open_dir_path(path)?, path: path.to_path_buf(), rel: Vec::new() })
    }

    /// Creates the directory `path` and its missing parents (like `mkdir -p`, by path: the
    /// caller's choice) and opens it as the top of the walk.
    pub fn create_all(path: &Path) -> io::Result<PlainDir> {
        std::fs::create_dir_all(path)?;
        PlainDir::open(path)
    }

    /// Opens the directory holding `path` (by path, the caller's choice) and returns it with
    /// the last name of `path`, which is then reached through the fd (not following a link
    /// there, like `cp -a`'s source). `None` for a path without a last name (`/`, `..`).
    pub fn open_parent_of(path: &Path) -> io::Result<Option<(PlainDir, Vec<u8>)>> {
        let Some(name) = path.file_name() else { return Ok(None) };
        if path.as_os_str().as_bytes().ends_with(b"/") {
            return Ok(None);
        }
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Ok(Some((PlainDir::open(parent)?, name.as_bytes().to_vec())))
    }

    /// The fd of this directory.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Its path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its names below the top of the walk (empty for the top).
    pub fn rel(&self) -> &[Vec<u8>] {
        &self.rel
    }

    /// The path of `name` in it (for messages).
    pub fn join(&self, name: &[u8]) -> PathBuf {
        self.path.join(std::ffi::OsStr::from_bytes(name))
    }

    /// The directory itself, to read or set its attributes.
    pub fn node(&self) -> io::Result<Node> {
        Ok(Node { fd: sys::open_dir_at(self.fd(), b".")?, stat: sys::fstat(self.fd())?, io: true })
    }

    /// Its names, sorted, without `.` and `..` (listed with the caller's rights only).
    pub fn names(&self) -> io::Result<Vec<Vec<u8>>> {
        let mut names: Vec<Vec<u8>> =
            sys::read_dir_plain(self.fd())?.into_iter().map(|e| e.name).filter(|n| n != b"." && n != b"..").collect();
        names.sort();
        Ok(names)
    }

    /// What is at `name` now (a symlink is the symlink itself), `None` if nothing. Only for
    /// a decision; what is then acted on is opened anew and checked.
    pub fn stat_at(&self, name: &[u8]) -> io::Result<Option<Stat>> {
        match sys::fstatat(self.fd(), name) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A handle on whatever `name` is (`O_PATH`: nothing is opened for I/O, no FIFO blocks,
    /// no driver runs; a symlink is the symlink itself) and its `fstat`.
    pub fn entry(&self, name: &[u8]) -> io::Result<Node> {
        let fd = sys::openat_beneath(self.fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let stat = sys::fstat(fd.as_fd())?;
        Ok(Node { fd, stat, io: false })
    }

    /// Opens the subdirectory `name`: never a symlink (ENOTDIR or ELOOP), never outside this
    /// directory.
    pub fn open_dir(&self, name: &[u8]) -> io::Result<PlainDir> {
        let fd = sys::openat_beneath(self.fd(), name, libc::O_DIRECTORY | libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
        Ok(self.child(fd, name))
    }

    /// Opens the subdirectory `name` (as [`PlainDir::open_dir`]) after making it private
    /// (mode 0700) through a handle on it: the owner can then list and fill it whatever its
    /// mode was, as when it is made anew.
    pub fn open_dir_private(&self, name: &[u8]) -> io::Result<PlainDir> {
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let handle = sys::openat_beneath(self.fd(), name, flags, 0)?;
        sys::chmod_fd(handle.as_fd(), 0o700)?;
        Ok(self.child(sys::open_dir_at(handle.as_fd(), b".")?, name))
    }

    fn child(&self, fd: OwnedFd, name: &[u8]) -> PlainDir {
        let mut rel = self.rel.clone();
        rel.push(name.to_vec());
        PlainDir { fd, path: self.join(name), rel }
    }

    /// Makes the directory `name` (mode 0700: private while it is filled) and opens it.
    pub fn make_dir(&self, name: &[u8]) -> io::Result<PlainDir> {
        sys::mkdirat(self.fd(), name, 0o700)?;
        self.open_dir(name)
    }

    /// Opens the directory `rel` below this one (the names of [`PlainDir::rel`]), name by
    /// name through fds.
    pub fn open_below(&self, rel: &[Vec<u8>]) -> io::Result<PlainDir> {
        let mut cur =
            PlainDir { fd: sys::open_dir_at(self.fd(), b".")?, path: self.path.clone(), rel: self.rel.clone() };
        for name in rel {
            cur = cur.open_dir(name)?;
        }
        Ok(cur)
    }

    /// Creates the new regular file `name` (exclusively: an existing name or a planted
    /// symlink there is EEXIST) for writing, mode `mode`.
    pub fn create_file(&self, name: &[u8], mode: libc::mode_t) -> io::Result<File> {
        let fd = sys::openat_beneath(
            self.fd(),
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode,
        )?;
        Ok(sys::into_file(fd))
    }

    /// Makes the symlink `name` to `target` and returns a handle on it, checked to be a
    /// symlink (a swap right after is refused).
    pub fn symlink(&self, target: &[u8], name: &[u8]) -> io::Result<Node> {
        sys::symlinkat(target, self.fd(), name)?;
        self.made(name, libc::S_IFLNK)
    }

    /// Makes the special file `name` (`mode` carries its type) and returns a handle on it,
    /// checked to be of that type.
    pub fn mknod(&self, name: &[u8], mode: libc::mode_t, rdev: libc::dev_t) -> io::Result<Node> {
        sys::mknodat(self.fd(), name, mode, rdev)?;
        self.made(name, mode & libc::S_IFMT)
    }

    fn made(&self, name: &[u8], kind_made: u32) -> io::Result<Node> {
        let n = self.entry(name)?;
        if kind(&n.stat) != kind_made {
            return Err(io::Error::other(format!(
                "{} was replaced by {} right after it was made",
                self.join(name).display(),
                sys::type_name(n.stat.st_mode)
            )));
        }
        Ok(n)
    }

    /// Hard-links `from_name` of `from` as `name` here, and checks that what got linked is
    /// the inode `(dev, ino)` (else removes the new name again and fails).
    pub fn link(&self, from: &PlainDir, from_name: &[u8], name: &[u8], want: (u64, u64)) -> io::Result<()> {
        sys::linkat(from.fd(), from_name, self.fd(), name)?;
        let st = sys::fstatat(self.fd(), name)?;
        if (st.st_dev, st.st_ino) != want {
            let _ = sys::unlinkat(self.fd(), name, false);
            return Err(io::Error::other(format!(
                "{} is no longer the file exported first; not linked",
                from.join(from_name).display()
            )));
        }
        Ok(())
    }

    /// Renames `from` to `to`, both in this directory: over an existing `to` only when
    /// `replace` (else EEXIST, also on a filesystem without `RENAME_NOREPLACE`: see
    /// [`sys::rename_noreplace`]).
    pub fn rename(&self, from: &[u8], to: &[u8], replace: bool) -> io::Result<()> {
        if replace {
            sys::renameat2(self.fd(), from, self.fd(), to, 0)
        } else {
            sys::rename_noreplace(self.fd(), from, self.fd(), to)
        }
    }

    /// Removes the non-directory `name` (a symlink itself, never its target).
    pub fn remove(&self, name: &[u8]) -> io::Result<()> {
        sys::unlinkat(self.fd(), name, false)
    }

    /// The target of the symlink `name`.
    pub fn readlink(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        sys::readlinkat(self.fd(), name)
    }

    /// The bytes of regular files in this tree (for a progress bar; each hard-linked inode
    /// counted at each name).
    pub fn bytes_under(&self) -> u64 {
        let Ok(names) = self.names() else { return 0 };
        names.iter().filter_map(|n| self.entry(n).ok()).map(|n| n.bytes_under(&self.path)).sum()
    }
}

/// An object of the plaintext tree: an fd on it (an `O_PATH` handle, or one open for I/O)
/// and its `fstat` from that fd.
#[derive(Debug)]
pub struct Node {
    fd: OwnedFd,
    /// What the object is: type, owner, mode, times, size, links.
    pub stat: Stat,
    /// Opened for I/O (not `O_PATH`).
    io: bool,
}

impl Node {
    /// A handle on `path` the caller named (by path, the caller's choice): a final symlink
    /// is followed only when `follow`.
    pub fn open_path(path: &Path, follow: bool) -> io::Result<Node> {
        let flags = libc::O_PATH | if follow { 0 } else { libc::O_NOFOLLOW };
        let fd = sys::openat(sys::CWD, path.as_os_str().as_bytes(), flags, 0)?;
        let stat = sys::fstat(fd.as_fd())?;
        Ok(Node { fd, stat, io: false })
    }

    /// The node of a file just created for writing (its fd and `fstat`).
    pub fn of_file(f: &File) -> io::Result<Node> {
        let fd = f.as_fd().try_clone_to_owned()?;
        let stat = sys::fstat(fd.as_fd())?;
        Ok(Node { fd, stat, io: true })
    }

    /// Opens the content of this regular file for reading: the very inode whose `stat` this
    /// is (never a FIFO or device put in its place: refused by type first).
    pub fn read_content(&self) -> io::Result<File> {
        if kind(&self.stat) != libc::S_IFREG {
            return Err(err(libc::EINVAL));
        }
        let fd = sys::reopen(self.fd.as_fd(), libc::O_RDONLY)?;
        let st = sys::fstat(fd.as_fd())?;
        if (st.st_dev, st.st_ino) != (self.stat.st_dev, self.stat.st_ino) {
            return Err(err(libc::ESTALE));
        }
        Ok(sys::into_file(fd))
    }

    /// This directory, to walk (`path` names it in messages).
    pub fn as_dir(&self, path: &Path) -> io::Result<PlainDir> {
        let fd = sys::open_dir_at(self.fd.as_fd(), b".")?;
        Ok(PlainDir { fd, path: path.to_path_buf(), rel: Vec::new() })
    }

    /// The target of this symlink.
    pub fn readlink(&self) -> io::Result<Vec<u8>> {
        sys::readlinkat(self.fd.as_fd(), b"")
    }

    fn xattrs(&self) -> XattrTarget<'_> {
        if self.io {
            XattrTarget::Fd(self.fd.as_fd())
        } else {
            XattrTarget::Handle(self.fd.as_fd())
        }
    }

    /// Its `user.*` extended attributes (none for a symlink, or on a filesystem without
    /// them).
    pub fn user_xattrs(&self) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if kind(&self.stat) == libc::S_IFLNK {
            return Ok(Vec::new());
        }
        let t = self.xattrs();
        let names = match t.list_all() {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for name in names.split(|&b| b == 0).filter(|s| s.starts_with(b"user.")) {
            let mut value = vec![0u8; t.get(name, &mut [])? + 256];
            let n = t.get(name, &mut value)?;
            value.truncate(n);
            out.push((name.to_vec(), value));
        }
        Ok(out)
    }

    /// Sets the extended attribute `name`.
    pub fn set_xattr(&self, name: &[u8], value: &[u8]) -> io::Result<()> {
        self.xattrs().set(name, value, 0)
    }

    /// Sets its owner (a symlink's own).
    pub fn set_owner(&self, uid: u32, gid: u32) -> io::Result<()> {
        sys::chown_fd(self.fd.as_fd(), uid, gid)
    }

    /// Sets its mode (never call for a symlink).
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        sys::chmod_fd(self.fd.as_fd(), mode)
    }

    /// Sets its access and modification times from `st` (a symlink's own).
    pub fn set_times(&self, st: &Stat) -> io::Result<()> {
        let ts = [
            libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
            libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
        ];
        sys::utimens_fd(self.fd.as_fd(), &ts)
    }

    /// The bytes of regular files at and under it (`path` names it in messages).
    pub fn bytes_under(&self, path: &Path) -> u64 {
        match kind(&self.stat) {
            libc::S_IFREG => self.stat.st_size as u64,
            libc::S_IFDIR => self.as_dir(path).map(|d| d.bytes_under()).unwrap_or(0),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_below_the_top_follows_a_symlink_or_leaves_the_tree() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("f"), b"x").unwrap();
        let top = PlainDir::create_all(&t.path().join("top")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join(b"link")).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), top.join(b"flink")).unwrap();
        let refused = top.open_dir(b"link").unwrap_err().raw_os_error();
        assert!(matches!(refused, Some(libc::ELOOP | libc::ENOTDIR)), "{refused:?}");
        assert_eq!(top.open_dir(b"..").unwrap_err().raw_os_error(), Some(libc::EXDEV));
        assert!(top.open_dir(b"link/..").is_err());
        assert!(top.create_file(b"flink", 0o600).is_err());
        assert!(top.create_file(b"link/new", 0o600).is_err());
        assert!(!outside.join("new").exists());
        let n = top.entry(b"flink").unwrap();
        assert_eq!(kind(&n.stat), libc::S_IFLNK);
        assert!(n.read_content().is_err());
        assert_eq!(n.readlink().unwrap(), outside.join("f").as_os_str().as_bytes());
        let sub = top.make_dir(b"d").unwrap();
        assert_eq!(top.open_below(sub.rel()).unwrap().rel(), sub.rel());
        std::fs::set_permissions(sub.path(), std::os::unix::fs::PermissionsExt::from_mode(0o300)).unwrap();
        assert_eq!(top.open_dir_private(b"d").unwrap().node().unwrap().stat.st_mode & 0o7777, 0o700);
        // A symlink is refused (ENOTDIR: the handle would be the link itself), its target
        // left alone.
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        let outside_mode = mode(&outside);
        assert!(top.open_dir_private(b"link").is_err());
        assert_eq!(mode(&outside), outside_mode);
        let f = sub.create_file(b"g", 0o600).unwrap();
        Node::of_file(&f).unwrap().set_mode(0o640).unwrap();
        assert_eq!(sub.entry(b"g").unwrap().stat.st_mode & 0o7777, 0o640);
    }

    #[test]
    fn a_fifo_is_a_handle_and_never_blocks() {
        let t = tempfile::tempdir().unwrap();
        let top = PlainDir::open(t.path()).unwrap();
        let fifo = top.mknod(b"p", libc::S_IFIFO | 0o644, 0).unwrap();
        assert_eq!(kind(&fifo.stat), libc::S_IFIFO);
        assert!(fifo.read_content().is_err());
        assert!(top.entry(b"p").unwrap().user_xattrs().unwrap().is_empty());
    }
}
