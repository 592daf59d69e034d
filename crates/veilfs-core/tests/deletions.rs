//! Deletions and resurrections, seen by a client that remembers a directory's entries
//! (`veilfs_core::known`, `veilfs_core::tombstone`; docs/design/rollback.md "Layer 2"), each
//! test named by attack. Two clients are two state directories over one CIPHERDIR; every
//! client here is a fresh unlock. "Non-client" steps change the ciphertext directly, as a
//! sync peer with storage access and no key would.

use crate::common::*;
use std::path::{Path, PathBuf};
use veilfs_core::fsck::{Checker, ProblemKind, Report};
use veilfs_core::known::{KnownOptions, Trust};
use veilfs_core::tombstone::{self, Event, Op, Tombstones, HEADER_LEN, HORIZON_SECS, RECORD_LEN};
use veilfs_core::{CipherDir, Error, Vault};

fn setup() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let c = t.path().join("c");
    new_vault(&c);
    (t, c)
}

fn client_as(cipherdir: &Path, state: &Path, trust: Trust) -> Vault {
    let mut v = reopen(cipherdir);
    v.remember(&KnownOptions { root: Some(state.to_path_buf()), trust }).unwrap();
    v
}

fn client(cipherdir: &Path, state: &Path) -> Vault {
    client_as(cipherdir, state, Trust::Check)
}

fn fsck(v: &Vault, repair: bool) -> Report {
    Checker::new(v, repair, &|_| {}).run().unwrap()
}

fn kinds(r: &Report) -> Vec<(ProblemKind, PathBuf)> {
    r.problems.iter().map(|p| (p.kind, p.cipher_path.clone())).collect()
}

/// Lists the root and every directory named in `dirs` (so the client remembers them).
fn look(v: &Vault, dirs: &[&str]) {
    let root = v.root().unwrap();
    let (_, bad) = v.list(&root).unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    for d in dirs {
        let e = v.lookup(&root, d.as_bytes()).unwrap().unwrap();
        let sub = v.open_dir(&root, &e).unwrap();
        assert!(v.list(&sub).unwrap().1.is_empty());
    }
}

/// The tombstone log of client `v` in `dir`.
fn log_path(v: &Vault, dir: &CipherDir) -> PathBuf {
    dir.path.join(tombstone::log_name(&v.known().unwrap().client_id()))
}

/// What the tombstone logs of `dir` say last of its entry `on_disk`.
fn latest(v: &Vault, dir: &CipherDir, on_disk: &str) -> Option<Event> {
    let t = tombstone::token(&v.content().keys, &dir.iv, on_disk.as_bytes());
    Tombstones::new([0; 16]).with_dir(dir.fd(), &v.content().keys, &dir.iv, None, |d| d.latest(&t))
}

#[test]
fn a_file_deleted_by_a_non_client_is_reported_by_the_client_that_saw_it() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let v = client(&c, &a);
    let root = v.root().unwrap();
    write_file(&v, &root, "f", b"one");
    write_file(&v, &root, "g", b"two");
    look(&v, &[]);
    let cp = cipher_path(&v, &root, "f");
    drop(v);
    std::fs::remove_file(&cp).unwrap();
    let v = client(&c, &a);
    let r = fsck(&v, false);
    assert_eq!(kinds(&r), vec![(ProblemKind::Deleted, c.clone())]);
    assert!(
        r.problems[0].detail.contains("1 entry this client saw is missing without a tombstone"),
        "{:?}",
        r.problems
    );
    assert!(!r.is_clean());
    // The listing still works (the entries there are fine); the finding stays until accepted.
    let root = v.root().unwrap();
    assert_eq!(v.list(&root).unwrap().0.len(), 1);
    drop(v);
    assert_eq!(kinds(&fsck(&client(&c, &a), false)), vec![(ProblemKind::Deleted, c.clone())]);
    // A client that never saw the entry has nothing to object to.
    assert!(fsck(&client(&c, &t.path().join("fresh")), false).is_clean());
    // `fsck --accept` forgets it.
    assert!(fsck(&client_as(&c, &a, Trust::Accept), false).is_clean());
    assert!(fsck(&client(&c, &a), false).is_clean());
}

#[test]
fn a_subtree_deleted_by_a_non_client_is_reported_on_its_parent() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let v = client(&c, &a);
    let root = v.root().unwrap();
    let (_, d) = v.mkdir(&root, b"d", 0o755).unwrap();
    write_file(&v, &d, "x", b"inside");
    let (_, dd) = v.mkdir(&d, b"dd", 0o755).unwrap();
    write_file(&v, &dd, "y", b"deeper");
    look(&v, &["d"]);
    let dpath = d.path.clone();
    drop((v, d, dd));
    std::fs::remove_dir_all(&dpath).unwrap();
    let r = fsck(&client(&c, &a), false);
    assert_eq!(kinds(&r), vec![(ProblemKind::Deleted, c.clone())]);
}

#[test]
fn an_entry_put_back_after_a_client_deleted_it_is_refused_as_resurrected() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let v = client(&c, &a);
    let root = v.root().unwrap();
    write_file(&v, &root, "f", b"deleted later");
    write_file(&v, &root, "g", b"stays");
    look(&v, &[]);
    let cp = cipher_path(&v, &root, "f");
    let saved = std::fs::read(&cp).unwrap();
    let e = v.lookup(&root, b"f").unwrap().unwrap();
    v.remove(&root, &e).unwrap();
    let tomb = log_path(&v, &root);
    assert_eq!(std::fs::metadata(&tomb).unwrap().len(), (HEADER_LEN + RECORD_LEN) as u64);
    assert_eq!(latest(&v, &root, &e.on_disk).map(|e| e.op), Some(Op::Deleted));
    drop(v);
    // The deletion itself is no finding, for this client or another.
    assert!(fsck(&client(&c, &a), false).is_clean());
    std::fs::write(&cp, &saved).unwrap();
    for state in [a.clone(), t.path().join("b")] {
        let v = client(&c, &state);
        let root = v.root().unwrap();
        match v.lookup(&root, b"f") {
            Err(Error::Rollback { what, detail }) => {
                assert_eq!(Path::new(&what), cp);
                assert!(detail.starts_with("resurrected"), "{detail}");
            }
            other => panic!("expected a resurrected entry, got {other:?}"),
        }
        let (good, bad) = v.list(&root).unwrap();
        assert_eq!(good.len(), 1);
        assert_eq!(bad.len(), 1);
        assert!(matches!(bad[0].error, Error::Rollback { .. }));
        assert_eq!(bad[0].error.errno(), libc::EIO);
        let r = fsck(&v, false);
        assert_eq!(kinds(&r), vec![(ProblemKind::Resurrected, cp.clone())]);
        assert_eq!(r.problems[0].plain_path.as_deref(), Some(Path::new("f")));
    }
    // `fsck --accept` keeps it: a "back" record answers the deletion, for every client.
    assert!(fsck(&client_as(&c, &a, Trust::Accept), false).is_clean());
    let v = client(&c, &a);
    assert_eq!(latest(&v, &v.root().unwrap(), &e.on_disk).map(|e| e.op), Some(Op::Back));
    assert!(fsck(&client(&c, &t.path().join("c2")), false).is_clean());
    assert_eq!(read_file(&v, &v.root().unwrap(), "f").unwrap(), b"deleted later");
    assert!(fsck(&v, false).is_clean());
}

#[test]
fn deletions_renames_and_edits_by_another_client_raise_no_alarm() {
    let (t, c) = setup();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let v = client(&c, &a);
    let root = v.root().unwrap();
    for n in ["f", "g", "h", "k", "over"] {
        write_file(&v, &root, n, n.as_bytes());
    }
    let (_, d) = v.mkdir(&root, b"d", 0o755).unwrap();
    write_file(&v, &d, "x", b"x");
    v.mkdir(&root, b"e", 0o755).unwrap();
    look(&v, &["d", "e"]);
    drop((v, d));

    // Client B: unlink, rename within the directory, rename into a subdirectory, rename over
    // another entry, an edit, and an rmdir of a directory whose entries it deleted first.
    let w = client(&c, &b);
    let root = w.root().unwrap();
    let f = w.lookup(&root, b"f").unwrap().unwrap();
    w.remove(&root, &f).unwrap();
    let g = w.lookup(&root, b"g").unwrap().unwrap();
    w.rename(&root, &g, &root, b"g2", None).unwrap();
    let d_e = w.lookup(&root, b"d").unwrap().unwrap();
    let d = w.open_dir(&root, &d_e).unwrap();
    let h = w.lookup(&root, b"h").unwrap().unwrap();
    w.rename(&root, &h, &d, b"h", None).unwrap();
    let k = w.lookup(&root, b"k").unwrap().unwrap();
    let over = w.lookup(&root, b"over").unwrap().unwrap();
    w.rename(&root, &k, &root, b"over", Some(&over)).unwrap();
    let x = w.lookup(&d, b"x").unwrap().unwrap();
    let f2 = w.open_file(&d, &x, libc::O_RDWR).unwrap();
    f2.write_at(b"edited", 0, 1).unwrap();
    f2.settle().unwrap();
    drop(f2);
    let e_e = w.lookup(&root, b"e").unwrap().unwrap();
    let e = w.open_dir(&root, &e_e).unwrap();
    write_file(&w, &e, "tmp", b"t");
    let tmp = w.lookup(&e, b"tmp").unwrap().unwrap();
    w.remove(&e, &tmp).unwrap();
    drop(e);
    w.remove(&root, &e_e).unwrap();
    // An exchange (RENAME_EXCHANGE) of a file in the root with one in d.
    let (g2, hd) = (w.lookup(&root, b"g2").unwrap().unwrap(), w.lookup(&d, b"h").unwrap().unwrap());
    w.exchange_at(&root, &g2, &d, &hd).unwrap();
    // ...and back, so the names the exchange took away come back without looking resurrected.
    let (g2, hd) = (w.lookup(&root, b"g2").unwrap().unwrap(), w.lookup(&d, b"h").unwrap().unwrap());
    w.exchange_at(&root, &g2, &d, &hd).unwrap();
    drop((w, d));

    let r = fsck(&client(&c, &a), false);
    assert!(r.is_clean(), "{:?}", r.problems);
    // B's memory of the directory it removed went with it.
    assert!(client(&c, &b).known().unwrap().entries(&e_e.identity).is_empty());
    // B renames g2 back to g: the old name's tombstone goes, so g is not resurrected; and A,
    // which saw g deleted (by its tombstone), sees it back as a new entry.
    let w = client(&c, &b);
    let root = w.root().unwrap();
    let g2 = w.lookup(&root, b"g2").unwrap().unwrap();
    w.rename(&root, &g2, &root, b"g", None).unwrap();
    drop(w);
    let v = client(&c, &a);
    let r = fsck(&v, false);
    assert!(r.is_clean(), "{:?}", r.problems);
    assert_eq!(read_file(&v, &v.root().unwrap(), "g").unwrap(), b"g");
}

#[test]
fn a_forged_edited_or_moved_tombstone_never_makes_a_deletion_look_legitimate() {
    let (t, c) = setup();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let v = client(&c, &a);
    let root = v.root().unwrap();
    for n in ["f1", "f2", "f3"] {
        write_file(&v, &root, n, n.as_bytes());
    }
    let (_, d) = v.mkdir(&root, b"d", 0o755).unwrap();
    write_file(&v, &d, "x", b"x");
    look(&v, &["d"]);
    let on_disk = |n: &str| v.lookup(&root, n.as_bytes()).unwrap().unwrap().on_disk;
    let (f1, f3) = (on_disk("f1"), on_disk("f3"));
    let (cp1, cp3) = (cipher_path(&v, &root, "f1"), cipher_path(&v, &root, "f3"));
    let _ = (f1, f3);
    drop((v, d));

    // Client B deletes x in d and f2 in the root: one valid record in each of its two logs.
    let w = client(&c, &b);
    let root = w.root().unwrap();
    let d_e = w.lookup(&root, b"d").unwrap().unwrap();
    let d = w.open_dir(&root, &d_e).unwrap();
    let x = w.lookup(&d, b"x").unwrap().unwrap();
    w.remove(&d, &x).unwrap();
    let tx = log_path(&w, &d);
    let f2 = w.lookup(&root, b"f2").unwrap().unwrap();
    w.remove(&root, &f2).unwrap();
    let t2 = log_path(&w, &root);
    drop((w, d));

    // The storage deletes f1 and f3 and dresses them up: B's log of d moved into the root
    // under another name, B's record of f2 edited, a forged log.
    std::fs::remove_file(&cp1).unwrap();
    std::fs::remove_file(&cp3).unwrap();
    let t1 = root.path.join("veilfs.D.moved");
    std::fs::copy(&tx, &t1).unwrap();
    let mut edited = std::fs::read(&t2).unwrap();
    edited[HEADER_LEN + 20] ^= 1;
    std::fs::write(&t2, &edited).unwrap();
    let t3 = root.path.join("veilfs.D.forged");
    let mut forged = tombstone::header(&[7; 16]).to_vec();
    forged.extend_from_slice(&[7u8; RECORD_LEN]);
    std::fs::write(&t3, forged).unwrap();

    let r = fsck(&client(&c, &a), false);
    let mut found = kinds(&r);
    found.sort_by(|x, y| x.1.cmp(&y.1));
    let mut want = vec![
        (ProblemKind::Deleted, c.clone()),
        (ProblemKind::Damaged, t1.clone()),
        (ProblemKind::Damaged, t2.clone()),
        (ProblemKind::Damaged, t3.clone()),
    ];
    want.sort_by(|x, y| x.1.cmp(&y.1));
    assert_eq!(found, want, "{:?}", r.problems);
    let deleted = r.problems.iter().find(|p| p.kind == ProblemKind::Deleted).unwrap();
    assert!(deleted.detail.starts_with("3 entries"), "{}", deleted.detail);
    assert!(r.problems.iter().filter(|p| p.kind == ProblemKind::Damaged).all(|p| p.detail.contains("does not verify")));
    // The directory d, where x's tombstone is valid, has no finding.
}

#[test]
fn tombstones_older_than_the_horizon_are_removed_by_fsck_repair() {
    let (t, c) = setup();
    let v = client(&c, &t.path().join("a"));
    let root = v.root().unwrap();
    let keys = &v.content().keys;
    let now = tombstone::now();
    let client = v.known().unwrap().client_id();
    let recs: Vec<_> = [HORIZON_SECS + 86_400, HORIZON_SECS - 86_400]
        .into_iter()
        .enumerate()
        .map(|(i, age)| {
            let t = tombstone::token(keys, &root.iv, format!("entry{i}").as_bytes());
            (t, Event { op: Op::Deleted, kind: 1, time: now - age })
        })
        .collect();
    Tombstones::new(client).append(root.fd(), keys, &root.iv, &recs).unwrap();
    let log = log_path(&v, &root);
    let r = fsck(&v, false);
    assert!(r.is_clean() && r.expired_tombstones == 0, "{:?}", r.problems);
    assert_eq!(std::fs::metadata(&log).unwrap().len(), (HEADER_LEN + 2 * RECORD_LEN) as u64);
    let r = fsck(&v, true);
    assert!(r.is_clean(), "{:?}", r.problems);
    assert_eq!(r.expired_tombstones, 1);
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        (HEADER_LEN + RECORD_LEN) as u64,
        "the record past the horizon is dropped, the one within it stays"
    );
    assert_eq!(latest(&v, &root, "entry1").map(|e| e.op), Some(Op::Deleted));
    assert_eq!(latest(&v, &root, "entry0"), None);
}

/// Churn (a build, an editor's temporary files) leaves one log per client in a directory, of
/// one record per removed name, not one file per name; a sync tool's copy of a log (a state
/// copied to a second machine) reads as one more log, not as damage.
#[test]
fn many_deletions_in_one_directory_leave_one_log_and_a_copy_of_it_is_no_damage() {
    let (t, c) = setup();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let v = client(&c, &a);
    let root = v.root().unwrap();
    for i in 0..300 {
        write_file(&v, &root, &format!("f{i}"), b"x");
    }
    look(&v, &[]);
    drop(v);
    let w = client(&c, &b);
    let root = w.root().unwrap();
    for i in 0..300 {
        let e = w.lookup(&root, format!("f{i}").as_bytes()).unwrap().unwrap();
        w.remove(&root, &e).unwrap();
    }
    let log = log_path(&w, &root);
    drop(w);
    let logs: Vec<_> = std::fs::read_dir(&c)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(tombstone::LOG_PREFIX))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(std::fs::metadata(&log).unwrap().len(), (HEADER_LEN + 300 * RECORD_LEN) as u64);
    // Syncthing's copy of the log, as when two machines wrote one client's log.
    let n = log.file_name().unwrap().to_str().unwrap();
    let copy = c.join(format!("veilfs.D.sync-conflict-20261128-101010-ABCDEFG.{}", &n["veilfs.D.".len()..]));
    std::fs::copy(&log, &copy).unwrap();
    // The copy alone (the original's sync still under way) vouches for the deletions.
    std::fs::remove_file(&log).unwrap();
    let r = fsck(&client(&c, &a), false);
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// A sync tool renames an entry it saw conflict to a conflict copy's name (Syncthing's form
/// here): not a deletion (the copy shows the entry), and `fsck --repair`, which makes the copy
/// an ordinary entry, leaves a tombstone for the original name, so no client raises an alarm
/// afterwards.
#[test]
fn an_entry_a_sync_tool_renamed_to_a_conflict_copy_is_not_a_deletion() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let v = client(&c, &a);
    let root = v.root().unwrap();
    write_file(&v, &root, "f", b"one");
    look(&v, &[]);
    let cp = cipher_path(&v, &root, "f");
    drop(v);
    let name = cp.file_name().unwrap().to_str().unwrap().to_string();
    let (k, s) = name.split_once('.').unwrap();
    std::fs::rename(&cp, root.path.join(format!("{k}.sync-conflict-20261127-101010-ABCDEFG.{s}"))).unwrap();
    let r = fsck(&client(&c, &a), false);
    assert!(r.is_clean() && r.conflicts.len() == 1, "{:?} {:?}", r.problems, r.conflicts);
    let r = fsck(&client(&c, &t.path().join("b")), true);
    assert!(r.is_clean() && r.conflicts[0].repaired.is_some(), "{:?} {:?}", r.problems, r.conflicts);
    let r = fsck(&client(&c, &a), false);
    assert!(r.is_clean() && r.conflicts.is_empty(), "{:?} {:?}", r.problems, r.conflicts);
}

/// A crash between a client's tombstone record and the removal it announces (the crash
/// matrix's `vault.carry_side`, or any step that failed before the intent record of an
/// exchange) leaves the entry present under this client's own deletion record while this
/// client still remembers it: its next listing takes it for its own unfinished step and
/// answers with a "back" record, for every client, instead of refusing the entry as
/// resurrected. Another client's record, or an entry this client had forgotten, stays a
/// resurrection.
#[test]
fn a_crash_between_a_clients_tombstone_record_and_its_removal_is_not_a_resurrection() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let v = client(&c, &a);
    let root = v.root().unwrap();
    write_file(&v, &root, "f", b"kept");
    write_file(&v, &root, "g", b"other's");
    look(&v, &[]);
    let keys = &v.content().keys;
    let rec = |name: &str, client: [u8; 16]| {
        let e = v.lookup(&root, name.as_bytes()).unwrap().unwrap();
        let tok = tombstone::token(keys, &root.iv, e.on_disk.as_bytes());
        let ev = Event { op: Op::Deleted, kind: 1, time: tombstone::now() };
        Tombstones::new(client).append(root.fd(), keys, &root.iv, &[(tok, ev)]).unwrap();
        e.on_disk
    };
    // This client's own record for f (the removal never happened); another client's for g.
    let f = rec("f", v.known().unwrap().client_id());
    let g = rec("g", [0x42; 16]);
    let r = fsck(&v, false);
    assert_eq!(kinds(&r), vec![(ProblemKind::Resurrected, root.path.join(&g))], "{:?}", r.problems);
    assert_eq!(latest(&v, &root, &f).map(|e| e.op), Some(Op::Back), "f's unfinished removal answered");
    assert_eq!(read_file(&v, &root, "f").unwrap(), b"kept");
    drop(v);
    // Every other client now reads f too.
    let r = fsck(&client(&c, &t.path().join("b")), false);
    assert_eq!(kinds(&r), vec![(ProblemKind::Resurrected, root.path.join(&g))], "{:?}", r.problems);
}
