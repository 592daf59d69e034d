//! The arguments of `veilfs mount`, in clap's form, and their value parsers.
//!
//! Their own module because two modules fill them in: `mount` from the command line and
//! `mountopts` from mount(8)'s `-o` lists (fstab, the `mount.fuse.veilfs` helper). Kept
//! below both, so neither needs the other's names.

use super::UnlockArgs;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `veilfs mount`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
veilfs mount ~/vault ~/private                   asks for the password, returns once mounted\n  \
veilfs mount ~/vault ~/private --idle 30m        unmounts itself after 30 minutes without use\n  \
veilfs mount ~/vault ~/private -f                stays in the foreground, logs to stderr\n  \
veilfs umount ~/private                          (or: fusermount3 -u ~/private)\n  \
mount -t fuse.veilfs ~/vault ~/private -o passfile=/etc/veilfs/pw,allow_other\n\n\
An fstab line (then `mount MOUNTPOINT` and `umount MOUNTPOINT`, as a user too with `user`):\n  \
/home/me/vault /home/me/private fuse.veilfs noauto,user,passfile=/home/me/.vault-pw 0 0\n\n\
Reverse mode (an encrypted read-only view of a plaintext directory, for backups):\n  \
veilfs mount --reverse ~/data ~/data-encrypted --exclude '*.tmp' --exclude 'cache/'\n  \
/home/me/data /home/me/data-encrypted fuse.veilfs noauto,user,reverse,passfile=/home/me/.pw,exclude=*.tmp 0 0\n\n\
--exclude takes gitignore patterns matched against paths relative to PLAINDIR: `*.log` anywhere, `/build` only \
at the top, `cache/` directories only, `**` across directories (`a/**/b`), `!keep.log` takes back an earlier \
exclude. An excluded directory is absent with everything in it: as in git, `!` cannot bring back an entry inside \
an excluded directory (exclude `dir/*` and then `!dir/keep` instead). Later patterns win; --exclude-from files \
come before --exclude patterns. Excludes go by path and a hard link is another path to the same content, so while \
any exclude is active, files with more than one link are left out of the view under every name (each named once \
in the log): break the links or back them up from a view without excludes.\n\n\
A mount locks its vault (an OS lock on the empty file veilfs.lock in CIPHERDIR, which is never written or \
removed): a second mount of this machine and the commands that write it (import, fsck --repair) are refused with \
exit code 9, naming the process that holds it; reading commands (cat, ls, export, info, fsck) and passwd work. A \
daemon that died holds nothing: the next mount says the last writer did not end cleanly and runs the crash \
sweep. The lock does not reach other machines through a synced folder (nothing can); its file never blocks them. \
Being the only writer, \
a locked mount lets the kernel cache names and attributes for an hour (--attr-timeout) and tells it of every \
change it makes itself. Use --shared-storage when several writers share CIPHERDIR (mounts on several machines, \
or a mount and offline imports): such a mount takes no vault lock and caches nothing (slower, but never stale); \
every mount of the vault must then use it: a mount that caches is refused (exit code 9) while a shared-storage \
mount is live, and a shared-storage mount while a mount that caches is.")]
pub struct Args {
    /// The vault.
    pub cipherdir: PathBuf,
    /// Where the plaintext view appears (an existing empty directory).
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub unlock: UnlockArgs,
    #[command(flatten)]
    pub rollback: super::RollbackArgs,
    /// Stay in the foreground and log to stderr (default: daemonize, log to the journal or
    /// syslog).
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount read-only.
    #[arg(long, visible_alias = "ro")]
    pub read_only: bool,
    /// Let other users access the mount (the kernel enforces file permissions).
    #[arg(long)]
    pub allow_other: bool,
    /// Unmount after this long without any access and no open files (e.g. 90s, 30m, 2h,
    /// 1h30m; a bare number is seconds).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle: Option<Duration>,
    /// Several writers at once: CIPHERDIR may change underneath (another mount, an offline
    /// `veilfs import`, a sync tool). Takes no vault lock and caches nothing (slower, never
    /// stale); refused while a mount without it is live. Without it a mount locks the vault:
    /// a second mount and the commands that write (import, fsck --repair) are
    /// refused while it is mounted.
    #[arg(long)]
    pub shared_storage: bool,
    #[command(flatten)]
    pub lock: super::LockArgs,
    /// Seconds the kernel may cache attributes and names (also "no such file" answers).
    /// Default: an hour on a mount that holds the vault lock, which tells the kernel itself
    /// of every change it makes; 1 s on a reverse view (its PLAINDIR changes under it); none
    /// with --shared-storage (this option is then ignored).
    #[arg(long, value_name = "SECS")]
    pub attr_timeout: Option<f64>,
    /// Worker threads serving requests (default: one per CPU, at least 2). More threads
    /// than CPUs only contend for the kernel's FUSE queue: on 2 CPUs, 4 threads read a
    /// stream ~20 % slower than 2.
    #[arg(long, default_value_t = default_threads(), value_parser = parse_threads)]
    pub threads: usize,
    /// Disable the kernel's writeback cache (small writes then reach veilfs one by one).
    #[arg(long)]
    pub no_writeback: bool,
    /// Reading a file never changes its access time (default: as Linux's `relatime`, the
    /// access time moves when it is older than the last change or a day old).
    #[arg(long)]
    pub noatime: bool,
    /// Mount over a directory that is not empty (never over CIPHERDIR itself or a directory
    /// that contains it).
    #[arg(long)]
    pub nonempty: bool,
    /// Reverse mode: CIPHERDIR is a plaintext directory made a reverse vault by `veilfs init
    /// --reverse`; show at MOUNTPOINT its deterministic, read-only encrypted view (a vault:
    /// copy it anywhere, and `veilfs mount`/`export`/`fsck` of the copy restore the data).
    #[arg(long)]
    pub reverse: bool,
    /// With --reverse: leave out plaintext paths matching PATTERN (gitignore syntax, relative
    /// to PLAINDIR; repeatable; `!PATTERN` takes one back, but never inside an excluded
    /// directory: see below). While any pattern excludes, files with more than one link
    /// are left out too (a link could show an excluded file's content).
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// With --reverse: read exclude patterns from FILE (one a line, gitignore syntax).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,
    /// Mount options as in fstab and mount(8), comma-separated: passfile=FILE, extpass=CMD,
    /// recovery_key, slot=N, allow_other, ro, idle=DURATION, shared_storage, break_lock,
    /// attr_timeout=SECS, threads=N, no_writeback, noatime, nonempty, fsname=NAME (the source shown
    /// in the mount table; default CIPHERDIR), reverse, exclude=PATTERN (one per option, `\,`
    /// for a comma), exclude_from=FILE. mount(8)'s flags are applied: rw/ro, exec/noexec,
    /// nosuid, nodev, sync/async, dirsync, atime/relatime/strictatime/noatime, and as root also
    /// suid, dev, nodiratime, lazytime, nosymfollow (a user's mount is always nosuid,nodev and
    /// these are refused); user, users, owner and group imply noexec,nosuid,nodev unless a later
    /// exec, suid or dev says otherwise; SELinux context= options are refused. remount (root)
    /// changes the flags of the live mount at MOUNTPOINT (rw only if it was not mounted ro).
    /// mount(8)'s and systemd's own options (noauto, nofail, _netdev, x-systemd.*, defaults, …)
    /// are ignored. The full table is in docs/FUSE.md.
    #[arg(short = 'o', value_name = "OPTIONS", action = clap::ArgAction::Append)]
    pub options: Vec<String>,
    /// Unknown -o options only warn (mount -s).
    #[arg(long, hide = true)]
    pub sloppy: bool,
    /// Run as mount(8)'s helper (see `helper`): at a remount, the -o list names every flag.
    #[arg(long, hide = true)]
    pub mount_helper: bool,
    /// The mount's source in the mount table (`-o fsname=`).
    #[arg(skip)]
    pub fsname: Option<String>,
    /// mount(8)'s generic flags from the `-o` lists (see `mountopts`).
    #[arg(skip)]
    pub flags: veilfs_core::sys::process::MountFlags,
    /// The generic flag options as given, in order (a remount applies them to the live
    /// mount's flags).
    #[arg(skip)]
    pub flag_options: Vec<String>,
    /// `-o remount`: change the flags of the live mount at MOUNTPOINT.
    #[arg(skip)]
    pub remount: bool,
    /// `-o strictatime`.
    #[arg(skip)]
    pub strictatime: bool,
}

/// One worker per CPU. Measured on 2 vCPUs (512 MiB streamed, tmpfs backing): 2 threads
/// read in 0.39–0.52 s against 0.53–0.64 s for 4 and 0.56–0.61 s for 3, write in 0.75–1.10 s
/// against 0.84–1.14 s, and use less CPU for 4 KiB random writes; with more threads than
/// CPUs the idle ones contend for the spin lock of the kernel's request queue (6.6 % of the
/// daemon's samples while reading). Two at least, so a slow request never stalls the rest.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).max(2)
}

/// Parses a duration with humantime (`90s`, `30m`, `1h30m`, `2 days`); a bare number is
/// seconds. Zero is refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = match s.parse::<u64>() {
        Ok(n) => Duration::from_secs(n),
        Err(_) => {
            humantime::parse_duration(s).map_err(|e| format!("'{s}' is not a duration like 90s, 30m or 1h30m: {e}"))?
        }
    };
    if d.is_zero() {
        return Err(format!("'{s}' must be longer than zero"));
    }
    Ok(d)
}

pub fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a thread count in 1..=1024")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
