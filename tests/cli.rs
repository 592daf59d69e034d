//! The `veilfs` command line, end to end: password sources, exit codes, slots, and the
//! offline tools (import/export/cat/ls/encrypt-path/decrypt-path) on real trees.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;

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
        Self::with(&[])
    }

    /// A vault of v1 files (`init --no-block-map`), for the tests of that format's offsets.
    fn v1() -> Self {
        Self::with(&["--no-block-map"])
    }

    fn with(init: &[&str]) -> Self {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_path_buf();
        let pf = dir.join("pf");
        common::write_passfile(&pf, "hunter2");
        let vault = dir.join("vault");
        let o =
            veilfs(&[&["init", vault.to_str().unwrap(), "--passfile", pf.to_str().unwrap()][..], &WEAK, init].concat());
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

/// A `veilfs.conf` its user may not read (the vault belongs to someone else) is said as it is:
/// an I/O error naming the file, exit code 1 ("other error"), never 5 ("config damaged"),
/// which would send the user to restore a config that is intact.
#[test]
fn an_unreadable_config_is_an_io_error_not_a_damaged_one() {
    use std::os::unix::process::CommandExt;
    if !common::root_only("runs veilfs as another user (nobody) against a vault of root's") {
        return;
    }
    let f = Fixture::new();
    // The other user may reach the vault and run the binary (a copy beside it), not read the config.
    let bin = f.dir.join("veilfs");
    std::fs::copy(BIN, &bin).unwrap();
    for (p, mode) in [(&f.dir, 0o755), (&f.vault, 0o755), (&bin, 0o755), (&f.vault.join("veilfs.conf"), 0o600)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let o = Command::new(&bin).args(["info", f.v()]).uid(65534).gid(65534).stdin(Stdio::null()).output().unwrap();
    assert_eq!(code(&o), 1, "{}", err(&o));
    assert!(err(&o).contains("veilfs.conf") && err(&o).to_lowercase().contains("permission denied"), "{}", err(&o));
    assert!(!err(&o).contains("damaged"), "{}", err(&o));
}

#[test]
fn init_prints_a_recovery_key_and_refuses_a_non_empty_dir() {
    let f = Fixture::new();
    assert_eq!(f.recovery.len(), 14 * 4 + 13, "recovery key on stdout: {:?}", f.recovery);
    // An existing vault is named as one, not as "not empty".
    let o = veilfs(&[&["init", f.v(), "--passfile", f.pf.to_str().unwrap()][..], &WEAK].concat());
    assert_eq!(code(&o), 4, "{}", err(&o));
    assert!(err(&o).contains("is already a veilfs vault"), "{}", err(&o));
    let other = f.dir.join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("x"), "x").unwrap();
    let o = veilfs(&[&["init", other.to_str().unwrap(), "--passfile", f.pf.to_str().unwrap()][..], &WEAK].concat());
    assert_eq!(code(&o), 4, "{}", err(&o));
    assert!(err(&o).contains("not empty"), "{}", err(&o));
}

#[test]
fn init_refuses_a_key_derivation_that_every_unlock_would_refuse() {
    let f = Fixture::new();
    let new = f.dir.join("heavy");
    // 1100 MiB is above the ceiling an unlock applies without --allow-slow-kdf.
    let o = veilfs(&["init", new.to_str().unwrap(), "--passfile", f.pf.to_str().unwrap(), "--kdf-memory", "1100"]);
    assert_eq!(code(&o), 2, "{}", err(&o));
    assert!(err(&o).contains("--allow-slow-kdf"), "{}", err(&o));
    assert!(!new.join("veilfs.conf").exists(), "nothing was made");
    let o = f.run(&["passwd", f.v(), "--add", "--new-passfile", f.pf.to_str().unwrap(), "--kdf-memory", "1100"]);
    assert_eq!(code(&o), 2, "{}", err(&o));
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
fn a_fifo_planted_as_the_passfile_is_refused_at_once_instead_of_blocking() {
    let f = Fixture::new();
    let fifo = f.dir.join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let start = std::time::Instant::now();
    let o = common::run_timeout(20, BIN, &["ls", f.v(), "--passfile", fifo.to_str().unwrap()])
        .expect("veilfs blocked on a FIFO passfile");
    assert_eq!(code(&o), 7, "{}", err(&o));
    assert!(err(&o).contains("is a FIFO, not a regular file") && err(&o).contains("--extpass"), "{}", err(&o));
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn a_passfile_every_user_can_read_is_used_with_one_warning() {
    let f = Fixture::new();
    std::fs::set_permissions(&f.pf, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = f.run(&["ls", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(err(&o).matches("readable by every user").count(), 1, "{}", err(&o));
    assert!(err(&o).contains("chmod 600"), "{}", err(&o));
    std::fs::set_permissions(&f.pf, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = f.run(&["ls", f.v()]);
    assert!(!err(&o).contains("readable"), "{}", err(&o));
}

#[test]
fn ls_recursive_lists_every_directory_as_ls_dash_capital_r_does() {
    let f = Fixture::new();
    let src = f.dir.join("tree");
    for d in ["a/b/c", "a/empty", "z"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    for file in ["top.txt", "a/one", "a/b/two", "a/b/c/three", "z/last"] {
        std::fs::write(src.join(file), file).unwrap();
    }
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let o = f.run(&["ls", "-R", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let ls = Command::new("ls").arg("-R").arg(&src).env("LC_ALL", "C").output().unwrap();
    let want = out(&ls).replace(&src.display().to_string(), f.v());
    assert_eq!(out(&o), want);
}

/// What Syncthing, Dropbox, Nextcloud, rclone, Resilio, Google Drive and desktops leave in a
/// synced folder: named by fsck as foreign with exit code 0, left out of ls and export, never
/// touched by fsck --repair, and a sync tool's directory (Syncthing's version store) is not
/// walked. (One name per tool here; crates/veilfs-core/src/foreign.rs tests every pattern.)
#[test]
fn sync_tools_files_in_the_vault_are_foreign_not_damage_and_never_repaired() {
    let f = Fixture::new();
    let src = f.dir.join("tree");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/file"), "data").unwrap();
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let sub = std::fs::read_dir(&f.vault)
        .unwrap()
        .flatten()
        .find(|e| e.file_type().unwrap().is_dir())
        .expect("the ciphertext of sub")
        .path();
    let planted = [
        (f.vault.join(".stfolder"), "Syncthing"),
        (f.vault.join(".stignore"), "Syncthing"),
        (sub.join(".syncthing.veilfs.diriv.a3f0.tmp"), "Syncthing"),
        (f.vault.join("~syncthing~Zm9vYmFy.tmp"), "Syncthing"),
        (f.vault.join(".dropbox.cache"), "Dropbox"),
        (f.vault.join(".sync_1a2b3c.db-wal"), "Nextcloud/ownCloud"),
        (sub.join(".Zm9vYmFy.~1a2b"), "Nextcloud/ownCloud"),
        (sub.join("Zm9vYmFyYmF6.1a2b.partial"), "rclone"),
        (f.vault.join("Zm9vYmFyYmF6.!sync"), "Resilio Sync"),
        (f.vault.join("desktop.ini"), "Windows (OneDrive, Explorer)"),
        (sub.join(".DS_Store"), "macOS Finder"),
        (f.vault.join(".directory"), "KDE Dolphin"),
    ];
    for (p, _) in &planted {
        std::fs::write(p, "a sync tool's bytes").unwrap();
    }
    // Syncthing's version store: old ciphertext under changed names, never walked.
    let versions = f.vault.join(".stversions");
    std::fs::create_dir(&versions).unwrap();
    std::fs::write(versions.join("Zm9vYmFyYmF6cXV4cXV1eA.AAAAAAAAAAAAAAAAAAAAAA~20261127-101010"), "old").unwrap();
    for args in [vec!["ls", "-R", f.v()], vec!["cat", &format!("{}/sub/file", f.v())]] {
        let o = f.run(&args);
        assert_eq!(code(&o), 0, "{args:?}: {}", err(&o));
        assert!(!err(&o).contains("not a veilfs"), "{}", err(&o));
    }
    let dest = f.dir.join("out");
    let o = f.run(&["export", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let mut exported: Vec<String> =
        std::fs::read_dir(&dest).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    exported.sort();
    assert_eq!(exported, ["sub"]);
    for repair in [false, true] {
        let o = if repair { f.run(&["fsck", "--repair", f.v()]) } else { f.run(&["fsck", f.v()]) };
        assert_eq!(code(&o), 0, "fsck (repair {repair}): {}", err(&o));
        for (p, tool) in &planted {
            let line = format!("foreign (sync tool: {tool}): {}", p.display());
            assert!(err(&o).contains(&line), "{line} in: {}", err(&o));
            assert_eq!(std::fs::read_to_string(p).unwrap(), "a sync tool's bytes", "{} was touched", p.display());
        }
        assert!(err(&o).contains(&format!("foreign (sync tool: Syncthing): {}", versions.display())));
        assert!(versions.join("Zm9vYmFyYmF6cXV4cXV1eA.AAAAAAAAAAAAAAAAAAAAAA~20261127-101010").exists());
        assert!(!err(&o).contains("20261127-101010"), "the version store was walked: {}", err(&o));
    }
    // Anything else unknown is still an integrity finding.
    std::fs::write(f.vault.join("stray-file"), "x").unwrap();
    assert_eq!(code(&f.run(&["fsck", f.v()])), 6);
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
    common::write_passfile(&newpf, "correct horse");
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

/// `veilfs upgrade` converts a vault of v1 files in place: everything exports as before, fsck
/// is clean, `info` names the feature, and a second run says there is nothing to do.
#[test]
fn upgrade_converts_a_no_block_map_vault_in_place() {
    let f = Fixture::v1();
    let src = f.dir.join("src");
    make_tree(&src);
    // A sparse file and one past 1 MiB.
    let sparse = std::fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(6 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"end", 6 << 20).unwrap();
    std::fs::write(src.join("two-mib"), vec![7u8; 2 << 20]).unwrap();
    let o = f.run(&["import", &format!("{}/.", src.display()), f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(!out(&veilfs(&["info", f.v()])).contains("block-map"));

    let o = f.run(&["upgrade", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains("the vault has block maps"), "{}", err(&o));
    let info = out(&veilfs(&["info", f.v()]));
    assert!(info.contains("block-map") && !info.contains("block-map-upgrade"), "{info}");
    let dest = f.dir.join("out");
    let o = f.run(&["export", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_same_tree(&src, &dest);
    assert_eq!(std::fs::read(dest.join("sparse")).unwrap(), std::fs::read(src.join("sparse")).unwrap());
    let o = f.run(&["fsck", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));

    let o = f.run(&["upgrade", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains("already has block maps"), "{}", err(&o));
}

/// `veilfs upgrade` writes the vault: a mounted one is refused with exit code 9, as `import`
/// is, and nothing is changed.
#[test]
fn upgrade_refuses_a_mounted_vault() {
    if !common::fuse_available() {
        return common::skip("needs FUSE");
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            if !veilfs(&["umount", self.0.to_str().unwrap()]).status.success() {
                let _ = common::run("fusermount3", &["-uz", self.0.to_str().unwrap()]);
            }
        }
    }
    let f = Fixture::v1();
    let mnt = f.dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let o = Command::new(BIN)
        .args(["mount", f.v(), mnt.to_str().unwrap(), "--passfile", f.pf.to_str().unwrap()])
        .env("VEILFS_LOG_FILE", f.dir.join("veilfs.log"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", err(&o));
    let _u = Unmount(mnt.clone());
    std::fs::write(mnt.join("x"), "written through the mount").unwrap();
    let conf = std::fs::read(f.vault.join("veilfs.conf")).unwrap();
    let o = f.run(&["upgrade", f.v()]);
    assert_eq!(code(&o), 9, "{}", err(&o));
    assert!(err(&o).contains("is mounted by pid"), "{}", err(&o));
    assert_eq!(std::fs::read(f.vault.join("veilfs.conf")).unwrap(), conf);
}

/// A damaged file stops `veilfs upgrade` before anything changes (exit code 6, naming it);
/// after `fsck --repair` (which salvages it under its name and sets the original aside in
/// /lost+found) the upgrade goes through, leaving that original as it is, named (exit code 6).
#[test]
fn upgrade_refuses_a_damaged_file_until_fsck_repairs_it() {
    let f = Fixture::v1();
    let src = f.dir.join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a"), vec![1u8; 20000]).unwrap();
    std::fs::write(src.join("b"), b"fine").unwrap();
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let o = f.run(&["encrypt-path", f.v(), "a"]);
    let cipher = PathBuf::from(out(&o).trim());
    let cipher = if cipher.is_absolute() { cipher } else { f.vault.join(cipher) };
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new().write(true).open(&cipher).unwrap(),
        b"XX",
        9000,
    )
    .unwrap();
    let conf = std::fs::read(f.vault.join("veilfs.conf")).unwrap();
    let o = f.run(&["upgrade", f.v()]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert!(
        err(&o).contains("damaged") && err(&o).contains("(/a)") && err(&o).contains("nothing was changed"),
        "{}",
        err(&o)
    );
    assert_eq!(std::fs::read(f.vault.join("veilfs.conf")).unwrap(), conf);
    assert_eq!(code(&f.run(&["fsck", "--repair", f.v()])), 0);
    let o = f.run(&["upgrade", f.v()]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert!(err(&o).contains("damaged, left as it is") && err(&o).contains("(/lost+found/"), "{}", err(&o));
    assert!(err(&o).contains("the vault has block maps"), "{}", err(&o));
    assert_eq!(out(&f.run(&["cat", &format!("{}/b", f.v())])), "fine");
    // The salvaged copy under the name was converted: block 2 (the damaged one) reads as zeros.
    let a = f.run(&["cat", &format!("{}/a", f.v())]);
    assert_eq!(code(&a), 0, "{}", err(&a));
    assert_eq!(a.stdout.len(), 20000);
    assert!(out(&veilfs(&["info", f.v()])).contains("block-map"));
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
    // A ciphertext name may begin with '-' (base64url): after `--` it is never an option.
    let o = veilfs(&[&["decrypt-path"][..], &f.p(), &["--", f.v(), &cpath]].concat());
    assert_eq!(out(&o).trim(), "src/a/b/c/deep.txt", "{}", err(&o));
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

/// `export --salvage` (a vault of v1 files; block-map files: the test below): a file with a damaged block and a cut-off end comes out under its name
/// with every block that authenticates (zeros for the lost block, the lost end cut off), each
/// lost byte range named, the ciphertext file named once, and exit code 6 still; without
/// `--salvage` the same file is left out and the message says how to salvage it.
#[test]
fn export_salvage_writes_what_authenticates_and_names_the_lost_ranges() {
    let f = Fixture::v1();
    let src = f.dir.join("src");
    std::fs::create_dir(&src).unwrap();
    let data: Vec<u8> = (0..5 * 4096 + 100).map(|i| (i % 253) as u8).collect();
    std::fs::write(src.join("f"), &data).unwrap();
    std::fs::write(src.join("ok"), b"intact").unwrap();
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let cpath = out(&f.run(&["encrypt-path", f.v(), "f"])).trim().to_string();
    let p = f.vault.join(&cpath);
    let (h, cb) = (36usize, 4096 + 28usize);
    let mut c = std::fs::read(&p).unwrap();
    c[h + cb + 50] ^= 1; // block 1
    c.truncate(h + 4 * cb + 10); // block 4 cut, the final block 5 gone
    std::fs::write(&p, c).unwrap();
    let dest = f.dir.join("out");
    let o = f.run(&["export", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert!(err(&o).contains("--salvage writes what authenticates") && !dest.join("f").exists(), "{}", err(&o));
    let o = f.run(&["export", "--salvage", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    let e = err(&o);
    assert_eq!(e.lines().filter(|l| l.contains(&cpath)).count(), 1, "one message names the ciphertext file: {e}");
    assert!(e.contains("DAMAGED, salvaged") && e.contains("lost byte ranges: 4096..8192, 16384.."), "{e}");
    assert!(e.contains("1 damaged item (1 salvaged in part, 0 left out)"), "{e}");
    let mut want = data[..4 * 4096].to_vec();
    want[4096..8192].fill(0);
    assert_eq!(std::fs::read(dest.join("f")).unwrap(), want);
    assert_eq!(std::fs::read(dest.join("ok")).unwrap(), b"intact");
}

/// `export --salvage` and `fsck --repair` of a file with a block map (docs/FORMAT.md §5.10,
/// "Salvage"; every new vault has block maps): one
/// block put back as its older copy (which would open at its place: a v1 salvage would keep
/// it) and another corrupted. Both commands keep every other block, name both ranges lost and
/// the first as an older version put back; after the repair the file reads as salvaged.
#[test]
fn export_salvage_and_fsck_repair_of_a_block_map_file_lose_a_rolled_back_block() {
    use std::os::unix::fs::FileExt;
    let f = Fixture::new();
    let src = f.dir.join("src");
    std::fs::create_dir(&src).unwrap();
    let mut data: Vec<u8> = (0..5 * 4096 + 100).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("f"), &data).unwrap();
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let p = f.vault.join(out(&f.run(&["encrypt-path", f.v(), "f"])).trim());
    let old = std::fs::read(&p).unwrap();
    // Block 1 rewritten in place (through the engine, as a mount's write does).
    let pw = std::fs::read_to_string(&f.pf).unwrap();
    let secret = veilfs_core::Secret::Password(secrecy::SecretString::from(pw.trim_end().to_string()));
    let v = veilfs_core::Vault::open(&f.vault, &secret, None).unwrap();
    let root = v.root().unwrap();
    let e = v.lookup(&root, b"f").unwrap().unwrap();
    v.open_file(&root, &e, libc::O_RDWR).unwrap().write_at(b"newer", 4096, data.len() as u64).unwrap();
    drop(v);
    let l = veilfs_core::content::blockmap::MapLayout::new(4096, 28);
    let (b1, b3) = (l.block_offset(1) as usize, l.block_offset(3));
    let file = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    file.write_all_at(&old[b1..b1 + 4124], b1 as u64).unwrap();
    file.write_all_at(&[0x99], b3 + 77).unwrap();
    drop(file);
    data[4096..8192].fill(0);
    data[3 * 4096..4 * 4096].fill(0);

    let dest = f.dir.join("out");
    let o = f.run(&["export", "--salvage", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    let e = err(&o);
    assert!(e.contains("DAMAGED, salvaged") && e.contains("lost byte ranges: 4096..8192, 12288..16384"), "{e}");
    assert!(e.contains("an older version put back (a rollback): 4096..8192"), "{e}");
    assert!(std::fs::read(dest.join("f")).unwrap() == data);

    assert_eq!(code(&f.run(&["fsck", f.v()])), 6);
    let o = f.run(&["fsck", "--repair", f.v()]);
    assert_eq!(code(&o), 0, "{}{}", out(&o), err(&o));
    let said = format!("{}{}", out(&o), err(&o));
    assert!(said.contains("lost byte ranges: 4096..8192, 12288..16384") && said.contains("rollback"), "{said}");
    let o = f.run(&["cat", &format!("{}/f", f.v())]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(o.stdout == data, "the salvaged copy reads under its name");
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

// ---------------------------------------------------------------------------------------
// Rough edges a new user hit, each with the command that showed it.
// ---------------------------------------------------------------------------------------

/// Runs a bash command line (for pipes, exactly as a user types them).
fn bash(script: &str) -> Output {
    Command::new("bash").arg("-c").arg(script).stdin(Stdio::null()).output().unwrap()
}

/// Runs `cmd` under a pseudo-terminal (script(1)), so stderr is a terminal; the output of
/// both streams, or None when script(1) is missing.
fn on_terminal(cmd: &str) -> Option<String> {
    if !Path::new("/usr/bin/script").exists() {
        eprintln!("SKIPPED part: script(1) is missing (apt-get install bsdutils)");
        return None;
    }
    let o = Command::new("script").args(["-qec", cmd, "/dev/null"]).stdin(Stdio::null()).output().unwrap();
    Some(out(&o))
}

fn sq(p: &Path) -> String {
    format!("'{}'", p.display())
}

#[test]
fn sigpipe_ls_into_head_and_cat_into_head_end_quietly() {
    let f = Fixture::new();
    let src = f.dir.join("many");
    std::fs::create_dir(&src).unwrap();
    for i in 0..400 {
        std::fs::write(src.join(format!("f{i:04}")), "x").unwrap();
    }
    std::fs::write(src.join("big"), vec![b'a'; 3 << 20]).unwrap();
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let pf = sq(&f.pf);
    // The commands from the issue; 141 = killed by SIGPIPE, as coreutils' ls and cat are.
    for cmd in [
        format!("veilfs ls {} --passfile {pf} | head -1", f.v()),
        format!("veilfs cat {}/big --passfile {pf} | head -c 10", f.v()),
    ] {
        let o = bash(&format!("{} ; echo \"status ${{PIPESTATUS[0]}}\" >&2", cmd.replacen("veilfs", BIN, 1)));
        let e = err(&o);
        assert!(e.ends_with("status 141\n") || e.ends_with("status 0\n"), "{cmd}: {e}");
        assert!(!e.contains("panicked") && !e.contains("Broken pipe") && !e.contains("error"), "{cmd}: {e}");
    }
    // The same, deterministic: a pipe whose reader is already gone.
    for args in [vec!["ls", f.v()], vec!["cat", &format!("{}/big", f.v())]] {
        let (r, w) = std::io::pipe().unwrap();
        drop(r);
        let o = Command::new(BIN).args(&args).args(f.p()).stdin(Stdio::null()).stdout(w).output().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{args:?}: {:?} {}", o.status, err(&o));
        assert!(err(&o).is_empty(), "{args:?}: {}", err(&o));
    }
}

#[test]
fn ls_long_is_human_readable() {
    let f = Fixture::new();
    let src = f.dir.join("src");
    make_tree(&src);
    std::fs::create_dir(src.join("private")).unwrap();
    std::fs::set_permissions(src.join("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(src.join("big.bin"), std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    // big.bin's mtime is 2009-02-13 23:31:30 UTC: an old date shows the year, as in ls.
    let ls = |extra: &[&str]| {
        let o = Command::new(BIN).args(["ls", f.v()]).args(extra).args(f.p()).env("TZ", "UTC").output().unwrap();
        assert_eq!(code(&o), 0, "{}", err(&o));
        out(&o)
    };
    let text = ls(&["-l"]);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.ends_with(&format!(" {name}")) || l.contains(&format!(" {name} -> ")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .to_string()
    };
    let big = line("big.bin");
    assert!(big.starts_with("-rw-r--r-- "), "{big}");
    assert!(big.contains(" 200000 Feb 13  2009 big.bin"), "size and local date: {big}");
    assert!(line("private").starts_with("drwx------ "), "{text}");
    assert!(line("fifo").starts_with("prw-r----- "), "{text}");
    let link = line("link");
    assert!(link.starts_with("lrwxrwxrwx "), "{link}");
    assert!(link.contains(&format!(" {} ", "a/b/c/deep.txt".len())), "plaintext target length: {link}");
    assert!(link.ends_with("link -> a/b/c/deep.txt"), "{link}");
    assert!(!text.contains("1234567890"), "no epoch seconds: {text}");
    let human = ls(&["-l", "-h"]);
    assert!(human.lines().any(|l| l.starts_with("-rw-r--r--") && l.contains(" 196K Feb 13  2009 big.bin")), "{human}");
    // A recent file shows the time of day instead of the year, in the local time zone.
    let o = Command::new(BIN).args(["ls", "-l", f.v()]).args(f.p()).env("TZ", "UTC-14").output().unwrap();
    let now_plus14 = out(&bash("TZ=UTC-14 date +'%b %e'")).trim().to_string();
    assert!(out(&o).lines().any(|l| l.contains(&now_plus14) && l.ends_with(" private")), "{}", out(&o));
}

#[test]
fn one_message_per_error_naming_the_plaintext_path() {
    let f = Fixture::new();
    let src = f.dir.join("src");
    make_tree(&src);
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let missing = format!("{}/a/nope.txt", f.v());
    let o = f.run(&["cat", &missing]);
    assert_eq!(code(&o), 4, "{}", err(&o));
    assert_eq!(err(&o), format!("veilfs: error: {missing}: No such file or directory\n"));
    let o = f.run(&["ls", &format!("{}/nodir", f.v())]);
    assert_eq!(err(&o).matches("No such file or directory").count(), 1, "{}", err(&o));
    assert!(err(&o).contains(&format!("{}/nodir", f.v())), "{}", err(&o));
    // A tampered file: one line, naming the path the user gave and, to restore it from a
    // backup, the damaged ciphertext file.
    let cpath = out(&f.run(&["encrypt-path", f.v(), "big.bin"])).trim().to_string();
    let p = f.vault.join(&cpath);
    let mut c = std::fs::read(&p).unwrap();
    c[10_000] ^= 4;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&p, c).unwrap();
    let o = f.run(&["cat", &format!("{}/big.bin", f.v())]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert_eq!(err(&o).lines().count(), 1, "printed once: {}", err(&o));
    assert!(err(&o).contains(&format!("{}/big.bin", f.v())) && err(&o).contains("block 2"), "{}", err(&o));
    assert!(err(&o).contains(&cpath), "the ciphertext file: {}", err(&o));
    // A renamed ciphertext entry in a listing: reported once.
    let cdir = out(&f.run(&["encrypt-path", f.v(), "a"])).trim().to_string();
    let hard = out(&f.run(&["encrypt-path", f.v(), "a/hardlink.bin"])).trim().to_string();
    std::fs::rename(f.vault.join(&hard), f.vault.join(&cdir).join("garbage")).unwrap();
    let o = f.run(&["ls", &format!("{}/a", f.v())]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert_eq!(err(&o).lines().count(), 1, "printed once: {}", err(&o));
}

/// Every case of the issue, and the table in `--help` and the README.
#[test]
fn exit_codes_follow_the_documented_table() {
    let f = Fixture::new();
    let file = f.dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let fs = file.to_str().unwrap();
    let missing = f.dir.join("missing");
    let ms = missing.to_str().unwrap();
    let pf = f.pf.to_str().unwrap();
    let typo = {
        let mut t = f.recovery.clone();
        t.replace_range(0..1, if t.starts_with('A') { "B" } else { "A" });
        t
    };
    let short_key = "ABCD-EFGH".to_string();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["init", f.v(), "--passfile", pf], 4, "init into a non-empty dir"),
        (vec!["init", fs, "--passfile", pf], 4, "init over a file"),
        (vec!["info", ms], 4, "missing CIPHERDIR"),
        (vec!["ls", ms, "--passfile", pf], 4, "missing CIPHERDIR (ls)"),
        (vec!["passwd", ms, "--passfile", pf], 4, "missing CIPHERDIR (passwd)"),
        (vec!["mount", ms, f.dir.to_str().unwrap(), "--passfile", pf], 4, "missing CIPHERDIR (mount)"),
        (vec!["info", fs], 4, "CIPHERDIR is a file"),
        (vec!["encrypt-path", fs, "x", "--passfile", pf], 4, "CIPHERDIR is a file (encrypt-path)"),
        (vec!["ls", f.v(), "--passfile", pf, "--slot", "99"], 2, "--slot 99"),
        (vec!["ls", f.v(), "--passfile", pf, "--slot", "1"], 2, "--slot of the recovery slot with a password"),
        (vec!["passwd", f.v(), "--passfile", pf, "--remove-slot", "99"], 2, "--remove-slot 99"),
        (vec!["ls", f.v(), "--recovery-key", "--extpass"], 3, "recovery-key typo"),
        (vec!["ls", f.v(), "--recovery-key", "--extpass"], 3, "recovery key too short"),
        (vec!["ls", f.v(), "--extpass", "echo wrong"], 3, "wrong password"),
        (vec!["ls", f.v(), "--no-such-option"], 2, "unknown option"),
        (vec!["umount", ms], 4, "umount of something not mounted"),
    ];
    let mut typos = vec![format!("echo {typo}"), format!("echo {short_key}")].into_iter();
    for (mut args, want, what) in cases {
        let extra;
        if args.last() == Some(&"--extpass") {
            extra = typos.next().unwrap();
            args.push(&extra);
        }
        let o = veilfs(&args);
        assert_eq!(code(&o), want, "{what}: {args:?}: {}", err(&o));
        assert!(!err(&o).contains("panicked"), "{what}: {}", err(&o));
    }
    // The documented table: --help and the README list the same codes and meanings.
    let help = out(&veilfs(&["--help"]));
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for (code, _) in (0..=9).map(|c| (c, ())) {
        assert!(help.lines().any(|l| l.starts_with(&format!("  {code}  "))), "code {code} in --help:\n{help}");
        assert!(readme.lines().any(|l| l.starts_with(&format!("| {code} | "))), "code {code} in README");
    }
    for (code, meaning) in help.lines().filter_map(|l| l.strip_prefix("  ")?.split_once("  ")) {
        if let Ok(c) = code.parse::<u8>() {
            assert!(readme.contains(&format!("| {c} | {meaning} |")), "README row for {c}: {meaning}");
        }
    }
}

#[test]
fn invalid_options_fail_before_any_prompt_and_create_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("DIR");
    let d = dir.to_str().unwrap();
    // stdin is /dev/null and no password source is given: a prompt would fail with 7.
    for args in [
        vec!["init", "--block-size", "1000", d],
        vec!["init", "--block-size", "0", d],
        vec!["init", "--kdf-memory", "0", d],
        vec!["init", "--kdf-parallelism", "0", d],
        vec!["init", "--kdf-iterations", "1000", d],
        vec!["init", "--cipher", "rot13", d],
    ] {
        let o = veilfs(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", err(&o));
        assert!(!err(&o).to_lowercase().contains("password"), "{args:?}: {}", err(&o));
        assert!(!dir.exists(), "{args:?} left {d} behind");
    }
    // Mount options too, before the vault or password is looked at.
    let f = Fixture::new();
    for args in [
        vec!["mount", f.v(), d, "--threads", "0"],
        vec!["mount", f.v(), d, "--idle", "soon"],
        vec!["mount", f.v(), d, "--idle", "0s"],
    ] {
        let o = veilfs(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", err(&o));
    }
    // `--idle 1h30m` is accepted: the mount then fails on the missing mount point (4), not on the option.
    let o = veilfs(&["mount", f.v(), d, "--idle", "1h30m"]);
    assert_eq!(code(&o), 4, "{}", err(&o));
    assert!(err(&o).contains("mount point"), "{}", err(&o));
}

#[test]
fn quiet_and_verbose_levels_as_documented() {
    let f = Fixture::new();
    let help = out(&veilfs(&["--help"]));
    assert!(help.contains("-v info, -vv debug, -vvv trace"), "{help}");
    assert!(help.contains("VEILFS_LOG"), "documented in --help: {help}");
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    assert!(readme.contains("VEILFS_LOG"), "documented in the README");
    let e0 = err(&f.run(&["ls", f.v()]));
    let e1 = err(&f.run(&["-v", "ls", f.v()]));
    let e2 = err(&f.run(&["-vv", "ls", f.v()]));
    assert!(!e0.contains("INFO") && !e0.contains("DEBUG"), "default: {e0}");
    assert!(e1.contains("INFO") && !e1.contains("DEBUG"), "-v: {e1}");
    assert!(e2.contains("INFO") && e2.contains("DEBUG"), "-vv: {e2}");
    let o = Command::new(BIN).args(["ls", f.v()]).args(f.p()).env("VEILFS_LOG", "debug").output().unwrap();
    assert!(err(&o).contains("DEBUG"), "VEILFS_LOG=debug: {}", err(&o));
    // -q: no summary, no hint; on a terminal no progress bar and no KDF notice.
    let src = f.dir.join("src");
    make_tree(&src);
    let o = f.run(&["-q", "import", src.to_str().unwrap(), f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).is_empty(), "-q import: {}", err(&o));
    let dest = f.dir.join("out-q");
    let cmd = |q: &str, dest: &Path| format!("{BIN} {q} export {} {} --passfile {}", f.v(), sq(dest), sq(&f.pf));
    if let Some(text) = on_terminal(&cmd("-q", &dest)) {
        assert!(!text.contains("exporting") && !text.contains("deriving"), "-q on a terminal: {text}");
        let text = on_terminal(&cmd("", &f.dir.join("out-bar"))).unwrap();
        assert!(text.contains("exporting"), "progress bar on a terminal: {text}");
    }
}

#[test]
fn passwd_keeps_slot_numbers_and_guards_the_last_recovery_key() {
    let f = Fixture::new();
    let slots = || -> Vec<(u64, String)> {
        let j: serde_json::Value = serde_json::from_str(&out(&veilfs(&["info", f.v(), "--json"]))).unwrap();
        j["slots"].as_array().unwrap().iter().map(|s| (s["id"].as_u64().unwrap(), s["kind"].to_string())).collect()
    };
    let before = slots();
    let np = f.dir.join("np");
    common::write_passfile(&np, "new one");
    let o = veilfs(
        &[&["passwd", f.v(), "--passfile", f.pf.to_str().unwrap(), "--new-passfile", np.to_str().unwrap()][..], &WEAK]
            .concat(),
    );
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(slots(), before, "a changed password keeps its slot number");
    assert!(err(&o).contains("slot 0"), "{}", err(&o));
    let o = veilfs(
        &[&["passwd", f.v(), "--add", "--extpass", "echo new one", "--new-extpass", "echo two"][..], &WEAK].concat(),
    );
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(slots().iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2], "a new slot takes the next number");
    // Change slot 2: still slot 2; slot 0 and the recovery slot untouched.
    let o = veilfs(
        &[&["passwd", f.v(), "--slot", "2", "--extpass", "echo two", "--new-extpass", "echo three"][..], &WEAK]
            .concat(),
    );
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(slots().iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(code(&veilfs(&["ls", f.v(), "--slot", "2", "--extpass", "echo three"])), 0);
    // The recovery key is the last recovery path: no terminal, no --yes: refused, kept.
    let o = veilfs(&["passwd", f.v(), "--extpass", "echo new one", "--remove-slot", "1"]);
    assert_eq!(code(&o), 2, "{}", err(&o));
    assert!(err(&o).contains("--yes"), "{}", err(&o));
    assert_eq!(slots().len(), 3, "nothing removed");
    let o = veilfs(&["passwd", f.v(), "--extpass", "echo new one", "--remove-slot", "1", "--yes"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(slots().iter().map(|s| s.0).collect::<Vec<_>>(), [0, 2]);
    assert_eq!(err(&o).trim(), "veilfs: removed key slot 1 (recovery key)");
    // No Rust Debug forms in any message.
    let o = veilfs(&["passwd", f.v(), "--extpass", "echo new one", "--new-extpass", "echo x"]);
    assert_eq!(code(&o), 2, "{}", err(&o));
    assert!(err(&o).contains("(0, 2)") && !err(&o).contains('['), "{}", err(&o));
}

#[test]
fn progress_totals_summaries_and_hints() {
    let t = tempfile::tempdir().unwrap();
    let v = t.path().join("v");
    let o = veilfs(&[&["init", v.to_str().unwrap(), "--extpass", "echo pw"][..], &WEAK].concat());
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains(&format!("now mount it with: veilfs mount {} MOUNTPOINT", v.display())), "{}", err(&o));
    let src = t.path().join("src");
    make_tree(&src);
    let vs = v.to_str().unwrap();
    let o = veilfs(&["import", &format!("{}/.", src.display()), vs, "--extpass", "echo pw"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    // Regular files: big.bin, a/hardlink.bin (a link: not copied twice), deep.txt, empty, latin1, LLL…
    let files = 5;
    let bytes = 200_000 + 4 + 5 + 12;
    assert!(
        err(&o).contains(&format!(
            "veilfs: imported {files} files ({bytes} bytes, 196K), skipped 0 identical, 0 conflicts, 0 errors"
        )),
        "{}",
        err(&o)
    );
    let o = veilfs(&["export", vs, t.path().join("out").to_str().unwrap(), "--extpass", "echo pw"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(
        err(&o).contains(&format!(
            "veilfs: exported {files} files ({bytes} bytes, 196K), skipped 0 identical, 0 conflicts, 0 errors"
        )),
        "{}",
        err(&o)
    );
    // On a terminal: the KDF notice, and an export bar with its total (indicatif's KiB).
    let cmd = format!("{BIN} export {vs} {} --extpass 'echo pw'", sq(&t.path().join("out2")));
    if let Some(text) = on_terminal(&cmd) {
        assert!(text.contains("deriving the key (Argon2id, 8 MiB)"), "{text}");
        assert!(text.contains("/195.33 KiB"), "export bar total: {text}");
    }
}

#[test]
fn mount_refuses_to_hide_its_own_cipherdir() {
    let t = tempfile::tempdir().unwrap();
    let v = t.path().join("v");
    assert_eq!(code(&veilfs(&[&["init", v.to_str().unwrap(), "--extpass", "echo pw"][..], &WEAK].concat())), 0);
    for mnt in [t.path(), v.as_path()] {
        let o = veilfs(&["mount", v.to_str().unwrap(), mnt.to_str().unwrap(), "--nonempty", "--extpass", "echo pw"]);
        assert_eq!(code(&o), 4, "{}", err(&o));
        let e = err(&o);
        assert!(e.contains("hide CIPHERDIR") || e.contains("inside CIPHERDIR"), "{e}");
    }
}

#[test]
fn man_pages_and_completions_are_generated() {
    let t = tempfile::tempdir().unwrap();
    let man = t.path().join("man");
    let o = veilfs(&["generate", "man", man.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    for page in
        ["veilfs", "veilfs-init", "veilfs-mount", "veilfs-umount", "veilfs-passwd", "veilfs-ls", "veilfs-export"]
    {
        assert!(man.join(format!("{page}.1")).is_file(), "{page}.1");
    }
    assert!(!man.join("veilfs-generate.1").exists(), "the hidden subcommand has no page");
    let top = std::fs::read_to_string(man.join("veilfs.1")).unwrap();
    let mount = std::fs::read_to_string(man.join("veilfs-mount.1")).unwrap();
    for s in [
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH OPTIONS",
        ".SH SUBCOMMANDS",
        ".SH \"EXIT STATUS\"",
        ".SH ENVIRONMENT",
        "VEILFS_LOG",
    ] {
        assert!(top.contains(s), "veilfs.1 has {s}");
    }
    for s in [
        "\\-\\-idle",
        "\\-\\-allow\\-other",
        "\\-\\-read\\-only",
        "\\-\\-shared\\-storage",
        "\\-\\-nonempty",
        ".SH \"EXIT STATUS\"",
    ] {
        assert!(mount.contains(s), "veilfs-mount.1 has {s}");
    }
    if common_which("man") {
        for page in ["veilfs.1", "veilfs-mount.1"] {
            let o = Command::new("man")
                .args(["-l", "--warnings"])
                .arg(man.join(page))
                .env("MANWIDTH", "100")
                .output()
                .unwrap();
            assert!(o.status.success(), "man -l {page}: {}", err(&o));
            assert!(err(&o).is_empty(), "man warnings for {page}: {}", err(&o));
            let text = out(&o);
            assert!(text.contains("EXIT STATUS") && text.contains("wrong password or recovery key"), "{text}");
        }
    }
    for shell in ["bash", "zsh", "fish"] {
        let o = veilfs(&["generate", "completions", shell]);
        assert_eq!(code(&o), 0, "{shell}: {}", err(&o));
        assert!(out(&o).contains("passwd") && out(&o).contains("recovery-key"), "{shell}");
        if shell == "bash" {
            let script = t.path().join("veilfs.bash");
            std::fs::write(&script, out(&o)).unwrap();
            let o = Command::new("bash").arg("-n").arg(&script).output().unwrap();
            assert!(o.status.success(), "bash -n: {}", err(&o));
            // It also loads and registers the completion.
            let o = bash(&format!("source {} && complete -p veilfs", sq(&script)));
            assert!(out(&o).contains("veilfs"), "{}{}", out(&o), err(&o));
        }
    }
}

fn common_which(cmd: &str) -> bool {
    bash(&format!("command -v {cmd}")).status.success()
}

// ---------------------------------------------------------------------------------------
// Mount-table checks, stale mounts and /dev/fuse access: these mount for real (root and
// /dev/fuse), each on its own tmpfs, and unmount whatever they mounted, also on panic.
// ---------------------------------------------------------------------------------------

/// Lazily unmounts `0` on drop if it is still mounted.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// True when `p` is a mount point (read from the mount table, escapes decoded by findmnt).
fn mounted(p: &Path) -> bool {
    Command::new("findmnt").arg("--mountpoint").arg(p).stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// A weak vault `v` (password "pw") on a fresh tmpfs.
fn vault_on_tmpfs() -> (common::Tmpfs, PathBuf) {
    let t = common::Tmpfs::new("64m");
    let v = t.path.join("v");
    assert_eq!(code(&veilfs(&[&["init", v.to_str().unwrap(), "--extpass", "echo pw"][..], &WEAK].concat())), 0);
    (t, v)
}

#[test]
fn umount_finds_a_mount_point_with_a_space_and_leaves_other_filesystems_alone() {
    if !common::root_only("the other file system is the test's own tmpfs, which a user cannot mount")
        || !common::fuse_available()
    {
        return;
    }
    let (t, v) = vault_on_tmpfs();
    let mnt = t.path.join("my plain");
    std::fs::create_dir(&mnt).unwrap();
    let _guard = Unmount(mnt.clone());
    let o = veilfs(&["mount", v.to_str().unwrap(), mnt.to_str().unwrap(), "--extpass", "echo pw"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(mounted(&mnt));
    // The command from the issue, run where the mount point is.
    let o = Command::new(BIN).args(["umount", "my plain"]).current_dir(&t.path).output().unwrap();
    assert_eq!(code(&o), 0, "veilfs umount \"my plain\": {}", err(&o));
    assert!(!mounted(&mnt), "still mounted");
    // Not a veilfs mount (the tmpfs itself): refused with 4, left mounted.
    let o = veilfs(&["umount", t.path.to_str().unwrap()]);
    assert_eq!(code(&o), 4, "{}", err(&o));
    assert!(err(&o).contains("not a veilfs mount") && err(&o).contains("tmpfs"), "{}", err(&o));
    assert!(mounted(&t.path), "the tmpfs must stay mounted");
}

#[test]
fn a_mount_stacks_on_a_directory_that_is_already_a_mount_point_as_the_kernel_allows() {
    if !common::root_only("the lower mount is the test's own tmpfs, which a user cannot mount")
        || !common::fuse_available()
    {
        return;
    }
    let (_t, v) = vault_on_tmpfs();
    // The mount point is itself a (second, empty) tmpfs: xfstests' generic/604 mounts so.
    let lower = common::Tmpfs::new("1m");
    let mnt = lower.path.clone();
    let _guard = Unmount(mnt.clone());
    let o = veilfs(&["mount", v.to_str().unwrap(), mnt.to_str().unwrap(), "--extpass", "echo pw"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let top = Command::new("findmnt").args(["-n", "-o", "FSTYPE", "--mountpoint"]).arg(&mnt).output().unwrap();
    assert_eq!(out(&top).lines().last(), Some("fuse.veilfs"), "{}", out(&top));
    std::fs::write(mnt.join("f"), b"on the veilfs mount").unwrap();
    let o = veilfs(&["umount", mnt.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    // The tmpfs below is still mounted, and the file went to the vault, not into it.
    assert!(mounted(&mnt), "the lower mount must stay");
    assert!(!mnt.join("f").exists());
}

#[test]
fn mount_names_a_stale_mount_and_how_to_clear_it() {
    if !common::fuse_available() {
        return;
    }
    let (t, v) = vault_on_tmpfs();
    let mnt = t.path.join("plain");
    std::fs::create_dir(&mnt).unwrap();
    let _guard = Unmount(mnt.clone());
    let mut daemon = Command::new(BIN)
        .args(["mount", "-f", v.to_str().unwrap(), mnt.to_str().unwrap(), "--extpass", "echo pw"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !mounted(&mnt) {
        assert!(std::time::Instant::now() < deadline, "the mount did not come up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The daemon crashes: the mount point is left answering ENOTCONN.
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let e = std::fs::metadata(&mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    let o = veilfs(&["mount", v.to_str().unwrap(), mnt.to_str().unwrap(), "--extpass", "echo pw"]);
    assert_eq!(code(&o), 4, "{}", err(&o));
    assert!(err(&o).contains("stale mount"), "{}", err(&o));
    assert!(err(&o).contains(&format!("fusermount3 -u {}", mnt.display())), "{}", err(&o));
    assert!(!err(&o).contains("not a directory"), "{}", err(&o));
    // And veilfs umount clears it.
    let o = veilfs(&["umount", mnt.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(!mounted(&mnt));
}

#[test]
fn a_user_without_access_to_dev_fuse_is_told_so() {
    if !common::root_only("replaces /dev/fuse in a private mount namespace (unshare -m), then becomes nobody")
        || !common::fuse_available()
        || !common::which("unshare")
        || !common::which("setpriv")
    {
        return;
    }
    let (t, v) = vault_on_tmpfs();
    let mnt = t.path.join("plain");
    std::fs::create_dir(&mnt).unwrap();
    // A copy of the binary where nobody may run it (the build directory may be private).
    let bin_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = bin_dir.path().join("veilfs");
    std::fs::copy(BIN, &bin).unwrap();
    let nofuse = t.path.join("nofuse");
    std::fs::write(&nofuse, "").unwrap();
    std::fs::set_permissions(&nofuse, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = Command::new("chmod").args(["-R", "a+rwX"]).arg(&v).arg(&mnt).status().unwrap();
    assert!(o.success());
    // In a private mount namespace, /dev/fuse is replaced by a root-only file; then the
    // mount runs as nobody.
    let script = format!(
        "mount --bind {} /dev/fuse && exec setpriv --reuid=65534 --regid=65534 --clear-groups {} mount {} {} --extpass 'echo pw'",
        sq(&nofuse),
        sq(&bin),
        sq(&v),
        sq(&mnt)
    );
    let o = Command::new("unshare").args(["-m", "sh", "-c", &script]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(code(&o), 8, "{}", err(&o));
    assert!(err(&o).contains("/dev/fuse") && err(&o).contains("may not use FUSE"), "{}", err(&o));
    assert!(!mounted(&mnt));
}

#[test]
fn install_script_puts_binary_man_pages_and_completions_under_prefix() {
    let t = tempfile::tempdir().unwrap();
    let prefix = t.path().join("usr");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let sbin = prefix.join("sbin");
    let o = Command::new("sh")
        .arg(&script)
        .env("PREFIX", &prefix)
        .env("SBINDIR", &sbin)
        .env("VEILFS_BIN", BIN)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", err(&o));
    for f in [
        "bin/veilfs",
        "share/man/man1/veilfs.1",
        "share/man/man1/veilfs-mount.1",
        "share/bash-completion/completions/veilfs",
        "share/zsh/site-functions/_veilfs",
        "share/fish/vendor_completions.d/veilfs.fish",
    ] {
        assert!(prefix.join(f).is_file(), "{f} installed");
    }
    // The mount(8) helper: a link to the installed binary.
    assert_eq!(std::fs::read_link(sbin.join("mount.fuse.veilfs")).unwrap(), prefix.join("bin/veilfs"));
    let o = Command::new("sh")
        .arg(&script)
        .arg("--uninstall")
        .env("PREFIX", &prefix)
        .env("SBINDIR", &sbin)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert!(!prefix.join("bin/veilfs").exists() && !prefix.join("share/man/man1/veilfs.1").exists());
    assert!(sbin.join("mount.fuse.veilfs").symlink_metadata().is_err());
}

/// `veilfs import` into a vault with the feature `block-map` (docs/FORMAT.md §5.10; every new
/// vault has it): each file
/// is written in one write session, ended before the file gets its name, so every file is
/// left settled (header v2 without UNSETTLED), no session log is left, and a file of five
/// 1 MiB writes has generation 2 (its first write, then one session), not one per write.
#[test]
fn an_import_into_a_block_map_vault_leaves_files_settled_with_no_log() {
    let f = Fixture::new();
    let src = f.dir.join("src");
    std::fs::create_dir(&src).unwrap();
    let big: Vec<u8> = (0..(5u32 << 20) - 7).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(src.join("big"), &big).unwrap();
    std::fs::write(src.join("small"), b"small").unwrap();
    let o = f.run(&["import", &format!("{}/.", src.display()), f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let mut generations = Vec::new();
    for e in std::fs::read_dir(&f.vault).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with(veilfs_core::stash::STASH_PREFIX), "write-session log left: {name}");
        assert!(!name.starts_with(veilfs_core::names::PART_PREFIX), "partial file left: {name}");
        let md = e.metadata().unwrap();
        if md.is_file() && md.len() > 0 && !name.starts_with("veilfs.") {
            let c = std::fs::read(e.path()).unwrap();
            assert_eq!(&c[..2], &[0, 2], "{name} is header v2");
            assert_eq!(c[3] & 2, 0, "{name} is settled (no UNSETTLED)");
            generations.push((md.len(), u64::from_be_bytes(c[20..28].try_into().unwrap())));
        }
    }
    generations.sort();
    assert_eq!(generations.iter().map(|g| g.1).collect::<Vec<_>>(), [1, 2], "one session per file: {generations:?}");
    let o = f.run(&["cat", &format!("{}/big", f.v())]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(o.stdout == big, "big reads back");
}

/// Import and export keep `user.*` extended attributes (encrypted in the vault),
/// and export withholds set-id bits and device nodes unless `--preserve-special`.
#[test]
fn import_and_export_keep_user_xattrs_and_withhold_set_id_bits() {
    let f = Fixture::new();
    let src = f.dir.join("xsrc");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("f"), b"data").unwrap();
    std::fs::write(src.join("suid"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(src.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let set =
        bash(&format!("setfattr -n user.colour -v blue {0}/f && setfattr -n user.note -v 'a dir' {0}/d", sq(&src)));
    if !set.status.success() {
        // The test directory's filesystem has no user xattrs (or setfattr is missing).
        let msg = format!("cannot set user xattrs in {}: {}", src.display(), String::from_utf8_lossy(&set.stderr));
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}: refusing to skip under CI=true");
        eprintln!("SKIPPED: {msg}");
        return;
    }
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    // In the vault, the attribute names and values are encrypted.
    let dump = bash(&format!("getfattr -R -d -m - {}", sq(&f.vault)));
    assert!(!out(&dump).contains("colour") && !out(&dump).contains("blue"), "{}", out(&dump));
    let dest = f.dir.join("xout");
    let o = f.run(&["export", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let got = bash(&format!(
        "getfattr -n user.colour --only-values {0}/f; echo; getfattr -n user.note --only-values {0}/d",
        sq(&dest)
    ));
    assert_eq!(out(&got), "blue\na dir", "{}", err(&got));
    assert!(err(&o).contains("set-user-id/set-group-id bit not restored"), "{}", err(&o));
    let mode = std::fs::metadata(dest.join("suid")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755, "set-id bit withheld by default");
    let again = f.dir.join("xout2");
    let o = f.run(&["export", f.v(), again.to_str().unwrap(), "--preserve-special"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(std::fs::metadata(again.join("suid")).unwrap().permissions().mode() & 0o7777, 0o4755);
}

// ---------------------------------------------------------------------------------------
// One writer at a time (the vault lock), and interrupted imports and exports that
// leave no cut-off file and resume.
// ---------------------------------------------------------------------------------------

/// Runs `veilfs ARGS --passfile PASSFILE` for a `common::Mounted` vault.
fn with_pass(m: &common::Mounted, args: &[&str]) -> Output {
    veilfs(&[args, &["--passfile", m.passfile.to_str().unwrap()]].concat())
}

/// A mount locks its vault: the commands that write it and a second mount are refused with
/// exit code 9 and a message naming the daemon (found through the kernel: the lock file has
/// no content); the reading ones work. (`import` into a mounted vault used to exit 0, and the
/// file never appeared in the mount.)
#[test]
fn a_mount_locks_its_vault_against_other_writers() {
    let Some(mut m) = common::Mounted::new("64m", &[]) else { return };
    let v = m.cipher.to_str().unwrap().to_string();
    let pid = common::daemon_pid(&m.mnt).expect("the daemon's pid");
    assert_eq!(std::fs::read(m.cipher.join("veilfs.lock")).unwrap(), b"", "nothing is written into the lock file");
    assert!(!common::vault_lock_is_free(&m.cipher));
    std::fs::write(m.m("inside"), "written through the mount").unwrap();
    let src = m.tmpfs.path.join("new-file");
    std::fs::write(&src, "imported").unwrap();
    let holder = format!("{v} is mounted by pid {pid} on host ");
    let refused = [with_pass(&m, &["import", src.to_str().unwrap(), &v]), with_pass(&m, &["fsck", "--repair", &v])];
    for o in &refused {
        assert_eq!(code(o), 9, "{}", err(o));
        assert!(err(o).contains(&holder) && err(o).contains("unmount it first, or use --shared-storage"), "{}", err(o));
        assert_eq!(err(o).lines().count(), 1, "one clear message: {}", err(o));
    }
    assert!(!m.m("new-file").exists(), "nothing was imported");
    let second = m.tmpfs.path.join("second");
    std::fs::create_dir(&second).unwrap();
    let o = m.mount_cmd(&second);
    assert_eq!(code(&o), 9, "a second mount: {}", err(&o));
    assert!(err(&o).contains(&format!("is mounted by pid {pid} on host ")), "{}", err(&o));
    // passwd works while mounted (it changes only the key slots, which the mount does not
    // read again), and the mount goes on serving.
    let conf = std::fs::read(m.cipher.join("veilfs.conf")).unwrap();
    let o = with_pass(&m, &["passwd", &v, "--new-passfile", m.passfile.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "passwd while mounted: {}", err(&o));
    assert_ne!(std::fs::read(m.cipher.join("veilfs.conf")).unwrap(), conf, "a new slot was written");
    std::fs::write(m.m("after-passwd"), "still served").unwrap();
    // Reading works while mounted.
    assert_eq!(out(&with_pass(&m, &["cat", &format!("{v}/inside")])), "written through the mount");
    assert!(out(&with_pass(&m, &["ls", &v])).contains("inside"));
    let dest = m.tmpfs.path.join("exported");
    for o in
        [with_pass(&m, &["export", &v, dest.to_str().unwrap()]), with_pass(&m, &["fsck", &v]), veilfs(&["info", &v])]
    {
        assert_eq!(code(&o), 0, "{}", err(&o));
    }
    m.umount();
    assert!(common::vault_lock_is_free(&m.cipher), "the lock is released at unmount");
    assert_eq!(std::fs::read(m.cipher.join("veilfs.lock")).unwrap(), b"", "and its file stays, unchanged");
    let o = with_pass(&m, &["import", src.to_str().unwrap(), &v]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    m.mount();
    assert_eq!(std::fs::read_to_string(m.m("new-file")).unwrap(), "imported");
    // fusermount3 -u returns before the daemon has let go of the lock: a writer right after
    // it waits for that instead of refusing.
    assert_eq!(code(&common::run("fusermount3", &["-u", m.mnt.to_str().unwrap()])), 0);
    let o = with_pass(&m, &["import", src.to_str().unwrap(), &format!("{v}/again")]);
    assert_eq!(code(&o), 0, "{}", err(&o));
}

/// A daemon killed with SIGKILL blocks nothing (its OS lock died with it): the next mount
/// succeeds at once, says the last writer did not end cleanly and runs the crash sweep; after
/// a clean unmount the mount after it says nothing of the kind (the host-local mark is gone).
#[test]
fn a_killed_daemon_blocks_nothing_and_the_next_mount_sweeps() {
    let Some(mut m) = common::Mounted::new("64m", &[]) else { return };
    std::fs::write(m.m("kept"), "written before the crash").unwrap();
    m.kill_daemon();
    assert!(common::vault_lock_is_free(&m.cipher));
    let o = m.mount_output();
    assert!(err(&o).contains("did not end cleanly"), "{}", err(&o));
    assert_eq!(std::fs::read_to_string(m.m("kept")).unwrap(), "written before the crash");
    let new_pid = common::daemon_pid(&m.mnt).expect("the new daemon's pid");
    let o = with_pass(&m, &["import", m.passfile.to_str().unwrap(), m.cipher.to_str().unwrap()]);
    assert_eq!(code(&o), 9, "{}", err(&o));
    assert!(err(&o).contains(&format!("is mounted by pid {new_pid} on host ")), "{}", err(&o));
    m.umount();
    let o = m.mount_output();
    assert!(!err(&o).contains("did not end cleanly"), "a clean unmount clears the mark: {}", err(&o));
}

/// `fusermount3 -u` returns before the daemon has let go of the vault: a copy of CIPHERDIR
/// made right after it sees every file it lists (the lock file used to vanish under `cp -a`).
#[test]
fn a_copy_right_after_an_unmount_sees_no_file_vanish() {
    let Some(mut m) = common::Mounted::new("64m", &[]) else { return };
    for round in 0..5 {
        std::fs::write(m.m(&format!("f{round}")), "x").unwrap();
        assert_eq!(code(&common::run("fusermount3", &["-u", m.mnt.to_str().unwrap()])), 0);
        let copy = m.tmpfs.path.join(format!("copy{round}"));
        let o = common::run("cp", &["-a", m.cipher.to_str().unwrap(), copy.to_str().unwrap()]);
        assert_eq!(code(&o), 0, "round {round}: {}", err(&o));
        // The daemon may still be ending: the next mount waits for it.
        m.mount();
    }
}

/// `--shared-storage` takes no lock: the vault mounts twice, and an offline import shows up
/// in both mounts at once.
#[test]
fn shared_storage_mounts_take_no_lock_and_see_an_import() {
    let Some(m) = common::Mounted::new("64m", &["--shared-storage"]) else { return };
    assert!(common::vault_lock_is_free(&m.cipher));
    let second = m.tmpfs.path.join("second");
    std::fs::create_dir(&second).unwrap();
    let _guard = common::UnmountOnDrop(second.clone());
    let o = m.mount_cmd(&second);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let src = m.tmpfs.path.join("imported");
    std::fs::write(&src, "from import").unwrap();
    let o = with_pass(&m, &["import", src.to_str().unwrap(), m.cipher.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(std::fs::read_to_string(m.m("imported")).unwrap(), "from import");
    assert_eq!(std::fs::read_to_string(second.join("imported")).unwrap(), "from import");
    // fsck --repair still refuses a mounted vault (the mount table names it).
    let o = with_pass(&m, &["fsck", "--repair", m.cipher.to_str().unwrap()]);
    assert_eq!(code(&o), 9, "{}", err(&o));
    assert_eq!(code(&common::run(BIN, &["umount", second.to_str().unwrap()])), 0);
}

/// `veilfs mount CIPHERDIR at EXTRA…` of `m`'s vault (a mount of another kind than `m`'s).
fn mount_at(m: &common::Mounted, at: &std::path::Path, extra: &[&str]) -> Output {
    std::fs::create_dir_all(at).unwrap();
    with_pass(m, &[&["mount", m.cipher.to_str().unwrap(), at.to_str().unwrap()], extra].concat())
}

/// A mount that caches (for an hour) and a `--shared-storage` mount never run on one
/// vault at once: each is refused with exit code 9 while the other kind is live, naming it;
/// shared-storage mounts coexist and see each other's changes at once.
#[test]
fn caching_and_shared_storage_mounts_refuse_each_other() {
    let Some(mut m) = common::Mounted::new("64m", &[]) else { return };
    let pid = common::daemon_pid(&m.mnt).expect("the daemon's pid");
    let (a, b) = (m.tmpfs.path.join("shared-a"), m.tmpfs.path.join("shared-b"));
    let _guards = (common::UnmountOnDrop(a.clone()), common::UnmountOnDrop(b.clone()));
    let o = mount_at(&m, &a, &["--shared-storage"]);
    assert_eq!(code(&o), 9, "a shared-storage mount beside a caching one: {}", err(&o));
    assert!(err(&o).contains(&format!("is mounted by pid {pid} on host ")), "{}", err(&o));
    assert!(err(&o).contains("a mount that caches"), "{}", err(&o));
    m.umount();
    for at in [&a, &b] {
        let o = mount_at(&m, at, &["--shared-storage"]);
        assert_eq!(code(&o), 0, "{}", err(&o));
    }
    std::fs::write(a.join("from-a"), "written in a").unwrap();
    assert_eq!(std::fs::read_to_string(b.join("from-a")).unwrap(), "written in a");
    let o = mount_at(&m, &m.mnt, &[]);
    assert_eq!(code(&o), 9, "a caching mount beside shared-storage ones: {}", err(&o));
    let e = err(&o);
    assert!(e.contains("is mounted with --shared-storage") && e.contains(a.to_str().unwrap()), "{e}");
    assert!(e.contains(b.to_str().unwrap()), "names every mount of this machine: {e}");
    assert!(common::vault_lock_is_free(&m.cipher), "the refused mount holds no lock");
    // Offline writers still work beside shared-storage mounts.
    let src = m.tmpfs.path.join("imported");
    std::fs::write(&src, "from import").unwrap();
    let o = with_pass(&m, &["import", src.to_str().unwrap(), m.cipher.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(std::fs::read_to_string(b.join("imported")).unwrap(), "from import");
    for at in [&a, &b] {
        assert_eq!(code(&common::run(BIN, &["umount", at.to_str().unwrap()])), 0);
    }
    m.mount();
    assert_eq!(std::fs::read_to_string(m.m("from-a")).unwrap(), "written in a");
}

/// A lock file that arrives from elsewhere (a synced or copied CIPHERDIR, here in the format
/// of older versions, naming another machine, and one naming a live process of this one)
/// never refuses a writer and is never rewritten; sync tools' copies of it are their files:
/// fsck exit 0 naming them, `--repair` leaves them, `ls` and `export` do not stumble. A real
/// holder of this machine that is not veilfs is named with its pid.
#[test]
fn a_lock_file_from_elsewhere_never_refuses_and_its_copies_are_not_damage() {
    let f = Fixture::new();
    let src = f.dir.join("file");
    std::fs::write(&src, "x").unwrap();
    let lock = f.vault.join("veilfs.lock");
    let host = String::from_utf8_lossy(&common::run("uname", &["-n"]).stdout).trim().to_string();
    for (i, text) in [
        "pid=4242\nhost=laptop.example\nsince=1700000000\ncommand=mount\n".to_string(),
        format!("pid=1\nhost={host}\nsince=0\ncommand=mount\n"),
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(&lock, text).unwrap();
        let o = f.run(&["import", src.to_str().unwrap(), &format!("{}/f{i}", f.v())]);
        assert_eq!(code(&o), 0, "{text:?}: {}", err(&o));
        assert_eq!(&std::fs::read_to_string(&lock).unwrap(), text, "the lock file is not rewritten");
    }
    // Accepted for old command lines; nothing to break.
    let o = f.run(&["import", src.to_str().unwrap(), &format!("{}/f2", f.v()), "--break-lock"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let copies = [
        "veilfs.sync-conflict-20261127-101010-ABCDEFG.lock",
        "veilfs (conflicted copy 2026-11-27 101010).lock",
        "veilfs (1).lock",
        "veilfs-LAPTOP.lock",
    ];
    for c in copies {
        std::fs::write(f.vault.join(c), "pid=4242\nhost=laptop.example\nsince=1700000000\ncommand=mount\n").unwrap();
    }
    let o = f.run(&["fsck", f.v()]);
    assert_eq!(code(&o), 0, "{}{}", out(&o), err(&o));
    for c in copies {
        assert!(out(&o).contains(c) || err(&o).contains(c), "fsck names {c}: {}{}", out(&o), err(&o));
    }
    let o = f.run(&["fsck", "--repair", f.v()]);
    assert_eq!(code(&o), 0, "{}{}", out(&o), err(&o));
    for c in copies {
        assert!(f.vault.join(c).exists(), "--repair leaves {c} alone");
    }
    let o = f.run(&["ls", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(out(&o).contains("f0") && !out(&o).contains("lock"), "{}", out(&o));
    let o = f.run(&["export", f.v(), f.dir.join("out").to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    // A holder of this machine that is not veilfs: refused, naming its pid.
    let mut holder = Command::new("flock").args(["-x", lock.to_str().unwrap(), "sleep", "30"]).spawn().unwrap();
    let t = std::time::Instant::now();
    while common::vault_lock_is_free(&f.vault) {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "flock did not take the lock");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = f.run(&["import", src.to_str().unwrap(), &format!("{}/f3", f.v())]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(code(&o), 9, "{}", err(&o));
    assert!(
        err(&o).contains(&format!("is locked by pid {} (`flock`, not veilfs) on host {host}", holder.id())),
        "{}",
        err(&o)
    );
}

/// Every file under `dir` whose name starts with `prefix`.
fn files_named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(it) = std::fs::read_dir(dir) else { return found };
    for e in it.flatten() {
        if e.file_name().to_string_lossy().starts_with(prefix) {
            found.push(e.path());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(files_named(&e.path(), prefix));
        }
    }
    found
}

/// Starts `veilfs ARGS`, waits until a temporary file named `prefix…` under `watch` has
/// grown past 8 MiB (the copy is inside the large file), sends `signal` and returns how it
/// ended.
fn interrupt_mid_file(args: &[&str], watch: &Path, prefix: &str, signal: i32) -> std::process::ExitStatus {
    let mut child = Command::new(BIN).args(args).stdin(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let t = std::time::Instant::now();
    let inside = || files_named(watch, prefix).iter().any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 8 << 20));
    while !inside() {
        assert!(child.try_wait().unwrap().is_none(), "{args:?} ended before it was interrupted");
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "no temporary file appeared");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // SAFETY: kill with the pid of our own child, which has not been reaped yet.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    child.wait().unwrap()
}

/// Size of `zz-large` (see [`tree_with_a_big_last_file`]).
const LARGE: u64 = 160 * (1 << 20) - 159 * 160 / 2;

/// A tree whose last file in import order (`zz-large`, [`LARGE`] bytes) is big enough for a
/// signal to land inside it.
fn tree_with_a_big_last_file(root: &Path) {
    make_tree(root);
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut f = std::fs::File::create(root.join("zz-large")).unwrap();
    for i in 0..160u8 {
        std::io::Write::write_all(&mut f, &chunk[usize::from(i)..]).unwrap();
    }
}

/// Ctrl-C in the middle of a large import and a large export: nothing cut off under a final
/// name, no temporary file left, the process ends by SIGINT; the re-run completes and skips
/// what is there, and the trees are equal. A run after a complete one skips everything.
#[test]
fn ctrl_c_during_import_and_export_leaves_nothing_cut_off_and_a_rerun_completes() {
    use std::os::unix::process::ExitStatusExt;
    let t = common::Tmpfs::new("900m");
    let src = t.path.join("src");
    tree_with_a_big_last_file(&src);
    let v = t.path.join("v");
    let pf = t.path.join("pf");
    common::write_passfile(&pf, "pw");
    let o = veilfs(&[&["init", v.to_str().unwrap(), "--passfile", pf.to_str().unwrap()][..], &WEAK].concat());
    assert_eq!(code(&o), 0, "{}", err(&o));
    let (vs, p) = (v.to_str().unwrap(), pf.to_str().unwrap());
    let import_src = format!("{}/.", src.display());
    let import = ["import", &import_src, vs, "--passfile", p];
    let st = interrupt_mid_file(&import, &v, "veilfs.part.", libc::SIGINT);
    assert_eq!(st.signal(), Some(libc::SIGINT), "import ends by the signal: {st:?}");
    assert!(files_named(&v, "veilfs.part.").is_empty(), "the partial copy is removed");
    assert!(common::vault_lock_is_free(&v), "the lock is released");
    let listing = out(&veilfs(&["ls", vs, "--passfile", p]));
    assert!(listing.contains("big.bin") && !listing.contains("zz-large"), "cut-off file under its name: {listing}");
    let o = veilfs(&import);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains(&format!("imported 1 file ({LARGE} bytes")), "{}", err(&o));
    assert!(!err(&o).contains("skipped 0 "), "the files before it are skipped: {}", err(&o));
    let o = veilfs(&import);
    assert!(err(&o).contains("imported 0 files (0 bytes, 0), skipped 10 identical, 0 conflicts"), "{}", err(&o));

    let dest = t.path.join("out");
    let export = ["export", vs, dest.to_str().unwrap(), "--passfile", p];
    let st = interrupt_mid_file(&export, &dest, ".veilfs-part-", libc::SIGINT);
    assert_eq!(st.signal(), Some(libc::SIGINT), "export ends by the signal: {st:?}");
    assert!(files_named(&dest, ".veilfs-part-").is_empty(), "the partial file is removed");
    // Export goes in directory order: whatever is under its name is whole.
    assert!(!dest.join("zz-large").exists(), "cut-off file under its name");
    let o = veilfs(&export);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_same_tree(&src, &dest);
    let o = veilfs(&export);
    assert!(err(&o).contains("exported 0 files (0 bytes, 0), skipped 10 identical, 0 conflicts"), "{}", err(&o));
}

/// SIGKILL leaves the temporary file behind (its lock died with it): fsck names the partial
/// copy, and the re-run says the last writer did not end cleanly, removes the leftovers and
/// completes.
#[test]
fn a_killed_import_or_export_is_cleaned_up_by_the_rerun() {
    let t = common::Tmpfs::new("700m");
    let src = t.path.join("src");
    tree_with_a_big_last_file(&src);
    let v = t.path.join("v");
    let pf = t.path.join("pf");
    common::write_passfile(&pf, "pw");
    let o = veilfs(&[&["init", v.to_str().unwrap(), "--passfile", pf.to_str().unwrap()][..], &WEAK].concat());
    assert_eq!(code(&o), 0, "{}", err(&o));
    let (vs, p) = (v.to_str().unwrap(), pf.to_str().unwrap());
    let import_src = format!("{}/.", src.display());
    let import = ["import", &import_src, vs, "--passfile", p];
    interrupt_mid_file(&import, &v, "veilfs.part.", libc::SIGKILL);
    assert_eq!(files_named(&v, "veilfs.part.").len(), 1);
    let o = veilfs(&["fsck", vs, "--passfile", p]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert!(err(&o).contains("an interrupted import left a partial copy"), "{}", err(&o));
    let o = veilfs(&import);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains("did not end cleanly"), "{}", err(&o));
    assert!(files_named(&v, "veilfs.part.").is_empty(), "the re-run removes the leftover");
    assert_eq!(code(&veilfs(&["fsck", vs, "--passfile", p])), 0);

    let dest = t.path.join("out");
    let export = ["export", vs, dest.to_str().unwrap(), "--passfile", p];
    interrupt_mid_file(&export, &dest, ".veilfs-part-", libc::SIGKILL);
    assert_eq!(files_named(&dest, ".veilfs-part-").len(), 1);
    let o = veilfs(&export);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(files_named(&dest, ".veilfs-part-").is_empty(), "the re-run removes the leftover");
    assert_same_tree(&src, &dest);
}

/// A source file that changed since it was imported (or exported) is a conflict: reported,
/// counted, kept, exit code 1; `--overwrite` replaces it.
#[test]
fn a_changed_file_is_a_conflict_unless_overwrite() {
    let f = Fixture::new();
    let src = f.dir.join("csrc");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/keep"), "same").unwrap();
    std::fs::write(src.join("d/change"), "first version").unwrap();
    let import_src = format!("{}/.", src.display());
    assert_eq!(code(&f.run(&["import", &import_src, f.v()])), 0);
    std::fs::write(src.join("d/change"), "second, longer version").unwrap();
    let o = f.run(&["import", &import_src, f.v()]);
    assert_eq!(code(&o), 1, "{}", err(&o));
    assert!(err(&o).contains("d/change: conflict: already in the vault and different"), "{}", err(&o));
    assert!(
        err(&o).contains("imported 0 files (0 bytes, 0), skipped 1 identical, 1 conflict, 0 errors"),
        "{}",
        err(&o)
    );
    assert_eq!(out(&f.run(&["cat", &format!("{}/d/change", f.v())])), "first version");
    let o = f.run(&["import", &import_src, f.v(), "--overwrite"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains("imported 1 file (22 bytes, 22), skipped 1 identical, 0 conflicts"), "{}", err(&o));
    assert_eq!(out(&f.run(&["cat", &format!("{}/d/change", f.v())])), "second, longer version");
    // The same for export, with a destination file edited after the export.
    let dest = f.dir.join("cout");
    assert_eq!(code(&f.run(&["export", f.v(), dest.to_str().unwrap()])), 0);
    std::fs::write(dest.join("d/change"), "edited").unwrap();
    let o = f.run(&["export", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 1, "{}", err(&o));
    assert!(err(&o).contains("conflict: already in the destination and different"), "{}", err(&o));
    assert_eq!(std::fs::read_to_string(dest.join("d/change")).unwrap(), "edited");
    let o = f.run(&["export", f.v(), dest.to_str().unwrap(), "--overwrite"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(std::fs::read_to_string(dest.join("d/change")).unwrap(), "second, longer version");
}

/// Conflict copies offline: `veilfs conflicts` lists a Syncthing and a Dropbox copy of a file,
/// and copies of copies (Dropbox's copy of its copy, a counter's `(1) (2)`), under the names
/// every tool shows them as, and the copies of veilfs's own lock and config; fsck reports
/// them as conflict copies with exit code 0; `fsck --repair` makes the file copies ordinary
/// entries (every version kept) and leaves the copies of the lock (a sync tool's file, as
/// every form of it) and of the config alone.
#[test]
fn conflicts_lists_copies_and_fsck_repair_makes_them_ordinary_files() {
    let f = Fixture::new();
    let src = f.dir.join("tree");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("notes.txt"), "mine").unwrap();
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let entry = common::user_entries(&f.vault).remove(0);
    let syncthing = common::syncthing_copy_name(&entry);
    std::fs::copy(&entry, &syncthing).unwrap();
    let name = entry.file_name().unwrap().to_str().unwrap();
    let dot = name.rfind('.').unwrap();
    let dropbox = f.vault.join(format!("{} (host's conflicted copy 2026-11-27){}", &name[..dot], &name[dot..]));
    std::fs::copy(&entry, &dropbox).unwrap();
    // Copies of copies.
    let (dbx1, dbx2) = ("host's conflicted copy 2026-11-27", "laptop's conflicted copy 2026-11-28");
    let dropbox2 = common::copy_name_with(&entry, &format!(" ({dbx1}) ({dbx2})"));
    std::fs::copy(&entry, &dropbox2).unwrap();
    let counters = common::copy_name_with(&entry, " (1) (2)");
    std::fs::copy(&entry, &counters).unwrap();
    let (shown_dbx2, shown_counters) = (format!("notes ({dbx1}, {dbx2}).txt"), "notes (1, 2).txt");
    let part = common::SYNCTHING_PART;
    let lock_copy = f.vault.join(format!("veilfs.{part}.lock"));
    std::fs::write(&lock_copy, "a lock of another machine").unwrap();
    let conf_copy = f.vault.join(format!("veilfs.{part}.conf"));
    std::fs::copy(f.vault.join("veilfs.conf"), &conf_copy).unwrap();

    let o = f.run(&["conflicts", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let listed = out(&o);
    for line in [
        format!("/notes ({part}).txt\tSyncthing copy of /notes.txt\t{}", syncthing.display()),
        format!("/notes (host's conflicted copy 2026-11-27).txt\tDropbox copy of /notes.txt\t{}", dropbox.display()),
        format!("/{shown_dbx2}\tDropbox copy of /notes.txt\t{}", dropbox2.display()),
        format!("/{shown_counters}\tGoogle Drive or copy counter copy of /notes.txt\t{}", counters.display()),
        format!("(not shown)\tSyncthing copy of veilfs's veilfs.lock\t{}", lock_copy.display()),
        format!("(not shown)\tSyncthing copy of veilfs's veilfs.conf\t{}", conf_copy.display()),
    ] {
        assert!(listed.contains(&line), "{line:?} in:\n{listed}");
    }
    let o = f.run(&["fsck", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains(&format!("conflict copy (Syncthing copy of /notes.txt): {}", syncthing.display())));
    assert!(err(&o).contains(&format!("conflict copy (Dropbox copy of /notes.txt): {}", dropbox2.display())));
    assert!(err(&o).contains("0 problems"), "{}", err(&o));

    let o = f.run(&["fsck", "--repair", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(!syncthing.exists() && !dropbox.exists(), "{}", err(&o));
    assert!(!dropbox2.exists() && !counters.exists(), "copies of copies are renamed too: {}", err(&o));
    assert!(lock_copy.exists(), "the lock's copy is left alone");
    assert!(conf_copy.exists(), "the config's copy is left alone");
    let o = f.run(&["ls", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    let shown_syncthing = format!("notes ({part}).txt");
    let mut expected = vec![
        "notes (host's conflicted copy 2026-11-27).txt",
        &shown_dbx2,
        shown_counters,
        &shown_syncthing,
        "notes.txt",
    ];
    expected.sort();
    assert_eq!(out(&o).lines().collect::<Vec<_>>(), expected);
    for n in ["notes.txt", &shown_syncthing, &shown_dbx2, shown_counters] {
        assert_eq!(out(&f.run(&["cat", &format!("{}/{n}", f.v())])), "mine");
    }
    let o = f.run(&["conflicts", f.v()]);
    assert_eq!(out(&o).lines().count(), 2, "only the copies of the config and the lock are left: {}", out(&o));
    assert_eq!(code(&f.run(&["fsck", f.v()])), 0);
}

/// Conflict copies whose tool's part is base64url itself: OneDrive's `D-HOST.S` and old
/// ownCloud clients' `D_conflict-YYYYMMDD-HHMMSS.S` are well-formed entry names whose names do
/// not decrypt; each is tried as a copy of `D.S` and, its binding verifying, shown like any
/// other copy: `ls`, `cat`, `export` and `conflicts` show it, fsck reports it as a conflict
/// copy with exit code 0 and `--repair` makes it an ordinary entry. A copy whose original was
/// since removed (the ownCloud one here) is shown as well.
#[test]
fn onedrive_and_old_owncloud_copies_of_short_entries_are_shown_as_copies() {
    let f = Fixture::new();
    let src = f.dir.join("tree");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("notes.txt"), "mine").unwrap();
    std::fs::write(src.join("plan.md"), "the plan, a longer file").unwrap();
    assert_eq!(code(&f.run(&["import", &format!("{}/.", src.display()), f.v()])), 0);
    let mut entries = common::user_entries(&f.vault);
    entries.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let (notes, plan) = (entries[0].clone(), entries[1].clone());
    let onedrive = common::copy_name_with(&notes, "-LAPTOP");
    std::fs::copy(&notes, &onedrive).unwrap();
    let owncloud = common::copy_name_with(&plan, common::OWNCLOUD_PART);
    std::fs::rename(&plan, &owncloud).unwrap();
    let (nc, pc) = ("notes (LAPTOP).txt", "plan (conflict-20261127-101010).md");

    let ls = |f: &Fixture| {
        let o = f.run(&["ls", f.v()]);
        assert_eq!(code(&o), 0, "ls: {}", err(&o));
        let mut names: Vec<String> = out(&o).lines().map(str::to_string).collect();
        names.sort();
        names
    };
    assert_eq!(ls(&f), [nc, "notes.txt", pc]);
    for (n, content) in [(nc, "mine"), ("notes.txt", "mine"), (pc, "the plan, a longer file")] {
        let o = f.run(&["cat", &format!("{}/{n}", f.v())]);
        assert_eq!((code(&o), out(&o).as_str()), (0, content), "cat {n}: {}", err(&o));
    }
    let dest = f.dir.join("exported");
    let o = f.run(&["export", f.v(), dest.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "export: {}", err(&o));
    assert_eq!(std::fs::read_to_string(dest.join(nc)).unwrap(), "mine");
    assert_eq!(std::fs::read_to_string(dest.join(pc)).unwrap(), "the plan, a longer file");

    let o = f.run(&["conflicts", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    for line in [
        format!("/{nc}\tOneDrive copy of /notes.txt\t{}", onedrive.display()),
        format!("/{pc}\townCloud copy of /plan.md\t{}", owncloud.display()),
    ] {
        assert!(out(&o).contains(&line), "{line:?} in:\n{}", out(&o));
    }
    let o = f.run(&["fsck", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains(&format!("conflict copy (OneDrive copy of /notes.txt): {}", onedrive.display())));
    assert!(err(&o).contains(&format!("conflict copy (ownCloud copy of /plan.md): {}", owncloud.display())));
    assert!(err(&o).contains("0 problems"), "{}", err(&o));

    let o = f.run(&["fsck", "--repair", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(!onedrive.exists() && !owncloud.exists(), "renamed to ordinary entries: {}", err(&o));
    assert_eq!(ls(&f), [nc, "notes.txt", pc]);
    assert_eq!(out(&f.run(&["cat", &format!("{}/{pc}", f.v())])), "the plan, a longer file");
    let o = f.run(&["conflicts", f.v()]);
    assert_eq!(out(&o).lines().count(), 0, "{}", out(&o));
    assert_eq!(code(&f.run(&["fsck", f.v()])), 0);
}

/// Attack: an older `veilfs.conf` put back (here: from before a password was added; a removed
/// password slot comes back the same way). The machine that saw the newer config refuses the
/// older one at unlock with exit code 6, naming the config; `veilfs fsck --accept` adopts it.
/// The first unlock on the machine says once that it trusts the vault as found, and `veilfs
/// info` shows the client state.
#[test]
fn an_older_config_put_back_is_refused_with_exit_6_and_fsck_accept_adopts_it() {
    let f = Fixture::new();
    let o = f.run(&["ls", f.v()]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert!(err(&o).contains("first use of this vault on this machine"), "{}", err(&o));
    let o = f.run(&["ls", f.v()]);
    assert!(!err(&o).contains("first use"), "said once: {}", err(&o));
    let info = out(&veilfs(&["info", f.v()]));
    assert!(info.contains("client state: ") && info.contains("client ID "), "{info}");
    let conf = f.vault.join("veilfs.conf");
    let saved = std::fs::read(&conf).unwrap();
    let newpf = f.dir.join("newpf");
    common::write_passfile(&newpf, "second");
    let o = f.run(&[&["passwd", f.v(), "--add", "--new-passfile", newpf.to_str().unwrap()][..], &WEAK].concat());
    assert_eq!(code(&o), 0, "{}", err(&o));
    std::fs::remove_file(&conf).unwrap();
    std::fs::write(&conf, &saved).unwrap();
    let o = f.run(&["ls", f.v()]);
    assert_eq!(code(&o), 6, "{}", err(&o));
    assert!(err(&o).contains("config rolled back") && err(&o).contains(conf.to_str().unwrap()), "{}", err(&o));
    let o = f.run(&["fsck", f.v(), "--accept"]);
    assert_eq!(code(&o), 0, "{}", err(&o));
    assert_eq!(code(&f.run(&["ls", f.v()])), 0, "adopted");
}
