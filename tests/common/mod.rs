//! Test fixtures that mount veilfs for real.
//!
//! Every mount lives on its own size-capped tmpfs (so runaway data never reaches the shared
//! disk) and is unmounted in `Drop`, also when the test panics. Without /dev/fuse or root,
//! tests skip with a message — except under `CI=true`, where they fail loudly.
#![allow(dead_code)]

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_veilfs");
pub const PASSWORD: &str = "test password";

/// Whether real mounts can run here. Panics under CI=true when they cannot.
pub fn fuse_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && Path::new("/dev/fuse").exists() && which("fusermount3");
    if !ok {
        let msg = "mount tests need root, /dev/fuse and fusermount3 (apt-get install fuse3)";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{msg}: refusing to skip under CI=true");
        }
        eprintln!("SKIPPED: {msg}");
    }
    ok
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

/// A size-capped tmpfs, unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn new(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("veilfs-test-").tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let o =
            run("mount", &["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs", path.to_str().unwrap()]);
        assert!(o.status.success(), "mount tmpfs: {}", text(&o));
        Tmpfs { path, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = run("umount", &["-l", self.path.to_str().unwrap()]);
    }
}

/// A vault mounted with `veilfs mount`, and a plain directory beside it for comparisons.
pub struct Mounted {
    pub cipher: PathBuf,
    pub mnt: PathBuf,
    pub plain: PathBuf,
    pub passfile: PathBuf,
    pub extra: Vec<String>,
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
        Command::new(BIN).args(&args).stdin(Stdio::null()).output().unwrap()
    }

    pub fn umount(&mut self) {
        if self.mounted {
            let o = run(BIN, &["umount", self.mnt.to_str().unwrap()]);
            if !o.status.success() {
                let _ = run("fusermount3", &["-uz", self.mnt.to_str().unwrap()]);
            }
            self.mounted = false;
        }
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
        let (uid, gid) = (format!("--reuid={}", self.uid), format!("--regid={}", self.uid));
        run("timeout", &[&secs.to_string(), "setpriv", &uid, &gid, "--clear-groups", "sh", "-c", script])
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = run("pkill", &["-KILL", "-u", &self.uid.to_string()]);
        let _ = run("userdel", &[&self.name]);
    }
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

/// Serialises the tests of one binary that change machine-wide files (/etc/fstab,
/// /etc/fuse.conf, /dev/fuse's mode, /usr/sbin helpers, installed packages).
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
            let _ = run("umount", &["-l", self.0.to_str().unwrap()]);
        }
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

/// A new vault in `dir/cipher` with a cheap KDF, the password in `dir/pass`, an empty
/// `dir/mnt`. Returns (cipher, mnt, passfile).
pub fn new_vault(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (cipher, mnt, pass) = (dir.join("cipher"), dir.join("mnt"), dir.join("pass"));
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(&pass, format!("{PASSWORD}\n")).unwrap();
    let o = run(
        BIN,
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
        let msg = "terminal tests need python3";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}: refusing to skip under CI=true");
        eprintln!("SKIPPED: {msg}");
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
