//! `veilfs mount` and `veilfs umount`.
//!
//! By default the mount daemonizes: the parent unlocks the vault (asking for the password),
//! forks, and exits 0 only once the child reports a live mount (the kernel's INIT answered),
//! or non-zero with the child's error. SIGINT, SIGTERM and SIGHUP unmount cleanly; so do
//! `veilfs umount`, `fusermount3 -u` and `umount`.
//!
//! Under systemd (`NOTIFY_SOCKET` set) the process that serves the mount sends `READY=1`
//! once the mount is live, so a `Type=notify` unit is started only when its mount works.
//! mount(8), fstab lines and systemd mount units reach `run` through `-o` lists (see
//! `mountopts`) and the `mount.fuse.veilfs` helper (see `helper`).

use super::mountargs::Args;
use crate::exit::{Exit, BAD_PATH, MOUNT};
use anyhow::Result;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use veilfs_core::sys::{self, process};

fn mount_err(msg: impl std::fmt::Display) -> anyhow::Error {
    Exit::new(MOUNT, anyhow::anyhow!("{msg}")).into()
}

/// A mount point that is wrong (missing, not a directory, not empty, stale): exit code 4.
fn path_err(msg: impl std::fmt::Display) -> anyhow::Error {
    Exit::new(BAD_PATH, anyhow::anyhow!("{msg}")).into()
}

/// `path` made absolute: resolved when it can be; otherwise (a stale mount answers stat with
/// ENOTCONN) its parent resolved and the last component kept.
fn absolute(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (abs.parent().and_then(|d| d.canonicalize().ok()), abs.file_name()) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => abs,
    }
}

/// The message for a mount point left behind by a daemon that died.
fn stale_mount(mp: &Path) -> anyhow::Error {
    path_err(format!(
        "{} is a stale mount: the veilfs process serving it is gone (Transport endpoint is not connected); \
         clear it with `fusermount3 -u {}` (as root: `umount -l {}`), then mount again",
        mp.display(),
        mp.display(),
        mp.display()
    ))
}

/// Checks that this user can open /dev/fuse, with a message that says what to do.
fn check_dev_fuse() -> Result<()> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(mount_err("/dev/fuse is missing: load the fuse module (modprobe fuse) or install fuse3"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(mount_err(
            "this user may not use FUSE: /dev/fuse cannot be opened (Permission denied); an administrator can allow \
             it (on most distributions /dev/fuse is mode 0666), or in a container start it with --device /dev/fuse",
        )),
        Err(e) => Err(mount_err(format!("/dev/fuse cannot be opened: {e}"))),
    }
}

/// Checks the mount point before any password is asked for: it exists, is a directory, is
/// not a stale mount, is empty unless `--nonempty`, and the mount would not hide CIPHERDIR.
/// Each problem is the path being wrong (exit code 4), named absolute. A directory that is
/// already a mount point is fine: the kernel stacks the new mount on top, as for any
/// filesystem (`veilfs umount` then removes the top one).
fn check_mount_point(a: &Args, cipherdir: &Path) -> Result<PathBuf> {
    let mountpoint = absolute(&a.mountpoint);
    match std::fs::metadata(&mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Err(stale_mount(&mountpoint)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(path_err(format!(
                "mount point {} does not exist (create it with mkdir -p {})",
                mountpoint.display(),
                mountpoint.display()
            )))
        }
        Err(e) => return Err(path_err(format!("mount point {}: {e}", mountpoint.display()))),
        Ok(m) if !m.is_dir() => {
            return Err(path_err(format!("mount point {} is not a directory", mountpoint.display())))
        }
        Ok(_) => {}
    }
    if mountpoint.starts_with(cipherdir) {
        return Err(path_err("the mount point must not be inside CIPHERDIR"));
    }
    if cipherdir.starts_with(&mountpoint) {
        return Err(path_err(format!(
            "mounting on {} would hide CIPHERDIR {} under the mount; choose another mount point",
            mountpoint.display(),
            cipherdir.display()
        )));
    }
    if !a.nonempty && std::fs::read_dir(&mountpoint).map(|mut d| d.next().is_some()).unwrap_or(false) {
        return Err(path_err(format!(
            "mount point {} is not empty (use --nonempty to mount over it)",
            mountpoint.display()
        )));
    }
    Ok(mountpoint)
}

/// True when /etc/fuse.conf has a `user_allow_other` line (fuse.conf(5)).
fn user_allow_other() -> bool {
    std::fs::read_to_string("/etc/fuse.conf")
        .is_ok_and(|t| t.lines().any(|l| l.split('#').next().is_some_and(|l| l.trim() == "user_allow_other")))
}

/// allow_other by a user other than root needs the administrator's consent in fuse.conf;
/// says so before any password is asked for (fusermount3 would fail only after).
fn check_allow_other(a: &Args) -> Result<()> {
    if a.allow_other && sys::euid() != 0 && !user_allow_other() {
        return Err(mount_err(
            "allow_other is only allowed for users other than root when /etc/fuse.conf has a line \
             `user_allow_other` (an administrator adds it); mount without allow_other, or as root",
        ));
    }
    Ok(())
}

/// Runs `veilfs mount`.
pub fn run(mut a: Args) -> Result<i32> {
    let sloppy = a.sloppy;
    super::mountopts::apply(&mut a, sloppy)?;
    if a.remount {
        return remount(&a);
    }
    let cipherdir = match a.cipherdir.canonicalize() {
        Ok(c) => c,
        Err(_) => return Err(veilfs_core::Error::not_a_vault(&a.cipherdir).into()),
    };
    let mountpoint = check_mount_point(&a, &cipherdir)?;
    check_dev_fuse()?;
    check_allow_other(&a)?;
    if a.reverse {
        // A reverse view writes nothing into PLAINDIR: no vault lock.
        return run_reverse(&a, &cipherdir, &mountpoint);
    }
    let mut lock = take_lock(&a, &cipherdir)?;
    let vault = Arc::new(a.unlock.open_trusting(&cipherdir, a.rollback.trust())?);
    // Kept to write what the mount saw at its end (the vault itself goes with the session).
    let known = vault.known().cloned();
    if lock.last_writer_crashed() && !a.read_only {
        // The last writer crashed: settle the files it left mid-write before serving
        // (docs/FORMAT.md §5.8), so the kernel never caches a size the crash rules shorten,
        // and finish its interrupted exchanges (§10).
        match veilfs_core::settle::crash_sweep(&vault) {
            Ok(n) => {
                if n != Default::default() {
                    tracing::warn!(
                        "{}: recovered crash state: settled {} file(s) left mid-write, finished {} exchange(s)",
                        cipherdir.display(),
                        n.files,
                        n.exchanges
                    );
                }
                // Swept: a clean end of this mount clears the crash mark.
                if let MountLock::Vault(l) = &mut lock {
                    l.swept();
                }
            }
            Err(e) => tracing::warn!("{}: crash sweep: {e}", cipherdir.display()),
        }
    }
    let ready = if a.foreground { None } else { Some(daemonize()?) };
    serve(&a, &cipherdir, &mountpoint, ready, lock, |cfg, activity| {
        veilfs_fuse::mount(vault, mountpoint.as_path(), cfg, activity)
    })?;
    if let Some(Err(e)) = known.map(|k| k.flush()) {
        tracing::warn!("{e}");
    }
    Ok(crate::exit::OK)
}

/// `mount -o remount,… MOUNTPOINT` or `veilfs mount -o remount,… CIPHERDIR MOUNTPOINT`:
/// changes the generic flags of the live veilfs mount at MOUNTPOINT, as `mount -i -o remount`
/// would. mount(8) runs the helper with the whole list, the live mount's flags merged with the
/// new ones and a default flag left out (`remount,exec` on a noexec mount arrives as
/// `rw,nosuid,nodev,relatime,remount`), so from mount(8) the list is the new state, starting
/// from mount(8)'s defaults; `veilfs mount -o remount,…` changes only what it names. Only root
/// can (fusermount3 cannot change a live mount). A mount made `ro`
/// stays read-only: its daemon serves the vault read-only (and did not settle a crashed
/// writer's files), so `rw` is refused for it; a mount made read-write can go `ro` and back.
fn remount(a: &Args) -> Result<i32> {
    let mp = absolute(&a.mountpoint);
    let m = match crate::mountinfo::find(&mp) {
        Some(m) if m.is_veilfs() => m,
        Some(m) => return Err(path_err(format!("{} is not a veilfs mount (it is {})", mp.display(), m.fstype))),
        None => return Err(path_err(format!("{} is not mounted: nothing to remount", mp.display()))),
    };
    if sys::euid() != 0 {
        return Err(mount_err(format!(
            "only root can change the flags of a live mount (-o remount): fusermount3, which makes a user's \
             mounts, cannot; unmount {} and mount it again with the new options",
            mp.display()
        )));
    }
    let now = m.flags();
    let mut flags = if a.mount_helper {
        // Without an atime mode named, the kernel keeps the mount's (as mount(2) does).
        veilfs_core::sys::process::MountFlags {
            noatime: now.noatime,
            strictatime: now.strictatime,
            ..Default::default()
        }
    } else {
        now
    };
    for o in &a.flag_options {
        super::mountopts::generic_flag(&mut flags, o);
    }
    if m.super_read_only() && !flags.read_only {
        return Err(mount_err(format!(
            "{} was mounted read-only (ro): its veilfs daemon serves the vault read-only, so it cannot become \
             read-write; unmount it and mount it again without ro",
            mp.display()
        )));
    }
    if let Err(e) = process::remount(&mp, &flags, m.super_read_only()) {
        let why = if e.raw_os_error() == Some(libc::EBUSY) {
            "busy (a file in it is open for writing)".to_string()
        } else {
            e.to_string()
        };
        return Err(mount_err(format!("cannot remount {}: {why}", mp.display())));
    }
    Ok(crate::exit::OK)
}

/// `veilfs mount --reverse PLAINDIR MOUNTPOINT`: always read-only.
fn run_reverse(a: &Args, plaindir: &Path, mountpoint: &Path) -> Result<i32> {
    let excludes = veilfs_core::reverse::Excludes::new(plaindir, &a.exclude, &a.exclude_from)
        .map_err(|e| Exit::new(crate::exit::USAGE, e))?;
    let mut rv = a.unlock.open_reverse(plaindir)?;
    rv.set_excludes(excludes);
    let rv = Arc::new(rv);
    let ready = if a.foreground { None } else { Some(daemonize()?) };
    serve(a, plaindir, mountpoint, ready, MountLock::None, |cfg, activity| {
        veilfs_fuse::mount_reverse(rv, mountpoint, cfg, activity)
    })?;
    Ok(crate::exit::OK)
}

/// What a mount holds of its vault's locks (see `veilfs_core::lock`), released when it ends.
enum MountLock {
    /// A mount that caches: the vault lock, which also keeps shared-storage mounts out.
    Vault(veilfs_core::VaultLock),
    /// A `--shared-storage` mount: keeps mounts that cache out.
    Shared { _held: veilfs_core::lock::SharedLock },
    /// A reverse view, which writes nothing into its PLAINDIR.
    None,
}

impl MountLock {
    /// Whether the last writer of the vault on this machine did not end cleanly.
    fn last_writer_crashed(&self) -> bool {
        matches!(self, MountLock::Vault(l) if l.last_writer_crashed())
    }
}

/// The locks of this mount. A mount that caches takes the vault lock and keeps
/// `--shared-storage` mounts out; a shared-storage mount keeps mounts that cache out (the
/// kernel caches for an hour on a locked mount: another writer's changes would go unseen).
/// A holder of this machine whose mount is gone from the mount table is unmounting: it is
/// waited for a moment.
fn take_lock(a: &Args, cipherdir: &Path) -> Result<MountLock> {
    let here = || match crate::mountinfo::find_veilfs_source(cipherdir) {
        Ok(m) => m.into_iter().collect::<Vec<_>>(),
        Err(many) => many,
    };
    if a.shared_storage {
        veilfs_core::VaultConfig::load(cipherdir)?;
        let ending = |h: &veilfs_core::holder::Holder| h.command == "mount" && h.is_this_host() && here().is_empty();
        return Ok(MountLock::Shared { _held: veilfs_core::lock::SharedLock::acquire(cipherdir, &ending)? });
    }
    let lock = a.lock.take(cipherdir, "mount")?;
    if let Err(e) = lock.exclude_shared_mounts(&|| here().is_empty()) {
        let at: Vec<String> = here().iter().map(|m| m.mount_point.display().to_string()).collect();
        if at.is_empty() {
            return Err(e.into());
        }
        return Err(
            Exit::new(crate::exit::IN_USE, anyhow::anyhow!("{e} (on this machine at {})", at.join(", "))).into()
        );
    }
    Ok(MountLock::Vault(lock))
}

/// Forks. The parent waits for the child's report and exits; the child gets the pipe's
/// write end. Must run before any thread exists.
fn daemonize() -> Result<OwnedFd> {
    let (r, w) = process::pipe()?;
    // The CLI starts no threads before mounting (fork refuses otherwise).
    match process::fork()? {
        process::Forked::Child => {
            drop(r);
            // Detach from the terminal's session (cannot fail: a fresh child leads no group).
            let _ = process::setsid();
            Ok(w)
        }
        process::Forked::Parent(_) => {
            drop(w);
            let mut msg = String::new();
            let _ = std::fs::File::from(r).read_to_string(&mut msg);
            if msg == "ok" {
                std::process::exit(0);
            }
            let msg =
                if msg.is_empty() { "the mount daemon exited before the mount was ready".to_string() } else { msg };
            eprintln!("veilfs: error: {msg}");
            std::process::exit(MOUNT);
        }
    }
}

/// Mounts with `mount` (the forward or the reverse front end) and serves until unmounted.
fn serve<FS: fuser::Filesystem + Send + Sync + 'static>(
    a: &Args,
    cipherdir: &Path,
    mountpoint: &Path,
    ready: Option<OwnedFd>,
    lock: MountLock,
    mount: impl FnOnce(&veilfs_fuse::MountConfig, Arc<veilfs_fuse::Activity>) -> std::io::Result<fuser::Session<FS>>,
) -> Result<()> {
    let report = |ready: &Option<OwnedFd>, msg: &str| {
        if let Some(w) = ready {
            if let Ok(w) = w.try_clone() {
                let _ = std::fs::File::from(w).write_all(msg.as_bytes());
            }
        }
    };
    // Hardening: no core dumps and no ptrace by same-user processes of the daemon holding
    // the keys. Only as root: an undumpable process owned by a user cannot open its own
    // /proc/self/fd/* paths, which the xattr calls on files need.
    if sys::euid() == 0 {
        let _ = process::set_undumpable();
    }
    // The kernel already applied the caller's umask to modes it sends.
    process::set_umask(0);
    // Every directory the kernel knows holds an open fd: allow as many as the hard limit.
    let _ = process::raise_fd_limit();
    // SIGINT/SIGTERM/SIGHUP wait, in this and every later thread, for the signal thread.
    let signals = process::block_signals(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])?;
    let activity = Arc::new(veilfs_fuse::Activity::default());
    let ttl = cache_time(a);
    let cfg = veilfs_fuse::MountConfig {
        fs: veilfs_fuse::FsOptions {
            read_only: a.read_only || a.reverse,
            shared_storage: a.shared_storage,
            ttl,
            negative_ttl: ttl,
            writeback: !a.no_writeback && !a.shared_storage,
            noatime: a.noatime,
            strictatime: a.strictatime,
            check_permissions: !a.allow_other,
        },
        allow_other: a.allow_other,
        threads: a.threads,
        fsname: fsname_option(a.fsname.clone().unwrap_or_else(|| cipherdir.display().to_string())),
        flags: veilfs_core::sys::process::MountFlags { read_only: a.read_only || a.reverse, ..a.flags },
    };
    let session = match mount(&cfg, activity.clone()) {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("cannot mount {} on {}: {e}", cipherdir.display(), mountpoint.display());
            drop(lock);
            if ready.is_some() {
                // The parent prints it: once.
                report(&ready, &msg);
                std::process::exit(MOUNT);
            }
            return Err(mount_err(msg));
        }
    };
    // The flags neither mount(2)'s data nor fusermount3 takes: root sets them on the live
    // mount (a user's mount refused them in `mountopts`).
    let f = &cfg.flags;
    if sys::euid() == 0 && (f.nodiratime || f.nosymfollow || f.strictatime) {
        if let Err(e) = process::remount(mountpoint, f, f.read_only) {
            let msg = format!("cannot set nodiratime, nosymfollow or strictatime on {}: {e}", mountpoint.display());
            let _ = process::unmount(mountpoint, true);
            drop(lock);
            if ready.is_some() {
                report(&ready, &msg);
                std::process::exit(MOUNT);
            }
            return Err(mount_err(msg));
        }
    }
    spawn_signal_thread(signals, mountpoint.to_path_buf());
    if let Some(idle) = a.idle {
        spawn_idle_thread(idle, activity.clone(), mountpoint.to_path_buf());
    }
    notify_ready(ready.is_some(), cipherdir, mountpoint);
    match &ready {
        Some(_) => {
            use crate::logging::Destination;
            // Said while the terminal is still there: where to look when something fails.
            match crate::logging::to_system_log() {
                Destination::File(p) => {
                    eprintln!("veilfs: no journal or syslog on this machine: the mount logs to {}", p.display())
                }
                Destination::Nowhere(p, e) => {
                    eprintln!("veilfs: warning: no journal or syslog, and no log file {}: {e}", p.display())
                }
                Destination::Journal | Destination::Syslog => {}
            }
            report(&ready, "ok");
            drop(ready);
            detach_stdio();
        }
        None => {
            if crate::logging::stderr_is_journal() {
                crate::logging::to_system_log();
            }
            eprintln!("veilfs: {} mounted on {} (Ctrl-C unmounts)", cipherdir.display(), mountpoint.display())
        }
    }
    tracing::info!("mounted {} on {}", cipherdir.display(), mountpoint.display());
    // Serve on fuser's background thread and wait until the filesystem is torn down (an
    // unmount by anyone). The background session is then forgotten, not dropped: dropping
    // it would unmount the mount point *by path* a second time, and fuser 0.18 takes POLLERR
    // on /dev/fuse for "still mounted", so under load that could hit a new mount at the same
    // place. Our own unmounts (signals, --idle) happen while the mount is live.
    let bg = session.spawn().map_err(|e| mount_err(format!("cannot start the FUSE session: {e}")))?;
    activity.wait_ended();
    std::mem::forget(bg);
    // The filesystem is torn down (destroy ran, the keys are gone): the vault is free again.
    drop(lock);
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("unmounted {}", mountpoint.display());
    Ok(())
}

/// How long the kernel caches names and attributes on a mount that holds the vault lock.
///
/// Such a mount is CIPHERDIR's only writer (`veilfs_core::lock`), and every change it makes
/// reaches the kernel: in the reply of the request that made it, by the kernel's own
/// bookkeeping (unlink, rename, xattr, read atime), or by an invalidation the daemon sends
/// (`veilfs_fuse::VeilFs::invalidate_attr`). So nothing would go stale with no limit at all;
/// an hour bounds the damage of a change that some day escapes all three, and is long beyond
/// any tree walk (a warm `git status`, `make` or `rsync` then asks the daemon nothing but
/// OPENDIR). The kernel still drops cached entries under memory pressure.
const CACHING_TTL: Duration = Duration::from_secs(3600);

/// The cache time of a reverse view: its PLAINDIR may change under it at any time, which the
/// view only learns of when asked.
const REVERSE_TTL: Duration = Duration::from_secs(1);

/// The mount's cache time: `--attr-timeout` when given, else as the mount kind wants; none
/// for `--shared-storage` (other writers change CIPHERDIR).
fn cache_time(a: &Args) -> Duration {
    match a.attr_timeout {
        _ if a.shared_storage => Duration::ZERO,
        Some(secs) => Duration::from_secs_f64(secs.max(0.0)),
        None if a.reverse => REVERSE_TTL,
        None => CACHING_TTL,
    }
}

/// The mount's source as fuser passes it on. A user's mount goes through fusermount3, which
/// reads it from a comma-separated `-o fsname=` list and takes `\,` for a comma (as libfuse
/// escapes it); root's mount(2) takes it as is.
fn fsname_option(name: String) -> String {
    if sys::euid() == 0 {
        return name;
    }
    name.replace('\\', "\\\\").replace(',', "\\,")
}

/// Tells systemd (when `NOTIFY_SOCKET` is set) that the mount is live. A daemonized mount
/// names itself as the main process: the parent that systemd started exits next (such a
/// unit needs `NotifyAccess=all`; the shipped units run `veilfs mount -f` instead).
fn notify_ready(daemonized: bool, cipherdir: &Path, mountpoint: &Path) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let status = format!("{} mounted on {}", cipherdir.display(), mountpoint.display());
    let mut states = vec![sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(&status)];
    if daemonized {
        states.push(sd_notify::NotifyState::MainPid(std::process::id()));
    }
    if let Err(e) = sd_notify::notify(&states) {
        tracing::warn!("cannot notify the service manager (NOTIFY_SOCKET): {e}");
    }
}

fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = process::stdio_to(null.as_fd());
    }
    let _ = std::env::set_current_dir("/");
}

/// Unmounts `mountpoint` (this process's own live mount). `Ok(false)` when busy.
fn unmount_live(mountpoint: &Path, lazy: bool) -> bool {
    match process::unmount(mountpoint, lazy) {
        Ok(()) => return true,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return false,
        Err(_) => {}
    }
    // Not root: the setuid helper does it.
    std::process::Command::new("fusermount3")
        .arg(if lazy { "-uz" } else { "-u" })
        .arg(mountpoint)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn spawn_signal_thread(set: process::BlockedSignals, mountpoint: PathBuf) {
    std::thread::spawn(move || {
        let wait = || set.wait();
        let sig = wait();
        tracing::info!("signal {sig}: unmounting");
        // Busy (files open inside): detach now; the mount ends when they are closed.
        if !unmount_live(&mountpoint, false) {
            unmount_live(&mountpoint, true);
        }
        wait();
        unmount_live(&mountpoint, true);
        std::process::exit(0);
    });
}

fn spawn_idle_thread(idle: Duration, activity: Arc<veilfs_fuse::Activity>, mountpoint: PathBuf) {
    std::thread::spawn(move || {
        let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        activity.last.store(now(), Ordering::Relaxed);
        let step = (idle / 10).clamp(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            std::thread::sleep(step);
            let quiet = now().saturating_sub(activity.last.load(Ordering::Relaxed));
            if quiet >= idle.as_secs().max(1) && activity.open_files.load(Ordering::Relaxed) == 0 {
                tracing::info!("idle for {quiet} s: unmounting");
                if unmount_live(&mountpoint, false) {
                    return;
                }
                // Busy (a process has its working directory inside): try again later.
            }
        }
    });
}

/// After an unmount: waits (up to 5 s) until the daemon has let go of the vault lock, so the
/// vault is free when `veilfs umount` returns (the kernel ends the mount before the daemon
/// has finished; `fusermount3 -u` does not wait, and a new writer waits for it instead).
fn wait_for_lock_release(cipherdir: &Path) {
    let t = std::time::Instant::now();
    while veilfs_core::lock::holder(cipherdir).is_some_and(|h| h.command == "mount" && h.is_this_host()) {
        if t.elapsed() > Duration::from_secs(5) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Arguments of `veilfs umount`.
#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// The mount point (or the vault, CIPHERDIR, when it is mounted once).
    #[arg(value_name = "MOUNTPOINT|CIPHERDIR")]
    pub mountpoint: PathBuf,
    /// Detach now even if busy; the mount goes away once no longer used.
    #[arg(short = 'z', long)]
    pub lazy: bool,
}

/// Runs `veilfs umount`: only a veilfs mount, found in the mount table by its decoded path.
pub fn umount(a: UmountArgs) -> Result<i32> {
    let arg = absolute(&a.mountpoint);
    let (mp, m) = match crate::mountinfo::find(&arg) {
        Some(m) => (arg, m),
        None => match crate::mountinfo::find_veilfs_source(&arg) {
            // `veilfs umount CIPHERDIR`: the one veilfs mount of that vault.
            Ok(Some(m)) => (m.mount_point.clone(), m),
            Ok(None) => {
                return Err(Exit::new(crate::exit::BAD_PATH, anyhow::anyhow!("{} is not mounted", arg.display())).into())
            }
            Err(many) => {
                let list: Vec<String> = many.iter().map(|m| m.mount_point.display().to_string()).collect();
                return Err(Exit::new(
                    crate::exit::BAD_PATH,
                    anyhow::anyhow!(
                        "the vault {} is mounted more than once ({}); name the mount point",
                        arg.display(),
                        list.join(", ")
                    ),
                )
                .into());
            }
        },
    };
    if !m.is_veilfs() {
        return Err(Exit::new(
            crate::exit::BAD_PATH,
            anyhow::anyhow!(
                "{} is not a veilfs mount (it is {} from {}); veilfs umount leaves it alone: use umount(8)",
                mp.display(),
                m.fstype,
                m.source.display()
            ),
        )
        .into());
    }
    let Err(err) = process::unmount(&mp, a.lazy) else {
        if !a.lazy {
            wait_for_lock_release(&m.source);
        }
        return Ok(crate::exit::OK);
    };
    if err.raw_os_error() == Some(libc::EBUSY) {
        anyhow::bail!("{} is busy (a process uses files in it); close them, or use --lazy", mp.display());
    }
    // Not root: the setuid helper does it.
    let st = std::process::Command::new("fusermount3")
        .arg(if a.lazy { "-uz" } else { "-u" })
        .arg(&mp)
        .status()
        .map_err(|e| anyhow::anyhow!("cannot unmount {}: {err}; fusermount3: {e}", mp.display()))?;
    if st.success() {
        if !a.lazy {
            wait_for_lock_release(&m.source);
        }
        Ok(crate::exit::OK)
    } else {
        anyhow::bail!("cannot unmount {}: {err}", mp.display())
    }
}
