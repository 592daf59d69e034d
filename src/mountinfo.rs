//! The mount table as `/proc/self/mountinfo` gives it (proc(5)): mount point, file system
//! type and source of every mount, with the kernel's octal escapes (`\040` for a space)
//! decoded, so a mount point with a space in its name is found.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// File system type: `fuse.veilfs`, `fuse`, `ext4`, …
    pub fstype: String,
    /// The source: for a veilfs mount, CIPHERDIR.
    pub source: PathBuf,
    /// The mount's own options (`rw,nosuid,nodev,relatime`).
    pub mount_opts: String,
    /// The superblock's options (`rw,user_id=0,group_id=0`).
    pub super_opts: String,
}

impl Mount {
    /// The generic flags of this mount, as its options in the table say.
    pub fn flags(&self) -> veilfs_core::sys::process::MountFlags {
        let has = |opts: &str, o: &str| opts.split(',').any(|x| x == o);
        let m = |o: &str| has(&self.mount_opts, o);
        let sb = |o: &str| has(&self.super_opts, o);
        veilfs_core::sys::process::MountFlags {
            read_only: m("ro"),
            nosuid: m("nosuid"),
            nodev: m("nodev"),
            noexec: m("noexec"),
            sync: sb("sync"),
            dirsync: sb("dirsync"),
            lazytime: sb("lazytime"),
            noatime: m("noatime"),
            strictatime: !m("noatime") && !m("relatime"),
            nodiratime: m("nodiratime"),
            nosymfollow: m("nosymfollow"),
        }
    }

    /// Whether the superblock is read-only (mounted `ro`).
    pub fn super_read_only(&self) -> bool {
        self.super_opts.split(',').any(|x| x == "ro")
    }
}

impl Mount {
    /// True for a veilfs mount: type `fuse.veilfs` or `fuse.veilfs-reverse` (a reverse
    /// view), or plain `fuse` (a mount made without the subtype) whose source is a vault or a
    /// reverse vault's PLAINDIR.
    pub fn is_veilfs(&self) -> bool {
        let reverse_config = || self.source.join(veilfs_core::reverse::REVERSE_CONFIG_NAME).is_file();
        self.fstype == "fuse.veilfs"
            || self.fstype == "fuse.veilfs-reverse"
            || (self.fstype == "fuse"
                && (veilfs_core::VaultConfig::path_in(&self.source).is_file() || reverse_config()))
    }
}

/// Decodes the kernel's `\ooo` octal escapes (space, tab, newline, backslash).
pub fn decode(field: &str) -> OsString {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    OsString::from_vec(out)
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            Some(Mount {
                mount_point: PathBuf::from(decode(fields.get(4)?)),
                fstype: fields.get(sep + 1)?.to_string(),
                source: PathBuf::from(decode(fields.get(sep + 2)?)),
                mount_opts: fields.get(5)?.to_string(),
                super_opts: fields.get(sep + 3).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// Every mount of this process's mount namespace.
pub fn all() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse(&t)).unwrap_or_default()
}

/// The mount at `mount_point` (the topmost, if several).
pub fn find(mount_point: &Path) -> Option<Mount> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse(&text).into_iter().rev().find(|m| m.mount_point == mount_point)
}

/// The veilfs mount whose source is `source` (an absolute CIPHERDIR); `Err` with all of
/// them when there are several.
pub fn find_veilfs_source(source: &Path) -> Result<Option<Mount>, Vec<Mount>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<Mount> = parse(&text).into_iter().filter(|m| m.source == source && m.is_veilfs()).collect();
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(found),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_paths_are_decoded() {
        let text = "36 35 0:52 / /tmp/my\\040plain rw,nosuid,nodev,relatime shared:1 - fuse /tmp/my\\040vault rw\n\
                    37 35 0:53 / /mnt/a\\134b rw - fuse.veilfs /v rw,user_id=0\n\
                    garbage\n";
        let m = parse(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, Path::new("/tmp/my plain"));
        assert_eq!(m[0].source, Path::new("/tmp/my vault"));
        assert_eq!(m[0].fstype, "fuse");
        assert_eq!(m[1].mount_point, Path::new("/mnt/a\\b"));
        assert!(m[1].is_veilfs());
        assert_eq!(decode("a\\01"), OsString::from("a\\01"), "a short escape is kept as is");
    }
}
