//! Who holds a vault lock: read from the kernel, never from a file in CIPHERDIR.
//!
//! Why: CIPHERDIR may be a synced folder, and anything written into it travels to other
//! machines, where a holder's name would block or mislead (a pid of another host means
//! nothing there). The vault lock is an `flock(2)` on a file without content ([`crate::lock`]),
//! and the kernel knows who holds it: every process's open files are under `/proc/PID/fd`,
//! and `/proc/PID/fdinfo/N` lists the `flock` held through that open file (`lock:` lines).
//! A mount's daemon inherits its lock from the process that took it (which then exits), and
//! `/proc/locks` keeps naming that first process; the open file names the one that holds it
//! now. Processes of other users cannot be looked into without root: then `/proc/locks`
//! (readable by all) gives the pid that took the lock, if it is still alive.
//!
//! This module only names holders for messages and for "is it unmounting?" waits; whether a
//! lock is free is decided by `flock` alone. It uses nothing of the crate but `sys`, so the
//! error type can name a holder without depending on the lock itself.

use crate::sys;

/// The [`Holder::command`] that stands for `--shared-storage` mounts, which keep a mount that
/// caches out (see [`crate::lock::SharedLock`]) without naming themselves.
pub const SHARED_MOUNTS: &str = "mount --shared-storage";

/// Who holds a vault lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Process id of the holder (0: unknown, e.g. a process of another machine on a network
    /// filesystem whose locks reach across machines).
    pub pid: u32,
    /// Host name of the holder's machine (empty: unknown).
    pub host: String,
    /// The veilfs command holding it (`mount`, `import`, `fsck`), [`SHARED_MOUNTS`], or
    /// empty when the holder is not veilfs (then see `program`).
    pub command: String,
    /// The holder's program name (`/proc/PID/comm`), when known.
    pub program: String,
}

impl Holder {
    /// The holder that stands for live `--shared-storage` mounts (no pid: there may be many).
    pub fn shared_mounts() -> Holder {
        Holder { pid: 0, host: sys::host_name(), command: SHARED_MOUNTS.to_string(), program: String::new() }
    }

    /// A holder this machine cannot name.
    pub fn unknown() -> Holder {
        Holder { pid: 0, host: String::new(), command: String::new(), program: String::new() }
    }

    /// Process `pid` of this machine, named from its command line.
    pub fn process(pid: u32) -> Holder {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let program = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string();
        Holder { pid, host: sys::host_name(), command: veilfs_command(&cmdline).unwrap_or_default(), program }
    }

    /// Whether the holder runs on this machine.
    pub fn is_this_host(&self) -> bool {
        !self.host.is_empty() && self.host == sys::host_name()
    }

    /// "mounted by pid 12 on host h", "in use by `veilfs import` (pid 12) on host h", "locked
    /// by pid 12 (`flock`) on host h", or, for a holder this machine cannot see, what it may be.
    pub fn describe(&self) -> String {
        if self.command == SHARED_MOUNTS {
            "mounted with --shared-storage (by this machine or another sharing CIPHERDIR)".to_string()
        } else if self.pid == 0 {
            "locked by a process this machine cannot see (on another machine sharing CIPHERDIR over a network \
             filesystem whose locks reach across machines, or of another user or PID namespace)"
                .to_string()
        } else if self.command == "mount" {
            format!("mounted by pid {} on host {}", self.pid, self.host)
        } else if !self.command.is_empty() {
            format!("in use by `veilfs {}` (pid {}) on host {}", self.command, self.pid, self.host)
        } else if self.program == "veilfs" {
            // Its command line is gone: it is exiting.
            format!("in use by veilfs (pid {}, ending) on host {}", self.pid, self.host)
        } else {
            let program = if self.program.is_empty() { "?" } else { &self.program };
            format!("locked by pid {} (`{}`, not veilfs) on host {}", self.pid, program.replace('\n', " "), self.host)
        }
    }
}

/// The veilfs command a command line runs: `mount` for the mount helpers
/// (`mount.veilfs`, `mount.fuse.veilfs` and `mount.fuse3 …#veilfs` style), else the first
/// argument that names a command that takes the vault lock.
pub fn veilfs_command(cmdline: &[u8]) -> Option<String> {
    let mut args = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty());
    let argv0 = args.next()?;
    let base = argv0.rsplit(|&b| b == b'/').next().unwrap_or(argv0);
    if base.starts_with(b"mount.") && base.windows(6).any(|w| w == b"veilfs") {
        return Some("mount".into());
    }
    if base != b"veilfs" {
        return None;
    }
    const COMMANDS: &[&str] = &["mount", "import", "fsck", "passwd", "export", "ls", "cat", "info", "init"];
    args.find_map(|a| COMMANDS.iter().find(|c| c.as_bytes() == a).map(|c| c.to_string()))
}

/// One line of `/proc/locks` (or an fdinfo `lock:` line after its tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockLine {
    /// An `flock` (not a POSIX or OFD lock).
    pub flock: bool,
    /// Exclusive (`WRITE`), not shared.
    pub write: bool,
    /// The pid the kernel shows (the process that took the lock).
    pub pid: u32,
    /// The device (major, minor) of the locked file's filesystem.
    pub dev: (u32, u32),
    /// The locked file's inode number.
    pub ino: u64,
}

/// Parses `1: FLOCK  ADVISORY  WRITE 25544 fe:00:5415163 0 EOF`; `None` for a waiter's line
/// (`1: -> FLOCK …`) and anything else.
pub fn parse_lock_line(line: &str) -> Option<LockLine> {
    let mut f = line.split_whitespace();
    f.next()?.strip_suffix(':')?;
    let kind = f.next()?;
    let _advisory = f.next()?;
    let write = match f.next()? {
        "WRITE" => true,
        "READ" => false,
        _ => return None,
    };
    let pid = f.next()?.parse::<i64>().ok().and_then(|p| u32::try_from(p).ok())?;
    let mut id = f.next()?.split(':');
    let major = u32::from_str_radix(id.next()?, 16).ok()?;
    let minor = u32::from_str_radix(id.next()?, 16).ok()?;
    let ino = id.next()?.parse().ok()?;
    if id.next().is_some() {
        return None;
    }
    Some(LockLine { flock: kind == "FLOCK", write, pid, dev: (major, minor), ino })
}

/// The processes of this machine that hold an `flock` on the file `st` describes (exclusive
/// ones only when `write`), named; found through their open files, else through
/// `/proc/locks`. Empty when none is visible.
pub fn holders_of(st: &sys::Stat, write: bool) -> Vec<Holder> {
    let mut pids = holding_processes(st, write);
    if pids.is_empty() {
        let dev = (libc::major(st.st_dev), libc::minor(st.st_dev));
        let text = std::fs::read_to_string("/proc/locks").unwrap_or_default();
        pids = text
            .lines()
            .filter_map(parse_lock_line)
            .filter(|l| l.flock && (l.write || !write) && l.dev == dev && l.ino == st.st_ino)
            .map(|l| l.pid)
            .filter(|&p| p != 0 && sys::process_exists(p))
            .collect();
        pids.dedup();
    }
    pids.into_iter().map(Holder::process).collect()
}

/// The first holder [`holders_of`] finds, or an unknown one.
pub fn holder_of(st: &sys::Stat, write: bool) -> Holder {
    holders_of(st, write).into_iter().next().unwrap_or_else(Holder::unknown)
}

/// Pids whose open files include `st`'s file with an `flock` on it (fdinfo `lock:` lines).
fn holding_processes(st: &sys::Stat, write: bool) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return found };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let same = std::fs::metadata(fd.path()).is_ok_and(|m| m.dev() == st.st_dev && m.ino() == st.st_ino);
            if !same {
                continue;
            }
            let info = std::fs::read_to_string(p.path().join("fdinfo").join(fd.file_name())).unwrap_or_default();
            let locked = info
                .lines()
                .filter_map(|l| l.strip_prefix("lock:"))
                .filter_map(|l| parse_lock_line(l.trim()))
                .any(|l| l.flock && (l.write || !write));
            if locked && !found.contains(&pid) {
                found.push(pid);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn lock_lines_parse_as_the_kernel_writes_them() {
        let l = parse_lock_line("1: FLOCK  ADVISORY  WRITE 25544 fe:00:5415163 0 EOF").unwrap();
        assert_eq!(l, LockLine { flock: true, write: true, pid: 25544, dev: (0xfe, 0), ino: 5_415_163 });
        let l = parse_lock_line("12: POSIX  ADVISORY  READ 7 08:01:42 0 EOF").unwrap();
        assert!(!l.flock && !l.write && l.dev == (8, 1));
        assert_eq!(parse_lock_line("1: -> FLOCK  ADVISORY  WRITE 25545 fe:00:5415163 0 EOF"), None);
        assert_eq!(parse_lock_line("2: OFDLCK ADVISORY  WRITE -1 fe:00:5415163 0 EOF").map(|l| l.pid), None);
        for junk in ["", "x", "1: FLOCK ADVISORY WRITE 1 fe:00 0 EOF", "1: FLOCK ADVISORY WRITE 1 zz:00:1 0 EOF"] {
            assert_eq!(parse_lock_line(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn command_lines_name_the_veilfs_command() {
        let c = |s: &str| veilfs_command(s.replace(' ', "\0").as_bytes());
        assert_eq!(c("/usr/bin/veilfs mount /v /m --passfile p"), Some("mount".into()));
        assert_eq!(c("veilfs --verbose import src /v"), Some("import".into()));
        assert_eq!(c("/sbin/mount.fuse.veilfs /v /m -o rw"), Some("mount".into()));
        assert_eq!(c("/usr/sbin/mount.veilfs /v /m"), Some("mount".into()));
        assert_eq!(c("flock /v/veilfs.lock sleep 9"), None);
        assert_eq!(c("veilfs"), None);
        assert_eq!(c(""), None);
    }

    #[test]
    fn a_held_flock_is_found_with_its_process_and_a_free_file_has_no_holder() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("f");
        std::fs::write(&path, b"").unwrap();
        let a = std::fs::File::open(&path).unwrap();
        let st = sys::fstat(a.as_fd()).unwrap();
        assert!(holders_of(&st, false).is_empty());
        assert!(sys::try_flock_exclusive(a.as_fd()).unwrap());
        let found = holders_of(&st, true);
        assert_eq!(found.iter().map(|h| h.pid).collect::<Vec<_>>(), vec![std::process::id()]);
        assert!(found[0].is_this_host() && found[0].command.is_empty(), "{found:?}");
        assert!(found[0].describe().starts_with(&format!("locked by pid {} (`", std::process::id())));
        drop(a);
        assert!(holders_of(&st, false).is_empty());
    }
}
