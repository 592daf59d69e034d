//! Mount options in mount(8)'s form (`-o passfile=FILE,allow_other,ro,idle=30m`), for
//! `veilfs mount -o`, fstab lines and the `mount.fuse.veilfs` helper.
//!
//! Why a second spelling of the flags: mount(8) and systemd only know `-o` lists. The option
//! names are the long flags with `_` for `-` (`--shared-storage` is `shared_storage`), as
//! sshfs and gocryptfs spell theirs.
//!
//! mount(8)'s generic options mean what mount(8) says (the table is in docs/FUSE.md, "Mount
//! options"): the flags (`ro`, `noexec`, `nosuid`, `nodev`, `sync`, `dirsync`, the atime
//! family, `lazytime`, `nosymfollow`, and their opposites) are applied, or refused with a
//! message naming the option when this mount cannot apply them (`suid`, `dev`, `nodiratime`,
//! `lazytime` and `nosymfollow` for a user, whose mount fusermount3 makes; SELinux
//! contexts); `user`, `users`, `owner` and `group` imply `noexec,nosuid,nodev` unless a later
//! option says otherwise (`user,exec`). What belongs to mount(8) or systemd (`noauto`,
//! `nofail`, `x-systemd.*`, …) is ignored. `remount` changes the flags of the live mount
//! (see `mount::remount`); the daemon's own options then keep their values.

use super::mountargs::{parse_duration, parse_threads, Args};
use crate::exit::{Exit, MOUNT, USAGE};
use anyhow::Result;
use std::path::PathBuf;
use veilfs_core::sys::process::MountFlags;

/// The options `-o` understands, for messages and `--help`.
pub const KNOWN: &str = "passfile=FILE, extpass=CMD, recovery_key, slot=N, allow_other, ro, idle=DURATION, \
                         shared_storage, break_lock, attr_timeout=SECS, threads=N, no_writeback, noatime, \
                         nonempty, fsname=NAME, reverse, exclude=PATTERN, exclude_from=FILE, and mount(8)'s \
                         rw, exec, noexec, suid, nosuid, dev, nodev, sync, async, dirsync, atime, relatime, \
                         strictatime, nodiratime, lazytime, nosymfollow, user, remount";

/// Options that belong to mount(8), fstab or systemd: ignored.
fn for_mount8(name: &str) -> bool {
    const NAMES: [&str; 8] = ["defaults", "auto", "noauto", "nouser", "nofail", "_netdev", "loud", "silent"];
    NAMES.contains(&name) || name.starts_with("x-") || name.starts_with("comment=") || name == "default_permissions"
}

/// The options the kernel shows for a live FUSE mount, which mount(8) hands back to the
/// helper at `remount`: ignored then, refused on a new mount (the kernel sets them).
fn kernel_fuse_option(name: &str) -> bool {
    ["user_id", "group_id", "rootmode", "fd", "max_read", "blksize"].contains(&name)
}

/// Applies one of mount(8)'s generic flag options to `f`; false when `opt` is none.
pub fn generic_flag(f: &mut MountFlags, opt: &str) -> bool {
    match opt {
        "ro" => f.read_only = true,
        "rw" => f.read_only = false,
        "noexec" => f.noexec = true,
        "exec" => f.noexec = false,
        "nosuid" => f.nosuid = true,
        "suid" => f.nosuid = false,
        "nodev" => f.nodev = true,
        "dev" => f.nodev = false,
        "sync" => f.sync = true,
        "async" => f.sync = false,
        "dirsync" => f.dirsync = true,
        "noatime" => f.noatime = true,
        // The kernel's default mode, relatime, for all three (mount(8): `atime` and
        // `norelatime` use "the kernel defaults").
        "atime" | "relatime" | "norelatime" | "nostrictatime" => (f.noatime, f.strictatime) = (false, false),
        "strictatime" => (f.noatime, f.strictatime) = (false, true),
        "nodiratime" => f.nodiratime = true,
        "diratime" => f.nodiratime = false,
        "lazytime" => f.lazytime = true,
        "nolazytime" => f.lazytime = false,
        "nosymfollow" => f.nosymfollow = true,
        "symfollow" => f.nosymfollow = false,
        // mount(8): `user` (also `user=NAME`, as mount(8) may pass it), `users`, `owner`
        // and `group` imply noexec, nosuid and nodev unless a later option overrides them.
        _ if ["user", "users", "owner", "group"].contains(&opt) || opt.starts_with("user=") => {
            (f.noexec, f.nosuid, f.nodev) = (true, true, true)
        }
        _ => return false,
    }
    true
}

/// The flags a new mount starts from: FUSE's `nosuid,nodev` (fusermount3 always sets them for
/// a user; root's mount asks for `suid` or `dev` to drop them), the rest as mount(8)'s
/// defaults.
pub fn default_flags() -> MountFlags {
    MountFlags { nosuid: true, nodev: true, ..MountFlags::default() }
}

/// Refuses the flags a user's mount cannot have: fusermount3 sets `nosuid,nodev` always and
/// knows none of `nodiratime`, `lazytime`, `nosymfollow`.
fn check_user_flags(f: &MountFlags) -> Result<()> {
    let refused = [
        (!f.nosuid, "suid"),
        (!f.nodev, "dev"),
        (f.nodiratime, "nodiratime"),
        (f.lazytime, "lazytime"),
        (f.nosymfollow, "nosymfollow"),
    ];
    if let Some((_, name)) = refused.iter().find(|(on, _)| *on) {
        return Err(Exit::new(
            MOUNT,
            anyhow::anyhow!(
                "-o {name}: only root can mount with {name}; a user's FUSE mount is made by fusermount3, which \
                 mounts it nosuid,nodev always and cannot set nodiratime, lazytime or nosymfollow"
            ),
        )
        .into());
    }
    Ok(())
}

/// Splits an option list at commas; `\,` is a comma inside a value (as for libfuse).
pub fn split(list: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = list.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&',') => {
                out.last_mut().expect("never empty").push(',');
                chars.next();
            }
            ',' => out.push(String::new()),
            c => out.last_mut().expect("never empty").push(c),
        }
    }
    out.into_iter().filter(|o| !o.is_empty()).collect()
}

fn usage(msg: String) -> anyhow::Error {
    Exit::new(USAGE, anyhow::anyhow!(msg)).into()
}

/// Applies the `-o` lists in `a.options` onto `a`. An unknown option is a usage error
/// unless `sloppy` (mount -s), which only warns.
pub fn apply(a: &mut Args, sloppy: bool) -> Result<()> {
    let lists = std::mem::take(&mut a.options);
    let mut flags = default_flags();
    flags.read_only = a.read_only;
    flags.noatime = a.noatime;
    let mut kernel_options = Vec::new();
    let mut daemon_options = Vec::new();
    for opt in lists.iter().flat_map(|l| split(l)) {
        if generic_flag(&mut flags, &opt) {
            a.flag_options.push(opt);
            continue;
        }
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt.as_str(), None),
        };
        let need = |v: Option<&str>| v.map(str::to_string).ok_or_else(|| usage(format!("-o {name} needs a value")));
        if !["remount", "context", "fscontext", "defcontext", "rootcontext"].contains(&name)
            && !for_mount8(&opt)
            && !kernel_fuse_option(name)
        {
            daemon_options.push(opt.clone());
        }
        match name {
            "remount" => a.remount = true,
            "context" | "fscontext" | "defcontext" | "rootcontext" => {
                return Err(usage(format!(
                    "-o {name}=: SELinux contexts are not supported on a veilfs mount (FUSE file systems \
                     carry no security labels of their own)"
                )))
            }
            _ if kernel_fuse_option(name) => kernel_options.push(opt.clone()),
            "passfile" => a.unlock.password.passfile = Some(PathBuf::from(need(value)?)),
            "extpass" => a.unlock.password.extpass = Some(need(value)?),
            "recovery_key" => a.unlock.recovery_key = true,
            "slot" => {
                let v = need(value)?;
                a.unlock.slot = Some(v.parse().map_err(|_| usage(format!("-o slot={v}: not a slot number")))?);
            }
            "allow_other" => a.allow_other = true,
            "idle" => a.idle = Some(parse_duration(&need(value)?).map_err(|e| usage(format!("-o idle: {e}")))?),
            "shared_storage" => a.shared_storage = true,
            "break_lock" => a.lock.break_lock = true,
            "attr_timeout" => {
                let v = need(value)?;
                a.attr_timeout = v
                    .parse::<f64>()
                    .map(Some)
                    .ok()
                    .filter(|s| s.is_some_and(|s| s.is_finite() && s >= 0.0))
                    .ok_or_else(|| usage(format!("-o attr_timeout={v}: not a number of seconds")))?;
            }
            "threads" => a.threads = parse_threads(&need(value)?).map_err(|e| usage(format!("-o threads: {e}")))?,
            "no_writeback" => a.no_writeback = true,
            "nonempty" => a.nonempty = true,
            "fsname" => a.fsname = Some(need(value)?),
            "reverse" => a.reverse = true,
            // One pattern per option (a comma inside one is written `\,`), repeatable.
            "exclude" => a.exclude.push(need(value)?),
            "exclude_from" => a.exclude_from.push(PathBuf::from(need(value)?)),
            _ if for_mount8(&opt) => tracing::debug!("-o {opt}: for mount(8), ignored"),
            _ if sloppy => tracing::warn!("-o {opt}: unknown mount option, ignored (sloppy)"),
            _ => return Err(usage(format!("unknown mount option '{opt}' (veilfs knows: {KNOWN})"))),
        }
    }
    if a.remount {
        // The daemon's own options (passfile, idle, …) keep their values: mount(8) passes
        // the fstab line's options again at a remount.
        if !daemon_options.is_empty() {
            tracing::warn!(
                "-o remount: {} left as they are (only mount(8)'s flags change on a live mount)",
                daemon_options.join(",")
            );
        }
        a.flags = flags;
        return Ok(());
    }
    if let Some(o) = kernel_options.first() {
        return Err(usage(format!("-o {o}: set by the kernel for a FUSE mount, not an option of a new mount")));
    }
    if veilfs_core::sys::euid() != 0 {
        check_user_flags(&flags)?;
    }
    a.read_only = flags.read_only;
    a.noatime = flags.noatime;
    a.strictatime = flags.strictatime;
    a.flags = flags;
    if !a.reverse && (!a.exclude.is_empty() || !a.exclude_from.is_empty()) {
        return Err(usage("exclude and exclude_from are for reverse mounts: add reverse (or --reverse)".into()));
    }
    let p = &a.unlock.password;
    if usize::from(p.passfile.is_some()) + usize::from(p.extpass.is_some()) + usize::from(p.password_stdin) > 1 {
        return Err(usage("give one password source: passfile, extpass or --password-stdin".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    fn parse(argv: &[&str]) -> Result<Args> {
        let mut a = T::try_parse_from([&["t", "/c", "/m"], argv].concat()).unwrap().a;
        apply(&mut a, false)?;
        Ok(a)
    }

    #[test]
    fn options_map_onto_flags() {
        let a = parse(&[
            "-o",
            "passfile=/p,allow_other,ro,idle=30m",
            "-o",
            "threads=3,attr_timeout=0.5,fsname=v,shared_storage,break_lock",
        ])
        .unwrap();
        assert!(a.shared_storage && a.lock.break_lock);
        assert_eq!(a.unlock.password.passfile, Some(PathBuf::from("/p")));
        assert!(a.allow_other && a.read_only);
        assert_eq!(a.idle, Some(std::time::Duration::from_secs(1800)));
        assert_eq!((a.threads, a.attr_timeout, a.fsname.as_deref()), (3, Some(0.5), Some("v")));
        assert!(!a.noatime && a.flags.read_only);
        assert!(parse(&["-o", "noatime"]).unwrap().noatime);
        assert!(!parse(&["-o", "relatime,atime"]).unwrap().noatime);
    }

    #[test]
    fn generic_options_are_ignored_and_unknown_ones_refused() {
        let a = parse(&["-o", "rw,noauto,nofail,x-systemd.automount,_netdev,defaults,comment=x"]).unwrap();
        assert!(!a.read_only && !a.allow_other);
        assert_eq!(a.flags, default_flags());
        let e = parse(&["-o", "bogus"]).unwrap_err();
        assert!(e.to_string().contains("unknown mount option 'bogus'"), "{e}");
        assert!(parse(&["-o", "idle"]).is_err());
        assert!(parse(&["-o", "threads=0"]).is_err());
        assert!(parse(&["-o", "passfile=/a,extpass=echo x"]).is_err());
        let e = parse(&["-o", "context=system_u:object_r:tmp_t:s0"]).unwrap_err();
        assert!(e.to_string().contains("-o context="), "{e}");
        let e = parse(&["-o", "user_id=0"]).unwrap_err();
        assert!(e.to_string().contains("user_id=0"), "{e}");
    }

    #[test]
    fn generic_flags_mean_what_mount8_says() {
        let f = |opts: &str| parse(&["-o", opts]).unwrap().flags;
        let d = default_flags();
        assert_eq!(f("noexec"), MountFlags { noexec: true, ..d });
        assert_eq!(f("user"), MountFlags { noexec: true, ..d });
        assert_eq!(f("users,exec"), d, "a later exec overrides user's noexec");
        assert_eq!(f("exec,user=bob"), MountFlags { noexec: true, ..d });
        assert_eq!(f("owner"), f("group"));
        assert_eq!(f("sync,dirsync,async"), MountFlags { dirsync: true, ..d });
        assert_eq!(f("noatime"), MountFlags { noatime: true, ..d });
        assert_eq!(f("noatime,strictatime"), MountFlags { strictatime: true, ..d });
        assert_eq!(f("strictatime,relatime"), d);
        let a = parse(&["-o", "ro,noatime,strictatime"]).unwrap();
        assert!(a.read_only && !a.noatime && a.strictatime);
        assert!(!parse(&["-o", "ro,rw"]).unwrap().read_only);
        if veilfs_core::sys::euid() == 0 {
            assert_eq!(f("suid,dev"), MountFlags { nosuid: false, nodev: false, ..d });
            assert_eq!(
                f("nodiratime,lazytime,nosymfollow"),
                MountFlags { nodiratime: true, lazytime: true, nosymfollow: true, ..d }
            );
        }
        let e = check_user_flags(&MountFlags { nosuid: false, ..d }).unwrap_err();
        assert!(e.to_string().contains("-o suid: only root"), "{e}");
        for name in ["nodiratime", "lazytime", "nosymfollow", "dev"] {
            let mut flags = d;
            assert!(generic_flag(&mut flags, name));
            let e = check_user_flags(&flags).unwrap_err();
            assert!(e.to_string().contains(&format!("-o {name}:")), "{e}");
        }
        assert!(
            check_user_flags(&MountFlags { noexec: true, sync: true, dirsync: true, strictatime: true, ..d }).is_ok()
        );
    }

    #[test]
    fn remount_takes_flags_and_leaves_the_daemon_options() {
        let a =
            parse(&["-o", "rw,nosuid,nodev,relatime,remount,noexec,user_id=0,group_id=0,passfile=/p,idle=5m"]).unwrap();
        assert!(a.remount);
        assert_eq!(a.flag_options, ["rw", "nosuid", "nodev", "relatime", "noexec"]);
        assert_eq!(a.flags, MountFlags { noexec: true, ..default_flags() });
    }

    #[test]
    fn reverse_and_excludes() {
        let a = parse(&["-o", r"reverse,passfile=/p,exclude=*.log,exclude=a\,b", "-o", "exclude_from=/x"]).unwrap();
        assert!(a.reverse);
        assert_eq!(a.exclude, ["*.log", "a,b"]);
        assert_eq!(a.exclude_from, [PathBuf::from("/x")]);
        let e = parse(&["-o", "exclude=*.log"]).unwrap_err();
        assert!(e.to_string().contains("reverse"), "{e}");
        assert!(parse(&["-o", "reverse,exclude"]).is_err());
    }

    #[test]
    fn escaped_commas_stay_in_values() {
        assert_eq!(split(r"extpass=printf a\,b,ro,,x"), ["extpass=printf a,b", "ro", "x"]);
    }
}
