//! Acting as the calling user: a daemon running as root for `--allow-other` makes changes
//! with the requesting user's filesystem ids and groups, so that even a missed race acts with
//! that user's rights, not root's. fsuid/fsgid are per thread in Linux; supplementary groups
//! are per thread too when set with the raw system call (glibc's setgroups() would change
//! every thread of the daemon; rustix's `set_thread_groups` is that raw call).

use std::io;
use std::os::fd::BorrowedFd;

use rustix::process::Gid;

thread_local! {
    /// The caller this thread acts as, if any: (uid, gid, groups).
    static ACTING: std::cell::RefCell<Option<(u32, u32, Vec<Gid>)>> =
        const { std::cell::RefCell::new(None) };
}

fn set_creds(uid: u32, gid: u32, groups: &[Gid]) -> io::Result<()> {
    rustix::thread::set_thread_groups(groups)?;
    // rustix has no setfsuid/setfsgid, hence libc.
    // SAFETY: setfsgid/setfsuid take plain ids and touch no memory of ours; they return the
    // previous id and report no error, so the result is verified by reading the value back.
    unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
    }
    // SAFETY: an invalid id (-1) leaves the fs ids unchanged and returns the current ones.
    let (u, g) = unsafe { (libc::setfsuid(u32::MAX), libc::setfsgid(u32::MAX)) };
    if u as u32 != uid || g as u32 != gid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// Acts as `uid`/`gid` with supplementary `groups` on this thread until the guard drops
/// (then back to root with no supplementary groups). Only for a daemon running as root.
pub fn act_as(uid: u32, gid: u32, groups: Vec<libc::gid_t>) -> io::Result<ActingGuard> {
    let groups: Vec<Gid> = groups.into_iter().map(Gid::from_raw).collect();
    set_creds(uid, gid, &groups)?;
    ACTING.with_borrow_mut(|a| *a = Some((uid, gid, groups)));
    Ok(ActingGuard(std::marker::PhantomData))
}

/// Returned by [`act_as`]; restores root's filesystem ids on drop. Not `Send`: the ids
/// belong to the thread.
pub struct ActingGuard(std::marker::PhantomData<*const ()>);

impl Drop for ActingGuard {
    fn drop(&mut self) {
        ACTING.with_borrow_mut(|a| *a = None);
        if let Err(e) = set_creds(0, 0, &[]) {
            // Never serve a later request with a user's ids: nothing sane can continue.
            eprintln!("veilfs: cannot restore the daemon's credentials: {e}");
            std::process::abort();
        }
    }
}

/// Runs `f` with the daemon's own (root) ids even while this thread acts as a caller: for
/// the format's internal steps on objects the daemon itself just verified or created (the
/// directory IV file of a directory being removed), which the caller's plaintext rights
/// cover but the backing modes may not.
pub fn privileged<R>(f: impl FnOnce() -> R) -> R {
    let acting = ACTING.with_borrow(|a| a.clone());
    let Some((uid, gid, groups)) = acting else { return f() };
    if set_creds(0, 0, &[]).is_err() {
        return f();
    }
    let r = f();
    if let Err(e) = set_creds(uid, gid, &groups) {
        eprintln!("veilfs: cannot switch back to the caller's credentials: {e}");
        std::process::abort();
    }
    r
}

/// What `/proc/PID/status` says of a process's rights: its supplementary groups and its
/// effective capabilities (`CAP_FSETID` keeps set-id bits through a write; the DAC ones
/// override file modes).
#[derive(Debug, Clone, Default)]
pub struct ProcCreds {
    /// Supplementary groups.
    pub groups: Vec<libc::gid_t>,
    /// `CAP_FSETID` is effective.
    pub cap_fsetid: bool,
    /// The effective capability set, one bit per capability number (`CAP_CHOWN` = 0, …).
    pub caps: u64,
}

/// The credentials of process `pid` (from `/proc/PID/status`).
pub fn creds_of(pid: u32) -> io::Result<ProcCreds> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)).ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
    };
    let groups = field("Groups:")?.split_ascii_whitespace().filter_map(|g| g.parse().ok()).collect();
    let caps =
        u64::from_str_radix(field("CapEff:")?.trim(), 16).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    const CAP_FSETID: u32 = 4;
    Ok(ProcCreds { groups, cap_fsetid: caps & (1 << CAP_FSETID) != 0, caps })
}

/// The supplementary groups of process `pid` (from `/proc/PID/status`), for [`act_as`].
pub fn groups_of(pid: u32) -> io::Result<Vec<libc::gid_t>> {
    creds_of(pid).map(|c| c.groups)
}

/// The user id this thread's filesystem calls are checked with: the caller it acts as
/// ([`act_as`]), else the effective user id.
pub fn fs_uid() -> u32 {
    ACTING.with_borrow(|a| a.as_ref().map(|(u, _, _)| *u)).unwrap_or_else(super::euid)
}

// Directories whose mode denies their owner (`chmod 000`, `0100`, `0644` on a directory) are
// allowed on Linux, where the owner still sees, stats, searches and removes them as the mode
// says. The format keeps an IV file inside every directory, which the engine must read to
// open one and remove to remove one, and a lookup lists the directory (an entry's binding is
// not computable from its name). A daemon running as root never notices (it passes every
// permission check); a user's own mount, or a root daemon acting as the owner, needs the
// owner's `rwx` for a moment: granted, used and taken back under one lock, so a second grant
// never takes the first one's temporary mode for the directory's own. A crash inside a grant
// leaves the directory with `u+rwx` added, nothing else.

/// The lock of [`with_owner_rwx`].
static GRANT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How many grants [`with_owner_rwx`] has made in this process (see [`grants`]).
static GRANTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many [`with_owner_rwx`] calls are between making a grant and putting the mode back.
static IN_GRANT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// [`grants`] when no grant is in progress (`None` while one is): a caller that reads a
/// mode it wants to keep reads this before and after, and keeps the mode only if both are
/// the same `Some`, so it never keeps a mode that a grant added for a moment.
pub fn grants_settled() -> Option<u64> {
    use std::sync::atomic::Ordering::SeqCst;
    (IN_GRANT.load(SeqCst) == 0).then(|| GRANTS.load(SeqCst))
}

/// The number of grants made so far: a caller that reads it before and after a step knows
/// whether the step (or another thread meanwhile) moved some object's change time with a
/// grant, and can tell whoever caches that time (a FUSE mount tells the kernel).
pub fn grants() -> u64 {
    GRANTS.load(std::sync::atomic::Ordering::Relaxed)
}

thread_local! {
    /// Whether this thread holds `GRANT` (grants nest: a directory and its parent).
    static GRANTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the owner's `rwx` added for the moment to the mode of the directory behind
/// `fd` (any fd on it, `O_PATH` too; `rw` for a regular file, which the daemon must open for
/// reading and writing to serve a writer that the kernel let in, also after a chmod to 0444
/// or for a write-only mode 0200), if this thread's filesystem uid owns it and its mode
/// lacks them; then puts the mode back (unless something changed it meanwhile). For a step
/// that already failed with EACCES. Calls nest.
pub fn with_owner_rwx<T, E>(fd: BorrowedFd<'_>, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let nested = GRANTING.get();
    let _lock = (!nested).then(|| GRANT.lock().unwrap_or_else(|e| e.into_inner()));
    GRANTING.set(true);
    IN_GRANT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let granted = grant(fd);
    let r = f();
    if let Some((mode, granted_mode, ino)) = granted {
        if super::fstat(fd).is_ok_and(|now| now.st_mode & 0o7777 == granted_mode) {
            if let Err(e) = super::chmod_fd(fd, mode) {
                tracing::warn!("backing inode {ino}: mode {mode:o} not restored: {e}");
            }
        }
    }
    IN_GRANT.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    GRANTING.set(nested);
    r
}

/// Adds `u+rwx` to the directory (`u+rw` to the regular file) behind `fd` if it is ours and
/// lacks them: its old mode, the granted mode and the inode number, or `None` if nothing
/// changed.
fn grant(fd: BorrowedFd<'_>) -> Option<(u32, u32, u64)> {
    let st = super::fstat(fd).ok()?;
    let mode = st.st_mode & 0o7777;
    let need = match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => 0o700,
        libc::S_IFREG => 0o600,
        _ => return None,
    };
    if st.st_uid != fs_uid() || mode & need == need {
        return None;
    }
    match super::chmod_fd(fd, mode | need) {
        Ok(()) => {
            GRANTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some((mode, mode | need, st.st_ino))
        }
        Err(e) => {
            tracing::debug!("backing inode {}: owner access not granted: {e}", st.st_ino);
            None
        }
    }
}

/// Runs `f`, a step that reaches a name inside the directory behind `dir` (stat, an `O_PATH`
/// or content open, a link from it), and if the backing store refuses it with EACCES
/// (`denied`), runs it once more with the owner's `rwx` granted on that directory for the
/// moment ([`with_owner_rwx`]). The kernel let the caller reach the object (through another
/// hard link, or an fd opened before a `chmod` of its directory to 0600), so the daemon's own
/// way to it by name must not fail where tmpfs, which needs no name, does not.
pub fn in_dir_as_owner<T, E>(
    dir: BorrowedFd<'_>,
    denied: impl Fn(&E) -> bool,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    match f() {
        Err(e) if denied(&e) => with_owner_rwx(dir, f),
        r => r,
    }
}

/// Whether an I/O error is EACCES (for [`in_dir_as_owner`]).
pub fn is_eacces(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EACCES)
}

/// Runs `f`, a step of the crash sweep or of `fsck --repair` on the directories behind
/// `dirs` (a rename between two of them, an unlink in one), with the least rights that can
/// make it: when this process is privileged (effective uid 0) and does not already act as a
/// caller, with the filesystem uid of the directories' owner (and the group of the first
/// one), so that the step can do nothing their owner could not do herself. Directories of
/// different owners are refused (`EPERM`, naming both): a step that needs the rights of two
/// users is never made as root on their behalf. Root-owned directories are acted on as root;
/// an unprivileged process acts with its own rights, as always.
pub fn as_owner_of<T>(dirs: &[BorrowedFd<'_>], f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    if super::euid() != 0 || ACTING.with_borrow(|a| a.is_some()) {
        return f();
    }
    let mut owner: Option<(u32, u32)> = None;
    for d in dirs {
        let st = super::fstat(*d)?;
        match owner {
            None => owner = Some((st.st_uid, st.st_gid)),
            Some((uid, _)) if uid == st.st_uid => {}
            Some((uid, _)) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the directories belong to different users (uid {uid} and {}); not acted on as root",
                        st.st_uid
                    ),
                ))
            }
        }
    }
    match owner {
        Some((uid, gid)) if uid != 0 => {
            let _guard = act_as(uid, gid, Vec::new())?;
            f()
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Two directories of `uid`s made in a fresh temporary directory (root only).
    fn dirs_of(uids: [u32; 2]) -> (std::path::PathBuf, Vec<std::os::fd::OwnedFd>) {
        let top = std::env::temp_dir().join(format!("veilfs-as-owner-{}-{}-{}", std::process::id(), uids[0], uids[1]));
        let _ = std::fs::remove_dir_all(&top);
        std::fs::create_dir(&top).unwrap();
        let mut fds = Vec::new();
        for (i, uid) in uids.into_iter().enumerate() {
            let d = top.join(i.to_string());
            std::fs::create_dir(&d).unwrap();
            std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
            fds.push(super::super::open_dir_path(&d).unwrap());
        }
        (top, fds)
    }

    #[test]
    fn a_repair_step_on_two_users_directories_is_refused_and_on_one_users_runs_as_her() {
        if super::super::euid() != 0 {
            return; // acting as another user needs root
        }
        let (top, fds) = dirs_of([60_001, 60_002]);
        let ran = std::cell::Cell::new(false);
        let r = as_owner_of(&[fds[0].as_fd(), fds[1].as_fd()], || {
            ran.set(true);
            Ok(())
        });
        let e = r.unwrap_err();
        assert!(!ran.get() && e.kind() == io::ErrorKind::PermissionDenied && e.to_string().contains("different users"));
        std::fs::remove_dir_all(&top).unwrap();

        let (top, fds) = dirs_of([60_001, 60_001]);
        as_owner_of(&[fds[0].as_fd(), fds[1].as_fd()], || {
            assert_eq!(fs_uid(), 60_001, "the step runs as the directories' owner");
            super::super::mkdirat(fds[0].as_fd(), b"made", 0o700)
        })
        .unwrap();
        let st = super::super::fstatat(fds[0].as_fd(), b"made").unwrap();
        assert_eq!((st.st_uid, st.st_gid), (60_001, 60_001), "what the step made belongs to her");
        assert_eq!(fs_uid(), 0, "back to root afterwards");
        std::fs::remove_dir_all(&top).unwrap();
    }
}
