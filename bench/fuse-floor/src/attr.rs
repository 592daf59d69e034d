//! Conversions between the backing `struct stat` and fuser's types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

/// The FUSE file type for a `st_mode`.
pub fn kind_from_mode(mode: u32) -> FileType {
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

/// The FUSE file type for a `d_type`, if the backing fs reported one.
///
/// fuser's `FileType` has no "unknown" member, so `DT_UNKNOWN` forces the
/// caller to stat the entry.
pub fn kind_from_dtype(d_type: u8) -> Option<FileType> {
    Some(match d_type {
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

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

/// The device number as the FUSE protocol carries it (the kernel's
/// `new_encode_dev` layout), which differs from glibc's 64-bit `dev_t`.
pub fn rdev_to_fuse(rdev: libc::dev_t) -> u32 {
    let major = libc::major(rdev);
    let minor = libc::minor(rdev);
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// The inverse of [`rdev_to_fuse`], for mknod requests.
pub fn rdev_from_fuse(rdev: u32) -> libc::dev_t {
    let major = (rdev & 0xfff00) >> 8;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    libc::makedev(major, minor)
}

/// Builds the attributes reported for `nodeid` from the backing `stat`.
///
/// fuser uses `attr.ino` as the FUSE node id in entry replies, so the reported
/// inode number and the node id are necessarily the same value.
pub fn file_attr(st: &libc::stat, nodeid: u64) -> FileAttr {
    let atime = time(st.st_atime, st.st_atime_nsec);
    let mtime = time(st.st_mtime, st.st_mtime_nsec);
    let ctime = time(st.st_ctime, st.st_ctime_nsec);
    FileAttr {
        ino: INodeNo(nodeid),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime,
        mtime,
        ctime,
        crtime: ctime,
        kind: kind_from_mode(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: rdev_to_fuse(st.st_rdev),
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// Attributes carrying only an inode number and type.
///
/// Used where the kernel ignores everything else: the "." and ".." entries of
/// READDIRPLUS (never linked into the dcache) and negative lookups (node id 0
/// tells the kernel "no such entry, cache that for the entry timeout").
pub fn placeholder(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
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
    fn rdev_round_trip() {
        for (maj, min) in [(0, 0), (1, 3), (8, 17), (259, 65536), (4095, 1_048_575)] {
            let dev = libc::makedev(maj, min);
            assert_eq!(rdev_from_fuse(rdev_to_fuse(dev)), dev);
        }
    }

    #[test]
    fn negative_times() {
        let t = time(-1, 500_000_000);
        assert_eq!(UNIX_EPOCH.duration_since(t).unwrap(), Duration::from_millis(500));
    }
}
