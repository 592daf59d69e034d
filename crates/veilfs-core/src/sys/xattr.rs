//! Extended attributes, by where the call goes: an open fd (`f*xattr`), the object behind a
//! verified `O_PATH` handle (through `/proc/self/fd/N`, as there is no fd form taking one),
//! or a path whose last component is not followed (`l*xattr`). An empty `buf` asks a
//! get or list call for the size (as in libc; rustix has separate `*_query` calls for it,
//! and its plain calls answer 0 for an empty buffer).

use std::ffi::CString;
use std::io;
use std::os::fd::BorrowedFd;

use rustix::fs::XattrFlags;

use super::fd_path;

fn xflags(flags: libc::c_int) -> XattrFlags {
    XattrFlags::from_bits_retain(flags as u32)
}

/// `lgetxattr`; an empty `buf` asks for the size.
pub fn lgetxattr(path: &CString, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    Ok(match buf.is_empty() {
        true => rustix::fs::lgetxattr_query(path, name)?,
        false => rustix::fs::lgetxattr(path, name, buf)?,
    })
}

/// `lsetxattr`.
pub fn lsetxattr(path: &CString, name: &[u8], value: &[u8], flags: libc::c_int) -> io::Result<()> {
    Ok(rustix::fs::lsetxattr(path, name, value, xflags(flags))?)
}

/// `llistxattr`; an empty `buf` asks for the size.
pub fn llistxattr(path: &CString, buf: &mut [u8]) -> io::Result<usize> {
    Ok(match buf.is_empty() {
        true => rustix::fs::llistxattr_query(path)?,
        false => rustix::fs::llistxattr(path, buf)?,
    })
}

/// `lremovexattr`.
pub fn lremovexattr(path: &CString, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::lremovexattr(path, name)?)
}

/// `fgetxattr`; an empty `buf` asks for the size.
pub fn fgetxattr(fd: BorrowedFd<'_>, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    Ok(match buf.is_empty() {
        true => rustix::fs::fgetxattr_query(fd, name)?,
        false => rustix::fs::fgetxattr(fd, name, buf)?,
    })
}

/// `fsetxattr`.
pub fn fsetxattr(fd: BorrowedFd<'_>, name: &[u8], value: &[u8], flags: libc::c_int) -> io::Result<()> {
    Ok(rustix::fs::fsetxattr(fd, name, value, xflags(flags))?)
}

/// `flistxattr`; an empty `buf` asks for the size.
pub fn flistxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    Ok(match buf.is_empty() {
        true => rustix::fs::flistxattr_query(fd)?,
        false => rustix::fs::flistxattr(fd, buf)?,
    })
}

/// `fremovexattr`.
pub fn fremovexattr(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::fremovexattr(fd, name)?)
}

/// `getxattr` of the object behind `fd` (an `O_PATH` handle of a non-symlink); an empty
/// `buf` asks for the size.
pub fn getxattr_fd(fd: BorrowedFd<'_>, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    Ok(match buf.is_empty() {
        true => rustix::fs::getxattr_query(fd_path(fd), name)?,
        false => rustix::fs::getxattr(fd_path(fd), name, buf)?,
    })
}

/// `setxattr` of the object behind `fd` (an `O_PATH` handle of a non-symlink).
pub fn setxattr_fd(fd: BorrowedFd<'_>, name: &[u8], value: &[u8], flags: libc::c_int) -> io::Result<()> {
    Ok(rustix::fs::setxattr(fd_path(fd), name, value, xflags(flags))?)
}

/// `listxattr` of the object behind `fd` (an `O_PATH` handle of a non-symlink).
pub fn listxattr_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    Ok(match buf.is_empty() {
        true => rustix::fs::listxattr_query(fd_path(fd))?,
        false => rustix::fs::listxattr(fd_path(fd), buf)?,
    })
}

/// `removexattr` of the object behind `fd` (an `O_PATH` handle of a non-symlink).
pub fn removexattr_fd(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::removexattr(fd_path(fd), name)?)
}

/// Where an xattr call goes: an open fd (a directory, an open file), a verified `O_PATH`
/// handle of a non-symlink (through `/proc/self/fd/N`), or a path whose last component is
/// not followed (a symlink itself, which only takes `trusted.*`/`security.*` attributes).
#[derive(Debug, Clone, Copy)]
pub enum XattrTarget<'a> {
    /// An fd opened for I/O (not `O_PATH`).
    Fd(BorrowedFd<'a>),
    /// An `O_PATH` handle of anything but a symlink.
    Handle(BorrowedFd<'a>),
    /// A path, the last component not followed (`l*xattr`).
    NoFollow(&'a CString),
}

impl XattrTarget<'_> {
    /// `getxattr`; an empty `buf` asks for the size.
    pub fn get(self, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
        match self {
            XattrTarget::Fd(fd) => fgetxattr(fd, name, buf),
            XattrTarget::Handle(fd) => getxattr_fd(fd, name, buf),
            XattrTarget::NoFollow(p) => lgetxattr(p, name, buf),
        }
    }

    /// `setxattr`.
    pub fn set(self, name: &[u8], value: &[u8], flags: libc::c_int) -> io::Result<()> {
        match self {
            XattrTarget::Fd(fd) => fsetxattr(fd, name, value, flags),
            XattrTarget::Handle(fd) => setxattr_fd(fd, name, value, flags),
            XattrTarget::NoFollow(p) => lsetxattr(p, name, value, flags),
        }
    }

    /// `listxattr`; an empty `buf` asks for the size.
    pub fn list(self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            XattrTarget::Fd(fd) => flistxattr(fd, buf),
            XattrTarget::Handle(fd) => listxattr_fd(fd, buf),
            XattrTarget::NoFollow(p) => llistxattr(p, buf),
        }
    }

    /// `removexattr`.
    pub fn remove(self, name: &[u8]) -> io::Result<()> {
        match self {
            XattrTarget::Fd(fd) => fremovexattr(fd, name),
            XattrTarget::Handle(fd) => removexattr_fd(fd, name),
            XattrTarget::NoFollow(p) => lremovexattr(p, name),
        }
    }

    /// The whole list of stored names (NUL-separated).
    pub fn list_all(self) -> io::Result<Vec<u8>> {
        loop {
            let mut buf = vec![0u8; self.list(&mut [])? + 256];
            match self.list(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf);
                }
                // Grew meanwhile: ask again.
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
