//! veilfs as a mount(8) helper.
//!
//! `mount -t fuse.veilfs SOURCE TARGET -o OPTS` (and an fstab line of that type) runs
//! `/sbin/mount.fuse.veilfs SOURCE TARGET [-s] [-f] [-n] [-v] -o OPTS` (util-linux: the
//! helper is looked up as /sbin/mount.TYPE; checked with strace on util-linux 2.38, which
//! runs it as the calling user for a user's fstab mount). That helper is a symlink to the
//! veilfs binary, so the binary recognises its name. Without the symlink, mount(8) falls
//! back to mount.fuse3, which runs `veilfs SOURCE TARGET -o OPTS` from PATH (the classic
//! `veilfs#SOURCE` form does the same): the second form recognised here.
//!
//! Both become `veilfs mount SOURCE TARGET -o OPTS`; `-o` lists are read in `mountopts`.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// What the command line means.
#[derive(Debug, PartialEq, Eq)]
pub enum Invocation {
    /// An ordinary `veilfs SUBCOMMAND …` command line.
    Cli,
    /// A mount helper call, rewritten as `veilfs mount …`.
    Mount(Vec<OsString>),
    /// `mount -f` (fake): do everything but mounting, i.e. nothing.
    Fake,
}

/// Reads `argv`; `subcommands` are the CLI's subcommand names (never taken for a source).
pub fn invocation(argv: &[OsString], subcommands: &[&str]) -> Invocation {
    let name = argv.first().and_then(|a| Path::new(a).file_name()).unwrap_or_default();
    let is_helper_name = name.as_encoded_bytes().starts_with(b"mount.");
    let rest = argv.get(1..).unwrap_or_default();
    // mount.fuse3's form: `veilfs SOURCE TARGET -o OPTS`, SOURCE an existing directory.
    let looks_like_fuse3 = rest.len() >= 2
        && !rest[0].as_encoded_bytes().starts_with(b"-")
        && !subcommands.iter().any(|s| OsStr::new(s) == rest[0])
        && Path::new(strip_type(&rest[0])).is_dir();
    if !is_helper_name && !looks_like_fuse3 {
        return Invocation::Cli;
    }
    translate(rest)
}

/// `veilfs#/path` (mount.fuse's TYPE#SOURCE form) → `/path`.
fn strip_type(source: &OsStr) -> &OsStr {
    let b = source.as_encoded_bytes();
    match b.strip_prefix(b"veilfs#") {
        Some(rest) => std::os::unix::ffi::OsStrExt::from_bytes(rest),
        None => source,
    }
}

/// The helper's arguments (`SOURCE TARGET [-sfnv] [-o OPTS] [-t TYPE]`) as `veilfs mount`'s.
fn translate(args: &[OsString]) -> Invocation {
    // `--mount-helper`: the `-o` list is mount(8)'s, which at a remount names every flag the
    // mount is to have (see `mount::remount`).
    let mut out: Vec<OsString> = vec!["veilfs".into(), "mount".into(), "--mount-helper".into()];
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let b = arg.as_encoded_bytes();
        match b {
            b"-o" => {
                if let Some(v) = it.next() {
                    out.extend(["-o".into(), v.clone()]);
                }
            }
            _ if b.starts_with(b"-o") => out.extend(["-o".into(), OsString::from(&arg.to_string_lossy()[2..])]),
            // The type is ours (mount(8) chose this helper by it).
            b"-t" => {
                it.next();
            }
            _ if b.starts_with(b"-") && b.len() > 1 && b[1] != b'-' => {
                for flag in &b[1..] {
                    match flag {
                        b'f' => return Invocation::Fake,
                        b's' => out.push("--sloppy".into()),
                        b'v' => out.push("-v".into()),
                        // -n: no /etc/mtab to write (there is none); others unknown: ignored.
                        _ => {}
                    }
                }
            }
            _ => positional.push(arg.clone()),
        }
    }
    let mut positional = positional.into_iter();
    if let Some(source) = positional.next() {
        out.push(strip_type(&source).to_os_string());
    }
    out.extend(positional);
    Invocation::Mount(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(argv: &[&str]) -> Invocation {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        invocation(&argv, &["mount", "init"])
    }

    fn mount(argv: &[&str]) -> Invocation {
        Invocation::Mount(argv.iter().map(OsString::from).collect())
    }

    #[test]
    fn helper_name_becomes_veilfs_mount() {
        assert_eq!(
            inv(&["/sbin/mount.fuse.veilfs", "/v", "/m", "-o", "rw,passfile=/p", "-n"]),
            mount(&["veilfs", "mount", "--mount-helper", "-o", "rw,passfile=/p", "/v", "/m"])
        );
        assert_eq!(
            inv(&["mount.veilfs", "veilfs#/v", "/m", "-sv", "-oro", "-t", "fuse.veilfs"]),
            mount(&["veilfs", "mount", "--mount-helper", "--sloppy", "-v", "-o", "ro", "/v", "/m"])
        );
        assert_eq!(inv(&["mount.fuse.veilfs", "/v", "/m", "-f", "-o", "ro"]), Invocation::Fake);
    }

    #[test]
    fn mount_fuse3_form_needs_an_existing_directory() {
        let dir = std::env::temp_dir();
        let d = dir.to_str().unwrap();
        assert_eq!(
            inv(&["veilfs", d, "/m", "-o", "ro"]),
            mount(&["veilfs", "mount", "--mount-helper", "-o", "ro", d, "/m"])
        );
        assert_eq!(inv(&["veilfs", "mount", d, "/m"]), Invocation::Cli);
        assert_eq!(inv(&["veilfs", "/no/such/dir", "/m"]), Invocation::Cli);
        assert_eq!(inv(&["veilfs", "--help"]), Invocation::Cli);
    }
}
