//! Mount options in mount(8)'s form (`-o passfile=FILE,allow_other,ro,idle=30m`), for
//! `veilfs mount -o`, fstab lines and the `mount.fuse.veilfs` helper.
//!
//! Why a second spelling of the flags: mount(8) and systemd only know `-o` lists. The option
//! names are the long flags with `_` for `-` (`--shared-storage` is `shared_storage`), as
//! sshfs and gocryptfs spell theirs. The generic options mount(8) adds or keeps for itself
//! (`user`, `noauto`, `nofail`, `x-systemd.*`, `rw`, `nosuid`, …) are accepted and ignored:
//! a FUSE mount by a user is always nosuid and nodev, and the rest are for mount(8) or
//! systemd. `remount` is refused: a live mount keeps its options.

use super::mount::{parse_duration, parse_threads, Args};
use crate::exit::{Exit, MOUNT, USAGE};
use anyhow::Result;
use std::path::PathBuf;

/// The options `-o` understands, for messages and `--help`.
pub const KNOWN: &str = "passfile=FILE, extpass=CMD, recovery_key, slot=N, allow_other, ro, idle=DURATION, \
                         shared_storage, break_lock, attr_timeout=SECS, threads=N, no_writeback, noatime, \
                         nonempty, fsname=NAME, reverse, exclude=PATTERN, exclude_from=FILE";

/// Options that belong to mount(8), fstab or systemd, or that a FUSE mount has anyway.
fn generic(name: &str) -> bool {
    const NAMES: [&str; 25] = [
        "rw",
        "defaults",
        "auto",
        "noauto",
        "user",
        "nouser",
        "users",
        "owner",
        "group",
        "nofail",
        "_netdev",
        "dev",
        "nodev",
        "suid",
        "nosuid",
        "exec",
        "noexec",
        "atime",
        "relatime",
        "norelatime",
        "strictatime",
        "lazytime",
        "async",
        "loud",
        "silent",
    ];
    NAMES.contains(&name)
        || name.starts_with("x-")
        || name.starts_with("comment=")
        // mount(8) turns `user` into `user=NAME` for a user's mount.
        || name.starts_with("user=")
        || name == "default_permissions"
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
    for opt in lists.iter().flat_map(|l| split(l)) {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt.as_str(), None),
        };
        let need = |v: Option<&str>| v.map(str::to_string).ok_or_else(|| usage(format!("-o {name} needs a value")));
        match name {
            "remount" => {
                return Err(Exit::new(
                    MOUNT,
                    anyhow::anyhow!(
                        "a veilfs mount cannot change its options while mounted (remount): unmount it \
                         (umount MOUNTPOINT) and mount it again with the new options"
                    ),
                )
                .into())
            }
            "passfile" => a.unlock.password.passfile = Some(PathBuf::from(need(value)?)),
            "extpass" => a.unlock.password.extpass = Some(need(value)?),
            "recovery_key" => a.unlock.recovery_key = true,
            "slot" => {
                let v = need(value)?;
                a.unlock.slot = Some(v.parse().map_err(|_| usage(format!("-o slot={v}: not a slot number")))?);
            }
            "allow_other" => a.allow_other = true,
            "ro" => a.read_only = true,
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
            "noatime" => a.noatime = true,
            "nonempty" => a.nonempty = true,
            "fsname" => a.fsname = Some(need(value)?),
            "reverse" => a.reverse = true,
            // One pattern per option (a comma inside one is written `\,`), repeatable.
            "exclude" => a.exclude.push(need(value)?),
            "exclude_from" => a.exclude_from.push(PathBuf::from(need(value)?)),
            _ if generic(&opt) => tracing::debug!("-o {opt}: for mount(8), ignored"),
            _ if sloppy => tracing::warn!("-o {opt}: unknown mount option, ignored (sloppy)"),
            _ => return Err(usage(format!("unknown mount option '{opt}' (veilfs knows: {KNOWN})"))),
        }
    }
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
        assert!(!a.noatime);
        assert!(parse(&["-o", "noatime"]).unwrap().noatime);
        assert!(!parse(&["-o", "relatime,atime"]).unwrap().noatime);
    }

    #[test]
    fn generic_options_are_ignored_and_unknown_ones_refused() {
        let a =
            parse(&["-o", "rw,noexec,nosuid,nodev,user,user=bob,noauto,nofail,x-systemd.automount,_netdev"]).unwrap();
        assert!(!a.read_only && !a.allow_other);
        let e = parse(&["-o", "bogus"]).unwrap_err();
        assert!(e.to_string().contains("unknown mount option 'bogus'"), "{e}");
        assert!(parse(&["-o", "idle"]).is_err());
        assert!(parse(&["-o", "threads=0"]).is_err());
        assert!(parse(&["-o", "passfile=/a,extpass=echo x"]).is_err());
        let e = parse(&["-o", "ro,remount"]).unwrap_err();
        assert!(e.to_string().contains("remount"), "{e}");
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
