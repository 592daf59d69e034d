//! Test fixtures that mount veilfs for real.
//!
//! Every mount lives on a size-capped tmpfs (so runaway data never reaches the shared disk)
//! and is unmounted in `Drop`, also when the test panics. Without /dev/fuse, tests skip with
//! a message — except under `CI=true`, where they fail loudly.
//!
//! The tests run as root or as an ordinary user (scripts/test-nonroot.sh runs the mount
//! group as one). As a user, mounts go through fusermount3 as on a desktop: /dev/fuse must
//! be open to the user, and since a user cannot mount a tmpfs of its own, each test's
//! "tmpfs" is a directory in `$TMPDIR`, which must itself be a tmpfs. Tests that need root
//! say so with [`root_only`], which reports them as not run.
//!
//! Two machines sharing a vault: [`syncthing`] runs two Syncthing instances on 127.0.0.1
//! that sync one folder, [`sshfs`] mounts a directory through sshfs over loopback.
#![allow(dead_code)]

pub mod sshfs;
pub mod syncthing;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The `veilfs` binary under test: the one cargo built, or `$VEILFS_TEST_BIN` (the non-root
/// run copies the binaries where its user can reach them: the build directory may be private).
pub static BIN: Bin = Bin(std::sync::OnceLock::new());
pub const PASSWORD: &str = "test password";

/// The path of the binary under test; a `&str` (through `Deref`) and `Display`.
pub struct Bin(std::sync::OnceLock<String>);

impl std::ops::Deref for Bin {
    type Target = str;
    fn deref(&self) -> &str {
        self.0.get_or_init(|| {
            keep_state_in_target();
            std::env::var("VEILFS_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_veilfs").into())
        })
    }
}

/// Every veilfs the tests start keeps its host-local state (the crash marks of its vaults)
/// under the build's own temporary directory, never in the machine's `/var/lib/veilfs` or a
/// user's `~/.local/state`: a test that kills a daemon on purpose would leave its mark there.
/// Set once, before the first veilfs is started (every start goes through [`BIN`]), unless
/// the caller chose a directory.
fn keep_state_in_target() {
    if std::env::var_os("VEILFS_STATE_DIR").is_none() {
        let dir = concat!(env!("CARGO_TARGET_TMPDIR"), "/veilfs-state");
        std::env::set_var("VEILFS_STATE_DIR", dir);
    }
}

impl std::fmt::Display for Bin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

impl AsRef<std::ffi::OsStr> for Bin {
    fn as_ref(&self) -> &std::ffi::OsStr {
        std::ffi::OsStr::new(&**self)
    }
}

/// Whether the tests run as root (otherwise as an ordinary user, through fusermount3).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether real mounts can run here, as root or as this user. Panics under CI=true when they
/// cannot.
pub fn fuse_available() -> bool {
    let missing = if !Path::new("/dev/fuse").exists() || !which("fusermount3") {
        Some("mount tests need /dev/fuse and fusermount3 (apt-get install fuse3)".to_string())
    } else if is_root() {
        None
    } else if std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_err() {
        Some("mount tests as an ordinary user need /dev/fuse open to it (mode 0666, as desktop distributions ship it); or run them as root".into())
    } else if !on_tmpfs(&std::env::temp_dir()) {
        Some(format!(
            "mount tests as an ordinary user keep their data in TMPDIR, which must be a size-capped tmpfs ({} is not); or run them as root",
            std::env::temp_dir().display()
        ))
    } else {
        None
    };
    if let Some(msg) = &missing {
        skip(msg);
    }
    missing.is_none()
}

/// A test that cannot run here says why and skips, except under CI=true, where what it
/// needs must be there: there it fails with the same message.
pub fn skip(msg: &str) {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}: refusing to skip under CI=true");
    eprintln!("SKIPPED: {msg}");
}

fn on_tmpfs(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: zeroed statfs is a valid out-buffer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC }
}

/// For a test that needs root: true as root. As an ordinary user it says that the test was
/// not run and why — on stderr and, for scripts/test-nonroot.sh to list and count, as a line
/// `TEST<TAB>WHY` appended to `$VEILFS_ROOT_ONLY_LOG` — and returns false.
pub fn root_only(why: &str) -> bool {
    if is_root() {
        return true;
    }
    let test = std::thread::current().name().unwrap_or("?").to_string();
    eprintln!("ROOT-ONLY: {test} not run as an ordinary user: {why}");
    if let Some(log) = std::env::var_os("VEILFS_ROOT_ONLY_LOG") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        writeln!(f, "{test}\t{why}").unwrap();
    }
    false
}

pub fn which(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

pub fn sh(script: &str) -> Output {
    Command::new("sh").arg("-c").arg(script).stdin(Stdio::null()).output().unwrap()
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A size-capped tmpfs of its own, unmounted on drop. As an ordinary user (who cannot mount
/// one) a directory in `$TMPDIR`, a tmpfs shared by the tests (`fuse_available` checks it).
pub struct Tmpfs {
    pub path: PathBuf,
    mounted: bool,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn new(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("veilfs-test-").tempdir().unwrap();
        let path = dir.path().to_path_buf();
        if !is_root() {
            return Tmpfs { path, mounted: false, _dir: dir };
        }
        let o =
            run("mount", &["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs", path.to_str().unwrap()]);
        assert!(o.status.success(), "mount tmpfs: {}", text(&o));
        Tmpfs { path, mounted: true, _dir: dir }
    }

    /// Bytes the files under it take (its own file system only: mounts on it are left out).
    pub fn used(&self) -> u64 {
        let o = run("du", &["-sxB1", self.path.to_str().unwrap()]);
        assert!(o.status.success(), "du: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).split_whitespace().next().unwrap().parse().unwrap()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = run("umount", &["-l", self.path.to_str().unwrap()]);
        }
    }
}

/// A vault mounted with `veilfs mount`, and a plain directory beside it for comparisons.
pub struct Mounted {
    pub cipher: PathBuf,
    pub mnt: PathBuf,
    pub plain: PathBuf,
    pub passfile: PathBuf,
    pub extra: Vec<String>,
    /// Environment variables for the mount daemon (e.g. `FAILPOINTS` in tests/crash.rs).
    pub env: Vec<(String, String)>,
    mounted: bool,
    pub tmpfs: Tmpfs,
}

impl Mounted {
    /// A fresh vault on a new tmpfs of `size`, mounted with `extra` options.
    pub fn new(size: &str, extra: &[&str]) -> Option<Mounted> {
        if !fuse_available() {
            return None;
        }
        let tmpfs = Tmpfs::new(size);
        let (cipher, mnt, passfile) = new_vault(&tmpfs.path);
        let plain = tmpfs.path.join("plain");
        std::fs::create_dir_all(&plain).unwrap();
        let mut m = Mounted {
            cipher,
            mnt,
            plain,
            passfile,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            mounted: false,
            tmpfs,
        };
        m.mount();
        Some(m)
    }

    pub fn mount(&mut self) {
        let o = self.mount_cmd(&self.mnt.clone());
        assert!(o.status.success(), "veilfs mount: {}", text(&o));
        self.mounted = true;
        // The mount belongs to whoever ran the test: an ordinary user's went through fusermount3.
        // SAFETY: geteuid has no preconditions.
        let owner = format!("user_id={}", unsafe { libc::geteuid() });
        let e = mount_entry(&self.mnt).expect("mounted");
        assert!(e.super_opts.split(',').any(|o| o == owner), "{owner} not in {e:?}");
    }

    /// Mounts again and returns what `veilfs mount` said (it must succeed).
    pub fn mount_output(&mut self) -> Output {
        let o = self.mount_cmd(&self.mnt.clone());
        assert!(o.status.success(), "veilfs mount: {}", text(&o));
        self.mounted = true;
        o
    }

    /// Runs `veilfs mount` of this vault at `at` (for second mounts).
    pub fn mount_cmd(&self, at: &Path) -> Output {
        let mut args = vec![
            "mount".to_string(),
            self.cipher.display().to_string(),
            at.display().to_string(),
            "--passfile".into(),
            self.passfile.display().to_string(),
        ];
        args.extend(self.extra.iter().cloned());
        // On a machine without journal or syslog the daemon logs to a file: the test's own.
        Command::new(&BIN)
            .args(&args)
            .env("VEILFS_LOG_FILE", self.tmpfs.path.join("veilfs.log"))
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn umount(&mut self) {
        if self.mounted {
            let o = run(&BIN, &["umount", self.mnt.to_str().unwrap()]);
            if !o.status.success() {
                let _ = run("fusermount3", &["-uz", self.mnt.to_str().unwrap()]);
            }
            self.mounted = false;
        }
    }

    /// Kills the mount's daemon with SIGKILL (a crash: no destructor, no clean release) and
    /// detaches the dead mount; returns the daemon's pid.
    pub fn kill_daemon(&mut self) -> u32 {
        let pid = daemon_pid(&self.mnt).expect("the daemon's pid");
        assert!(run("kill", &["-KILL", &pid.to_string()]).status.success());
        let t = std::time::Instant::now();
        // Gone, or every thread a zombie: only then are its files (and with them its OS
        // locks) closed. Its command line vanishes earlier, and a killed leader thread is a
        // zombie while the others still exit, holding the files they share.
        let dead = || {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
            tasks.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .map(|st| st.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])))
                    .unwrap_or(true)
            })
        };
        while !dead() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "the daemon did not die");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(run("fusermount3", &["-uz", self.mnt.to_str().unwrap()]).status.success());
        self.mounted = false;
        pid
    }

    pub fn remount(&mut self) {
        self.umount();
        self.mount();
    }

    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Every byte of the ciphertext tree, names included.
    pub fn ciphertext_dump(&self) -> Vec<u8> {
        let mut out = Vec::new();
        fn walk(p: &Path, out: &mut Vec<u8>) {
            for e in std::fs::read_dir(p).unwrap().flatten() {
                out.extend_from_slice(e.file_name().as_bytes());
                out.push(b'\n');
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    walk(&e.path(), out);
                } else if ft.is_file() {
                    out.extend(std::fs::read(e.path()).unwrap());
                } else if ft.is_symlink() {
                    out.extend_from_slice(std::fs::read_link(e.path()).unwrap().as_os_str().as_bytes());
                }
            }
        }
        walk(&self.cipher, &mut out);
        out
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.umount();
    }
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// An ordinary user made for one test (`useradd`), deleted on drop. Tests run commands as
/// it with `setpriv`; its uid is free on this machine.
pub struct TestUser {
    pub name: String,
    pub uid: u32,
}

impl TestUser {
    pub fn new(prefix: &str) -> TestUser {
        require_sandbox("the machine's users (useradd)");
        let name = format!("{prefix}{}", std::process::id() % 100_000);
        let _ = run("userdel", &[&name]);
        let o = run("useradd", &["--no-create-home", "--user-group", "--shell", "/bin/sh", &name]);
        assert!(o.status.success(), "useradd {name}: {}", text(&o));
        let o = run("id", &["-u", &name]);
        let uid = String::from_utf8_lossy(&o.stdout).trim().parse().expect("uid of the new user");
        TestUser { name, uid }
    }

    /// `sh -c script` as this user (its own group, no others), with a time limit.
    pub fn sh(&self, secs: u32, script: &str) -> Output {
        self.sh_in_groups(secs, &[], script)
    }

    /// `sh -c script` as this user with supplementary `groups`, with a time limit.
    pub fn sh_in_groups(&self, secs: u32, groups: &[u32], script: &str) -> Output {
        let (uid, gid) = (format!("--reuid={}", self.uid), format!("--regid={}", self.uid));
        let groups = match groups {
            [] => "--clear-groups".to_string(),
            g => format!("--groups={}", g.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
        };
        run("timeout", &[&secs.to_string(), "setpriv", &uid, &gid, &groups, "sh", "-c", script])
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = run("pkill", &["-KILL", "-u", &self.uid.to_string()]);
        let _ = run("userdel", &[&self.name]);
    }
}

/// Whether the vault lock of `cipherdir` is free: nobody holds an `flock` on its
/// `veilfs.lock` (asked with util-linux `flock -n`, which takes and drops it at once).
pub fn vault_lock_is_free(cipherdir: &Path) -> bool {
    let lock = cipherdir.join("veilfs.lock");
    run("flock", &["-n", "-x", lock.to_str().unwrap(), "true"]).status.success()
}

/// Runs `cmd args` with a time limit; `None` if it had to be killed (it hung).
pub fn run_timeout(secs: u64, cmd: &str, args: &[&str]) -> Option<Output> {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    let t = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if t.elapsed() > std::time::Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The pid of the `veilfs mount` daemon serving `mnt`.
pub fn daemon_pid(mnt: &Path) -> Option<u32> {
    let want = mnt.display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        (args.first().is_some_and(|a| a.ends_with(b"veilfs"))
            && args.iter().any(|a| *a == b"mount")
            && args.contains(&want.as_bytes()))
        .then_some(pid)
    })
}

/// Fails the calling test unless it runs inside `scripts/sandbox.sh` (as `scripts/test.sh`
/// runs the suite): `what` is the machine-wide state it is about to change (a user, an /etc
/// file, the mount helper in /usr/sbin, a package, /dev/fuse's mode). In the sandbox those
/// changes go to a throwaway overlay and namespace; outside it they would change the machine
/// of whoever runs `cargo test` as root, which a test must never do.
pub fn require_sandbox(what: &str) {
    if std::env::var_os("VEILFS_TEST_SANDBOX").is_none_or(|v| v != "1") {
        panic!(
            "this test changes {what} and runs only in a throwaway view of the machine: run it as \
             `scripts/sandbox.sh cargo test --release --test NAME` (scripts/test.sh does)"
        );
    }
}

/// Serialises the tests of one binary that change machine-wide files (/etc/fstab,
/// /etc/fuse.conf, /dev/fuse's mode, /usr/sbin helpers, installed packages). Inside
/// `scripts/sandbox.sh` they change its overlay only.
pub fn machine_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A machine file replaced for one test and put back as it was on drop (also when it did
/// not exist, and when the test panics).
pub struct FileGuard {
    path: PathBuf,
    old: Option<Vec<u8>>,
}

impl FileGuard {
    /// Replaces `path`'s content with `content` (`None`: removes it).
    pub fn set(path: &str, content: Option<&str>) -> FileGuard {
        require_sandbox(path);
        let path = PathBuf::from(path);
        let old = std::fs::read(&path).ok();
        let g = FileGuard { path, old };
        g.write(content);
        g
    }

    /// The content it had before.
    pub fn old_text(&self) -> String {
        String::from_utf8_lossy(self.old.as_deref().unwrap_or_default()).into_owned()
    }

    pub fn write(&self, content: Option<&str>) {
        match content {
            Some(c) => std::fs::write(&self.path, c).unwrap(),
            None => {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl Drop for FileGuard {
    fn drop(&mut self) {
        match &self.old {
            Some(b) => std::fs::write(&self.path, b).unwrap(),
            None => {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// /dev/fuse opened to every user (mode 0666, as desktop distributions ship it); its mode
/// is restored on drop.
pub struct DevFuseOpen {
    mode: u32,
}

impl DevFuseOpen {
    pub fn new() -> DevFuseOpen {
        use std::os::unix::fs::PermissionsExt;
        require_sandbox("/dev/fuse's mode");
        let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o7777;
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666)).unwrap();
        DevFuseOpen { mode }
    }
}

impl Drop for DevFuseOpen {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(self.mode));
    }
}

/// A mount point that is unmounted (lazily, whoever mounted it) on drop if still mounted.
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        if mount_entry(&self.0).is_some() {
            lazy_unmount(&self.0);
        }
    }
}

/// Detaches the mount at `mnt` now: `umount -l` as root, `fusermount3 -uz` as its user.
pub fn lazy_unmount(mnt: &Path) {
    if is_root() {
        let _ = run("umount", &["-l", mnt.to_str().unwrap()]);
    } else {
        let _ = run("fusermount3", &["-uz", mnt.to_str().unwrap()]);
    }
}

/// One line of /proc/self/mountinfo: the mount's type, source, per-mount options and
/// super-block options.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub fstype: String,
    pub source: String,
    pub mount_opts: String,
    pub super_opts: String,
}

/// The topmost mount at `mnt` (an absolute path without characters the kernel escapes).
pub fn mount_entry(mnt: &Path) -> Option<MountEntry> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        (f.get(4)? == &mnt.to_str()?).then(|| MountEntry {
            fstype: f[sep + 1].to_string(),
            source: f[sep + 2].to_string(),
            mount_opts: f[5].to_string(),
            super_opts: f.get(sep + 3).unwrap_or(&"").to_string(),
        })
    })
}

/// Writes `password` as a password file readable by its owner only (a file others may read
/// is used with a warning, which would stand in the output the tests read).
pub fn write_passfile(path: &Path, password: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{password}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A new vault in `dir/cipher` with a cheap KDF, the password in `dir/pass`, an empty
/// `dir/mnt`. Returns (cipher, mnt, passfile).
pub fn new_vault(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (cipher, mnt, pass) = (dir.join("cipher"), dir.join("mnt"), dir.join("pass"));
    std::fs::create_dir_all(&mnt).unwrap();
    write_passfile(&pass, PASSWORD);
    let o = run(
        &BIN,
        &[
            "init",
            cipher.to_str().unwrap(),
            "--passfile",
            pass.to_str().unwrap(),
            "--kdf-memory",
            "8",
            "--kdf-iterations",
            "1",
            "--no-recovery-key",
        ],
    );
    assert!(o.status.success(), "init: {}", text(&o));
    (cipher, mnt, pass)
}

/// Drives a command on a pseudo-terminal (python3's `pty`): it types each answer after the
/// next prompt (output that ends in ": " and waits for input), then reports the child's pid once it asks again or
/// has exited, and finally its exit code and output. The answers reach the program only
/// through the terminal (not its arguments or environment).
const PTY_DRIVER: &str = r#"
import os, pty, select, sys, time
args = sys.argv[1:]
answers = [sys.stdin.readline().rstrip("\n") for _ in range(int(sys.stdin.readline()))]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(args[0], args)
out, status = b"", None
def pump(timeout):
    global out
    if select.select([fd], [], [], timeout)[0]:
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        out += data
        return bool(data)
    return False
def exited():
    global status
    if status is None:
        p, st = os.waitpid(pid, os.WNOHANG)
        if p:
            status = st
    return status is not None
def prompted(pos):
    deadline = time.time() + 60
    while not out[pos:].endswith(b": ") and not exited() and time.time() < deadline:
        pump(0.05)
    return out[pos:].endswith(b": ")
pos = 0
for a in answers:
    if not prompted(pos):
        break
    pos = len(out)
    os.write(fd, a.encode() + b"\n")
prompted(pos)
print(f"child {pid}", flush=True)
while not exited():
    pump(0.05)
while pump(0.1):
    pass
sys.stdout.write(out.decode("utf-8", "replace"))
sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
"#;

/// A command running on a pseudo-terminal, see [`on_pty`].
pub struct OnPty {
    driver: std::process::Child,
    lines: std::io::BufReader<std::process::ChildStdout>,
    /// The program's pid: it has read every answer and asks again, or has exited.
    pub pid: u32,
}

/// Runs `args` on a pseudo-terminal, typing `answers` at its prompts. `None` (a skip) when
/// python3 is missing, except under CI=true, where that panics.
pub fn on_pty(args: &[&str], answers: &[&str]) -> Option<OnPty> {
    use std::io::{BufRead, Write};
    if !which("python3") {
        skip("terminal tests need python3");
        return None;
    }
    let mut driver = Command::new("python3")
        .arg("-c")
        .arg(PTY_DRIVER)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = driver.stdin.take().unwrap();
    writeln!(stdin, "{}", answers.len()).unwrap();
    for a in answers {
        writeln!(stdin, "{a}").unwrap();
    }
    drop(stdin);
    let mut lines = std::io::BufReader::new(driver.stdout.take().unwrap());
    let mut first = String::new();
    lines.read_line(&mut first).unwrap();
    let pid = first.trim().strip_prefix("child ").and_then(|p| p.parse().ok());
    let pid = pid.unwrap_or_else(|| panic!("the pty driver did not start {args:?}: {first:?}"));
    Some(OnPty { driver, lines, pid })
}

impl OnPty {
    /// Waits for the program to end: its exit code and everything it wrote to the terminal.
    pub fn finish(mut self) -> (i32, String) {
        use std::io::Read;
        let mut out = String::new();
        self.lines.read_to_string(&mut out).unwrap();
        let code = self.driver.wait().unwrap().code().unwrap_or(-1);
        (code, out)
    }
}

impl Drop for OnPty {
    fn drop(&mut self) {
        // The program loses its terminal with the driver, and ends.
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Every name, file's bytes and symlink target under `p`, in sorted order (so two trees with
/// the same contents dump equal whatever their readdir order).
pub fn dump_tree(p: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(p).unwrap().flatten().collect();
    names.sort_by_key(|e| e.file_name());
    for e in names {
        out.extend_from_slice(e.file_name().as_bytes());
        out.push(b'\n');
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            out.extend(dump_tree(&e.path()));
        } else if ft.is_file() {
            out.extend(std::fs::read(e.path()).unwrap());
        } else if ft.is_symlink() {
            out.extend_from_slice(std::fs::read_link(e.path()).unwrap().as_os_str().as_bytes());
        }
    }
    out
}

/// A reverse vault over a plaintext directory (`veilfs init --reverse`), mounted with
/// `veilfs mount --reverse` while `mounted`; unmounted on drop.
pub struct ReverseMount {
    pub plain: PathBuf,
    pub mnt: PathBuf,
    pub passfile: PathBuf,
    pub extra: Vec<String>,
    mounted: bool,
}

impl ReverseMount {
    /// Makes `plain` (existing) a reverse vault with a cheap KDF; `mnt` is created. Not mounted.
    pub fn init(plain: &Path, mnt: &Path, passfile: &Path) -> ReverseMount {
        std::fs::create_dir_all(mnt).unwrap();
        write_passfile(passfile, PASSWORD);
        let p = passfile.to_str().unwrap();
        let o = run(
            &BIN,
            &[
                "init",
                "--reverse",
                plain.to_str().unwrap(),
                "--passfile",
                p,
                "--kdf-memory",
                "8",
                "--kdf-iterations",
                "1",
            ],
        );
        assert!(o.status.success(), "init --reverse: {}", text(&o));
        ReverseMount::existing(plain, mnt, passfile)
    }

    /// `veilfs mount PLAINDIR MNT ARGS…` (no flags added: for `-o reverse,…`); the output.
    pub fn mount_raw(&mut self, args: &[&str]) -> Output {
        let o = Command::new(&BIN)
            .args(["mount", self.plain.to_str().unwrap(), self.mnt.to_str().unwrap()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        self.mounted = o.status.success();
        o
    }

    /// An already made reverse vault in `plain`.
    pub fn existing(plain: &Path, mnt: &Path, passfile: &Path) -> ReverseMount {
        std::fs::create_dir_all(mnt).unwrap();
        ReverseMount {
            plain: plain.to_path_buf(),
            mnt: mnt.to_path_buf(),
            passfile: passfile.to_path_buf(),
            extra: Vec::new(),
            mounted: false,
        }
    }

    pub fn mount(&mut self) {
        let mut args = vec![
            "mount".to_string(),
            "--reverse".into(),
            self.plain.display().to_string(),
            self.mnt.display().to_string(),
            "--passfile".into(),
            self.passfile.display().to_string(),
        ];
        args.extend(self.extra.iter().cloned());
        let o = Command::new(&BIN).args(&args).stdin(Stdio::null()).output().unwrap();
        assert!(o.status.success(), "veilfs mount --reverse: {}", text(&o));
        self.mounted = true;
    }

    pub fn umount(&mut self) {
        if self.mounted {
            let o = run(&BIN, &["umount", self.mnt.to_str().unwrap()]);
            if !o.status.success() {
                let _ = run("fusermount3", &["-uz", self.mnt.to_str().unwrap()]);
            }
            self.mounted = false;
        }
    }
}

impl Drop for ReverseMount {
    fn drop(&mut self) {
        self.umount();
    }
}

fn c_path(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// `lsetxattr(p, name, value, 0)`.
pub fn xattr_set(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (c, n) = (c_path(p), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid C strings and a readable value buffer of the given length.
    let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `lgetxattr(p, name)`: the whole value (up to Linux's 64 KiB).
pub fn xattr_get(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let (c, n) = (c_path(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C strings and a writable buffer of the given length.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// `llistxattr(p)`: the names.
pub fn xattr_list(p: &Path) -> std::io::Result<Vec<String>> {
    let c = c_path(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: a valid C string and a writable buffer of the given length.
    let r = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf.split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
}

/// `lremovexattr(p, name)`.
pub fn xattr_remove(p: &Path, name: &str) -> std::io::Result<()> {
    let (c, n) = (c_path(p), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid C strings.
    if unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Turns the unmounted vault in `cipher` (fresh from `init`) into one made before the feature
/// `iv-in-name` (docs/FORMAT.md §7.1): its config without the feature, its top directory's
/// IV in the 16-byte file `veilfs.diriv` instead of the empty file named after it.
pub fn without_iv_in_name(cipher: &Path, passfile: &Path) {
    use veilfs_core::diriv::IvCopy;
    let pw = std::fs::read_to_string(passfile).unwrap();
    let secret = veilfs_core::Secret::Password(secrecy::SecretString::from(pw.trim_end().to_string()));
    let mut v = veilfs_core::Vault::open(cipher, &secret, None).unwrap();
    let mut cfg = v.config().clone();
    cfg.features.retain(|f| f != veilfs_core::config::FEATURE_IV_IN_NAME);
    v.save_config(cfg).unwrap();
    let root = v.root_dir().unwrap();
    IvCopy::Name.remove(root.fd(), &root.iv).unwrap();
    IvCopy::File.write(root.fd(), &root.iv).unwrap();
}

/// The ciphertext size of a `plain`-byte file in a new vault (4 KiB blocks, AES-256-GCM, a
/// block map: docs/FORMAT.md §5.10).
pub fn cipher_size(plain: u64) -> u64 {
    veilfs_core::content::blockmap::MapLayout::new(4096, 28).cipher_size(plain)
}

/// Turns the unmounted vault in `cipher` into one made before `feature` existed (its config
/// without it), for a feature that changes nothing already on disk (e.g. `ordered-growth`).
pub fn without_feature(cipher: &Path, passfile: &Path, feature: &str) {
    let pw = std::fs::read_to_string(passfile).unwrap();
    let secret = veilfs_core::Secret::Password(secrecy::SecretString::from(pw.trim_end().to_string()));
    let mut v = veilfs_core::Vault::open(cipher, &secret, None).unwrap();
    let mut cfg = v.config().clone();
    cfg.features.retain(|f| f != feature);
    v.save_config(cfg).unwrap();
}

/// Every backing directory under `cipher` with the names (and sizes) of its directory IV
/// copies (`veilfs.diriv` or `veilfs.diriv.*`).
pub fn iv_copies(cipher: &Path) -> Vec<(PathBuf, Vec<(String, u64)>)> {
    let mut out = Vec::new();
    let mut todo = vec![cipher.to_path_buf()];
    while let Some(d) = todo.pop() {
        let mut copies = Vec::new();
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let (name, md) = (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap());
            if md.is_dir() {
                todo.push(e.path());
            } else if name.starts_with("veilfs.diriv") {
                copies.push((name, md.len()));
            }
        }
        out.push((d, copies));
    }
    out
}

/// The user entries of a ciphertext directory (every name but veilfs's own `veilfs.*`
/// files), sorted.
pub fn user_entries(cipher_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(cipher_dir)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().as_bytes().starts_with(b"veilfs."))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// The name Syncthing gives its conflict copy of `entry` (a ciphertext `D.S`): the conflict
/// part goes before the "extension", which for a vault name is its binding `S`.
pub const SYNCTHING_PART: &str = "sync-conflict-20261127-101010-ABCDEFG";

/// The part of a second Syncthing conflict copy (of another device, a day later), for a copy
/// of a copy: `D.<SYNCTHING_PART>.<SYNCTHING_PART_2>.S`.
pub const SYNCTHING_PART_2: &str = "sync-conflict-20261128-090909-HIJKLMN";

/// `entry`'s Syncthing conflict copy name (see [`SYNCTHING_PART`]).
pub fn syncthing_copy_name(entry: &Path) -> PathBuf {
    copy_name_with(entry, &format!(".{SYNCTHING_PART}"))
}

/// The part old ownCloud clients insert before a conflict copy's extension.
pub const OWNCLOUD_PART: &str = "_conflict-20261127-101010";

/// `entry`'s conflict copy name by a tool that inserts `part` right before the "extension"
/// (the binding `S`): OneDrive's `-HOST`, old ownCloud's [`OWNCLOUD_PART`]. On a short entry
/// both give another well-formed key `D<part>`.
pub fn copy_name_with(entry: &Path, part: &str) -> PathBuf {
    let name = entry.file_name().unwrap().to_str().unwrap();
    let dot = name.rfind('.').unwrap();
    entry.with_file_name(format!("{}{part}{}", &name[..dot], &name[dot..]))
}

/// Mounts `m`'s vault in the foreground with its log going to `log`; returns once mounted.
pub fn foreground_mount(m: &Mounted, log: &Path) -> std::process::Child {
    foreground_mount_with(m, log, &[])
}

/// [`foreground_mount`] with `extra` options.
pub fn foreground_mount_with(m: &Mounted, log: &Path, extra: &[&str]) -> std::process::Child {
    let child = std::process::Command::new(&BIN)
        .args([
            "mount",
            m.cipher.to_str().unwrap(),
            m.mnt.to_str().unwrap(),
            "--passfile",
            m.passfile.to_str().unwrap(),
            "-f",
        ])
        .args(extra)
        .envs(m.env.iter().cloned())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !sh(&format!("grep -q ' {} ' /proc/mounts", m.mnt.display())).status.success() {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "mount did not come up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child
}
