//! A vault in a folder that Syncthing keeps in sync between two machines, with the real
//! client (tests/common/syncthing.rs): two instances on 127.0.0.1, one vault, A and B.
//!
//! B plays another machine: its veilfs commands run in a UTS namespace of their own under
//! another host name, as a machine whose writers no lock of A's can see: the vault lock
//! (an `flock` on an empty `veilfs.lock` that never changes) must neither block B nor leave
//! conflict copies, with A mounted, crashed, or mounted while the two were apart.
//! What must hold: a vault made on A reads on B exactly as on A; an edit on A reaches a
//! mount on B; after the sync converges `fsck` is clean on both sides however many of
//! Syncthing's own files lie in the folder, and `export` of both sides is the same.
//!
//! The last group shares the vault the other way two machines do: on a network file system,
//! sshfs over loopback (tests/common/sshfs.rs), with a `--shared-storage` mount on the
//! vault's machine and one through sshfs.
//!
//! Also: edits made on both sides while they were apart stay visible on both (conflict
//! copies), and what the other machine delivers shows on a default mount within 5 s. Each
//! test keeps to a time budget (asserted), the file to well under three minutes.

mod common;
use common::sshfs::Sshfs;
use common::syncthing::SyncPair;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// B's host name (A keeps the machine's).
const HOST_B: &str = "veilfs-test-b";
/// How long one sync may take to converge.
const CONVERGE: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Side {
    A,
    B,
}

/// A vault on A, synced to B, and the places each side mounts and exports to.
struct Synced {
    sync: SyncPair,
    pass: PathBuf,
    log: PathBuf,
    root: PathBuf,
    _mounts: Vec<UnmountOnDrop>,
    // Last: the folders go after Syncthing and the mounts are gone.
    _tmpfs: Tmpfs,
}

impl Synced {
    /// A new vault on A (filled through a mount by `fill`), Syncthing started on both sides
    /// and in sync. `None` (a skip) without FUSE, root or Syncthing outside CI.
    fn new(fill: impl FnOnce(&Path)) -> Option<Synced> {
        if !fuse_available() || !root_only("side B runs as another host, in a UTS namespace of its own") {
            return None;
        }
        if !common::syncthing::syncthing_available() {
            return None;
        }
        let tmpfs = Tmpfs::new("512m");
        let root = tmpfs.path.clone();
        let (cipher_a, _, pass) = new_vault(&root.join("a"));
        let log = root.join("veilfs.log");
        let mnt = root.join("fill");
        std::fs::create_dir_all(&mnt).unwrap();
        let o = mount_at(Side::A, &log, &cipher_a, &mnt, &pass, &[]);
        assert!(o.status.success(), "mount on A: {}", text(&o));
        let guard = UnmountOnDrop(mnt.clone());
        fill(&mnt);
        umount(&mnt);
        drop(guard);
        let sync = SyncPair::start(&root, &cipher_a, &root.join("b").join("cipher"))?;
        sync.wait_in_sync(CONVERGE);
        Some(Synced { sync, pass, log, root, _mounts: Vec::new(), _tmpfs: tmpfs })
    }

    fn cipher(&self, side: Side) -> &Path {
        match side {
            Side::A => &self.sync.a.dir,
            Side::B => &self.sync.b.dir,
        }
    }

    /// `veilfs ARGS… CIPHERDIR --passfile PASS` on `side`.
    fn veilfs(&self, side: Side, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        all.extend([self.cipher(side).to_str().unwrap(), "--passfile", self.pass.to_str().unwrap()]);
        veilfs_at(side, &self.log, &all)
    }

    /// Mounts `side`'s vault at a new mount point named `name` with `extra` options; the
    /// output of `veilfs mount` (a failure is the caller's to judge) and the mount point.
    fn try_mount(&mut self, side: Side, name: &str, extra: &[&str]) -> (Output, PathBuf) {
        let mnt = self.root.join(name);
        std::fs::create_dir_all(&mnt).unwrap();
        let o = mount_at(side, &self.log, self.cipher(side), &mnt, &self.pass, extra);
        if o.status.success() {
            self._mounts.push(UnmountOnDrop(mnt.clone()));
        }
        (o, mnt)
    }

    /// Mounts `side`'s vault (it must work); the mount point.
    fn mount(&mut self, side: Side, name: &str, extra: &[&str]) -> PathBuf {
        let (o, mnt) = self.try_mount(side, name, extra);
        assert!(o.status.success(), "mount on {side:?}: {}", text(&o));
        mnt
    }

    /// `fsck` of `side` exits 0; its output.
    fn fsck_clean(&self, side: Side) -> String {
        let o = self.veilfs(side, &["fsck"]);
        assert!(o.status.success(), "fsck on {side:?} after the sync converged: {}", text(&o));
        text(&o)
    }

    /// `side`'s vault exported into a new folder (it must exit 0), dumped.
    fn export(&self, side: Side) -> Vec<u8> {
        let dest = self.root.join(format!("export-{side:?}-{}", rand_suffix()));
        let o = veilfs_at(
            side,
            &self.log,
            &[
                "export",
                self.cipher(side).to_str().unwrap(),
                dest.to_str().unwrap(),
                "--passfile",
                self.pass.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "export on {side:?}: {}", text(&o));
        assert!(!dest.join("lost+found").exists(), "{side:?}: something went to /lost+found");
        dump_tree(&dest)
    }

    /// Both sides exported the same, fsck clean on both; A's export dump.
    fn converged_and_clean(&self) -> Vec<u8> {
        self.fsck_clean(Side::A);
        self.fsck_clean(Side::B);
        let a = self.export(Side::A);
        assert!(a == self.export(Side::B), "the exports of A and B differ after the sync converged");
        a
    }

    /// Ciphertext names on `side` that Syncthing made as conflict copies.
    fn conflict_copies(&self, side: Side) -> Vec<String> {
        let o = run("find", &[self.cipher(side).to_str().unwrap(), "-name", "*sync-conflict*"]);
        String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect()
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// `veilfs ARGS…` as `side`: on B in a UTS namespace under [`HOST_B`] (a mount's daemon
/// stays there), logging to `log`. Each side keeps its client state (what it remembers of the
/// vault, crates/veilfs-core/src/known.rs) beside `log`, as two machines do.
fn veilfs_at(side: Side, log: &Path, args: &[&str]) -> Output {
    let mut cmd = match side {
        Side::A => Command::new(&BIN),
        Side::B => {
            let mut c = Command::new("unshare");
            c.args(["-u", "sh", "-c", r#"hostname "$0" && exec "$@""#, HOST_B, &BIN]);
            c
        }
    };
    let state = log.parent().expect("the log lies in the test's folder").join(format!("state-{side:?}"));
    cmd.args(args).env("VEILFS_LOG_FILE", log).env("VEILFS_STATE_DIR", state).stdin(Stdio::null()).output().unwrap()
}

/// `veilfs mount CIPHER MNT --passfile PASS EXTRA…` as `side`; the output.
fn mount_at(side: Side, log: &Path, cipher: &Path, mnt: &Path, pass: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["mount", cipher.to_str().unwrap(), mnt.to_str().unwrap(), "--passfile", pass.to_str().unwrap()];
    args.extend(extra);
    veilfs_at(side, log, &args)
}

/// Unmounts `mnt` and waits until its daemon is gone (the kernel ends the mount before the
/// daemon has settled and closed everything; that must be in the folder before the next
/// sync counts as converged).
fn umount(mnt: &Path) {
    let pid = daemon_pid(mnt);
    let o = run(&BIN, &["umount", mnt.to_str().unwrap()]);
    assert!(o.status.success(), "umount {}: {}", mnt.display(), text(&o));
    let t = Instant::now();
    while pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists()) {
        assert!(t.elapsed() < Duration::from_secs(10), "the daemon of {} did not end", mnt.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `n` bytes that differ from file to file (`seed`) and do not compress.
fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

/// What a user keeps in a vault: nested and empty directories, files across block
/// boundaries, names long enough for side files, non-ASCII names, symlinks of every kind.
fn fill_tree(m: &Path) {
    use std::fs;
    fs::create_dir_all(m.join("docs/2026/drafts")).unwrap();
    fs::create_dir_all(m.join("empty")).unwrap();
    for (i, n) in [0usize, 1, 4095, 4096, 4097, 70_000, 1_000_000].iter().enumerate() {
        fs::write(m.join(format!("docs/f{n}.bin")), pattern(i as u64, *n)).unwrap();
    }
    fs::write(m.join("docs/2026/drafts/notes.txt"), "synced notes\n").unwrap();
    let long = "n".repeat(240);
    fs::write(m.join(&long), "long name\n").unwrap();
    fs::create_dir_all(m.join(format!("{}/inner", "d".repeat(250)))).unwrap();
    fs::write(m.join(format!("{}/inner/x", "d".repeat(250))), "deep\n").unwrap();
    fs::write(m.join("Grüße ✓ résumé.txt"), "unicode\n").unwrap();
    std::os::unix::fs::symlink("docs/2026/drafts/notes.txt", m.join("to-notes")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", m.join("absolute")).unwrap();
    std::os::unix::fs::symlink("nowhere/at/all", m.join("dangling")).unwrap();
    std::os::unix::fs::symlink(&long, m.join("to-long")).unwrap();
}

fn within(t: Instant, budget: u64, what: &str) {
    let e = t.elapsed();
    assert!(e < Duration::from_secs(budget), "{what} took {e:?}, over its budget of {budget} s");
}

/// A vault made on A reads on B exactly as on A: fsck clean (Syncthing's folder marker
/// named as foreign, exit 0), the same export, and a mount on B shows the same tree.
#[test]
fn a_vault_made_on_a_reads_the_same_on_b() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(fill_tree) else { return };
    let fsck_b = s.fsck_clean(Side::B);
    assert!(fsck_b.contains("foreign") && fsck_b.contains(".stfolder"), "fsck on B does not name the marker: {fsck_b}");
    let a = s.converged_and_clean();
    assert!(contains(&a, &pattern(5, 70_000)) && contains(&a, b"deep\n"), "the export lacks the files written");
    let mnt = s.mount(Side::B, "mnt-b", &[]);
    assert!(dump_tree(&mnt) == a, "B's mount differs from A's export");
    assert_eq!(std::fs::read_link(mnt.join("absolute")).unwrap(), Path::new("/etc/hostname"));
    umount(&mnt);
    within(t, 60, "create on A, read on B");
}

/// What A writes reaches a `--shared-storage` mount open on B, which reads throughout
/// without an integrity error while Syncthing delivers the files.
#[test]
fn an_edit_on_a_reaches_a_shared_storage_mount_on_b() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(|m| {
        std::fs::create_dir_all(m.join("d")).unwrap();
        std::fs::write(m.join("d/report.txt"), "version 1\n").unwrap();
        std::fs::write(m.join("d/old-name.txt"), "renamed on A\n").unwrap();
    }) else {
        return;
    };
    let mnt_b = s.mount(Side::B, "mnt-b", &["--shared-storage"]);
    assert_eq!(std::fs::read_to_string(mnt_b.join("d/report.txt")).unwrap(), "version 1\n");
    // B reads everything over and over while A writes and Syncthing delivers.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, mnt_b) = (stop.clone(), mnt_b.clone());
        std::thread::spawn(move || {
            let (mut passes, mut eio) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(names) = std::fs::read_dir(mnt_b.join("d")) else { continue };
                for e in names.flatten() {
                    let p = e.path();
                    if let Err(err) = std::fs::read(&p) {
                        if err.raw_os_error() == Some(libc::EIO) {
                            eio.push(format!("{}: {err}", p.display()));
                        }
                    }
                }
                passes += 1;
            }
            (passes, eio)
        })
    };
    let mnt_a = s.mount(Side::A, "mnt-a", &[]);
    for i in 0..20 {
        std::fs::write(mnt_a.join("d/report.txt"), format!("version {}\n", i + 2)).unwrap();
        std::fs::write(mnt_a.join(format!("d/new-{i}.bin")), pattern(i, 30_000)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::rename(mnt_a.join("d/old-name.txt"), mnt_a.join("d/new-name.txt")).unwrap();
    umount(&mnt_a);
    s.sync.wait_in_sync(CONVERGE);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (passes, eio) = reader.join().unwrap();
    assert!(eio.is_empty(), "B's mount read EIO while the sync delivered ({passes} passes): {eio:?}");
    assert!(passes > 0);
    assert_eq!(std::fs::read_to_string(mnt_b.join("d/report.txt")).unwrap(), "version 21\n");
    assert_eq!(std::fs::read(mnt_b.join("d/new-19.bin")).unwrap(), pattern(19, 30_000));
    assert_eq!(std::fs::read_to_string(mnt_b.join("d/new-name.txt")).unwrap(), "renamed on A\n");
    assert!(!mnt_b.join("d/old-name.txt").exists(), "the old name is still there on B");
    let a = s.converged_and_clean();
    assert!(dump_tree(&mnt_b) == a, "B's mount differs from A's export");
    umount(&mnt_b);
    within(t, 60, "edit on A, read on B");
}

/// A mount on B that only reads writes nothing into the synced folder, also while
/// Syncthing is still delivering A's new directories (their IV files among them): every file
/// of the folder is, for Syncthing, as A made it.
#[test]
fn a_mount_that_only_reads_writes_nothing_into_the_synced_folder() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(|m| std::fs::write(m.join("first.txt"), "first\n").unwrap()) else { return };
    let mnt_b = s.mount(Side::B, "mnt-b", &["--shared-storage"]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, mnt_b) = (stop.clone(), mnt_b.clone());
        std::thread::spawn(move || {
            let mut passes = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = run("find", &[mnt_b.to_str().unwrap(), "-type", "f", "-exec", "cat", "{}", "+"]);
                passes += 1;
            }
            passes
        })
    };
    let mnt_a = s.mount(Side::A, "mnt-a", &[]);
    for i in 0..15 {
        std::fs::create_dir_all(mnt_a.join(format!("d{i}/sub"))).unwrap();
        std::fs::write(mnt_a.join(format!("d{i}/sub/f")), pattern(i, 5000)).unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
    umount(&mnt_a);
    s.sync.wait_in_sync(CONVERGE);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    umount(&mnt_b);
    s.sync.wait_in_sync(CONVERGE);
    let listing = Command::new("find")
        .args([".", "-path", "./.stfolder", "-prune", "-o", "-type", "f", "-printf", "%P\\n"])
        .current_dir(s.cipher(Side::B))
        .output()
        .unwrap();
    // Syncthing's own temporary files are in no index.
    let files: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter(|f| !f.rsplit('/').next().unwrap().starts_with(".syncthing."))
        .map(String::from)
        .collect();
    assert!(files.len() > 30, "{files:?}");
    let by_b: Vec<&String> = files.iter().filter(|f| s.sync.b.modified_by(f) != s.sync.a.short_id()).collect();
    assert!(by_b.is_empty(), "B, only reading, changed {} of {} files: {by_b:?}", by_b.len(), files.len());
    s.converged_and_clean();
    within(t, 60, "a mount that only reads");
}

/// Files Syncthing leaves behind are not damage: a transfer cut off (B receives slowly,
/// the connection drops mid-file, A deletes the file meanwhile) leaves B a
/// `.syncthing.*.tmp` with part of the ciphertext, kept for a day. After the sync
/// converges fsck is clean on both sides, names it as foreign, `--repair` leaves it where it
/// is, and both exports are the same.
#[test]
fn fsck_is_clean_after_convergence_with_syncthing_temporaries_left() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(|m| std::fs::write(m.join("keep.txt"), "kept\n").unwrap()) else { return };
    // B receives at 100 KiB/s (a LAN connection is limited only when told so).
    s.sync.b.patch("/rest/config/options", &serde_json::json!({"maxRecvKbps": 100, "limitBandwidthInLan": true}));
    let mnt_a = s.mount(Side::A, "mnt-a", &[]);
    std::fs::create_dir_all(mnt_a.join("big")).unwrap();
    std::fs::write(mnt_a.join("big/video.bin"), pattern(7, 4 << 20)).unwrap();
    umount(&mnt_a);
    s.sync.a.scan();
    // Wait for B's temporary file of it, with data in it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let tmp = loop {
        let o = run("find", &[s.cipher(Side::B).to_str().unwrap(), "-name", ".syncthing.*.tmp", "-size", "+16k"]);
        if let Some(l) = String::from_utf8_lossy(&o.stdout).lines().next() {
            break PathBuf::from(l);
        }
        assert!(Instant::now() < deadline, "B never began receiving the big file\nB:\n{}", s.sync.b.log_tail());
        std::thread::sleep(Duration::from_millis(100));
    };
    s.sync.pause();
    let mnt_a = s.mount(Side::A, "mnt-a", &[]);
    std::fs::remove_file(mnt_a.join("big/video.bin")).unwrap();
    umount(&mnt_a);
    s.sync.b.patch("/rest/config/options", &serde_json::json!({"maxRecvKbps": 0, "limitBandwidthInLan": false}));
    s.sync.resume();
    s.sync.wait_in_sync(CONVERGE);
    assert!(tmp.exists(), "Syncthing removed its temporary file: the test needs another way to leave one");
    let fsck_b = s.fsck_clean(Side::B);
    assert!(
        fsck_b.contains("foreign") && fsck_b.contains(".syncthing."),
        "fsck on B does not name the temporary file: {fsck_b}"
    );
    let a = s.converged_and_clean();
    assert!(contains(&a, b"kept\n") && !contains(&a, b"video.bin"));
    let o = s.veilfs(Side::B, &["fsck", "--repair"]);
    assert!(o.status.success(), "fsck --repair on B: {}", text(&o));
    assert!(tmp.exists(), "fsck --repair moved Syncthing's temporary file");
    assert!(!s.cipher(Side::B).join("lost+found").exists() && s.export(Side::B) == a);
    within(t, 90, "temporaries left by Syncthing");
}

/// The same file edited on both machines while they are apart, and another renamed to
/// different names on each: once they sync again both versions are visible on both sides,
/// the losing one under a conflict name `notes (…).txt`.
#[test]
fn edits_on_both_sides_while_apart_both_stay_visible() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(|m| {
        std::fs::write(m.join("notes.txt"), "base\n").unwrap();
        std::fs::write(m.join("r.txt"), "renamed twice\n").unwrap();
    }) else {
        return;
    };
    s.sync.pause();
    for (side, name) in [(Side::A, "mnt-a"), (Side::B, "mnt-b")] {
        let m = s.mount(side, name, &[]);
        std::fs::write(m.join("notes.txt"), format!("edited on {side:?}\n")).unwrap();
        std::fs::rename(m.join("r.txt"), m.join(format!("r-{side:?}.txt"))).unwrap();
        umount(&m);
        // Apart by some seconds, so the two versions' times differ as on two machines.
        std::thread::sleep(Duration::from_millis(1100));
    }
    s.sync.resume();
    s.sync.wait_in_sync(CONVERGE);
    let a = s.converged_and_clean();
    assert!(contains(&a, b"edited on A\n") && contains(&a, b"edited on B\n"), "a version was lost");
    for side in [Side::A, Side::B] {
        let m = s.mount(side, &format!("check-{side:?}"), &[]);
        let names: Vec<String> =
            std::fs::read_dir(&m).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(
            names.iter().any(|n| n.starts_with("notes (") && n.ends_with(").txt")),
            "{side:?}: no conflict name in {names:?}"
        );
        assert!(names.contains(&"r-A.txt".into()) && names.contains(&"r-B.txt".into()), "{side:?}: {names:?}");
        assert!(dump_tree(&m) == a);
        umount(&m);
    }
    within(t, 90, "concurrent edits");
}

/// A default (caching) mount on B sees what A creates and deletes within 5 s of the files'
/// arrival, also a name B looked up before it existed.
#[test]
fn a_remote_create_and_delete_show_on_a_default_mount_within_5_s() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(|m| {
        std::fs::create_dir_all(m.join("d")).unwrap();
        std::fs::write(m.join("d/old.txt"), "old\n").unwrap();
    }) else {
        return;
    };
    let mnt_b = s.mount(Side::B, "mnt-b", &[]);
    assert!(mnt_b.join("d/old.txt").exists() && !mnt_b.join("d/new.txt").exists());
    let _ = std::fs::read_dir(mnt_b.join("d")).unwrap().count();
    // A writes beside B's lock: a --shared-storage mount takes no lock file.
    let mnt_a = s.mount(Side::A, "mnt-a", &["--shared-storage"]);
    std::fs::write(mnt_a.join("d/new.txt"), "fresh\n").unwrap();
    std::fs::remove_file(mnt_a.join("d/old.txt")).unwrap();
    umount(&mnt_a);
    s.sync.wait_in_sync(CONVERGE);
    let arrived = Instant::now();
    while std::fs::read_to_string(mnt_b.join("d/new.txt")).ok().as_deref() != Some("fresh\n")
        || mnt_b.join("d/old.txt").exists()
    {
        assert!(
            arrived.elapsed() < Duration::from_secs(5),
            "B's default mount does not show A's create and delete 5 s after they arrived"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    umount(&mnt_b);
    s.converged_and_clean();
    within(t, 60, "remote create on a default mount");
}

/// Attacks through the synced folder: whoever can write A's folder (a sync peer, the storage)
/// puts back older ciphertext of a file that B has seen in its newer version; Syncthing
/// delivers it to B. A block of the file put back to its older copy, and the older header
/// with the newer body, are errors for every reader (the block map); the whole file put back is an error for B, which remembers the
/// newer generation — its mount gives EIO and logs one line naming the ciphertext file, and
/// `veilfs cat` on B exits 6. A's own legitimate edit, delivered the same way, is read on B
/// without an alarm.
#[test]
fn older_ciphertext_put_back_in_the_synced_folder_is_an_error_on_the_machine_that_saw_the_newer() {
    let t = Instant::now();
    let v1 = pattern(7, 3 * 4096 + 100);
    let Some(mut s) = Synced::new(|m| std::fs::write(m.join("doc.bin"), pattern(7, 3 * 4096 + 100)).unwrap()) else {
        return;
    };
    let o = veilfs_at(
        Side::A,
        &s.log,
        &["encrypt-path", s.cipher(Side::A).to_str().unwrap(), "doc.bin", "--passfile", s.pass.to_str().unwrap()],
    );
    assert!(o.status.success(), "encrypt-path: {}", text(&o));
    let rel = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let (backing_a, backing_b) = (s.cipher(Side::A).join(&rel), s.cipher(Side::B).join(&rel));
    let old = std::fs::read(&backing_a).unwrap();
    let mnt_b = s.mount(Side::B, "mnt-b", &[]);
    assert!(std::fs::read(mnt_b.join("doc.bin")).unwrap() == v1);
    // A's legitimate edit (a new write session, generation 2) reaches B and reads there.
    let mnt_a = s.mount(Side::A, "mnt-a", &["--shared-storage"]);
    let mut v2 = v1.clone();
    v2[5000..5010].copy_from_slice(b"version 2!");
    std::fs::write(mnt_a.join("doc.bin"), &v2).unwrap();
    umount(&mnt_a);
    s.sync.wait_in_sync(CONVERGE);
    let new = std::fs::read(&backing_a).unwrap();
    let read_b = |what: &str| {
        let t = Instant::now();
        loop {
            match std::fs::read(mnt_b.join("doc.bin")) {
                Ok(d) if d == v2 && what == "v2" => return Ok(()),
                Err(e) if what == "EIO" && e.raw_os_error() == Some(libc::EIO) => return Ok(()),
                other if t.elapsed() > Duration::from_secs(5) => {
                    return Err(format!("B's mount, waiting for {what}: {:?}", other.map(|d| d.len())))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    };
    read_b("v2").unwrap();
    // One block put back to its older copy (same size), delivered to B.
    let ml = veilfs_core::content::blockmap::MapLayout::new(4096, 28);
    let b1 = ml.block_offset(1) as usize..ml.block_offset(1) as usize + 4096 + 28;
    let mut mixed = new.clone();
    mixed[b1.clone()].copy_from_slice(&old[b1]);
    std::fs::write(&backing_a, &mixed).unwrap();
    s.sync.a.scan();
    s.sync.wait_in_sync(CONVERGE);
    assert!(std::fs::read(&backing_b).unwrap() == mixed, "Syncthing delivered the tampered file to B");
    read_b("EIO").unwrap();
    // The older header with the newer body, delivered to B.
    let hl = veilfs_core::content::blockmap::HEADER_V2_LEN;
    let mixed = [&old[..hl], &new[hl..]].concat();
    std::fs::write(&backing_a, &mixed).unwrap();
    s.sync.a.scan();
    s.sync.wait_in_sync(CONVERGE);
    assert!(std::fs::read(&backing_b).unwrap() == mixed, "Syncthing delivered the mixed file to B");
    read_b("EIO").unwrap();
    // The whole file put back to version 1: valid ciphertext of it, older than what B saw.
    std::fs::write(&backing_a, &old).unwrap();
    s.sync.a.scan();
    s.sync.wait_in_sync(CONVERGE);
    assert!(std::fs::read(&backing_b).unwrap() == old, "Syncthing delivered the old file to B");
    read_b("EIO").unwrap();
    umount(&mnt_b);
    let log = std::fs::read_to_string(&s.log).unwrap();
    let name = Path::new(&rel).file_name().unwrap().to_str().unwrap();
    assert!(
        log.lines().any(|l| l.contains("rolled back: generation") && l.contains(name)),
        "B's mount logged the rollback naming {name}: {log}"
    );
    let cat = |side: Side| {
        veilfs_at(
            side,
            &s.log,
            &["cat", &format!("{}/doc.bin", s.cipher(side).display()), "--passfile", s.pass.to_str().unwrap()],
        )
    };
    let o = cat(Side::B);
    assert_eq!(o.status.code(), Some(6), "cat on B: {}", text(&o));
    assert!(text(&o).contains("rolled back"), "{}", text(&o));
    // A saw version 2 as well (it wrote it): the same verdict there.
    assert_eq!(cat(Side::A).status.code(), Some(6));
    within(t, 90, "older ciphertext put back through the sync");
}

/// Deletions through the synced folder. A's client deletes a file and a subtree: B, which
/// saw them, finds A's tombstones and raises no alarm. Then whoever can write A's folder but
/// is no client deletes a file and a subtree B saw, and puts back the ciphertext of the file
/// A deleted: once Syncthing delivers it, `fsck` on B reports the deletions on their parent
/// directories and the resurrected entry (exit 6), `cat` of it exits 6, and B's mount gives
/// EIO for it with one log line naming the ciphertext file.
#[test]
fn deletions_and_a_resurrected_entry_through_the_synced_folder_are_told_apart_on_the_other_machine() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(|m| {
        for d in ["d/sub", "d/legit", "e"] {
            std::fs::create_dir_all(m.join(d)).unwrap();
        }
        for f in ["d/keep.txt", "d/gone.txt", "d/sub/x.txt", "d/legit/y.txt", "e/victim.txt", "e/stays.txt"] {
            std::fs::write(m.join(f), f).unwrap();
        }
    }) else {
        return;
    };
    let path_of = |s: &Synced, p: &str| {
        let o = veilfs_at(
            Side::A,
            &s.log,
            &["encrypt-path", s.cipher(Side::A).to_str().unwrap(), p, "--passfile", s.pass.to_str().unwrap()],
        );
        assert!(o.status.success(), "encrypt-path {p}: {}", text(&o));
        s.cipher(Side::A).join(String::from_utf8_lossy(&o.stdout).trim())
    };
    let (gone, victim, sub) = (path_of(&s, "d/gone.txt"), path_of(&s, "e/victim.txt"), path_of(&s, "d/sub"));
    let saved_gone = std::fs::read(&gone).unwrap();
    // B lists every directory: it remembers their entries from now on.
    s.fsck_clean(Side::B);
    // A's client deletes a file and a subtree; B sees a client's deletions.
    let mnt_a = s.mount(Side::A, "mnt-a", &["--shared-storage"]);
    std::fs::remove_file(mnt_a.join("d/gone.txt")).unwrap();
    std::fs::remove_dir_all(mnt_a.join("d/legit")).unwrap();
    umount(&mnt_a);
    s.sync.wait_in_sync(CONVERGE);
    s.converged_and_clean();
    // The storage deletes a file and a subtree, and puts back the file A deleted.
    std::fs::remove_file(&victim).unwrap();
    std::fs::remove_dir_all(&sub).unwrap();
    std::fs::write(&gone, &saved_gone).unwrap();
    s.sync.a.scan();
    s.sync.wait_in_sync(CONVERGE);
    assert!(s.cipher(Side::B).join(gone.strip_prefix(s.cipher(Side::A)).unwrap()).exists(), "not delivered to B");
    let o = s.veilfs(Side::B, &["fsck"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(6), "fsck on B: {out}");
    assert_eq!(out.matches("deleted by a non-client").count(), 2, "one finding per directory: {out}");
    assert!(out.contains("resurrected") && out.contains("d/gone.txt"), "{out}");
    let cat = veilfs_at(
        Side::B,
        &s.log,
        &["cat", &format!("{}/d/gone.txt", s.cipher(Side::B).display()), "--passfile", s.pass.to_str().unwrap()],
    );
    assert_eq!(cat.status.code(), Some(6), "cat on B: {}", text(&cat));
    let mnt_b = s.mount(Side::B, "mnt-b", &[]);
    assert_eq!(std::fs::read(mnt_b.join("d/gone.txt")).map_err(|e| e.raw_os_error()).err(), Some(Some(libc::EIO)));
    assert_eq!(std::fs::read(mnt_b.join("d/keep.txt")).unwrap(), b"d/keep.txt");
    umount(&mnt_b);
    let log = std::fs::read_to_string(&s.log).unwrap();
    let name = gone.file_name().unwrap().to_str().unwrap();
    assert!(
        log.lines().any(|l| l.contains("resurrected") && l.contains(name)),
        "B's mount logged the resurrected entry naming {name}: {log}"
    );
    // The user decides: `fsck --accept` on B adopts the vault as it is.
    let o = s.veilfs(Side::B, &["fsck", "--accept"]);
    assert!(o.status.success(), "fsck --accept on B: {}", text(&o));
    s.fsck_clean(Side::B);
    within(t, 90, "deletions through the sync");
}

/// Attack through the synced folder: the config put back to an older copy (before a password
/// was added on A) after B unlocked the newer one. Syncthing delivers it; B refuses to unlock
/// (exit 6, naming the config as rolled back), and A, which wrote the newer one, as well. A
/// fresh machine, which never saw the newer config, opens it (it trusts on first use).
#[test]
fn an_older_config_put_back_in_the_synced_folder_is_refused_on_the_machine_that_saw_the_newer() {
    let t = Instant::now();
    let Some(s) = Synced::new(|m| std::fs::write(m.join("f"), "f").unwrap()) else { return };
    let conf_a = s.cipher(Side::A).join("veilfs.conf");
    let old = std::fs::read(&conf_a).unwrap();
    let second = s.root.join("second-pass");
    std::fs::write(&second, "second password\n").unwrap();
    let o = s.veilfs(
        Side::A,
        &["passwd", "--add", "--new-passfile", second.to_str().unwrap(), "--kdf-memory", "8", "--kdf-iterations", "1"],
    );
    assert!(o.status.success(), "passwd --add on A: {}", text(&o));
    s.sync.wait_in_sync(CONVERGE);
    let o = s.veilfs(Side::B, &["ls"]);
    assert!(o.status.success(), "B unlocks the newer config: {}", text(&o));
    std::fs::write(&conf_a, &old).unwrap();
    s.sync.a.scan();
    s.sync.wait_in_sync(CONVERGE);
    assert!(std::fs::read(s.cipher(Side::B).join("veilfs.conf")).unwrap() == old, "Syncthing delivered the old config");
    for side in [Side::B, Side::A] {
        let o = s.veilfs(side, &["ls"]);
        assert_eq!(o.status.code(), Some(6), "{side:?}: {}", text(&o));
        assert!(text(&o).contains("config rolled back"), "{side:?}: {}", text(&o));
    }
    let fresh = s.root.join("fresh-state");
    let o = Command::new(&BIN)
        .args(["ls", s.cipher(Side::B).to_str().unwrap(), "--passfile", s.pass.to_str().unwrap()])
        .env("VEILFS_STATE_DIR", &fresh)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "a machine that never saw the newer config: {}", text(&o));
    within(t, 60, "older config through the sync");
}

/// Two machines that mount the synced vault at the same time both work: while apart (and
/// still mounted when they meet again), and while connected, where A's lock file reaches
/// B. They converge with no conflict copy of the lock and fsck clean.
#[test]
fn two_machines_mounted_at_once_both_work_and_converge() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(|m| std::fs::write(m.join("shared.txt"), "shared\n").unwrap()) else { return };
    // Apart: both mount, then they meet while both are mounted.
    s.sync.pause();
    let mnt_a = s.mount(Side::A, "mnt-a", &[]);
    let mnt_b = s.mount(Side::B, "mnt-b", &[]);
    s.sync.resume();
    s.sync.wait_in_sync(CONVERGE);
    std::fs::write(mnt_a.join("from-a.txt"), "A\n").unwrap();
    std::fs::write(mnt_b.join("from-b.txt"), "B\n").unwrap();
    umount(&mnt_a);
    umount(&mnt_b);
    s.sync.wait_in_sync(CONVERGE);
    for side in [Side::A, Side::B] {
        assert!(s.conflict_copies(side).is_empty(), "{side:?}: {:?}", s.conflict_copies(side));
    }
    let a = s.converged_and_clean();
    assert!(contains(&a, b"A\n") && contains(&a, b"B\n"));
    // Connected: A mounts first, its lock file reaches B, B mounts.
    let mnt_a = s.mount(Side::A, "mnt-a2", &[]);
    s.sync.wait_in_sync(CONVERGE);
    let mnt_b = s.mount(Side::B, "mnt-b2", &[]);
    std::fs::write(mnt_b.join("while-a-mounted.txt"), "B again\n").unwrap();
    umount(&mnt_b);
    umount(&mnt_a);
    s.sync.wait_in_sync(CONVERGE);
    for side in [Side::A, Side::B] {
        assert!(s.conflict_copies(side).is_empty(), "{side:?}: {:?}", s.conflict_copies(side));
    }
    assert!(contains(&s.converged_and_clean(), b"B again\n"));
    within(t, 90, "two machines mounted at once");
}

/// A machine that crashes while mounted (its daemon killed, its lock file already synced)
/// blocks nothing on the other: B mounts and writes, and A mounts again afterwards.
#[test]
fn a_crashed_machines_synced_lock_blocks_nothing() {
    let t = Instant::now();
    let Some(mut s) = Synced::new(|m| std::fs::write(m.join("before.txt"), "before\n").unwrap()) else { return };
    let mnt_a = s.mount(Side::A, "mnt-a", &[]);
    std::fs::write(mnt_a.join("from-a.txt"), "written before the crash\n").unwrap();
    s.sync.wait_in_sync(CONVERGE);
    assert!(s.cipher(Side::B).join("veilfs.lock").exists(), "A's lock file did not reach B");
    // A crashes: its daemon dies at once, the kernel's mount goes with it.
    let pid = daemon_pid(&mnt_a).expect("A's daemon");
    run("kill", &["-KILL", &pid.to_string()]);
    lazy_unmount(&mnt_a);
    s.sync.wait_in_sync(CONVERGE);
    let (o, mnt_b) = s.try_mount(Side::B, "mnt-b", &[]);
    assert!(o.status.success(), "B's mount refused after A crashed: {}", text(&o));
    assert_eq!(std::fs::read_to_string(mnt_b.join("from-a.txt")).unwrap(), "written before the crash\n");
    std::fs::write(mnt_b.join("from-b.txt"), "after the crash\n").unwrap();
    umount(&mnt_b);
    s.sync.wait_in_sync(CONVERGE);
    let mnt_a = s.mount(Side::A, "mnt-a2", &[]);
    assert_eq!(std::fs::read_to_string(mnt_a.join("from-b.txt")).unwrap(), "after the crash\n");
    umount(&mnt_a);
    s.sync.wait_in_sync(CONVERGE);
    for side in [Side::A, Side::B] {
        assert!(s.conflict_copies(side).is_empty(), "{side:?}: {:?}", s.conflict_copies(side));
    }
    s.converged_and_clean();
    within(t, 90, "crash of one side");
}

/// The vault's machine (A) and another reaching it through sshfs (B): a `--shared-storage`
/// mount on each, which is how two machines share a vault on a network file system.
struct OverSshfs {
    a: PathBuf,
    b: PathBuf,
    pass: PathBuf,
    log: PathBuf,
    cipher: PathBuf,
    // Drop order: the veilfs mounts, then sshfs, then the folders.
    _mounts: Vec<UnmountOnDrop>,
    net: Sshfs,
    _tmpfs: Tmpfs,
}

impl OverSshfs {
    fn new() -> Option<OverSshfs> {
        if !fuse_available() || !root_only("side B runs as another host, in a UTS namespace of its own") {
            return None;
        }
        let tmpfs = Tmpfs::new("256m");
        let root = tmpfs.path.clone();
        let (cipher, _, pass) = new_vault(&root.join("a"));
        // Without sshfs's own cache of listings and attributes (20 s by default), what B
        // sees of A's writes is up to veilfs alone.
        let net = Sshfs::mount(&cipher, &root.join("net"), &["dir_cache=no"])?;
        let log = root.join("veilfs.log");
        let (a, b) = (root.join("mnt-a"), root.join("mnt-b"));
        let mut mounts = Vec::new();
        for (side, c, m) in [(Side::A, &cipher, &a), (Side::B, &net.mnt, &b)] {
            std::fs::create_dir_all(m).unwrap();
            let o = mount_at(side, &log, c, m, &pass, &["--shared-storage"]);
            assert!(o.status.success(), "--shared-storage mount on {side:?}: {}", text(&o));
            mounts.push(UnmountOnDrop(m.clone()));
        }
        Some(OverSshfs { a, b, pass, log, cipher, _mounts: mounts, net, _tmpfs: tmpfs })
    }

    /// Unmounts both, then waits (up to 5 s) for sshfs to remove its `.fuse_hidden*` files:
    /// a file deleted through sshfs while still open (FUSE sends the close of a file
    /// after `close(2)` has returned, so B's daemon may hold one a moment longer) is renamed
    /// to one, and removed when its last handle goes.
    fn unmount(&self) {
        umount(&self.a);
        umount(&self.b);
        self.no_hidden_within_5s("after both mounts ended");
    }

    /// The `.fuse_hidden*` files sshfs keeps in the vault's top directory.
    fn hidden(&self) -> Vec<String> {
        std::fs::read_dir(&self.cipher)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".fuse_hidden"))
            .collect()
    }

    /// Waits (up to 5 s) until sshfs has removed its `.fuse_hidden*` files.
    fn no_hidden_within_5s(&self, when: &str) {
        let t = Instant::now();
        while !self.hidden().is_empty() {
            assert!(t.elapsed() < Duration::from_secs(5), "sshfs left {:?} {when}", self.hidden());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `fsck` clean and `export` of the vault through `side`'s path to it (B's: sshfs); the
    /// export.
    fn checked_through(&self, side: Side) -> Vec<u8> {
        let c = if side == Side::A { &self.cipher } else { &self.net.mnt };
        let p = self.pass.to_str().unwrap();
        let o = veilfs_at(side, &self.log, &["fsck", c.to_str().unwrap(), "--passfile", p]);
        assert!(o.status.success(), "fsck on {side:?}: {}", text(&o));
        let dest = self.cipher.with_file_name(format!("export-{side:?}"));
        let o = veilfs_at(side, &self.log, &["export", c.to_str().unwrap(), dest.to_str().unwrap(), "--passfile", p]);
        assert!(o.status.success(), "export on {side:?}: {}", text(&o));
        dump_tree(&dest)
    }
}

/// Files written at `w` — new, across blocks, overwritten, appended to, symlinks — read
/// back exactly at `r` at once (names end in `-{i}`).
fn written_here_read_there(w: &Path, r: &Path, i: u64) {
    use std::io::Write;
    let big = pattern(100 + i, 1_000_000);
    let f = |name: &str| format!("{name}-{i}");
    std::fs::write(w.join(f("big")), &big).unwrap();
    std::fs::write(w.join(f("small")), "first\n").unwrap();
    std::fs::write(w.join(f("small")), "second, longer\n").unwrap();
    std::fs::OpenOptions::new().append(true).open(w.join(f("small"))).unwrap().write_all(b"appended\n").unwrap();
    std::os::unix::fs::symlink(f("big"), w.join(f("link"))).unwrap();
    let read = std::fs::read(r.join(f("big")));
    assert!(read.as_ref().is_ok_and(|b| *b == big), "{} on the other side: {:?}", f("big"), read.map(|b| b.len()));
    assert_eq!(std::fs::read_to_string(r.join(f("small"))).unwrap(), "second, longer\nappended\n");
    assert_eq!(std::fs::read_link(r.join(f("link"))).unwrap(), Path::new(&f("big")));
}

/// What B writes through sshfs A reads at once, and B reads it back; fsck clean and the
/// export the same as the mounts on the vault's machine.
#[test]
fn a_shared_storage_mount_through_sshfs_writes_what_the_vaults_machine_reads() {
    let t = Instant::now();
    let Some(v) = OverSshfs::new() else { return };
    written_here_read_there(&v.b, &v.a, 0);
    written_here_read_there(&v.b, &v.b, 1);
    let a = dump_tree(&v.a);
    assert!(dump_tree(&v.b) == a, "the two mounts show different trees");
    v.unmount();
    assert!(v.checked_through(Side::A) == a, "the export differs from what the mounts showed");
    within(t, 60, "sshfs");
}

/// `fsck` and `export` through sshfs, which has no extended attributes, agree with the
/// vault's machine.
#[test]
fn fsck_and_export_through_sshfs_agree_with_the_vaults_machine() {
    let t = Instant::now();
    let Some(v) = OverSshfs::new() else { return };
    written_here_read_there(&v.b, &v.b, 0);
    v.unmount();
    assert!(v.checked_through(Side::B) == v.checked_through(Side::A), "the exports through sshfs and on A differ");
    within(t, 60, "fsck through sshfs");
}

/// Files written and deleted at once through sshfs leave nothing behind.
///
/// What can break it is sshfs's own: the mount closes the backing file at RELEASE, but the
/// kernel hands that close to sshfs later, and an UNLINK that overtakes it makes sshfs
/// (libfuse 3.14) rename the file to `.fuse_hidden*` and, as seen with B's daemon holding no
/// fd on the sshfs mount, sometimes never remove it. fsck and export call such a leftover a
/// FUSE file system's file (foreign), not damage.
#[test]
fn files_deleted_at_once_through_sshfs_leave_nothing_behind() {
    let t = Instant::now();
    let Some(v) = OverSshfs::new() else { return };
    for i in 0..20 {
        let p = v.b.join(format!("short-lived-{i}"));
        std::fs::write(&p, "deleted soon\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"deleted soon\n");
        std::fs::remove_file(&p).unwrap();
    }
    v.unmount();
    assert!(!contains(&v.checked_through(Side::A), b"short-lived"));
    within(t, 60, "deletes through sshfs");
}

/// A file deleted through sshfs while it is still open: sshfs keeps its ciphertext as a
/// `.fuse_hidden*` file, which `fsck` meanwhile calls a FUSE file system's own file (exit 0,
/// not damage); the mount closes its backing file at the last close, so sshfs removes that
/// file then, while both mounts stay.
#[test]
fn a_file_deleted_while_open_through_sshfs_is_gone_at_its_last_close() {
    use std::io::{Read, Seek, Write};
    let t = Instant::now();
    let Some(v) = OverSshfs::new() else { return };
    let p = v.b.join("open-while-deleted");
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    f.write_all(b"written before the delete\n").unwrap();
    std::fs::remove_file(&p).unwrap();
    f.write_all(b"and after\n").unwrap();
    let mut back = String::new();
    f.rewind().unwrap();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "written before the delete\nand after\n");
    assert!(!v.hidden().is_empty(), "sshfs kept no .fuse_hidden* file for a deleted open file");
    let pass = v.pass.to_str().unwrap();
    let o = veilfs_at(Side::A, &v.log, &["fsck", v.cipher.to_str().unwrap(), "--passfile", pass]);
    assert!(o.status.success() && text(&o).contains("fuse_hidden"), "fsck beside a .fuse_hidden* file: {}", text(&o));
    drop(f);
    v.no_hidden_within_5s("after the last close of the deleted file, both mounts still there");
    v.unmount();
    assert!(!contains(&v.checked_through(Side::A), b"open-while-deleted"));
    within(t, 60, "a file deleted while open through sshfs");
}

/// What A writes on the vault's machine a `--shared-storage` mount through sshfs reads at
/// once, also in the second in which B last looked at the directory.
#[test]
fn the_vaults_machine_writes_what_a_shared_storage_mount_through_sshfs_reads() {
    let t = Instant::now();
    let Some(v) = OverSshfs::new() else { return };
    for i in 0..5 {
        // Early in a second, so B's look and A's write fall into the same one.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        std::thread::sleep(Duration::from_nanos(1_000_000_000 - u64::from(now.subsec_nanos())));
        assert!(!v.b.join(format!("big-{i}")).exists());
        written_here_read_there(&v.a, &v.b, i);
    }
    let a = dump_tree(&v.a);
    assert!(dump_tree(&v.b) == a, "the two mounts show different trees");
    v.unmount();
    assert!(v.checked_through(Side::A) == a);
    within(t, 60, "sshfs");
}

/// Directories and renames through sshfs: made and renamed on B, seen on A.
#[test]
fn directories_and_renames_work_through_sshfs() {
    let t = Instant::now();
    let Some(v) = OverSshfs::new() else { return };
    std::fs::create_dir_all(v.b.join("d/e")).unwrap();
    std::fs::write(v.b.join("d/e/f.txt"), "in a directory\n").unwrap();
    std::fs::rename(v.b.join("d/e/f.txt"), v.b.join("d/g.txt")).unwrap();
    std::fs::write(v.b.join("d/h.txt"), "replaced\n").unwrap();
    std::fs::rename(v.b.join("d/g.txt"), v.b.join("d/h.txt")).unwrap();
    std::fs::rename(v.b.join("d/e"), v.b.join("d/e2")).unwrap();
    assert_eq!(std::fs::read_to_string(v.a.join("d/h.txt")).unwrap(), "in a directory\n");
    assert!(v.a.join("d/e2").is_dir() && !v.a.join("d/e").exists() && !v.a.join("d/g.txt").exists());
    let a = dump_tree(&v.a);
    v.unmount();
    assert!(v.checked_through(Side::A) == a);
    within(t, 60, "sshfs directories and renames");
}
