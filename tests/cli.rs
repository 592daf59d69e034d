//! The `veilfs` command line, end to end: password sources, exit codes, slots, and the
//! offline tools (import/export/cat/ls/encrypt-path/decrypt-path) on real trees.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_veilfs");
const WEAK: [&str; 4] = ["--kdf-memory", "8", "--kdf-iterations", "1"];

fn veilfs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).stdin(Stdio::null()).output().unwrap()
}

fn veilfs_stdin(args: &[&str], input: &str) -> Output {
    let mut c = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    c.wait_with_output().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Fixture {
    _t: tempfile::TempDir,
    dir: PathBuf,
    vault: PathBuf,
    pf: PathBuf,
    recovery: String,
}

impl Fixture {
    fn new() -> Self {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_path_buf();
        let pf = dir.join("pf");
        std::fs::write(&pf, "hunter2\n").unwrap();
        let vault = dir.join("vault");
        let o = veilfs(&[&["init", vault.to_str().unwrap(), "--passfile", pf.to_str().unwrap()][..], &WEAK].concat());
        assert_eq!(code(&o), 0, "{}", err(&o));
        let recovery = out(&o).trim().to_string();
        Fixture { _t: t, dir, vault, pf, recovery }
    }

    fn v(&self) -> &str {
        self.vault.to_str().unwrap()
    }

    fn p(&self) -> [&str; 2] {
        ["--passfile", self.pf.to_str().unwrap()]
    }

    fn run(&self, args: &[&str]) -> Output {
        veilfs(&[args, &self.p()].concat())
    }
}

#[test]
fn init_prints_a_recovery_key_and_refuses_a_non_empty_dir() {
    let f = Fixture::new();
    assert_eq!(f.recovery.len(), 14 * 4 + 13, "recovery key on stdout: {:?}", f.recovery);
    let o = veilfs(&[&["init", f.v(), "--passfile", f.pf.to_str().unwrap()][..], &WEAK].concat());
    assert_ne!(code(&o), 0);
    assert!(err(&o).contains("not empty"), "{}", err(&o));
}

#[test]
fn password_sources_and_wrong_password() {
    let f = Fixture::new();
    assert_eq!(code(&veilfs_stdin(&["ls", f.v(), "--password-stdin"], "hunter2\n")), 0);
    assert_eq!(code(&veilfs(&["ls", f.v(), "--extpass", "echo hunter2"])), 0);
    let conf = std::fs::read(f.vault.join("veilfs.conf")).unwrap();
    let o = veilfs(&["ls", f.v(), "--extpass", "echo wrong"]);
    assert_eq!(code(&o), 3, "{}", err(&o));
    assert!(err(&o).contains("incorrect"), "{}", err(&o));
    assert_eq!(std::fs::read(f.vault.join("veilfs.conf")).unwrap(), conf, "a failed unlock must not write");
    // No terminal and no source: a clear message and exit code 7.
    let o = Command::new(BIN).args(["ls", f.v()]).stdin(Stdio::null()).env_remove("DISPLAY").output().unwrap();
    if std::fs::File::open("/dev/tty").is_err() {
        assert_eq!(code(&o), 7, "{}", err(&o));
        assert!(err(&o).contains("--passfile"), "{}", err(&o));
    }
    let o = veilfs(&["ls", f.v(), "--extpass", "false"]);
    assert_eq!(code(&o), 7, "{}", err(&o));
    let o = veilfs(&["ls", f.v(), "--extpass", "true"]);
    assert_eq!(code(&o), 7, "empty password: {}", err(&o));
}

#[test]
fn not_a_vault_and_damaged_config_exit_codes() {
    let f = Fixture::new();
    let o = veilfs(&["info", f.dir.to_str().unwrap()]);
    assert_eq!(code(&o), 4, "{}", err(&o));
    assert!(err(&o).contains("veilfs init"), "{}", err(&o));
    let cfg = f.vault.join("veilfs.conf");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("\"block_size\": 4096", "\"block_size\": 8192")).unwrap();
    let o = f.run(&["ls", f.v()]);
    assert_eq!(code(&o), 5, "edited config: {}", err(&o));
    std::fs::write(&cfg, &text[..text.len() / 3]).unwrap();
    let o = veilfs(&["info", f.v()]);
    assert_eq!(code(&o), 5, "damaged config: {}", err(&o));
}

#[test]
fn info_json() {
    let f = Fixture::new();
    let o = veilfs(&["info", f.v(), "--json"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let j: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(j["format"], "veilfs");
    assert_eq!(j["version"], 1);
    assert_eq!(j["cipher"], "AES-256-GCM");
    assert_eq!(j["slots"].as_array().unwrap().len(), 2);
    assert_eq!(j["slots"][0]["kind"], "password");
    assert_eq!(j["slots"][0]["memory_kib"], 8192);
    assert_eq!(j["slots"][1]["kind"], "recovery");
    let text = out(&veilfs(&["info", f.v()]));
    assert!(text.contains("Argon2id") && text.contains("recovery key"), "{text}");
}

#[test]
fn passwd_change_add_remove_and_recover() {
    let f = Fixture::new();
    let newpf = f.dir.join("newpf");
    std::fs::write(&newpf, "correct horse\n").unwrap();
    let np = newpf.to_str().unwrap();
    let o =
        veilfs(&[&["passwd", f.v(), "--passfile", f.pf.to_str().unwrap(), "--new-passfile", np][..], &WEAK].concat());
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(code(&f.run(&["ls", f.v()])), 3, "old password must stop working");
    assert_eq!(code(&veilfs(&["ls", f.v(), "--passfile", np])), 0);
    // Add a second password via stdin (old line, new line), then remove the first.
    let o = veilfs_stdin(
        &[&["passwd", f.v(), "--add", "--password-stdin"][..], &WEAK].concat(),
        "correct horse\nsecond pw\n",
    );
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(code(&veilfs(&["ls", f.v(), "--extpass", "echo second pw"])), 0);
    let j: serde_json::Value = serde_json::from_str(&out(&veilfs(&["info", f.v(), "--json"]))).unwrap();
    let first_pw_slot =
        j["slots"].as_array().unwrap().iter().find(|s| s["kind"] == "password").unwrap()["id"].to_string();
    let o = veilfs(&["passwd", f.v(), "--passfile", np, "--remove-slot", &first_pw_slot]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(code(&veilfs(&["ls", f.v(), "--passfile", np])), 3);
    // Lost every password: the recovery key sets a new one.
    let rk = f.dir.join("rk");
    std::fs::write(&rk, format!("{}\n", f.recovery.to_lowercase())).unwrap();
    let o = veilfs(
        &[
            &["passwd", f.v(), "--recovery-key", "--passfile", rk.to_str().unwrap(), "--new-extpass", "echo third"][..],
            &WEAK,
        ]
        .concat(),
    );
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(code(&veilfs(&["ls", f.v(), "--extpass", "echo third"])), 0);
    assert_eq!(code(&veilfs(&["ls", f.v(), "--extpass", "echo second pw"])), 3, "recovery replaces all passwords");
    // A mistyped recovery key is reported as a typo.
    let mut typo = f.recovery.clone();
    typo.replace_range(0..1, if typo.starts_with('A') { "B" } else { "A" });
    let o = veilfs(&["ls", f.v(), "--recovery-key", "--extpass", &format!("echo {typo}")]);
    assert_ne!(code(&o), 0);
    assert!(err(&o).contains("typo"), "{}", err(&o));
}

/// A tree with the awkward cases: modes, times, symlinks, hard links, fifos, empty files,
/// long and non-UTF-8 names, nested directories, a file of several blocks.
fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("a/b/c/deep.txt"), "deep").unwrap();
    std::fs::write(root.join("empty"), "").unwrap();
    std::fs::write(root.join("big.bin"), (0..50_000u32).flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"caf\xe9 \x01 latin1")), "bytes").unwrap();
    std::fs::write(root.join("L".repeat(255)), "longest name").unwrap();
    std::os::unix::fs::symlink("a/b/c/deep.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/dangling", root.join("dangling")).unwrap();
    std::fs::hard_link(root.join("big.bin"), root.join("a/hardlink.bin")).unwrap();
    let fifo = std::ffi::CString::new(root.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    std::fs::set_permissions(root.join("empty"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let t = std::ffi::CString::new(root.join("big.bin").as_os_str().as_bytes()).unwrap();
    let ts = [
        libc::timespec { tv_sec: 1_000_000_000, tv_nsec: 5 },
        libc::timespec { tv_sec: 1_234_567_890, tv_nsec: 123_456_789 },
    ];
    // SAFETY: valid C string and timespec array.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, t.as_ptr(), ts.as_ptr(), 0) }, 0);
}

fn assert_same_tree(a: &Path, b: &Path) {
    // diff reports FIFOs as differing even when both are FIFOs: compare those by type below.
    let o = Command::new("diff").args(["-r", "--no-dereference", "-x", "fifo"]).arg(a).arg(b).output().unwrap();
    assert!(o.status.success(), "diff -r: {}{}", out(&o), err(&o));
    for rel in ["big.bin", "empty", "a/b", "link", "fifo", "a/hardlink.bin"] {
        let (ma, mb) =
            (std::fs::symlink_metadata(a.join(rel)).unwrap(), std::fs::symlink_metadata(b.join(rel)).unwrap());
        assert_eq!(ma.mode(), mb.mode(), "mode of {rel}");
        if !ma.is_dir() {
            assert_eq!((ma.mtime(), ma.mtime_nsec()), (mb.mtime(), mb.mtime_nsec()), "mtime of {rel}");
        }
        assert_eq!(ma.uid(), mb.uid(), "owner of {rel}");
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(b.join("fifo")).unwrap().file_type().is_fifo());
    assert_eq!(
        std::fs::metadata(b.join("a/hardlink.bin")).unwrap().ino(),
        std::fs::metadata(b.join("big.bin")).unwrap().ino(),
        "hard link kept"
    );
}

#[test]
fn import_export_round_trip_and_ciphertext_hides_everything() {
    let f = Fixture::new();
    let src = f.dir.join("src");
    make_tree(&src);
    let o = f.run(&["import", &format!("{}/.", src.display()), f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    // Nothing of the plaintext names or contents is in the ciphertext.
    let o = Command::new("grep")
        .args(["-r", "-a", "-l", "-e", "deep", "-e", "longest name", "-e", "latin1"])
        .arg(&f.vault)
        .output()
        .unwrap();
    assert!(out(&o).is_empty(), "plaintext found in ciphertext: {}", out(&o));
    let names = Command::new("find").arg(&f.vault).output().unwrap();
    for n in ["deep", "hardlink", "big.bin", "fifo", "LLLL"] {
        assert!(!out(&names).contains(n), "plaintext name {n} on disk");
    }
    let dest = f.dir.join("out");
    let o = f.run(&["export", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_same_tree(&src, &dest);
    // A sub-path export and cat.
    let o = f.run(&["export", &format!("{}/a/b", f.v()), f.dir.join("sub").to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(std::fs::read_to_string(f.dir.join("sub/c/deep.txt")).unwrap(), "deep");
    let o = f.run(&["cat", &format!("{}/a/b/c/deep.txt", f.v())]);
    assert_eq!(out(&o), "deep");
}

#[test]
fn ls_and_path_mapping() {
    let f = Fixture::new();
    let src = f.dir.join("src");
    make_tree(&src);
    assert_eq!(code(&f.run(&["import", src.to_str().unwrap(), f.v()])), 0);
    let o = f.run(&["ls", &format!("{}/src/a", f.v()), "-l", "-c"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(out(&o).contains("hardlink.bin") && out(&o).contains(" b\t"), "{}", out(&o));
    let o = f.run(&["encrypt-path", f.v(), "src/a/b/c/deep.txt"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let cpath = out(&o).trim().to_string();
    assert!(f.vault.join(&cpath).is_file(), "{cpath}");
    assert_eq!(cpath.split('/').count(), 5);
    let o = f.run(&["decrypt-path", f.v(), &cpath]);
    assert_eq!(out(&o).trim(), "src/a/b/c/deep.txt");
    let o = f.run(&["decrypt-path", f.v(), f.vault.join(&cpath).to_str().unwrap()]);
    assert_eq!(out(&o).trim(), "src/a/b/c/deep.txt");
    // ls also takes the ciphertext directory as it appears on disk.
    let cdir = Path::new(&cpath).parent().unwrap();
    let o = f.run(&["ls", f.vault.join(cdir).to_str().unwrap()]);
    assert_eq!(out(&o).trim(), "deep.txt", "{}", err(&o));
}

#[test]
fn export_names_a_damaged_file_and_exports_the_rest() {
    let f = Fixture::new();
    let src = f.dir.join("src");
    make_tree(&src);
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let cpath = out(&f.run(&["encrypt-path", f.v(), "big.bin"])).trim().to_string();
    let p = f.vault.join(&cpath);
    let mut c = std::fs::read(&p).unwrap();
    c[10_000] ^= 4;
    std::fs::write(&p, c).unwrap();
    let dest = f.dir.join("out");
    let o = f.run(&["export", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert!(err(&o).contains("big.bin") && err(&o).contains("DAMAGED"), "{}", err(&o));
    assert!(!dest.join("big.bin").exists(), "no partial damaged file");
    assert_eq!(std::fs::read_to_string(dest.join("a/b/c/deep.txt")).unwrap(), "deep");
    let o = f.run(&["cat", &format!("{}/big.bin", f.v())]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert!(err(&o).contains("block 2"), "names the block: {}", err(&o));
}

#[test]
fn xchacha_vault_round_trip() {
    let t = tempfile::tempdir().unwrap();
    let v = t.path().join("v");
    let o = veilfs(
        &[
            &[
                "init",
                v.to_str().unwrap(),
                "--cipher",
                "xchacha20-poly1305",
                "--extpass",
                "echo pw",
                "--no-recovery-key",
            ][..],
            &WEAK,
        ]
        .concat(),
    );
    assert_eq!(code(&o), 0, "{}", err(&o));
    let src = t.path().join("src");
    make_tree(&src);
    assert_eq!(
        code(&veilfs(&["import", &format!("{}/.", src.display()), v.to_str().unwrap(), "--extpass", "echo pw"])),
        0
    );
    let dest = t.path().join("out");
    let o = veilfs(&["export", v.to_str().unwrap(), dest.to_str().unwrap(), "--extpass", "echo pw"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_same_tree(&src, &dest);
    let j: serde_json::Value = serde_json::from_str(&out(&veilfs(&["info", v.to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(j["cipher"], "XChaCha20-Poly1305");
}
