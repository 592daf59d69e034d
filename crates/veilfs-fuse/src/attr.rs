//! Backing `stat` → the attributes the kernel sees: plaintext sizes, our node ids.

use fuser::{FileAttr, FileType, INodeNo};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use veilfs_core::content::Layout;
use veilfs_core::sys::Stat;

/// The FUSE file type of a `st_mode`.
pub fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// The FUSE file type of a `d_type`, if known.
pub fn kind_from_dtype(d: u8) -> Option<FileType> {
    Some(match d {
        libc::DT_DIR => FileType::Directory,
        libc::DT_REG => FileType::RegularFile,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => return None,
    })
}

/// A timestamp from `stat` fields.
pub fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

/// Plaintext length of a symlink target stored in `stored_len` bytes
/// (`base64url(ID ‖ nonce ‖ ciphertext ‖ tag)`, no padding).
pub fn symlink_len(stored_len: u64, overhead: u64) -> u64 {
    (stored_len * 3 / 4).saturating_sub(16 + overhead)
}

/// The FUSE device number encoding (the kernel's `new_encode_dev`).
pub fn rdev_to_fuse(rdev: libc::dev_t) -> u32 {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// The inverse of [`rdev_to_fuse`].
pub fn rdev_from_fuse(rdev: u32) -> libc::dev_t {
    let major = (rdev & 0xfff00) >> 8;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    libc::makedev(major, minor)
}

/// Attributes of node `ino` from its backing `st`. `size` overrides the plaintext size of a
/// regular file (the cached size of an open file).
pub fn file_attr(st: &Stat, ino: u64, layout: &Layout, size: Option<u64>) -> FileAttr {
    let k = kind(st.st_mode);
    let size = match k {
        FileType::RegularFile => size.unwrap_or_else(|| layout.plain_size_lenient(st.st_size as u64)),
        FileType::Symlink => symlink_len(st.st_size as u64, layout.overhead),
        FileType::Directory => st.st_size as u64,
        _ => 0,
    };
    let ctime = time(st.st_ctime, st.st_ctime_nsec);
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime,
        crtime: ctime,
        kind: k,
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: rdev_to_fuse(st.st_rdev),
        blksize: layout.block_size as u32,
        flags: 0,
    }
}

/// Attributes for a negative entry (node id 0).
pub fn negative() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlink_length_matches_encoding() {
        for len in [1usize, 2, 3, 100, 1000, 3000] {
            let stored = veilfs_core::names::b64_encode(&vec![0u8; 16 + len + 28]).len() as u64;
            assert_eq!(symlink_len(stored, 28), len as u64);
        }
    }

    #[test]
    fn rdev_round_trip() {
        for (ma, mi) in [(0, 0), (8, 1), (259, 70000), (4095, 255)] {
            let d = libc::makedev(ma, mi);
            assert_eq!(rdev_from_fuse(rdev_to_fuse(d)), d);
        }
    }
}
