//! Permission checks in the daemon, for a mount without `default_permissions`.
//!
//! Why: with `default_permissions` the kernel checks every path step and open against the
//! attributes it caches, and to do so it refreshes the parent directory's attributes after
//! each UNLINK (one GETATTR per removed file: `rm -rf` paid an extra round trip per file).
//! Without it, the kernel checks almost nothing itself (only that a regular file has some
//! execute bit for exec, the sticky-bit rule of unlink/rename, the user.* xattr rules and
//! hard-link protection) and leaves the rest to the filesystem. The backing filesystem's
//! own checks are not enough: lookups and listings are answered from the in-memory
//! directory index, and a daemon that is not root grants itself its owner's rights on
//! backing objects for a moment (`sys::with_owner_rwx`, SECURITY.md §7a). So a mount that
//! is not `--allow-other` (only the mount owner's processes reach it; fuser refuses every
//! other uid) has the daemon apply Linux's `generic_permission` here, once, for every
//! request that needs it; an `--allow-other` mount keeps `default_permissions` and skips
//! these checks.
//!
//! The rules follow Linux (fs/namei.c, fs/attr.c): owner, group, other classes; a process
//! holding `CAP_DAC_OVERRIDE` passes every check except execute on a non-directory without
//! any execute bit, `CAP_DAC_READ_SEARCH` passes read and search; `CAP_FOWNER` stands in for
//! ownership, `CAP_CHOWN` allows any chown, `CAP_FSETID` keeps a set-group-id bit. The
//! supplementary groups and capabilities come from `/proc/PID/status`, read only when the
//! mode bits alone do not decide (so the common case costs no system call).

use std::cell::OnceCell;
use std::io;
use veilfs_core::sys::{self, ProcCreds, Stat};

/// Read permission (`MAY_READ`).
pub(crate) const READ: u32 = 4;
/// Write permission (`MAY_WRITE`).
pub(crate) const WRITE: u32 = 2;
/// Execute, or search on a directory (`MAY_EXEC`).
pub(crate) const EXEC: u32 = 1;

const CAP_CHOWN: u32 = 0;
const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_FOWNER: u32 = 3;
const CAP_FSETID: u32 = 4;

/// The process a request came from, with its groups and capabilities read when first needed.
#[derive(Debug)]
pub(crate) struct Who {
    /// Filesystem user id.
    pub uid: u32,
    /// Filesystem group id.
    pub gid: u32,
    pid: u32,
    creds: OnceCell<Option<ProcCreds>>,
}

impl Who {
    /// The sender of a request (`pid` 0: the kernel itself).
    pub(crate) fn new(uid: u32, gid: u32, pid: u32) -> Who {
        Who { uid, gid, pid, creds: OnceCell::new() }
    }

    fn creds(&self) -> Option<&ProcCreds> {
        self.creds.get_or_init(|| if self.pid == 0 { None } else { sys::creds_of(self.pid).ok() }).as_ref()
    }

    /// Whether the capability is effective. A request the kernel makes itself, or from a
    /// process already gone, counts as root's if it has uid 0.
    fn capable(&self, cap: u32) -> bool {
        match self.creds() {
            Some(c) => c.caps & (1 << cap) != 0,
            None => self.uid == 0,
        }
    }

    /// `in_group_p`: the primary group or a supplementary one.
    pub(crate) fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.creds().is_some_and(|c| c.groups.contains(&gid))
    }

    /// `inode_owner_or_capable`.
    pub(crate) fn owns(&self, st: &Stat) -> bool {
        self.uid == st.st_uid || self.capable(CAP_FOWNER)
    }
}

fn denied() -> io::Error {
    io::Error::from_raw_os_error(libc::EACCES)
}

fn not_permitted() -> io::Error {
    io::Error::from_raw_os_error(libc::EPERM)
}

/// `generic_permission`: may `who` have `mask` (of [`READ`], [`WRITE`], [`EXEC`]) on an
/// object with attributes `st`? EACCES if not.
pub(crate) fn check(who: &Who, st: &Stat, mask: u32) -> io::Result<()> {
    let mode = st.st_mode;
    let bits = if who.uid == st.st_uid {
        mode >> 6
    } else if mask & (mode ^ (mode >> 3)) != 0 && who.in_group(st.st_gid) {
        // Group membership decides only where group and other bits differ.
        mode >> 3
    } else {
        mode
    };
    if mask & !bits & 7 == 0 {
        return Ok(());
    }
    let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
    if is_dir {
        if mask & WRITE == 0 && who.capable(CAP_DAC_READ_SEARCH) {
            return Ok(());
        }
        return if who.capable(CAP_DAC_OVERRIDE) { Ok(()) } else { Err(denied()) };
    }
    if mask == READ && who.capable(CAP_DAC_READ_SEARCH) {
        return Ok(());
    }
    if (mask & EXEC == 0 || mode & 0o111 != 0) && who.capable(CAP_DAC_OVERRIDE) {
        return Ok(());
    }
    Err(denied())
}

/// The sticky-bit rule of removing or replacing `victim` from directory `dir`: in a sticky
/// directory only the victim's owner, the directory's owner or a `CAP_FOWNER` holder may.
pub(crate) fn check_sticky(who: &Who, dir: &Stat, victim: &Stat) -> io::Result<()> {
    if dir.st_mode & libc::S_ISVTX == 0 || who.uid == victim.st_uid || who.uid == dir.st_uid {
        return Ok(());
    }
    if who.capable(CAP_FOWNER) {
        Ok(())
    } else {
        Err(not_permitted())
    }
}

/// Hard-link protection (`fs.protected_hardlinks`, `may_linkat`), which the kernel checks
/// through the permission this mount now makes: with it on, linking to a file needs its
/// ownership (or `CAP_FOWNER`), or a regular file without set-user-id (nor set-group-id with
/// group execute) that `who` may read and write. EPERM otherwise.
pub(crate) fn check_link_source(who: &Who, st: &Stat, protected: bool) -> io::Result<()> {
    if !protected || who.owns(st) {
        return Ok(());
    }
    let mode = st.st_mode;
    let safe = mode & libc::S_IFMT == libc::S_IFREG
        && mode & libc::S_ISUID == 0
        && mode & (libc::S_ISGID | libc::S_IXGRP) != (libc::S_ISGID | libc::S_IXGRP);
    if safe && check(who, st, READ | WRITE).is_ok() {
        Ok(())
    } else {
        Err(not_permitted())
    }
}

/// Whether the kernel protects hard links (`/proc/sys/fs/protected_hardlinks`; on when
/// unreadable, as distributions ship it).
pub(crate) fn hardlinks_protected() -> bool {
    std::fs::read_to_string("/proc/sys/fs/protected_hardlinks").map_or(true, |s| s.trim() != "0")
}

/// What a SETATTR changes, for [`check_setattr`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Change {
    /// New mode (with type bits stripped).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// A truncation by name (not through an open file, whose opening was checked).
    pub truncate_by_name: bool,
    /// Both times set to "now" (`utimensat(…, NULL)`): owner or write permission suffices.
    pub touch: bool,
    /// Times set to given values (or one of them to "now"): the owner's right.
    pub set_times: bool,
}

/// `setattr_prepare` (plus `may_setattr`'s rule for "now"): whether `who` may make `c` to an
/// object with attributes `st`. Returns the mode to set, with the set-group-id bit dropped
/// when Linux drops it (a chmod by someone outside the file's group without `CAP_FSETID`).
pub(crate) fn check_setattr(who: &Who, st: &Stat, c: &Change) -> io::Result<Option<u32>> {
    if let Some(uid) = c.uid {
        let own = who.uid == st.st_uid && uid == st.st_uid;
        if !own && !who.capable(CAP_CHOWN) {
            return Err(not_permitted());
        }
    }
    if let Some(gid) = c.gid {
        let own = who.uid == st.st_uid && (gid == st.st_gid || who.in_group(gid));
        if !own && !who.capable(CAP_CHOWN) {
            return Err(not_permitted());
        }
    }
    let mut mode = c.mode;
    if let Some(m) = &mut mode {
        if !who.owns(st) {
            return Err(not_permitted());
        }
        let gid = c.gid.unwrap_or(st.st_gid);
        if *m & libc::S_ISGID != 0 && !who.in_group(gid) && !who.capable(CAP_FSETID) {
            *m &= !libc::S_ISGID;
        }
    }
    if c.set_times && !who.owns(st) {
        return Err(not_permitted());
    }
    if c.touch && !who.owns(st) {
        check(who, st, WRITE)?;
    }
    if c.truncate_by_name {
        check(who, st, WRITE)?;
    }
    Ok(mode)
}

/// The access an OPEN with `flags` asks for: read and/or write by the access mode, write for
/// `O_TRUNC`, execute for an exec (`__FMODE_EXEC`, which the kernel passes on in the flags).
pub(crate) fn open_mask(flags: i32) -> u32 {
    const FMODE_EXEC: i32 = 0x20;
    if flags & FMODE_EXEC != 0 {
        return EXEC;
    }
    let mut mask = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => READ,
        libc::O_WRONLY => WRITE,
        _ => READ | WRITE,
    };
    if flags & libc::O_TRUNC != 0 {
        mask |= WRITE;
    }
    mask
}

/// `xattr_permission` for the namespaces Linux checks by mode: `user.*` only on regular files
/// and directories, written on a sticky directory only by its owner; then read or write
/// permission. `trusted.*` is the kernel's (`CAP_SYS_ADMIN`), `security.*` and `system.*`
/// are left to the filesystem.
pub(crate) fn check_xattr(who: &Who, st: &Stat, name: &[u8], write: bool) -> io::Result<()> {
    if !name.starts_with(b"user.") {
        return Ok(());
    }
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFREG && kind != libc::S_IFDIR {
        return Err(io::Error::from_raw_os_error(if write { libc::EPERM } else { libc::ENODATA }));
    }
    if write && kind == libc::S_IFDIR && st.st_mode & libc::S_ISVTX != 0 && !who.owns(st) {
        return Err(not_permitted());
    }
    check(who, st, if write { WRITE } else { READ })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(mode: u32, uid: u32, gid: u32) -> Stat {
        use std::os::fd::AsFd;
        let mut s = sys::fstat(std::fs::File::open("/").unwrap().as_fd()).unwrap();
        s.st_mode = mode;
        s.st_uid = uid;
        s.st_gid = gid;
        s
    }

    /// A request of the kernel's own (pid 0): no supplementary groups, capabilities by uid.
    fn who(uid: u32, gid: u32) -> Who {
        Who::new(uid, gid, 0)
    }

    #[test]
    fn classes_follow_owner_then_group_then_other() {
        let f = st(libc::S_IFREG | 0o460, 10, 20);
        // The owner's bits decide for the owner, even where group bits would grant.
        assert!(check(&who(10, 20), &f, WRITE).is_err());
        assert!(check(&who(10, 20), &f, READ).is_ok());
        assert!(check(&who(11, 20), &f, WRITE).is_ok());
        assert!(check(&who(11, 21), &f, READ).is_err());
    }

    #[test]
    fn root_passes_all_but_exec_without_any_x_bit() {
        let root = who(0, 0);
        assert!(check(&root, &st(libc::S_IFREG, 5, 5), READ | WRITE).is_ok());
        assert!(check(&root, &st(libc::S_IFREG, 5, 5), EXEC).is_err());
        assert!(check(&root, &st(libc::S_IFREG | 0o001, 5, 5), EXEC).is_ok());
        assert!(check(&root, &st(libc::S_IFDIR, 5, 5), EXEC | WRITE).is_ok());
    }

    #[test]
    fn sticky_directories_keep_others_files() {
        let dir = st(libc::S_IFDIR | 0o1777, 1, 1);
        let theirs = st(libc::S_IFREG | 0o666, 2, 2);
        assert_eq!(check_sticky(&who(3, 3), &dir, &theirs).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert!(check_sticky(&who(2, 3), &dir, &theirs).is_ok());
        assert!(check_sticky(&who(1, 3), &dir, &theirs).is_ok());
        assert!(check_sticky(&who(0, 0), &dir, &theirs).is_ok());
    }

    #[test]
    fn setattr_rules() {
        let f = st(libc::S_IFREG | 0o666, 2, 2);
        let chmod = Change { mode: Some(0o2644), ..Change::default() };
        assert!(check_setattr(&who(3, 3), &f, &chmod).is_err());
        // The owner outside the file's group loses set-group-id.
        assert_eq!(check_setattr(&who(2, 3), &f, &chmod).unwrap(), Some(0o644));
        let touch = Change { touch: true, ..Change::default() };
        assert!(check_setattr(&who(3, 3), &f, &touch).is_ok());
        let set = Change { set_times: true, ..Change::default() };
        assert!(check_setattr(&who(3, 3), &f, &set).is_err());
        assert!(check_setattr(&who(2, 2), &f, &Change { uid: Some(3), ..Change::default() }).is_err());
        assert!(check_setattr(&who(2, 2), &f, &Change { uid: Some(2), gid: Some(2), ..Change::default() }).is_ok());
        assert!(check_setattr(&who(2, 2), &f, &Change { gid: Some(9), ..Change::default() }).is_err());
    }
}
