//! `veilfs upgrade` (crate::upgrade, docs/FORMAT.md §5.10 "Upgrade"): a v1 vault converted in
//! place reads back identically with header v2 everywhere, keeps links, attributes and
//! holes, and then catches the rollbacks the map exists for; a run stopped where a crash
//! could stop it leaves a vault every other reader refuses and the next run finishes; a
//! damaged file stops the upgrade before anything changes.

use crate::common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use veilfs_core::config::{FEATURE_BLOCK_MAP, FEATURE_BLOCK_MAP_UPGRADE};
use veilfs_core::fsck::Checker;
use veilfs_core::upgrade::{self, Options, StopAt};
use veilfs_core::{Error, Secret, Vault};

const B: usize = 4096;

/// The plaintext files of the test vault: name → content.
fn contents() -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for (i, len) in [0, 1, 4095, 4096, 4097, 20000, 3 * B + 17, 1_500_000].into_iter().enumerate() {
        m.insert(format!("f{len}"), data(len, i as u8));
    }
    m.insert("x".repeat(200), data(5000, 9));
    m
}

/// A v1 vault with files of many sizes, a long name, a sparse file, a file ending in zeros,
/// a hard link across directories, a symlink, a FIFO and an extended attribute.
fn v1_vault(dir: &Path) -> Vault {
    let v = new_v1_vault(dir);
    let root = v.root().unwrap();
    for (name, c) in contents() {
        write_file(&v, &root, &name, &c);
    }
    // Sparse: a hole of 5 MiB, then a few bytes (declared holes of the v1 writer).
    let (_, f) = v.create_file(&root, b"sparse", 0o644).unwrap();
    f.write_at(b"tail", 5 << 20, 0).unwrap();
    drop(f);
    // Ends in zeros: its final block is zeros, and must not become a hole.
    let (_, f) = v.create_file(&root, b"zeros", 0o644).unwrap();
    f.write_at(b"head", 0, 0).unwrap();
    f.truncate(3 * B as u64 + 100, 4).unwrap();
    drop(f);
    let (sub_e, sub) = v.mkdir(&root, b"sub", 0o755).unwrap();
    let _ = sub_e;
    let e = write_file(&v, &root, "linked", &data(3 * B + 5, 7));
    v.link(&root, &e, &sub, b"other name").unwrap();
    v.symlink(&root, b"sym", b"f1").unwrap();
    v.mknod(&root, b"fifo", libc::S_IFIFO | 0o644, 0).unwrap();
    let e = v.lookup(&root, b"f20000").unwrap().unwrap();
    v.set_xattr(&root, &e, b"user.colour", b"blue").unwrap();
    v
}

fn read_all(v: &Vault) -> BTreeMap<String, Vec<u8>> {
    let root = v.root().unwrap();
    let mut out = BTreeMap::new();
    let (entries, bad) = v.list(&root).unwrap();
    assert!(bad.is_empty());
    for e in entries.iter().filter(|e| e.kind == veilfs_core::EntryKind::File) {
        let name = String::from_utf8(e.name.clone()).unwrap();
        out.insert(name.clone(), read_file(v, &root, &name).unwrap());
    }
    let sub = v.open_dir(&root, &v.lookup(&root, b"sub").unwrap().unwrap()).unwrap();
    out.insert("sub/other name".into(), read_file(v, &sub, "other name").unwrap());
    out
}

/// Every regular file below `dir` (the vault's own files left out), with its first bytes.
fn cipher_files(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        let name = e.file_name().into_string().unwrap();
        if md.is_dir() {
            out.extend(cipher_files(&e.path()));
        } else if md.is_file() && !name.starts_with("veilfs.") {
            out.push((e.path(), md));
        }
    }
    out
}

fn upgrade_temps(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("veilfs.upgrade.") {
            out.push(e.path());
        } else if e.file_type().unwrap().is_dir() {
            out.extend(upgrade_temps(&e.path()));
        }
    }
    out
}

fn open_for_upgrade(dir: &Path) -> Vault {
    Vault::open_for_upgrade(dir, &Secret::Password(password()), None, &veilfs_core::kdf::KdfCeiling::DEFAULT).unwrap()
}

fn run(v: &mut Vault, stop: Option<StopAt>) -> veilfs_core::Result<upgrade::Report> {
    upgrade::run(v, &Options { stop, ..Default::default() }, &|_, _| {})
}

/// What an upgraded vault must be: features, headers v2, contents, links, no temporaries,
/// fsck clean.
fn assert_upgraded(dir: &Path, want: &BTreeMap<String, Vec<u8>>) {
    let v = reopen(dir);
    assert!(v.config().has_feature(FEATURE_BLOCK_MAP));
    assert!(!v.config().has_feature(FEATURE_BLOCK_MAP_UPGRADE));
    assert!(v.content().block_map);
    assert_eq!(&read_all(&v), want);
    for (p, md) in cipher_files(dir) {
        if md.len() > 0 {
            let c = std::fs::read(&p).unwrap();
            assert_eq!(&c[..2], &[0, 2], "{} has header v2", p.display());
        }
    }
    assert!(upgrade_temps(dir).is_empty());
    let root = v.root().unwrap();
    let (a, sub) = (cipher_path(&v, &root, "linked"), v.open_dir(&root, &v.lookup(&root, b"sub").unwrap().unwrap()));
    let b = cipher_path(&v, &sub.unwrap(), "other name");
    let (ma, mb) = (std::fs::metadata(a).unwrap(), std::fs::metadata(b).unwrap());
    assert_eq!((ma.ino(), ma.nlink()), (mb.ino(), 2), "the two names stay one file");
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn a_v1_vault_converts_in_place_reads_back_identically_and_then_catches_a_rolled_back_block() {
    let t = tempfile::tempdir().unwrap();
    let mut v = v1_vault(t.path());
    let want = read_all(&v);
    assert_eq!(want["f1500000"], contents()["f1500000"]);
    let root = v.root().unwrap();
    // The backing attributes a conversion must carry over, and the objects it must not touch.
    let f = cipher_path(&v, &root, "f4097");
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::new(1_600_000_000, 123_456_789);
    let times = std::fs::FileTimes::new().set_modified(mtime).set_accessed(mtime);
    std::fs::File::options().write(true).open(&f).unwrap().set_times(times).unwrap();
    let ino = |v: &Vault, root: &veilfs_core::CipherDir, name: &str| {
        std::fs::symlink_metadata(cipher_path(v, root, name)).unwrap().ino()
    };
    let (sym, fifo) = (ino(&v, &root, "sym"), ino(&v, &root, "fifo"));

    let dir_times = |p: &Path| {
        let md = std::fs::metadata(p).unwrap();
        (md.mtime(), md.mtime_nsec())
    };
    let sub_path = root.path.join(v.lookup(&root, b"sub").unwrap().unwrap().on_disk);
    let sub_before = dir_times(&sub_path);
    let r = run(&mut v, None).unwrap();
    assert!(r.finished && r.problems.is_empty(), "{r:?}");
    // Directories keep their times: their listings did not change. (The top's moves with
    // the config, which is rewritten there.)
    assert_eq!(dir_times(&sub_path), sub_before, "a directory keeps its times");
    // f0 is empty: the same in both layouts.
    assert_eq!((r.converted, r.linked, r.unchanged), (want.len() as u64 - 2, 1, 1), "{r:?}");
    assert_upgraded(t.path(), &want);

    let v = reopen(t.path());
    let root = v.root().unwrap();
    let md = std::fs::metadata(cipher_path(&v, &root, "f4097")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o640);
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123_456_789));
    let e = v.lookup(&root, b"f20000").unwrap().unwrap();
    assert_eq!(v.xattrs(&root, &e).unwrap(), vec![(b"user.colour".to_vec(), b"blue".to_vec())]);
    assert_eq!(
        (ino(&v, &root, "sym"), ino(&v, &root, "fifo")),
        (sym, fifo),
        "symlinks and special files are not touched"
    );
    let e = v.lookup(&root, b"sym").unwrap().unwrap();
    assert_eq!(v.readlink(&root, &e).unwrap(), b"f1");
    // The hole stays a hole: 5 MiB of zeros take no space.
    let sparse = std::fs::metadata(cipher_path(&v, &root, "sparse")).unwrap();
    assert!(sparse.blocks() * 512 < 256 << 10, "{} bytes allocated", sparse.blocks() * 512);

    // What v1 files could not catch: an older copy of a block put back.
    let p = cipher_path(&v, &root, "f20000");
    let old = std::fs::read(&p).unwrap();
    let e = v.lookup(&root, b"f20000").unwrap().unwrap();
    let f = v.open_file(&root, &e, libc::O_RDWR).unwrap();
    f.write_at(b"new", 2 * B as u64 + 10, 20000).unwrap();
    f.settle().unwrap();
    drop(f);
    let l = veilfs_core::content::blockmap::MapLayout::new(B as u64, 28);
    let (a, b) = (l.block_offset(2) as usize, (l.block_offset(2) + B as u64 + 28) as usize);
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(&old[a..b], a as u64).unwrap();
    assert_auth(read_file(&reopen(t.path()), &root, "f20000"), "block 2 is not the version the header commits to");
}

#[test]
fn a_run_stopped_midway_leaves_a_vault_only_the_upgrade_opens_and_the_next_run_finishes_it() {
    for stop in [StopAt::AfterFiles(3), StopAt::BeforeRename(2), StopAt::MidLinks] {
        let t = tempfile::tempdir().unwrap();
        let mut v = v1_vault(t.path());
        let want = read_all(&v);
        let err = run(&mut v, Some(stop)).unwrap_err();
        assert!(err.to_string().contains("test hook"), "{err}");
        drop(v);
        // Part old, part new: refused, saying what to do.
        match Vault::open(t.path(), &Secret::Password(password()), None) {
            Err(Error::Config { detail, .. }) => assert!(detail.contains("run veilfs upgrade"), "{detail}"),
            other => panic!("{stop:?}: expected a refusal, got {other:?}"),
        }
        let temps = upgrade_temps(t.path());
        match stop {
            StopAt::AfterFiles(_) => assert!(temps.is_empty()),
            StopAt::BeforeRename(_) => assert_eq!(temps.len(), 1, "{temps:?}"),
            StopAt::MidLinks => {
                assert_eq!(temps.len(), 1, "{temps:?}");
                assert!(temps[0].to_string_lossy().contains("veilfs.upgrade.link."));
            }
        }
        let mut v = open_for_upgrade(t.path());
        let r = run(&mut v, None).unwrap();
        assert!(r.finished && r.problems.is_empty(), "{stop:?}: {r:?}");
        assert_eq!(r.leftovers.len(), temps.len(), "{stop:?}: {r:?}");
        assert!(r.unchanged > 1, "{stop:?}: the files of the first run are not converted again: {r:?}");
        assert_upgraded(t.path(), &want);
    }
}

#[test]
fn a_damaged_file_stops_the_upgrade_before_anything_changes_until_fsck_repair_sets_it_aside() {
    let t = tempfile::tempdir().unwrap();
    let mut v = v1_vault(t.path());
    let root = v.root().unwrap();
    let p = cipher_path(&v, &root, "f20000");
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(b"XXXX", 5000).unwrap();
    let before = std::fs::read(t.path().join("veilfs.conf")).unwrap();
    let r = run(&mut v, None).unwrap();
    assert!(r.refused && !r.finished, "{r:?}");
    assert_eq!(r.problems.len(), 1, "{r:?}");
    assert!(r.problems[0].damaged && r.problems[0].cipher_path.ends_with(p.file_name().unwrap().to_str().unwrap()));
    assert_eq!(r.problems[0].plain_path, PathBuf::from("f20000"));
    assert_eq!(std::fs::read(t.path().join("veilfs.conf")).unwrap(), before, "the config is not touched");
    // Still an ordinary v1 vault: every other file reads, nothing was rewritten.
    let v = reopen(t.path());
    assert!(!v.content().block_map);
    for (p, _) in cipher_files(t.path()).into_iter().filter(|(_, md)| md.len() > 0) {
        assert_eq!(&std::fs::read(&p).unwrap()[..2], &[0, 1], "{} keeps header v1", p.display());
    }
    assert_eq!(read_file(&v, &root, "f4097").unwrap(), contents()["f4097"]);
    assert!(upgrade_temps(t.path()).is_empty());

    // fsck --repair salvages it under its name and sets the original aside in /lost+found,
    // where it is left as it is: the upgrade finishes, naming it.
    let r = Checker::new(&v, true, &|_| {}).run().unwrap();
    assert!(r.problems.iter().all(|p| p.repaired.is_some()), "{:?}", r.problems);
    let mut v = reopen(t.path());
    let r = run(&mut v, None).unwrap();
    assert!(r.finished && !r.refused, "{r:?}");
    assert_eq!(r.problems.len(), 1, "{r:?}");
    assert!(r.problems[0].left && r.problems[0].plain_path.starts_with("lost+found"), "{r:?}");
    let v = reopen(t.path());
    assert!(v.content().block_map);
    assert_eq!(read_file(&v, &root, "f20000").unwrap().len(), 20000);
}

#[test]
fn an_unsettled_v1_file_is_settled_first_and_converted() {
    let t = tempfile::tempdir().unwrap();
    let mut v = v1_vault(t.path());
    let root = v.root().unwrap();
    let e = v.lookup(&root, b"f4097").unwrap().unwrap();
    let f = v.open_file(&root, &e, libc::O_RDWR).unwrap();
    // A write into the tail by a writer that settles later (the mount) sets UNSETTLED; the
    // handle is leaked, as a crash would.
    f.set_defer_sparse(true);
    f.write_at(b"more", 4097, 4097).unwrap();
    std::mem::forget(f);
    let c = std::fs::read(cipher_path(&v, &root, "f4097")).unwrap();
    assert_eq!(c[3] & 2, 2, "the file is UNSETTLED");
    let r = run(&mut v, None).unwrap();
    assert!(r.finished && r.settled == 1, "{r:?}");
    let mut want = contents()["f4097"].clone();
    want.extend_from_slice(b"more");
    assert_eq!(read_file(&reopen(t.path()), &root, "f4097").unwrap(), want);
}

#[test]
fn fsck_repair_removes_an_upgrade_temporary_and_an_upgraded_vault_is_left_alone() {
    let t = tempfile::tempdir().unwrap();
    let mut v = v1_vault(t.path());
    run(&mut v, None).unwrap();
    // A second run has nothing to do.
    let mut v = reopen(t.path());
    let r = run(&mut v, None).unwrap();
    assert!(r.finished && r.converted == 0 && r.problems.is_empty(), "{r:?}");
    let leftover = t.path().join("veilfs.upgrade.AAAAAAAAAAAAAAAA");
    std::fs::write(&leftover, b"partial").unwrap();
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(!r.is_clean() && r.problems[0].detail.contains("interrupted upgrade"), "{:?}", r.problems);
    let r = Checker::new(&v, true, &|_| {}).run().unwrap();
    assert!(r.problems.iter().all(|p| p.repaired.is_some()), "{:?}", r.problems);
    assert!(!leftover.exists());
}

#[test]
fn a_vault_of_the_oldest_features_upgrades_too() {
    use veilfs_core::config::*;
    let t = tempfile::tempdir().unwrap();
    let mut v = new_v1_vault(t.path());
    let mut cfg = v.config().clone();
    // The directory IV's form is not what this is about: the vault's top has an IV name.
    cfg.features.retain(|f| FEATURES_V1.contains(&f.as_str()) || f == FEATURE_IV_IN_NAME);
    cfg.generation = 0;
    v.save_config(cfg).unwrap();
    let mut v = reopen(t.path());
    let root = v.root().unwrap();
    for (name, c) in contents() {
        write_file(&v, &root, &name, &c);
    }
    let r = run(&mut v, None).unwrap();
    assert!(r.finished && r.problems.is_empty(), "{r:?}");
    let v = reopen(t.path());
    assert!(v.content().block_map && !v.content().unsettled_tails);
    for (name, c) in contents() {
        assert_eq!(read_file(&v, &root, &name).unwrap(), c, "{name}");
    }
    // Written after the upgrade too, by a writer that settles later (the mount).
    let e = v.lookup(&root, b"f4097").unwrap().unwrap();
    let f = v.open_file(&root, &e, libc::O_RDWR).unwrap();
    f.set_defer_sparse(true);
    f.write_at(b"more", 4097, 4097).unwrap();
    f.settle().unwrap();
    drop(f);
    assert_eq!(read_file(&reopen(t.path()), &root, "f4097").unwrap().len(), 4101);
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn an_interrupted_run_stops_between_files_and_leaves_no_temporary() {
    use std::sync::atomic::{AtomicU32, Ordering};
    static ASKED: AtomicU32 = AtomicU32::new(0);
    // Asked once per file checked, then once per file converted: stop after a few conversions.
    fn after_some() -> bool {
        ASKED.fetch_add(1, Ordering::Relaxed) >= 20
    }
    let t = tempfile::tempdir().unwrap();
    let mut v = v1_vault(t.path());
    let want = read_all(&v);
    let err =
        upgrade::run(&mut v, &Options { interrupted: Some(after_some), ..Default::default() }, &|_, _| {}).unwrap_err();
    assert!(upgrade::is_interrupted(&err), "{err}");
    assert!(v.config().has_feature(FEATURE_BLOCK_MAP_UPGRADE), "stopped while converting");
    assert!(upgrade_temps(t.path()).is_empty());
    drop(v);
    let mut v = open_for_upgrade(t.path());
    let r = run(&mut v, None).unwrap();
    assert!(r.finished && r.leftovers.is_empty() && r.unchanged > 1, "{r:?}");
    assert_upgraded(t.path(), &want);
}
