//! Reverse mode for real: `veilfs init --reverse PLAINDIR`, `veilfs mount
//! --reverse PLAINDIR MNT`, rsync of the view to a backup, and a forward `export`/`fsck` of
//! the backup. The view must be a valid vault, byte-identical across remounts and for a
//! copy of PLAINDIR, and an incremental rsync must send only what changed.

mod common;

use common::*;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A tree with every kind of entry: empty and sparse files, 255-byte and non-UTF-8 names,
/// symlinks, a hard link, deep directories, a FIFO, odd modes and old times.
fn make_tree(root: &Path) {
    let p = |rel: &str| root.join(rel);
    std::fs::create_dir_all(p("deep/a/b/c/d/e/f/g/h")).unwrap();
    std::fs::write(p("deep/a/b/c/d/e/f/g/h/leaf.txt"), b"deep leaf\n").unwrap();
    std::fs::write(p("empty"), b"").unwrap();
    std::fs::write(p("small.txt"), b"hello reverse\n").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(p("big.bin"), &big).unwrap();
    // Sparse: a hole of 3 MiB, then data, then a hole to the end.
    let f = std::fs::File::create(p("sparse")).unwrap();
    f.set_len(5 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"middle of nowhere", 3 << 20).unwrap();
    drop(f);
    std::fs::write(root.join(std::ffi::OsStr::from_bytes(&[b'n'; 255])), b"longest name").unwrap();
    std::fs::write(root.join(std::ffi::OsStr::from_bytes(&[b'L'; 150])), b"long name").unwrap();
    std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"latin1-\xe9t\xe9")), b"not utf-8").unwrap();
    std::os::unix::fs::symlink("small.txt", p("link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", p("dangling")).unwrap();
    std::fs::hard_link(p("small.txt"), p("deep/hardlink")).unwrap();
    std::fs::set_permissions(p("big.bin"), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(sh(&format!("mkfifo {}", p("fifo").display())).status.success());
    assert!(sh(&format!("touch -d '2001-02-03 04:05:06' {} {}", p("small.txt").display(), p("deep/a").display()))
        .status
        .success());
}

/// Paths under `root` (relative), the reverse config left out.
fn walk(root: &Path) -> Vec<PathBuf> {
    fn go(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(root.join(rel)).unwrap().flatten() {
            let r = rel.join(e.file_name());
            if r.as_os_str() == ".veilfs.reverse.conf" {
                continue;
            }
            out.push(r.clone());
            if e.file_type().unwrap().is_dir() {
                go(root, &r, out);
            }
        }
    }
    let mut out = Vec::new();
    go(root, Path::new(""), &mut out);
    out.sort();
    out
}

/// `restored` equals `plain`: the same paths, contents (diff -r), modes, and mtimes of
/// regular files.
fn assert_restored(plain: &Path, restored: &Path) {
    assert_eq!(walk(plain), walk(restored), "the restored tree has other paths");
    // diff reports FIFOs as differing; their type and mode are compared below.
    let (p, r) = (plain.to_str().unwrap(), restored.to_str().unwrap());
    let o = run("diff", &["-r", "--no-dereference", "-x", ".veilfs.reverse.conf", "-x", "fifo", p, r]);
    assert!(o.status.success(), "diff -r: {}", text(&o));
    for rel in walk(plain) {
        let (a, b) = (
            std::fs::symlink_metadata(plain.join(&rel)).unwrap(),
            std::fs::symlink_metadata(restored.join(&rel)).unwrap(),
        );
        assert_eq!(a.mode(), b.mode(), "{}: mode", rel.display());
        // Files only: rsync (3.5.0 here) leaves a directory's mtime at the time it created
        // files in it, also when backing up a plain directory; the view's directory times
        // are checked against the plaintext in the test itself.
        if a.file_type().is_file() {
            assert_eq!((a.mtime(), a.mtime_nsec()), (b.mtime(), b.mtime_nsec()), "{}: mtime", rel.display());
        }
    }
}

fn export(backup: &Path, out: &Path, pass: &Path) -> std::process::Output {
    let _ = std::fs::remove_dir_all(out);
    run(&BIN, &["export", backup.to_str().unwrap(), out.to_str().unwrap(), "--passfile", pass.to_str().unwrap()])
}

fn rsync(from: &Path, to: &Path) -> String {
    let o = run("rsync", &["-a", "--delete", "--stats", "-i", &format!("{}/", from.display()), to.to_str().unwrap()]);
    assert!(o.status.success(), "rsync: {}", text(&o));
    text(&o)
}

fn transferred(stats: &str) -> u64 {
    let line = stats.lines().find(|l| l.starts_with("Number of regular files transferred:")).expect(stats);
    line.rsplit(':').next().unwrap().trim().replace(',', "").parse().unwrap()
}

#[test]
fn a_backup_of_the_view_restores_the_tree_and_rsync_sends_only_changes() {
    if !fuse_available() || !which("rsync") {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "rsync is needed under CI=true");
        return;
    }
    let t = Tmpfs::new("200m");
    let (plain, backup, out) = (t.path.join("plain"), t.path.join("backup"), t.path.join("out"));
    std::fs::create_dir_all(&plain).unwrap();
    make_tree(&plain);
    let mut rm = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    // No attribute cache: the plaintext changes below must show at once.
    rm.extra = vec!["--attr-timeout".into(), "0".into()];
    rm.mount();
    // The config is shown as veilfs.conf; the reverse config itself is not an entry.
    let top: Vec<String> =
        std::fs::read_dir(&rm.mnt).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(top.contains(&"veilfs.conf".into()) && top.contains(&"veilfs.diriv".into()), "{top:?}");
    assert!(!top.iter().any(|n| n.contains("reverse")), "{top:?}");
    assert_eq!(
        std::fs::read(rm.mnt.join("veilfs.conf")).unwrap(),
        std::fs::read(plain.join(".veilfs.reverse.conf")).unwrap()
    );

    let first = rsync(&rm.mnt, &backup);
    assert!(transferred(&first) > 10, "{first}");
    let o = export(&backup, &out, &rm.passfile);
    assert!(o.status.success(), "export of the backup: {}", text(&o));
    assert_restored(&plain, &out);
    let o = run(&BIN, &["fsck", backup.to_str().unwrap(), "--passfile", rm.passfile.to_str().unwrap()]);
    assert!(o.status.success(), "fsck of the backup: {}", text(&o));

    // Byte-identical across an unmount and a remount.
    let view = dump_tree(&rm.mnt);
    rm.umount();
    rm.mount();
    assert!(dump_tree(&rm.mnt) == view, "the view changed across a remount");

    // Change one file, add one, delete one: rsync sends exactly two files.
    std::fs::write(plain.join("deep/a/b/c/d/e/f/g/h/leaf.txt"), b"changed leaf, longer than before\n").unwrap();
    std::fs::write(plain.join("deep/new.txt"), b"new file\n").unwrap();
    std::fs::remove_file(plain.join("empty")).unwrap();
    let second = rsync(&rm.mnt, &backup);
    assert_eq!(transferred(&second), 2, "{second}");
    // rsync sets a directory's time before it creates files in it, so one more pass fixes
    // those times; it must send nothing.
    let third = rsync(&rm.mnt, &backup);
    assert_eq!(transferred(&third), 0, "{third}");
    let o = export(&backup, &out, &rm.passfile);
    assert!(o.status.success(), "export after the incremental rsync: {}", text(&o));
    assert_restored(&plain, &out);

    // A tamper on the backup gets the integrity verdict, as for a forward vault.
    let rel = run(
        &BIN,
        &["encrypt-path", "--reverse", plain.to_str().unwrap(), "big.bin", "--passfile", rm.passfile.to_str().unwrap()],
    );
    assert!(rel.status.success(), "encrypt-path --reverse: {}", text(&rel));
    let rel = String::from_utf8(rel.stdout).unwrap().trim().to_string();
    let back = run(
        &BIN,
        // A ciphertext name may begin with '-' (base64url): after `--` it is never an option.
        &[
            "decrypt-path",
            "--reverse",
            "--passfile",
            rm.passfile.to_str().unwrap(),
            "--",
            plain.to_str().unwrap(),
            &rel,
        ],
    );
    assert_eq!(String::from_utf8_lossy(&back.stdout).trim(), "big.bin", "{}", text(&back));
    // The view shows the plaintext's directory times (the old one of deep/a).
    let dir_view = run(
        &BIN,
        &["encrypt-path", "--reverse", plain.to_str().unwrap(), "deep/a", "--passfile", rm.passfile.to_str().unwrap()],
    );
    let dir_view = rm.mnt.join(String::from_utf8(dir_view.stdout).unwrap().trim());
    let mtime = |p: &Path| std::fs::metadata(p).map(|m| (m.mtime(), m.mtime_nsec())).unwrap();
    assert_eq!(mtime(&dir_view), mtime(&plain.join("deep/a")));
    let victim = backup.join(&rel);
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[5000] ^= 1;
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&victim, &bytes).unwrap();
    let o = export(&backup, &out, &rm.passfile);
    assert_eq!(o.status.code(), Some(6), "export of a tampered backup: {}", text(&o));
    let o = run(&BIN, &["fsck", backup.to_str().unwrap(), "--passfile", rm.passfile.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(6), "fsck of a tampered backup: {}", text(&o));
}

#[test]
fn a_copy_of_plaindir_gives_the_same_view_and_excludes_hide_entries() {
    if !fuse_available() {
        return;
    }
    let t = Tmpfs::new("100m");
    let plain = t.path.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    make_tree(&plain);
    let mut a = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    // `cp -a`: the same paths, contents and config, other inode numbers.
    let copy = t.path.join("copy");
    assert!(run("cp", &["-a", plain.to_str().unwrap(), copy.to_str().unwrap()]).status.success());
    let ino = |p: &Path| std::fs::metadata(p.join("big.bin")).unwrap().ino();
    assert_ne!(ino(&plain), ino(&copy));
    let mut b = ReverseMount::existing(&copy, &t.path.join("mnt2"), &a.passfile);
    a.mount();
    b.mount();
    assert!(dump_tree(&a.mnt) == dump_tree(&b.mnt), "a copy of PLAINDIR shows another view");
    b.umount();

    // Excludes: patterns and a file of patterns, gitignore style, on plaintext paths.
    std::fs::create_dir_all(copy.join("cache/sub")).unwrap();
    std::fs::write(copy.join("cache/sub/x"), b"x").unwrap();
    std::fs::write(copy.join("deep/skip.log"), b"log").unwrap();
    let list = t.path.join("excludes");
    std::fs::write(&list, "# comment\n/big.bin\n").unwrap();
    b.extra = ["--exclude", "*.log", "--exclude", "cache/", "--exclude-from", list.to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    b.mount();
    let backup = t.path.join("backup");
    assert!(run("cp", &["-a", &format!("{}/.", b.mnt.display()), backup.to_str().unwrap()]).status.success());
    let out = t.path.join("out");
    let o = export(&backup, &out, &b.passfile);
    assert!(o.status.success(), "export: {}", text(&o));
    let restored = walk(&out);
    for gone in ["big.bin", "deep/skip.log", "cache"] {
        assert!(!restored.contains(&PathBuf::from(gone)), "{gone} was not excluded: {restored:?}");
    }
    assert!(restored.contains(&PathBuf::from("deep/a/b/c/d/e/f/g/h/leaf.txt")));
    assert!(restored.contains(&PathBuf::from("empty")));
    // With excludes active, a file with more than one link is left out under every name
    // (small.txt is also deep/hardlink): see a_hard_link_to_an_excluded_file_does_not_show_its_content.
    for linked in ["small.txt", "deep/hardlink"] {
        assert!(!restored.contains(&PathBuf::from(linked)), "{linked}, hard-linked, is in the view: {restored:?}");
    }
}

/// The top entries of a view with their contents (directories dumped whole), `veilfs.conf`
/// left out.
fn view_without_config(mnt: &Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(mnt)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name() != "veilfs.conf")
        .map(|e| {
            let ft = e.file_type().unwrap();
            let bytes = if ft.is_dir() {
                dump_tree(&e.path())
            } else if ft.is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                std::fs::read_link(e.path()).map(|t| t.as_os_str().as_bytes().to_vec()).unwrap_or_default()
            };
            (e.file_name(), bytes)
        })
        .collect();
    out.sort();
    out
}

/// `veilfs passwd` and `veilfs info` on a PLAINDIR: found by its reverse config (or named
/// with --reverse). A new password changes only the reverse config and the view's
/// veilfs.conf (at once, in a live mount); every other byte of the view stays; the old
/// password is refused by the reverse vault and by a backup made after the change.
#[test]
fn passwd_and_info_on_a_reverse_vault_keep_the_view_and_refuse_the_old_password() {
    if !fuse_available() || !which("rsync") {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "rsync is needed under CI=true");
        return;
    }
    let t = Tmpfs::new("100m");
    let plain = t.path.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    make_tree(&plain);
    let mut rm = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    let (p, old) = (plain.to_str().unwrap(), rm.passfile.to_str().unwrap().to_string());

    let o = run(&BIN, &["info", p]);
    assert!(o.status.success(), "info of a PLAINDIR: {}", text(&o));
    let info = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(info.contains("reverse") && info.contains("AES-256-GCM-SIV") && info.contains("deterministic"), "{info}");
    let o = run(&BIN, &["info", "--reverse", "--json", p]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("info --json");
    assert_eq!(json["reverse"], true);

    rm.extra = vec!["--attr-timeout".into(), "0".into()];
    rm.mount();
    let before = view_without_config(&rm.mnt);
    let conf_before = std::fs::read(rm.mnt.join("veilfs.conf")).unwrap();

    // Change the password while the view is mounted (auto-detected reverse vault).
    let new = t.path.join("newpass");
    common::write_passfile(&new, "a new password");
    let weak = ["--kdf-memory", "8", "--kdf-iterations", "1"];
    let o =
        run(&BIN, &[&["passwd", p, "--passfile", &old, "--new-passfile", new.to_str().unwrap()][..], &weak].concat());
    assert!(o.status.success(), "passwd of a reverse vault: {}", text(&o));
    assert!(!plain.join("veilfs.lock").exists(), "passwd left a lock file in PLAINDIR");
    let conf_now = std::fs::read(plain.join(".veilfs.reverse.conf")).unwrap();
    assert_ne!(conf_now, conf_before);
    assert_eq!(std::fs::read(rm.mnt.join("veilfs.conf")).unwrap(), conf_now, "the live view shows the new config");
    assert!(view_without_config(&rm.mnt) == before, "passwd changed the view beyond veilfs.conf");

    // The old password is refused; the new one opens the reverse vault.
    let path_with = |pf: &str| run(&BIN, &["encrypt-path", "--reverse", p, "small.txt", "--passfile", pf]);
    assert_eq!(path_with(&old).status.code(), Some(3), "the old password still opens the reverse vault");
    assert!(path_with(new.to_str().unwrap()).status.success());

    // A remount with the new password shows the same view; a backup made now opens with
    // the new password only.
    rm.umount();
    rm.passfile = new.clone();
    rm.mount();
    assert!(view_without_config(&rm.mnt) == before, "the view changed across passwd and a remount");
    let backup = t.path.join("backup");
    rsync(&rm.mnt, &backup);
    let out = t.path.join("out");
    assert_eq!(export(&backup, &out, Path::new(&old)).status.code(), Some(3), "old password opened the backup");
    let o = export(&backup, &out, &new);
    assert!(o.status.success(), "export with the new password: {}", text(&o));
    assert_restored(&plain, &out);

    // --reverse names it explicitly; adding a slot works the same way.
    let o = run(
        &BIN,
        &[&["passwd", "--reverse", p, "--add", "--passfile", new.to_str().unwrap(), "--new-passfile", &old][..], &weak]
            .concat(),
    );
    assert!(o.status.success(), "passwd --reverse --add: {}", text(&o));
    assert!(path_with(&old).status.success(), "the added slot does not open the reverse vault");
}

/// The independent Python reader (tests/vectors/reference_reader.py, written from
/// docs/FORMAT.md alone) decrypts an rsync'd backup of a reverse view — the deterministic
/// profile (§17: GCM-SIV, derived nonces and identities) on a real vault — finds the
/// plaintext tree in it, and detects every tamper class on copies of it.
#[test]
fn reference_reader_decrypts_a_backup_of_a_reverse_view() {
    let py = std::process::Command::new("python3").args(["-c", "import cryptography"]).output();
    if !fuse_available() || !which("rsync") || !py.is_ok_and(|o| o.status.success()) {
        let msg = "needs /dev/fuse, rsync and python3 with cryptography";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}: refusing to skip under CI=true");
        return;
    }
    let t = Tmpfs::new("100m");
    let plain = t.path.join("plain");
    let p = |rel: &str| plain.join(rel);
    std::fs::create_dir_all(p("a/b/c")).unwrap();
    std::fs::write(p("empty"), b"").unwrap();
    std::fs::write(p("one"), vec![1u8; 4096]).unwrap();
    std::fs::write(p("a/b/c/multi"), (0..20_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).unwrap();
    // The largest file at the top: the reader's self-test moves it into a directory.
    let f = std::fs::File::create(p("sparse")).unwrap();
    f.set_len(1 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"data in a hole", 600_000).unwrap();
    drop(f);
    std::fs::write(plain.join(std::ffi::OsStr::from_bytes(&[b'n'; 255])), b"longest name").unwrap();
    std::fs::write(plain.join(std::ffi::OsStr::from_bytes(b"a/latin1-\xe9t\xe9")), b"not utf-8").unwrap();
    std::os::unix::fs::symlink("../one", p("a/link")).unwrap();
    assert!(sh(&format!("mkfifo {}", p("a/b/fifo").display())).status.success());
    // Times in another second than the copy's: rsync 3.5.0 leaves the time of a directory
    // or symlink it created within the same second as its source's (also for plain trees).
    let touch = format!("find {} -exec touch -h -d '2001-02-03 04:05:06.5' {{}} +", plain.display());
    assert!(sh(&touch).status.success());
    let mut rm = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    rm.mount();
    let backup = t.path.join("backup");
    rsync(&rm.mnt, &backup);
    rm.umount();
    // The source as the reader sees it: PLAINDIR without its reverse config.
    let expected = t.path.join("expected");
    assert!(run("cp", &["-a", plain.to_str().unwrap(), expected.to_str().unwrap()]).status.success());
    std::fs::remove_file(expected.join(".veilfs.reverse.conf")).unwrap();
    let reader = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/reference_reader.py");
    let (r, b, pf) = (reader.to_str().unwrap(), backup.to_str().unwrap(), rm.passfile.to_str().unwrap());
    let o = run("python3", &[r, "--vault", b, "--password-file", pf, "--compare", expected.to_str().unwrap()]);
    let out = text(&o);
    assert!(o.status.success() && out.contains(" 0 failed"), "reference reader --compare: {out}");
    assert!(out.contains("compared 11 vault entries") && out.contains("AES-256-GCM-SIV"), "{out}");
    let o = run("python3", &[r, "--vault", b, "--password-file", pf, "--tamper-selftest"]);
    let out = text(&o);
    assert!(o.status.success() && out.contains(" 0 failed"), "reference reader --tamper-selftest: {out}");
}

/// `-o reverse,exclude=…` (fstab and mount(8)'s spelling) mounts the reverse view as
/// `--reverse --exclude` does; exclude without reverse is a usage error.
#[test]
fn dash_o_reverse_and_exclude_mount_the_view() {
    if !fuse_available() {
        return;
    }
    let t = Tmpfs::new("50m");
    let plain = t.path.join("plain");
    std::fs::create_dir_all(plain.join("d")).unwrap();
    std::fs::write(plain.join("d/keep.txt"), b"keep").unwrap();
    std::fs::write(plain.join("d/skip.log"), b"skip").unwrap();
    std::fs::write(plain.join("a,b"), b"comma").unwrap();
    let mut rm = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    let opts = format!(r"reverse,passfile={},exclude=*.log,exclude=a\,b,ro", rm.passfile.display());
    let o = rm.mount_raw(&["-o", &opts]);
    assert!(o.status.success(), "mount -o {opts}: {}", text(&o));
    let backup = t.path.join("backup");
    assert!(run("cp", &["-a", &format!("{}/.", rm.mnt.display()), backup.to_str().unwrap()]).status.success());
    // `veilfs umount` knows a reverse view (type fuse.veilfs-reverse) as a veilfs mount.
    let o = run(&BIN, &["umount", rm.mnt.to_str().unwrap()]);
    assert!(o.status.success(), "veilfs umount of a reverse view: {}", text(&o));
    rm.umount();
    let out = t.path.join("out");
    let o = export(&backup, &out, &rm.passfile);
    assert!(o.status.success(), "export: {}", text(&o));
    assert_eq!(walk(&out), [PathBuf::from("d"), PathBuf::from("d/keep.txt")]);

    let o = rm.mount_raw(&["-o", &format!("passfile={},exclude=*.log", rm.passfile.display())]);
    assert_eq!(o.status.code(), Some(2), "exclude without reverse: {}", text(&o));
    assert!(text(&o).contains("reverse"), "{}", text(&o));
}

/// Exclude patterns follow gitignore: `!` takes a path back, a leading `/` anchors at the
/// top of PLAINDIR, a trailing `/` matches directories only, `**` spans directories, and an
/// excluded directory is absent whole — a `!` for a path inside it brings nothing back (as
/// in git); `dir/*` with `!dir/keep` is the way to keep one entry of a directory.
#[test]
fn exclude_patterns_follow_gitignore_rules() {
    if !fuse_available() {
        return;
    }
    let t = Tmpfs::new("50m");
    let plain = t.path.join("plain");
    let files = [
        "a.log",
        "keep.log",
        "sub/b.log",
        "sub/keep.log",
        "top-only.txt",
        "sub/top-only.txt",
        "build/out.o",
        "sub/build",
        "deep/z",
        "deep/x/z",
        "deep/x/y/z",
        "deep/x/y/other",
        "excluded/keep",
        "excluded/other",
        "partial/keep",
        "partial/other",
    ];
    for f in files {
        let path = plain.join(f);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, f.as_bytes()).unwrap();
    }
    let mut rm = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    let list = t.path.join("patterns");
    std::fs::write(&list, "*.log\n!keep.log\n/top-only.txt\nbuild/\ndeep/**/z\nexcluded/\n!excluded/keep\n").unwrap();
    rm.extra = ["--exclude-from", list.to_str().unwrap(), "--exclude", "partial/*", "--exclude", "!partial/keep"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    rm.mount();
    let backup = t.path.join("backup");
    assert!(run("cp", &["-a", &format!("{}/.", rm.mnt.display()), backup.to_str().unwrap()]).status.success());
    rm.umount();
    let out = t.path.join("out");
    let o = export(&backup, &out, &rm.passfile);
    assert!(o.status.success(), "export: {}", text(&o));
    let shown: Vec<String> =
        walk(&out).into_iter().filter(|p| out.join(p).is_file()).map(|p| p.to_string_lossy().into_owned()).collect();
    assert_eq!(
        shown,
        ["deep/x/y/other", "keep.log", "partial/keep", "sub/build", "sub/keep.log", "sub/top-only.txt"],
        "files in the view"
    );
    assert!(!out.join("excluded").exists() && !out.join("build").exists(), "excluded directories are absent");
}

/// The view path of the plaintext path `rel` (as `veilfs encrypt-path --reverse` gives it).
fn view_path(rm: &ReverseMount, rel: &str) -> PathBuf {
    let o = run(
        &BIN,
        &["encrypt-path", "--reverse", rm.plain.to_str().unwrap(), rel, "--passfile", rm.passfile.to_str().unwrap()],
    );
    assert!(o.status.success(), "encrypt-path --reverse {rel}: {}", text(&o));
    rm.mnt.join(String::from_utf8(o.stdout).unwrap().trim())
}

/// Stops the threads of the FIFO test and wakes whatever still waits on the FIFO (an
/// `O_RDWR` open counts as a writer, so every blocked reader's `open` returns), even when the
/// test fails: a daemon worker stuck in `open` would otherwise keep the unmount waiting.
struct FifoRelease {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    fifo: PathBuf,
}

impl Drop for FifoRelease {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for _ in 0..20 {
            let _ = std::fs::OpenOptions::new().read(true).write(true).open(&self.fifo);
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// A user swaps her file for a FIFO between the view's LOOKUP and OPEN, atomically and in a
/// loop, while readers open and read it. No worker may block opening the FIFO: the view
/// keeps answering, and another file reads within 2 s throughout.
#[test]
fn a_file_swapped_for_a_fifo_between_lookup_and_open_does_not_hang_the_view() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    if !fuse_available() {
        return;
    }
    let t = Tmpfs::new("50m");
    let plain = t.path.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::write(plain.join("f"), vec![5u8; 64 << 10]).unwrap();
    std::fs::write(plain.join("other"), b"another file").unwrap();
    // Second names outside PLAINDIR of the regular file and of the FIFO: each swap links one
    // of them to a temporary name and renames that over `f` (so `f` always exists).
    let (reg, fifo) = (t.path.join("reg"), t.path.join("fifo"));
    std::fs::hard_link(plain.join("f"), &reg).unwrap();
    assert!(sh(&format!("mkfifo {}", fifo.display())).status.success());
    let mut rm = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    rm.extra = ["--attr-timeout", "0", "--threads", "2"].iter().map(|s| s.to_string()).collect();
    rm.mount();
    let (f_view, other_view) = (view_path(&rm, "f"), view_path(&rm, "other"));
    let other_bytes = std::fs::read(&other_view).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let _release = FifoRelease { stop: stop.clone(), fifo: fifo.clone() };

    let swapper = {
        let (stop, f, tmp) = (stop.clone(), plain.join("f"), t.path.join("tmp"));
        let (reg, fifo) = (reg.clone(), fifo.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for src in [&fifo, &reg] {
                    let _ = std::fs::remove_file(&tmp);
                    std::fs::hard_link(src, &tmp).unwrap();
                    std::fs::rename(&tmp, &f).unwrap();
                }
                swaps += 1;
            }
            swaps
        })
    };
    let (opened, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, path, opened, failed) = (stop.clone(), f_view.clone(), opened.clone(), failed.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // O_NONBLOCK: the test's own open never waits on anything but the daemon.
                    let f = std::os::unix::fs::OpenOptionsExt::custom_flags(
                        std::fs::OpenOptions::new().read(true),
                        libc::O_NONBLOCK,
                    )
                    .open(&path);
                    match f.and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut Vec::new())) {
                        Ok(_) => opened.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();

    // For 4 s, every 250 ms: another file of the view reads within 2 s.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        let (tx, rx) = std::sync::mpsc::channel();
        let p = other_view.clone();
        std::thread::spawn(move || {
            let _ = tx.send(std::fs::read(&p).ok());
        });
        let got = rx.recv_timeout(Duration::from_secs(2));
        assert!(
            got.as_ref().is_ok_and(|b| b.as_ref() == Some(&other_bytes)),
            "the view stopped answering after {:?} ({} opens of the swapped file read, {} failed): {got:?}",
            start.elapsed(),
            opened.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Every reader gets its answer: none sits waiting on a worker stuck in the FIFO's open.
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    while readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stuck = readers.iter().filter(|r| !r.is_finished()).count();
    assert_eq!(stuck, 0, "readers of the swapped file still waiting for the view 3 s after the last swap");
    for r in readers {
        r.join().unwrap();
    }
    let (ok, bad) = (opened.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(swaps > 100 && ok + bad > 100, "too little happened: {swaps} swaps, {ok} reads, {bad} failures");
    // Still the same file once the swapping is over.
    std::fs::rename(&reg, plain.join("f")).unwrap();
    assert_eq!(std::fs::read(&f_view).unwrap().len() as u64, std::fs::metadata(&f_view).unwrap().len());
}

/// A user who may not read an excluded file's content in a backup links it under a name no
/// pattern excludes — before the mount or while it runs. The view must not show the
/// content under any name: with excludes active, a non-directory with more than one link is
/// left out of the view.
#[test]
fn a_hard_link_to_an_excluded_file_does_not_show_its_content() {
    if !fuse_available() {
        return;
    }
    let t = Tmpfs::new("50m");
    let plain = t.path.join("plain");
    std::fs::create_dir_all(plain.join("d")).unwrap();
    let secret = b"excluded secret content";
    std::fs::write(plain.join("id.key"), secret).unwrap();
    std::fs::write(plain.join("d/visible.txt"), b"visible").unwrap();
    std::fs::hard_link(plain.join("id.key"), plain.join("innocent.txt")).unwrap();
    let mut rm = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    rm.extra = ["--exclude", "*.key", "--attr-timeout", "0"].iter().map(|s| s.to_string()).collect();
    rm.mount();
    // The view path the link would have: absent.
    let linked = view_path(&rm, "innocent.txt");
    assert!(std::fs::symlink_metadata(&linked).is_err(), "the hard link to an excluded file is in the view");
    // A link made while the view is mounted, after its directory was looked at.
    let later = view_path(&rm, "d/visible.txt");
    assert!(std::fs::read_dir(later.parent().unwrap()).unwrap().count() >= 2);
    std::fs::hard_link(plain.join("id.key"), plain.join("d/later.txt")).unwrap();

    let backup = t.path.join("backup");
    assert!(run("cp", &["-a", &format!("{}/.", rm.mnt.display()), backup.to_str().unwrap()]).status.success());
    let out = t.path.join("out");
    let o = export(&backup, &out, &rm.passfile);
    assert!(o.status.success(), "export: {}", text(&o));
    let restored = walk(&out);
    assert_eq!(restored, [PathBuf::from("d"), PathBuf::from("d/visible.txt")], "restored tree");
    for rel in &restored {
        let p = out.join(rel);
        if p.is_file() {
            assert!(!contains(&std::fs::read(&p).unwrap(), secret), "{} holds the excluded content", rel.display());
        }
    }
}

/// A directory's size and link count in the view must not tell how many excluded entries
/// (files, subdirectories) it holds: removing every excluded entry from the plaintext
/// changes neither, at the top or below, and the link count is 2 plus the visible
/// subdirectories.
#[test]
fn directory_sizes_and_link_counts_do_not_reveal_excluded_entries() {
    if !fuse_available() {
        return;
    }
    let t = Tmpfs::new("50m");
    let plain = t.path.join("plain");
    std::fs::create_dir_all(plain.join("d/sub")).unwrap();
    std::fs::write(plain.join("d/visible.txt"), b"visible").unwrap();
    std::fs::write(plain.join("top.txt"), b"top").unwrap();
    for dir in ["", "d"] {
        for i in 0..40 {
            std::fs::write(plain.join(dir).join(format!("excluded-{i:02}-with-a-long-name.log")), b"x").unwrap();
        }
        std::fs::create_dir_all(plain.join(dir).join("cache/inner")).unwrap();
    }
    let mut rm = ReverseMount::init(&plain, &t.path.join("mnt"), &t.path.join("pass"));
    rm.extra =
        ["--exclude", "*.log", "--exclude", "cache/", "--attr-timeout", "0"].iter().map(|s| s.to_string()).collect();
    rm.mount();
    let d_view = view_path(&rm, "d");
    let seen = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.size(), m.nlink(), m.blocks())
    };
    let (top, d) = (seen(&rm.mnt), seen(&d_view));
    assert_eq!(top.1, 3, "top: 2 + its one visible subdirectory (d)");
    assert_eq!(d.1, 3, "d: 2 + its one visible subdirectory (sub)");
    for dir in ["", "d"] {
        for i in 0..40 {
            std::fs::remove_file(plain.join(dir).join(format!("excluded-{i:02}-with-a-long-name.log"))).unwrap();
        }
        std::fs::remove_dir_all(plain.join(dir).join("cache")).unwrap();
    }
    assert_eq!(seen(&rm.mnt), top, "the top's (size, links, blocks) told of excluded entries");
    assert_eq!(seen(&d_view), d, "d's (size, links, blocks) told of excluded entries");
}
