//! A vault in a synced folder: a mount that caches (the default, locked mount) shows what
//! another machine wrote within seconds, and no mount writes into CIPHERDIR because it read
//! it.
//!
//! "The other machine" is a copy of the vault, mounted on its own (its own lock), where the
//! changes are made through veilfs; `rsync` then delivers its ciphertext into the first
//! vault's CIPHERDIR as a sync tool does: each file written under a temporary name and
//! renamed into place (or, with `--inplace`, rewritten where it is), removed names deleted.
//! The lock file stays each side's own.

mod common;
use common::*;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A remote change must be visible within this.
const FRESH: Duration = Duration::from_secs(5);

/// The other machine: a copy of `m`'s vault (taken while `m` is unmounted), mounted.
struct Other {
    cipher: PathBuf,
    mnt: PathBuf,
    _guard: UnmountOnDrop,
}

impl Other {
    fn new(m: &mut Mounted) -> Other {
        m.umount();
        let cipher = m.tmpfs.path.join("other-cipher");
        let mnt = m.tmpfs.path.join("other-mnt");
        fs::create_dir_all(&mnt).unwrap();
        deliver(&m.cipher, &cipher, &[]);
        m.mount();
        let o = Command::new(&BIN)
            .args(["mount", cipher.to_str().unwrap(), mnt.to_str().unwrap(), "--passfile"])
            .arg(&m.passfile)
            .env("VEILFS_LOG_FILE", m.tmpfs.path.join("other.log"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "mount of the other copy: {}", text(&o));
        Other { cipher, mnt: mnt.clone(), _guard: UnmountOnDrop(mnt) }
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Writes `rel` on the other machine, durably (its ciphertext complete before the sync).
    fn write(&self, rel: &str, data: &[u8]) {
        let mut f = fs::File::create(self.m(rel)).unwrap();
        f.write_all(data).unwrap();
        f.sync_all().unwrap();
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        let _ = run(&BIN, &["umount", self.mnt.to_str().unwrap()]);
    }
}

/// Delivers `from`'s ciphertext into `to` as a sync tool does (see the module docs).
fn deliver(from: &Path, to: &Path, extra: &[&str]) {
    let (src, dst) = (format!("{}/", from.display()), format!("{}/", to.display()));
    let mut args = vec!["-a", "--delete", "--exclude=/veilfs.lock"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[&src, &dst]);
    let o = run("rsync", &args);
    assert!(o.status.success(), "rsync: {}", text(&o));
}

/// How long until `seen` holds (polled every 20 ms); fails past twice [`FRESH`].
fn until(what: &str, seen: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !seen() {
        assert!(start.elapsed() < 2 * FRESH, "{what}: not visible after {:?}", start.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    eprintln!("{what}: visible after {:.2} s", took.as_secs_f64());
    took
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn a_default_mount_sees_what_another_machine_wrote_within_seconds() {
    if !which("rsync") {
        return eprintln!("skipped: no rsync");
    }
    let Some(mut m) = Mounted::new("96M", &[]) else { return };
    fs::write(m.m("keep"), "k").unwrap();
    fs::create_dir(m.m("d")).unwrap();
    fs::write(m.m("d/old"), "old").unwrap();
    for (n, c) in [("edit", "v1"), ("inplace", "i1"), ("gone", "x"), ("moved", "mv")] {
        fs::write(m.m(n), c).unwrap();
    }
    let other = Other::new(&mut m);
    // Everything the kernel may cache: names, absent names, attributes, pages, listings.
    let prime = |m: &Mounted| {
        for n in ["keep", "d/old", "edit", "inplace", "gone", "moved"] {
            fs::read(m.m(n)).unwrap();
        }
        for n in ["new", "d/new", "renamed", "newdir"] {
            assert!(fs::metadata(m.m(n)).is_err(), "{n} exists before");
        }
        names(&m.mnt);
        names(&m.m("d"));
    };
    prime(&m);
    let mut took = Vec::new();

    other.write("new", b"from the other machine");
    other.write("d/new", b"inside d");
    fs::create_dir(other.m("newdir")).unwrap();
    other.write("newdir/f", b"in a new directory");
    deliver(&other.cipher, &m.cipher, &[]);
    took.push(until("create", || fs::read(m.m("new")).is_ok_and(|c| c == b"from the other machine")));
    took.push(until("create in a subdirectory", || fs::read(m.m("d/new")).is_ok_and(|c| c == b"inside d")));
    took.push(until("new directory", || fs::read(m.m("newdir/f")).is_ok_and(|c| c == b"in a new directory")));
    until("listing after create", || names(&m.mnt).contains(&"new".to_string()));
    prime_after(&m, &["new", "d/new"]);

    fs::rename(other.m("moved"), other.m("renamed")).unwrap();
    deliver(&other.cipher, &m.cipher, &[]);
    took.push(until("rename", || {
        fs::metadata(m.m("moved")).is_err() && fs::read(m.m("renamed")).is_ok_and(|c| c == b"mv")
    }));

    fs::remove_file(other.m("gone")).unwrap();
    deliver(&other.cipher, &m.cipher, &[]);
    took.push(until("delete", || fs::metadata(m.m("gone")).is_err() && !names(&m.mnt).contains(&"gone".to_string())));

    // An edit: the other machine's ciphertext replaces this one's under the same name.
    other.write("edit", b"v2, longer than v1");
    deliver(&other.cipher, &m.cipher, &[]);
    took.push(until("edit (replaced)", || fs::read(m.m("edit")).is_ok_and(|c| c == b"v2, longer than v1")));
    // The same, rewritten in place: the file this mount knows (and whose pages the kernel
    // keeps) changes under it.
    other.write("inplace", b"i2, rewritten in place");
    deliver(&other.cipher, &m.cipher, &["--inplace"]);
    took.push(until("edit (in place)", || fs::read(m.m("inplace")).is_ok_and(|c| c == b"i2, rewritten in place")));

    assert_eq!(names(&m.mnt), names(&other.mnt));
    assert_eq!(names(&m.m("d")), names(&other.m("d")));
    let worst = took.iter().max().unwrap();
    assert!(*worst <= FRESH, "a remote change took {worst:?} to show (limit {FRESH:?}): {took:?}");
    // A sync is no damage: a read that came between the delivery and the watch's report
    // looked the name up again instead of failing.
    let log = fs::read_to_string(m.tmpfs.path.join("veilfs.log")).unwrap_or_default();
    assert!(!log.contains("ERROR"), "{log}");
    // Its own changes still work as before beside the watch.
    fs::write(m.m("mine"), "mine").unwrap();
    fs::rename(m.m("mine"), m.m("mine2")).unwrap();
    assert_eq!(fs::read(m.m("mine2")).unwrap(), b"mine");
    drop(other);
}

/// A time given to `touch -d` and `utimensat`: 2021-03-04 05:06:07 UTC.
const SOME_TIME: i64 = 1_614_834_367;

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0)
}

fn mtime(p: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).map(|m| m.mtime()).unwrap_or(0)
}

fn ino(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).unwrap().ino()
}

#[test]
fn a_mode_or_time_changed_on_another_machine_shows_on_a_default_mount_within_seconds() {
    if !which("rsync") {
        return eprintln!("skipped: no rsync");
    }
    let Some(mut m) = Mounted::new("64M", &[]) else { return };
    for n in ["chmod", "touched", "touched-unseen", "touched-replaced", "mine"] {
        fs::write(m.m(n), n).unwrap();
        fs::set_permissions(m.m(n), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    }
    fs::create_dir(m.m("dir")).unwrap();
    fs::set_permissions(m.m("dir"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    fs::write(m.m("dir/f"), "in dir").unwrap();
    let other = Other::new(&mut m);
    // The kernel caches the attributes (and pages) of all but one.
    for n in ["chmod", "touched", "touched-replaced", "mine", "dir/f"] {
        fs::read(m.m(n)).unwrap();
    }
    assert_eq!(mode(&m.m("chmod")), 0o644);
    assert_eq!(mode(&m.m("dir")), 0o755);
    assert_ne!(mtime(&m.m("touched")), SOME_TIME);
    assert_ne!(mtime(&m.m("dir")), SOME_TIME);
    let date = "@1614834367";
    let mut took = Vec::new();

    // Modes: rsync changes them in place.
    fs::set_permissions(other.m("chmod"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    fs::set_permissions(other.m("dir"), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    deliver(&other.cipher, &m.cipher, &[]);
    took.push(until("chmod of a file", || mode(&m.m("chmod")) == 0o600));
    took.push(until("chmod of a directory", || mode(&m.m("dir")) == 0o700));

    // Times only: a sync tool that sees the content unchanged (Syncthing, or rsync with
    // --size-only) sets the time in place.
    for n in ["touched", "touched-unseen", "dir"] {
        let o = run("touch", &["-m", "-d", date, other.m(n).to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
    }
    deliver(&other.cipher, &m.cipher, &["--size-only"]);
    took.push(until("touch of a file the kernel knows", || mtime(&m.m("touched")) == SOME_TIME));
    took.push(until("touch of a file the kernel did not know", || mtime(&m.m("touched-unseen")) == SOME_TIME));
    took.push(until("touch of a directory", || mtime(&m.m("dir")) == SOME_TIME));
    // Plain rsync replaces a file whose time changed (a new file renamed into place).
    let o = run("touch", &["-m", "-d", date, other.m("touched-replaced").to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    deliver(&other.cipher, &m.cipher, &[]);
    took.push(until("touch of a file, replaced", || mtime(&m.m("touched-replaced")) == SOME_TIME));

    // Nothing else changed, and the content reads as before.
    for n in ["chmod", "touched", "touched-unseen", "touched-replaced"] {
        assert_eq!(fs::read(m.m(n)).unwrap(), n.as_bytes());
    }
    assert_eq!(fs::read(m.m("dir/f")).unwrap(), b"in dir");
    assert_eq!(mode(&m.m("touched")), 0o644);
    let worst = took.iter().max().unwrap();
    assert!(*worst <= FRESH, "a remote change took {worst:?} to show (limit {FRESH:?}): {took:?}");

    // The mount's own chmod and touch are no one else's: the file stays the inode the
    // kernel knows (a change judged foreign would make it a new one).
    let before = ino(&m.m("mine"));
    fs::set_permissions(m.m("mine"), std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    let o = run("touch", &["-m", "-d", date, m.m("mine").to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((mode(&m.m("mine")), mtime(&m.m("mine"))), (0o640, SOME_TIME));
    assert_eq!(ino(&m.m("mine")), before, "the mount's own chmod or touch was taken for another machine's");
    let log = fs::read_to_string(m.tmpfs.path.join("veilfs.log")).unwrap_or_default();
    assert!(!log.contains("ERROR"), "{log}");
    drop(other);
}

/// A conflict copy made on another machine arrives as a new file of its own (the sync tool
/// carries its copies like any file): the directory's listing shows it within seconds, and
/// it reads as the version it holds; deleted there, it goes here.
#[test]
fn a_conflict_copy_made_on_another_machine_shows_on_a_default_mount_within_seconds() {
    if !which("rsync") {
        return eprintln!("skipped: no rsync");
    }
    let Some(mut m) = Mounted::new("64M", &[]) else { return };
    fs::write(m.m("report.txt"), "version A").unwrap();
    let other = Other::new(&mut m);
    assert_eq!(names(&m.mnt), ["report.txt"]);
    fs::read(m.m("report.txt")).unwrap();
    // On the other machine the sync tool kept this version as a copy (and a copy of it).
    let entry = user_entries(&other.cipher).remove(0);
    fs::copy(&entry, syncthing_copy_name(&entry)).unwrap();
    fs::copy(&entry, copy_name_with(&entry, " (1) (2)")).unwrap();
    deliver(&other.cipher, &m.cipher, &[]);
    let (copy, nested) = (format!("report ({SYNCTHING_PART}).txt"), "report (1, 2).txt".to_string());
    let took = until("a conflict copy", || names(&m.mnt).contains(&copy) && names(&m.mnt).contains(&nested));
    assert!(took <= FRESH, "took {took:?}");
    assert_eq!(fs::read(m.m(&copy)).unwrap(), b"version A");
    assert_eq!(fs::read(m.m(&nested)).unwrap(), b"version A");
    // Settled there (the copy deleted): gone here, also the name the kernel had looked up.
    fs::remove_file(syncthing_copy_name(&entry)).unwrap();
    deliver(&other.cipher, &m.cipher, &[]);
    let took = until("a conflict copy deleted", || !names(&m.mnt).contains(&copy) && fs::metadata(m.m(&copy)).is_err());
    assert!(took <= FRESH, "took {took:?}");
    assert_eq!(names(&m.mnt), [nested.as_str(), "report.txt"]);
    drop(other);
}

/// Reads what `rels` hold, so the kernel caches it again before the next change.
fn prime_after(m: &Mounted, rels: &[&str]) {
    for r in rels {
        fs::read(m.m(r)).unwrap();
    }
}

/// The ciphertext directories under `root` that hold no IV copy.
fn without_iv_copy(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(root).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            let p = e.path();
            if !names(&p).iter().any(|n| n.starts_with("veilfs.diriv")) {
                out.push(p.clone());
            }
            out.extend(without_iv_copy(&p));
        }
    }
    out
}

#[test]
fn a_directory_whose_iv_copy_has_not_arrived_is_read_without_writing_it() {
    if !which("rsync") {
        return eprintln!("skipped: no rsync");
    }
    let Some(mut m) = Mounted::new("64M", &[]) else { return };
    let other = Other::new(&mut m);
    fs::create_dir(other.m("late")).unwrap();
    other.write("late/f", b"arrived before its directory's IV copy");
    // The directory and its file arrive; its IV copy does not yet.
    deliver(&other.cipher, &m.cipher, &["--exclude=veilfs.diriv*"]);
    let missing = without_iv_copy(&m.cipher);
    assert_eq!(missing.len(), 1, "{missing:?}");
    until("a directory without its IV copy", || {
        fs::read(m.m("late/f")).is_ok_and(|c| c == b"arrived before its directory's IV copy")
    });
    assert_eq!(names(&m.m("late")), ["f"]);
    for mount in ["default", "--shared-storage"] {
        if mount != "default" {
            m.umount();
            m.extra = vec![mount.into()];
            m.mount();
            assert_eq!(fs::read(m.m("late/f")).unwrap(), b"arrived before its directory's IV copy");
            assert_eq!(names(&m.m("late")), ["f"]);
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            without_iv_copy(&m.cipher),
            missing,
            "a {mount} mount wrote the IV copy the sync tool was delivering"
        );
    }
    // Offline readers write nothing either.
    let o = run(&BIN, &["ls", m.cipher.join("late").to_str().unwrap(), "--passfile", m.passfile.to_str().unwrap()]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "f"), "{}", text(&o));
    assert_eq!(without_iv_copy(&m.cipher), missing);
    // Then it arrives, and nothing changes for the reader.
    deliver(&other.cipher, &m.cipher, &[]);
    assert!(without_iv_copy(&m.cipher).is_empty());
    assert_eq!(fs::read(m.m("late/f")).unwrap(), b"arrived before its directory's IV copy");
    drop(other);
}
