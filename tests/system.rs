//! veilfs as a citizen of the system: mount(8) and fstab (through the `mount.fuse.veilfs`
//! helper and mount.fuse3), `-o` option lists, mounts by an ordinary user through
//! fusermount3, systemd's readiness protocol, and the Debian package.
//!
//! These tests change machine-wide state — /etc/fstab, /etc/fuse.conf, /dev/fuse's mode,
//! /usr/sbin/mount.fuse.veilfs, a test user, an installed package — so they run only inside
//! `scripts/sandbox.sh` (throwaway overlays over /etc, /usr and /var, and namespaces of their
//! own; `require_sandbox` fails them elsewhere), take one lock, and undo every change in a
//! `Drop` as well (also when a test fails). /dev/fuse is needed;
//! without it they skip (fail under CI=true). Those that change the machine need root and,
//! run as an ordinary user, report themselves not run (`root_only`).

mod common;

use common::*;
use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const HELPER: &str = "/usr/sbin/mount.fuse.veilfs";

/// A machine path made a symlink to `target` (or removed) for one test; whatever was there
/// is put back on drop.
struct Link {
    path: PathBuf,
    backup: Option<PathBuf>,
}

impl Link {
    fn set(path: &str, target: Option<&str>) -> Link {
        require_sandbox(path);
        let path = PathBuf::from(path);
        let backup = path.symlink_metadata().is_ok().then(|| {
            let b = PathBuf::from(format!("{}.veilfs-test-backup", path.display()));
            std::fs::rename(&path, &b).unwrap();
            b
        });
        if let Some(t) = target {
            std::os::unix::fs::symlink(t, &path).unwrap();
        }
        Link { path, backup }
    }

    /// `/usr/sbin/mount.fuse.veilfs` → the binary under test.
    fn helper() -> Link {
        Link::set(HELPER, Some(&*BIN))
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(b) = &self.backup {
            let _ = std::fs::rename(b, &self.path);
        }
    }
}

/// The start most tests here share: /dev/fuse (skip, or fail under CI=true, without it), a
/// tmpfs holding a new vault (`cipher`, an empty mount point `mnt`, a passfile `pass`), and,
/// for a test that changes the machine (`machine: Some(what it changes)`), root, the machine
/// lock and, with `helper`, the mount helper linked to the binary under test. Fields drop in
/// order: the mount goes first (also on panic), then the tmpfs, the helper link, the lock.
struct Setup {
    _u: UnmountOnDrop,
    cipher: PathBuf,
    mnt: PathBuf,
    pass: PathBuf,
    fs: Tmpfs,
    _helper: Option<Link>,
    _l: Option<std::sync::MutexGuard<'static, ()>>,
}

impl Setup {
    /// `(cipher, mnt, pass)`.
    fn paths(&self) -> (PathBuf, PathBuf, PathBuf) {
        (self.cipher.clone(), self.mnt.clone(), self.pass.clone())
    }
}

fn setup(machine: Option<&str>, helper: bool) -> Option<Setup> {
    if let Some(what) = machine {
        if !root_only(what) {
            return None;
        }
    }
    if !fuse_available() {
        return None;
    }
    let _l = machine.map(|_| machine_lock());
    let _helper = helper.then(Link::helper);
    let fs = Tmpfs::new("64m");
    let (cipher, mnt, pass) = new_vault(&fs.path);
    Some(Setup { _u: UnmountOnDrop(mnt.clone()), cipher, mnt, pass, fs, _helper, _l })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn code(o: &std::process::Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// mount -t fuse.veilfs with an option list: the mount table shows type fuse.veilfs and
/// CIPHERDIR as source, the options take effect, mount(8)'s own options are ignored,
/// `mount -o remount,ro|rw` changes the live mount (not one mounted `ro`: refused with a
/// message), `umount MNT` unmounts.
#[test]
fn mount8_with_type_fuse_veilfs() {
    let Some(t) = setup(Some("links /usr/sbin/mount.fuse.veilfs"), true) else {
        return;
    };
    let (cipher, mnt, pass) = t.paths();
    let opts = format!("passfile={},allow_other,idle=30m,threads=2,nofail,x-systemd.automount,_netdev", s(&pass));
    let o = run("mount", &["-t", "fuse.veilfs", s(&cipher), s(&mnt), "-o", &opts]);
    assert!(o.status.success(), "mount -t fuse.veilfs: {}", text(&o));
    let e = mount_entry(&mnt).expect("mounted");
    assert_eq!((e.fstype.as_str(), e.source.as_str()), ("fuse.veilfs", s(&cipher)), "{e:?}");
    assert!(e.super_opts.contains("allow_other"), "{e:?}");
    std::fs::write(mnt.join("f"), "hello").unwrap();

    // remount: mount(8) runs the helper with -o remount,…, which changes the live mount.
    let o = run("mount", &["-o", "remount,ro", s(&mnt)]);
    assert!(o.status.success(), "mount -o remount,ro: {}", text(&o));
    assert!(mount_entry(&mnt).unwrap().mount_opts.split(',').any(|o| o == "ro"));
    assert_eq!(std::fs::read_to_string(mnt.join("f")).unwrap(), "hello");
    let err = std::fs::write(mnt.join("f"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let o = run("mount", &["-o", "remount,rw", s(&mnt)]);
    assert!(o.status.success(), "mount -o remount,rw: {}", text(&o));
    assert!(mount_entry(&mnt).unwrap().mount_opts.split(',').any(|o| o == "rw"));
    std::fs::write(mnt.join("f"), "hello").unwrap();

    // As for gocryptfs, util-linux umount does not take a directory source: "not mounted".
    let o = run("umount", &[s(&cipher)]);
    assert!(!o.status.success(), "umount CIPHERDIR: {}", text(&o));
    assert!(mount_entry(&mnt).is_some());
    let o = run("umount", &[s(&mnt)]);
    assert!(o.status.success(), "umount MNT: {}", text(&o));
    assert!(mount_entry(&mnt).is_none());

    // Read-only through -o ro.
    let o = run("mount", &["-t", "fuse.veilfs", s(&cipher), s(&mnt), "-o", &format!("ro,passfile={}", s(&pass))]);
    assert!(o.status.success(), "mount -o ro: {}", text(&o));
    assert!(mount_entry(&mnt).unwrap().mount_opts.split(',').any(|o| o == "ro"));
    assert_eq!(std::fs::read_to_string(mnt.join("f")).unwrap(), "hello");
    let err = std::fs::write(mnt.join("g"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    // Its daemon serves the vault read-only: it cannot become read-write.
    let o = run("mount", &["-o", "remount,rw", s(&mnt)]);
    assert!(!o.status.success());
    assert!(text(&o).contains("was mounted read-only"), "{}", text(&o));
    assert!(mount_entry(&mnt).unwrap().mount_opts.split(',').any(|o| o == "ro"));
    // `veilfs umount CIPHERDIR` finds the mount by its source.
    let o = run(&BIN, &["umount", s(&cipher)]);
    assert!(o.status.success(), "veilfs umount CIPHERDIR: {}", text(&o));
    assert!(mount_entry(&mnt).is_none());
}

/// Without the helper, mount(8) falls back to mount.fuse3, which runs `veilfs SOURCE
/// TARGET -o OPTS` through /bin/sh; the old `-t fuse veilfs#SOURCE` form does the same.
/// mount(8) gives its helpers no PATH, so the shell's default path must find veilfs: the
/// binary under test is linked as /usr/local/bin/veilfs for the test.
#[test]
fn mount_fuse3_runs_veilfs_from_path() {
    let Some(t) = setup(Some("links /usr/local/bin/veilfs"), false) else {
        return;
    };
    let (cipher, mnt, pass) = t.paths();
    let _helper = Link::set(HELPER, None);
    let _bin = Link::set("/usr/local/bin/veilfs", Some(&*BIN));
    let opt = format!("passfile={}", s(&pass));
    for (ty, source) in [("fuse.veilfs", s(&cipher).to_string()), ("fuse", format!("veilfs#{}", s(&cipher)))] {
        let o = run("mount", &["-t", ty, &source, s(&mnt), "-o", &opt]);
        assert!(o.status.success(), "mount -t {ty} {source}: {}", text(&o));
        assert_eq!(server_argv0(&mnt).as_deref(), Some("veilfs"), "run by mount.fuse3");
        let e = mount_entry(&mnt).expect("mounted");
        assert_eq!((e.fstype.as_str(), e.source.as_str()), ("fuse.veilfs", s(&cipher)), "{e:?}");
        let o = run("umount", &[s(&mnt)]);
        assert!(o.status.success(), "umount: {}", text(&o));
    }
}

/// `veilfs mount -o` takes the same names as fstab; unknown options are a usage error (2)
/// and remount of what is not mounted a path error (4), both before any password is read.
#[test]
fn veilfs_mount_dash_o() {
    let Some(t) = setup(None, false) else {
        return;
    };
    let (cipher, mnt, pass) = t.paths();
    let generic = "rw,defaults,user,noauto,nofail,_netdev,dev,suid,exec,x-systemd.automount,x-systemd.idle-timeout=5";
    let opts = format!("{generic},passfile={},fsname=my\\,vault,shared_storage,attr_timeout=0,no_writeback", s(&pass));
    let o = run(&BIN, &["mount", s(&cipher), s(&mnt), "-o", &opts]);
    assert!(o.status.success(), "veilfs mount -o: {}", text(&o));
    let e = mount_entry(&mnt).expect("mounted");
    assert_eq!((e.fstype.as_str(), e.source.as_str()), ("fuse.veilfs", "my,vault"), "{e:?}");
    let o = run(&BIN, &["umount", s(&mnt)]);
    assert!(o.status.success(), "veilfs umount: {}", text(&o));

    // No passfile: a prompt would fail (no terminal), so these must fail earlier.
    let o = run(&BIN, &["mount", s(&cipher), s(&mnt), "-o", "bogus"]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("unknown mount option 'bogus'"), "{}", text(&o));
    let o = run(&BIN, &["mount", s(&cipher), s(&mnt), "-o", "remount,ro"]);
    assert_eq!(code(&o), 4, "{}", text(&o));
    assert!(text(&o).contains("is not mounted"), "{}", text(&o));
    let o = run(&BIN, &["mount", s(&cipher), s(&mnt), "-o", "idle=soon"]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(mount_entry(&mnt).is_none());
}

/// The per-mount flags of `mnt` as the mount table shows them.
fn mount_flags(mnt: &Path) -> Vec<String> {
    mount_entry(mnt).expect("mounted").mount_opts.split(',').map(str::to_string).collect()
}

/// A shell script `name` in `dir` that prints "ran", made executable.
fn script(dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Whether running `path` works (prints "ran"); otherwise the error of the exec.
fn runs(path: &Path) -> Result<(), std::io::Error> {
    let o = Command::new(path).output()?;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n");
    Ok(())
}

/// mount(8)'s generic options, through the helper as root: each flag is in the mount table
/// and does what it says (a script in a noexec mount does not run, a symlink in a
/// nosymfollow mount is not followed, sync and dirsync and lazytime are on the superblock);
/// `mount -o remount,exec` and `remount,noexec` change it on the live mount, and so does
/// `veilfs mount -o remount,…`, which changes only what it names.
#[test]
fn mount8_generic_options_are_applied() {
    let Some(t) = setup(Some("links /usr/sbin/mount.fuse.veilfs"), true) else {
        return;
    };
    let (cipher, mnt, pass) = t.paths();
    let opts = format!("passfile={},noexec,nodiratime,nosymfollow,sync,dirsync,lazytime,strictatime", s(&pass));
    let o = run("mount", &["-t", "fuse.veilfs", s(&cipher), s(&mnt), "-o", &opts]);
    assert!(o.status.success(), "mount: {}", text(&o));
    let e = mount_entry(&mnt).unwrap();
    for f in ["noexec", "nodiratime", "nosymfollow", "nosuid", "nodev"] {
        assert!(mount_flags(&mnt).contains(&f.to_string()), "{f}: {e:?}");
    }
    assert!(!e.mount_opts.contains("relatime") && !e.mount_opts.contains("noatime"), "strictatime: {e:?}");
    for f in ["sync", "dirsync", "lazytime"] {
        assert!(e.super_opts.split(',').any(|o| o == f), "{f}: {e:?}");
    }
    let sh = script(&mnt, "s.sh");
    assert_eq!(runs(&sh).unwrap_err().raw_os_error(), Some(libc::EACCES), "noexec");
    std::os::unix::fs::symlink("s.sh", mnt.join("link")).unwrap();
    let err = std::fs::read(mnt.join("link")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "nosymfollow: {err}");

    let o = run("mount", &["-o", "remount,exec", s(&mnt)]);
    assert!(o.status.success(), "remount,exec: {}", text(&o));
    assert!(!mount_flags(&mnt).contains(&"noexec".to_string()));
    runs(&sh).unwrap();
    // A remount leaves the other flags as they were.
    assert!(mount_flags(&mnt).contains(&"nosymfollow".to_string()));
    let o = run(&BIN, &["mount", s(&cipher), s(&mnt), "-o", "remount,noexec"]);
    assert!(o.status.success(), "veilfs mount -o remount,noexec: {}", text(&o));
    assert!(mount_flags(&mnt).contains(&"noexec".to_string()));
    assert!(mount_flags(&mnt).contains(&"nodiratime".to_string()));
    assert_eq!(runs(&sh).unwrap_err().raw_os_error(), Some(libc::EACCES));
    let o = run("umount", &[s(&mnt)]);
    assert!(o.status.success(), "umount: {}", text(&o));

    // Root may ask for suid and dev; `user` implies noexec,nosuid,nodev unless overridden.
    // mount(8) drops its defaults (suid, dev, exec) before it runs the helper, so a FUSE
    // mount's nosuid,nodev are dropped with `veilfs mount -o suid,dev` (or a remount).
    for (via_mount8, opts, want, not) in [
        (false, "suid,dev", vec![], vec!["nosuid", "nodev", "noexec"]),
        (true, "user", vec!["noexec", "nosuid", "nodev"], vec![]),
        (true, "user,exec", vec!["nosuid", "nodev"], vec!["noexec"]),
        (true, "noatime", vec!["noatime"], vec!["relatime"]),
    ] {
        let opts = format!("{opts},passfile={}", s(&pass));
        let o = if via_mount8 {
            run("mount", &["-t", "fuse.veilfs", s(&cipher), s(&mnt), "-o", &opts])
        } else {
            run(&BIN, &["mount", s(&cipher), s(&mnt), "-o", &opts])
        };
        assert!(o.status.success(), "mount -o {opts}: {}", text(&o));
        let flags = mount_flags(&mnt);
        assert!(want.iter().all(|f| flags.contains(&f.to_string())), "{opts}: {flags:?}");
        assert!(not.iter().all(|f| !flags.contains(&f.to_string())), "{opts}: {flags:?}");
        let o = run("umount", &[s(&mnt)]);
        assert!(o.status.success(), "umount: {}", text(&o));
    }
    // Through mount(8), a remount drops nosuid.
    let o = run("mount", &["-t", "fuse.veilfs", s(&cipher), s(&mnt), "-o", &format!("passfile={}", s(&pass))]);
    assert!(o.status.success(), "mount: {}", text(&o));
    assert!(mount_flags(&mnt).contains(&"nosuid".to_string()));
    let o = run("mount", &["-o", "remount,suid", s(&mnt)]);
    assert!(o.status.success(), "remount,suid: {}", text(&o));
    assert!(!mount_flags(&mnt).contains(&"nosuid".to_string()) && mount_flags(&mnt).contains(&"nodev".to_string()));
    let o = run("umount", &[s(&mnt)]);
    assert!(o.status.success(), "umount: {}", text(&o));

    // Refused by name: SELinux contexts.
    let o = run(&BIN, &["mount", s(&cipher), s(&mnt), "-o", "context=system_u:object_r:tmp_t:s0"]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("-o context="), "{}", text(&o));
}

/// The fstab line of the issue, as root: `mount MNT`, `umount MNT`.
#[test]
fn fstab_line_as_root() {
    let Some(t) = setup(Some("edits /etc/fstab"), true) else {
        return;
    };
    let (cipher, mnt, pass) = t.paths();
    let line =
        format!("{} {} fuse.veilfs noauto,passfile={},nofail,x-systemd.automount 0 0\n", s(&cipher), s(&mnt), s(&pass));
    let fstab = FileGuard::set("/etc/fstab", None);
    fstab.write(Some(&format!("{}{line}", fstab.old_text())));
    let o = run("mount", &[s(&mnt)]);
    assert!(o.status.success(), "mount MNT: {}", text(&o));
    assert_eq!(mount_entry(&mnt).unwrap().fstype, "fuse.veilfs");
    std::fs::write(mnt.join("a"), "from fstab").unwrap();
    let o = run("umount", &[s(&mnt)]);
    assert!(o.status.success(), "umount MNT: {}", text(&o));
    assert!(mount_entry(&mnt).is_none());
}

/// The automount line of contrib/systemd/fstab.example, pointed at a real vault, through
/// systemd-fstab-generator (it runs without a running systemd): it makes an .automount
/// and a .mount unit of type fuse.veilfs; the mount command the .mount unit runs (`mount
/// WHAT WHERE -t TYPE -o OPTIONS`) then mounts the vault.
#[test]
fn fstab_example_through_systemd_fstab_generator() {
    let generator = "/lib/systemd/system-generators/systemd-fstab-generator";
    let Some(t) = setup(Some("links /usr/sbin/mount.fuse.veilfs"), true) else {
        return;
    };
    if !Path::new(generator).exists() {
        return;
    }
    let ((cipher, mnt, pass), fs) = (t.paths(), &t.fs);
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/systemd/fstab.example")).unwrap();
    let line = example.lines().find(|l| l.contains("x-systemd.automount") && !l.starts_with('#')).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let opts = fields[3].replace("/etc/veilfs/vault.pw", s(&pass));
    let tab = fs.path.join("fstab");
    std::fs::write(&tab, format!("{} {} {} {opts} 0 0\n", s(&cipher), s(&mnt), fields[2])).unwrap();
    let out = fs.path.join("gen");
    std::fs::create_dir(&out).unwrap();
    let o = Command::new(generator).args([&out, &out, &out]).env("SYSTEMD_FSTAB", &tab).output().unwrap();
    assert!(o.status.success(), "generator: {}", text(&o));
    let unit = String::from_utf8_lossy(&run("systemd-escape", &["--path", "--suffix=mount", s(&mnt)]).stdout)
        .trim()
        .to_string();
    let mount_unit = std::fs::read_to_string(out.join(&unit)).unwrap();
    let automount = out.join(unit.replace(".mount", ".automount"));
    assert!(std::fs::read_to_string(automount).unwrap().contains("TimeoutIdleSec=30min"));
    let key = |k: &str| {
        mount_unit.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap_or_else(|| panic!("{k}: {mount_unit}"))
    };
    assert_eq!(key("Type"), "fuse.veilfs");
    let o = run("mount", &[key("What"), key("Where"), "-t", key("Type"), "-o", key("Options")]);
    assert!(o.status.success(), "mount as the unit runs it: {}", text(&o));
    let e = mount_entry(&mnt).expect("mounted");
    assert_eq!((e.fstype.as_str(), e.source.as_str()), ("fuse.veilfs", s(&cipher)), "{e:?}");
    assert!(e.super_opts.contains("allow_other"), "{e:?}");
    let o = run("umount", &[s(&mnt)]);
    assert!(o.status.success(), "umount: {}", text(&o));
}

/// The argv[0] of the process serving `mnt` (its command line names the mount point):
/// `/sbin/mount.fuse.veilfs` when mount(8) ran the helper, `veilfs` through mount.fuse3.
fn server_argv0(mnt: &Path) -> Option<String> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        e.file_name().to_str()?.parse::<u32>().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        let argv0 = String::from_utf8_lossy(args.first()?).into_owned();
        (argv0.ends_with("veilfs") && args.contains(&mnt.to_str()?.as_bytes())).then_some(argv0)
    })
}

/// A tmpfs directory owned by `user`, for its vault.
fn user_dir(fs: &Tmpfs, user: &TestUser) -> PathBuf {
    let dir = fs.path.join("home");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.uid)).unwrap();
    dir
}

/// An ordinary user inits, mounts (through fusermount3), writes, uses xattrs (the daemon
/// stays dumpable so /proc/self/fd works), and unmounts. allow_other needs
/// user_allow_other in /etc/fuse.conf: a clear error without it, a working mount with it.
#[test]
fn non_root_user_mounts_through_fusermount3() {
    if !root_only("makes a user (useradd) and edits /etc/fuse.conf") {
        return;
    }
    if !fuse_available() || !which("setfattr") {
        return;
    }
    let _l = machine_lock();
    let user = TestUser::new("vfsys");
    let _fuse = DevFuseOpen::new();
    let conf = FileGuard::set("/etc/fuse.conf", Some("# no user_allow_other\n"));
    let fs = Tmpfs::new("64m");
    let dir = user_dir(&fs, &user);
    let (c, m) = (dir.join("cipher"), dir.join("mnt"));
    let _u = UnmountOnDrop(m.clone());
    let init = format!(
        "cd {d} && echo pw > pass && mkdir mnt && {BIN} init cipher --passfile pass --kdf-memory 8 --kdf-iterations 1 \
         --no-recovery-key",
        d = s(&dir)
    );
    let o = user.sh(60, &init);
    assert!(o.status.success(), "init as user: {}", text(&o));
    let mount = format!("{BIN} mount {} {} --passfile {}/pass", s(&c), s(&m), s(&dir));
    let o = user.sh(60, &mount);
    assert!(o.status.success(), "mount as user: {}", text(&o));
    let e = mount_entry(&m).expect("mounted");
    assert_eq!((e.fstype.as_str(), e.source.as_str()), ("fuse.veilfs", s(&c)), "{e:?}");
    assert!(e.super_opts.contains(&format!("user_id={}", user.uid)), "{e:?}");
    let work = format!(
        "cd {m} && echo hi > f && mkdir d && setfattr -n user.tag -v blue f && getfattr --only-values -n user.tag f \
         && cat f",
        m = s(&m)
    );
    let o = user.sh(30, &work);
    assert!(o.status.success(), "work as user: {}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "bluehi\n");
    // root may not look in (no allow_other).
    assert!(std::fs::read_dir(&m).is_err());
    let o = user.sh(30, &format!("{BIN} umount {}", s(&m)));
    assert!(o.status.success(), "umount as user: {}", text(&o));
    assert!(mount_entry(&m).is_none());

    let o = user.sh(60, &format!("{mount} --allow-other"));
    assert_eq!(code(&o), 8, "{}", text(&o));
    assert!(text(&o).contains("user_allow_other"), "{}", text(&o));
    assert!(mount_entry(&m).is_none());
    conf.write(Some("user_allow_other\n"));
    let o = user.sh(60, &format!("{mount} -o allow_other"));
    assert!(o.status.success(), "mount -o allow_other as user: {}", text(&o));
    assert_eq!(std::fs::read_to_string(m.join("f")).unwrap(), "hi\n", "root reads through allow_other");
    let o = user.sh(30, &format!("fusermount3 -u {}", s(&m)));
    assert!(o.status.success(), "fusermount3 -u as user: {}", text(&o));
    assert!(mount_entry(&m).is_none());

    // A comma and a backslash in CIPHERDIR survive fusermount3's option list. The vault is
    // renamed, not copied: fusermount3 -u returns before the daemon has finished its exit.
    let odd = dir.join("a,b\\c");
    let o = user.sh(60, &format!("cd {} && mv cipher 'a,b\\c'", s(&dir)));
    assert!(o.status.success(), "{}", text(&o));
    let o = user.sh(60, &format!("{BIN} mount '{}' {} --passfile {}/pass", s(&odd), s(&m), s(&dir)));
    assert!(o.status.success(), "mount of a CIPHERDIR with a comma: {}", text(&o));
    assert_eq!(mount_entry(&m).unwrap().source, s(&odd).replace('\\', "\\134"));
    let o = user.sh(30, &format!("{BIN} umount '{}'", s(&odd)));
    assert!(o.status.success(), "veilfs umount CIPHERDIR as user: {}", text(&o));
    assert!(mount_entry(&m).is_none());
    let o = user.sh(60, &format!("cd {} && mv 'a,b\\c' cipher", s(&dir)));
    assert!(o.status.success(), "{}", text(&o));

    // fusermount3 refuses a mount point the user may not write: the error is printed once.
    let root_only = fs.path.join("root-only");
    std::fs::create_dir(&root_only).unwrap();
    let o = user.sh(60, &format!("{BIN} mount {} {} --passfile {}/pass", s(&c), s(&root_only), s(&dir)));
    assert_eq!(code(&o), 8, "{}", text(&o));
    assert_eq!(text(&o).matches("no write access").count(), 1, "{}", text(&o));
}

/// The issue's fstab line with `user`: the user runs `mount MNT` (mount(8) runs the helper
/// as that user, which mounts through fusermount3), works in it, and `umount MNT`.
#[test]
fn non_root_fstab_user_mount() {
    if !root_only("makes a user (useradd) and edits /etc/fstab") {
        return;
    }
    if !fuse_available() {
        return;
    }
    let _l = machine_lock();
    let _helper = Link::helper();
    let user = TestUser::new("vfstab");
    let _fuse = DevFuseOpen::new();
    let fs = Tmpfs::new("64m");
    let dir = user_dir(&fs, &user);
    let (c, m) = (dir.join("cipher"), dir.join("mnt"));
    let _u = UnmountOnDrop(m.clone());
    let init = format!(
        "cd {d} && echo pw > pass && mkdir mnt && {BIN} init cipher --passfile pass --kdf-memory 8 --kdf-iterations 1 \
         --no-recovery-key",
        d = s(&dir)
    );
    let o = user.sh(60, &init);
    assert!(o.status.success(), "init as user: {}", text(&o));
    let line = format!(
        "{} {} fuse.veilfs noauto,user,passfile={}/pass,nofail,x-systemd.automount 0 0\n",
        s(&c),
        s(&m),
        s(&dir)
    );
    let fstab = FileGuard::set("/etc/fstab", None);
    fstab.write(Some(&format!("{}{line}", fstab.old_text())));
    let o = user.sh(60, &format!("mount {}", s(&m)));
    assert!(o.status.success(), "mount MNT as user: {}", text(&o));
    assert!(server_argv0(&m).is_some_and(|a| a.ends_with("mount.fuse.veilfs")), "{:?}", server_argv0(&m));
    let e = mount_entry(&m).expect("mounted");
    assert_eq!((e.fstype.as_str(), e.source.as_str()), ("fuse.veilfs", s(&c)), "{e:?}");
    assert!(e.super_opts.contains(&format!("user_id={}", user.uid)), "{e:?}");
    // `user` implies noexec (and nosuid,nodev): a script in the mount does not run.
    for f in ["noexec", "nosuid", "nodev"] {
        assert!(mount_flags(&m).contains(&f.to_string()), "{f}: {e:?}");
    }
    let o = user.sh(30, &format!("cd {} && echo data > f && cat f && ls", s(&m)));
    assert!(o.status.success(), "work as user: {}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "data\nf\n");
    let o =
        user.sh(30, &format!("cd {} && printf '#!/bin/sh\\necho ran\\n' > s.sh && chmod 755 s.sh && ./s.sh", s(&m)));
    assert!(!o.status.success() && text(&o).contains("Permission denied"), "noexec: {}", text(&o));
    // Only root changes a live mount's flags.
    let o = user.sh(30, &format!("{BIN} mount {} {} -o remount,exec", s(&c), s(&m)));
    assert_eq!(code(&o), 8, "{}", text(&o));
    assert!(text(&o).contains("only root can change the flags"), "{}", text(&o));
    let o = user.sh(30, &format!("umount {}", s(&m)));
    assert!(o.status.success(), "umount MNT as user: {}", text(&o));
    assert!(mount_entry(&m).is_none());

    // `user,exec`: exec wins, the script runs; suid is refused by name for a user.
    fstab.write(Some(&format!("{}{}", fstab.old_text(), line.replace("user,", "user,exec,"))));
    let o = user.sh(60, &format!("mount {}", s(&m)));
    assert!(o.status.success(), "mount MNT (user,exec) as user: {}", text(&o));
    assert!(!mount_flags(&m).contains(&"noexec".to_string()));
    let o = user.sh(30, &format!("{}/s.sh", s(&m)));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n", "{}", text(&o));
    let o = user.sh(30, &format!("umount {}", s(&m)));
    assert!(o.status.success(), "umount MNT as user: {}", text(&o));
    let o = user.sh(60, &format!("{BIN} mount {} {} --passfile {}/pass -o suid", s(&c), s(&m), s(&dir)));
    assert_eq!(code(&o), 8, "{}", text(&o));
    assert!(text(&o).contains("-o suid: only root"), "{}", text(&o));
    assert!(mount_entry(&m).is_none());
}

/// Reads one datagram within `secs`.
fn recv(sock: &UnixDatagram, secs: u64) -> Option<String> {
    sock.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn recv_bytes(sock: &UnixDatagram, secs: u64) -> Option<Vec<u8>> {
    sock.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
    let mut buf = vec![0u8; 65536];
    let n = sock.recv(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// The fields of one entry in the journal's native protocol: `NAME=value\n`, or `NAME\n`,
/// a 64-bit little-endian length, the value and `\n`.
fn journal_fields(mut b: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Some(nl) = b.iter().position(|&c| c == b'\n') {
        let line = &b[..nl];
        if let Some(eq) = line.iter().position(|&c| c == b'=') {
            out.push((lossy(&line[..eq]), lossy(&line[eq + 1..])));
            b = &b[nl + 1..];
        } else {
            let Some(len) = b.get(nl + 1..nl + 9) else { break };
            let len = u64::from_le_bytes(len.try_into().unwrap()) as usize;
            let Some(value) = b.get(nl + 9..nl + 9 + len) else { break };
            out.push((lossy(line), lossy(value)));
            b = b.get(nl + 10 + len..).unwrap_or_default();
        }
    }
    out
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// systemd's NOTIFY_SOCKET protocol: `READY=1` arrives only once the mount is live, from
/// a foreground mount (`-f`, as the shipped units run it) and from a daemonized one (with
/// MAINPID naming the daemon); `STOPPING=1` when it unmounts.
#[test]
fn notify_socket_ready_once_mounted() {
    let Some(t) = setup(None, false) else {
        return;
    };
    let ((cipher, mnt, pass), fs) = (t.paths(), &t.fs);
    let sock_path = fs.path.join("notify");
    let sock = UnixDatagram::bind(&sock_path).unwrap();

    let mut child = Command::new(&BIN)
        .args(["mount", "-f", s(&cipher), s(&mnt), "--passfile", s(&pass)])
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let msg = recv(&sock, 30);
    let live = mount_entry(&mnt);
    let msg = msg.unwrap_or_else(|| {
        let _ = child.kill();
        let mut e = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut e);
        panic!("no notification within 30 s: {e}")
    });
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(msg.contains(&format!("STATUS={} mounted on {}", s(&cipher), s(&mnt))), "{msg}");
    assert!(live.is_some_and(|e| e.fstype == "fuse.veilfs"), "READY=1 came before the mount was live");
    assert!(std::fs::read_dir(&mnt).is_ok());
    // SAFETY: kill with a pid we own.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.try_wait().unwrap().is_some_and(|s| s.success()), "mount -f did not end cleanly on SIGTERM");
    assert_eq!(recv(&sock, 5).as_deref(), Some("STOPPING=1\n"));
    assert!(mount_entry(&mnt).is_none());

    // Daemonized: the parent exits once mounted; the daemon names itself.
    let o = Command::new(&BIN)
        .args(["mount", s(&cipher), s(&mnt), "--passfile", s(&pass)])
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let msg = recv(&sock, 10).expect("READY=1 from the daemon");
    let pid = daemon_pid(&mnt).expect("daemon");
    assert!(msg.lines().any(|l| l == "READY=1") && msg.contains(&format!("MAINPID={pid}\n")), "{msg} (daemon {pid})");
    let o = run(&BIN, &["umount", s(&mnt)]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A daemonized mount logs to the journal when /run/systemd/journal/socket answers: the
/// test stands in for journald (this machine has none; skipped where a real one runs) and
/// receives native-protocol entries with priority, identifier and message.
#[test]
fn daemon_logs_to_the_journal_when_there() {
    if !root_only("binds /run/systemd/journal/socket") {
        return;
    }
    let path = Path::new("/run/systemd/journal/socket");
    if path.symlink_metadata().is_ok() {
        return;
    }
    let Some(t) = setup(None, false) else {
        return;
    };
    require_sandbox("/run/systemd/journal/socket");
    let ((cipher, mnt, pass), fs) = (t.paths(), &t.fs);
    // The socket and the directories made for it go on drop.
    struct Remove(Vec<PathBuf>);
    impl Drop for Remove {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
            }
        }
    }
    let mut made = vec![path.to_path_buf()];
    made.extend(path.ancestors().skip(1).take_while(|d| !d.exists()).map(Path::to_path_buf));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let _r = Remove(made);
    let journal = UnixDatagram::bind(path).unwrap();
    let o = run(&BIN, &["mount", "-v", s(&cipher), s(&mnt), "--passfile", s(&pass)]);
    assert!(o.status.success(), "{}", text(&o));
    let t = Instant::now();
    let mut seen = Vec::new();
    let want = format!("mounted {} on {}", s(&cipher), s(&mnt));
    let entry = loop {
        let Some(msg) = recv_bytes(&journal, 10) else { panic!("no journal entry for the mount: {seen:?}") };
        let fields = journal_fields(&msg);
        if fields.iter().any(|(k, v)| k == "MESSAGE" && *v == want) {
            break fields;
        }
        seen.push(fields);
        assert!(t.elapsed() < Duration::from_secs(10), "{seen:?}");
    };
    let field = |k: &str| entry.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(field("SYSLOG_IDENTIFIER"), Some("veilfs"), "{entry:?}");
    assert_eq!(field("PRIORITY"), Some("5"), "info is notice (tracing-journald's mapping): {entry:?}");
    let o = run(&BIN, &["umount", s(&mnt)]);
    assert!(o.status.success(), "{}", text(&o));

    // A foreground mount whose stderr is the journal's stream (JOURNAL_STREAM=DEV:INODE, as
    // systemd sets it for a service) logs natively too.
    use std::os::unix::fs::MetadataExt;
    let stderr_file = std::fs::File::create(fs.path.join("stderr")).unwrap();
    let meta = stderr_file.metadata().unwrap();
    let mut child = Command::new(&BIN)
        .args(["mount", "-f", "-v", s(&cipher), s(&mnt), "--passfile", s(&pass)])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stdin(Stdio::null())
        .stderr(stderr_file)
        .spawn()
        .unwrap();
    let mut found = false;
    while let Some(msg) = recv_bytes(&journal, 10) {
        if journal_fields(&msg).iter().any(|(k, v)| k == "MESSAGE" && *v == want) {
            found = true;
            break;
        }
    }
    // SAFETY: kill with a pid we own.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert!(found, "no journal entry from the foreground mount");
}

/// The fresh-machine test: scripts/package-deb.sh builds the .deb (with the
/// binary under test), `dpkg -i` installs it, `man veilfs` renders, the bash completion
/// loads, mount(8) finds mount.fuse.veilfs, an ordinary user mounts a vault from an fstab
/// line with `mount MNT`, works in it, `umount MNT`; `dpkg -r` then leaves none of the
/// files `dpkg -L` listed. Skipped when a veilfs package is already installed.
#[test]
fn debian_package_installs_works_and_removes_cleanly() {
    if !root_only("installs a package (dpkg -i)") {
        return;
    }
    if !fuse_available() || !which("dpkg-deb") {
        return;
    }
    require_sandbox("the installed packages (dpkg -i)");
    let _l = machine_lock();
    if run("dpkg-query", &["-W", "-f=${Status}", "veilfs"]).stdout.starts_with(b"install ok") {
        eprintln!("SKIPPED: a veilfs package is installed on this machine; not touching it");
        return;
    }
    struct Removed;
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = run("dpkg", &["--purge", "veilfs"]);
        }
    }
    let fs = Tmpfs::new("256m");
    let out = fs.path.join("deb");
    let repo = env!("CARGO_MANIFEST_DIR");
    let o = Command::new("bash")
        .arg(format!("{repo}/scripts/package-deb.sh"))
        .arg(&out)
        .env("VEILFS_BIN", &BIN)
        .env("DEB_COMPRESSION", "gzip")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "package-deb.sh: {}", text(&o));
    let deb = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb");
    let _removed = Removed;
    let o = run("dpkg", &["-i", s(&deb)]);
    assert!(o.status.success(), "dpkg -i: {}", text(&o));
    let listed: Vec<PathBuf> = String::from_utf8_lossy(&run("dpkg", &["-L", "veilfs"]).stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.symlink_metadata().is_ok_and(|m| !m.is_dir()))
        .collect();
    for want in
        ["/usr/bin/veilfs", HELPER, "/usr/share/man/man1/veilfs.1.gz", "/usr/share/bash-completion/completions/veilfs"]
    {
        assert!(listed.iter().any(|p| p == Path::new(want)), "{want} not in dpkg -L: {listed:?}");
    }
    assert!(listed.iter().any(|p| p.to_string_lossy().contains("systemd")), "no systemd units: {listed:?}");

    let o = sh("MANWIDTH=80 man veilfs 2>&1 | col -b | head -20");
    assert!(String::from_utf8_lossy(&o.stdout).contains("veilfs - "), "man veilfs: {}", text(&o));
    let o = sh("MANWIDTH=80 man veilfs-mount 2>&1 | col -b | grep -c passfile");
    assert!(!String::from_utf8_lossy(&o.stdout).starts_with('0'), "man veilfs-mount: {}", text(&o));
    let o = Command::new("bash")
        .args(["-c", ". /usr/share/bash-completion/completions/veilfs && complete -p veilfs"])
        .output()
        .unwrap();
    assert!(o.status.success() && text(&o).contains("veilfs"), "bash completion: {}", text(&o));
    // The installed user unit parses (systemd-analyze works without a running systemd).
    if which("systemd-analyze") {
        let rt = fs.path.join("runtime");
        std::fs::create_dir(&rt).unwrap();
        let stamp = Path::new("/run/systemd/systemd-units-load");
        let had_stamp = stamp.exists();
        let o = Command::new("systemd-analyze")
            .args(["verify", "--user", "/usr/lib/systemd/user/veilfs@.service"])
            .env("XDG_RUNTIME_DIR", &rt)
            .output()
            .unwrap();
        if !had_stamp {
            // systemd-analyze's unit loader leaves a time stamp there.
            let _ = std::fs::remove_file(stamp);
        }
        assert!(o.status.success() && text(&o).trim().is_empty(), "systemd-analyze verify: {}", text(&o));
    }

    // The installed binary and helper, used by an ordinary user from fstab.
    let user = TestUser::new("vfdeb");
    let _fuse = DevFuseOpen::new();
    let dir = user_dir(&fs, &user);
    let (c, m) = (dir.join("cipher"), dir.join("mnt"));
    let _u = UnmountOnDrop(m.clone());
    let o = user.sh(
        60,
        &format!(
            "cd {} && echo pw > pass && mkdir mnt && veilfs init cipher --passfile pass --kdf-memory 8 \
             --kdf-iterations 1 --no-recovery-key",
            s(&dir)
        ),
    );
    assert!(o.status.success(), "init as user: {}", text(&o));
    let fstab = FileGuard::set("/etc/fstab", None);
    fstab.write(Some(&format!(
        "{}{} {} fuse.veilfs noauto,user,passfile={}/pass,nofail,x-systemd.automount 0 0\n",
        fstab.old_text(),
        s(&c),
        s(&m),
        s(&dir)
    )));
    let o = user.sh(60, &format!("mount {}", s(&m)));
    assert!(o.status.success(), "mount MNT as user: {}", text(&o));
    // mount(8) found the packaged helper (not the mount.fuse3 fallback).
    assert_eq!(server_argv0(&m).as_deref(), Some("/sbin/mount.fuse.veilfs"));
    let o = user.sh(60, &format!("cd {m} && echo doc > note && cat note && cd / && umount {m}", m = s(&m)));
    assert!(o.status.success(), "work/umount as user: {}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "doc\n");
    assert!(mount_entry(&m).is_none());
    let o = run(&BIN, &["cat", &format!("{}/note", s(&c)), "--passfile", &format!("{}/pass", s(&dir))]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "doc\n", "{}", text(&o));

    let o = run("dpkg", &["-r", "veilfs"]);
    assert!(o.status.success(), "dpkg -r: {}", text(&o));
    let left: Vec<&PathBuf> = listed.iter().filter(|p| p.symlink_metadata().is_ok()).collect();
    assert!(left.is_empty(), "left behind by dpkg -r: {left:?}");
}
