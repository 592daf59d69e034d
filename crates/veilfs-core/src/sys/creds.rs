//! Acting as the calling user: a daemon running as root for `--allow-other` makes changes
//! with the requesting user's filesystem ids and groups, so that even a missed race acts with
//! that user's rights, not root's. fsuid/fsgid are per thread in Linux; supplementary groups
//! are per thread too when set with the raw system call (glibc's setgroups() would change
//! every thread of the daemon; rustix's `set_thread_groups` is that raw call).

use std::io;

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

/// What `/proc/PID/status` says of a process's rights: its supplementary groups and whether
/// its effective capabilities hold `CAP_FSETID` (which keeps set-id bits through a write).
#[derive(Debug, Clone, Default)]
pub struct ProcCreds {
    /// Supplementary groups.
    pub groups: Vec<libc::gid_t>,
    /// `CAP_FSETID` is effective.
    pub cap_fsetid: bool,
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
    Ok(ProcCreds { groups, cap_fsetid: caps & (1 << CAP_FSETID) != 0 })
}

/// The supplementary groups of process `pid` (from `/proc/PID/status`), for [`act_as`].
pub fn groups_of(pid: u32) -> io::Result<Vec<libc::gid_t>> {
    creds_of(pid).map(|c| c.groups)
}
