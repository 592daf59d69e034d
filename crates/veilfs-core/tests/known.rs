//! Whole-file and config rollback, seen by a client that remembers (`veilfs_core::known`,
//! docs/design/rollback.md "Layer 2"), each test named by attack. Two clients are two state
//! directories over one CIPHERDIR; every client here is a fresh unlock (nothing cached).

use crate::common::*;
use std::path::{Path, PathBuf};
use veilfs_core::fsck::{Checker, ProblemKind};
use veilfs_core::known::{KnownOptions, Seen, Trust};
use veilfs_core::{CipherDir, Error, Vault};

/// A vault with a block map in `t/c` (512-byte blocks).
fn setup() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let c = t.path().join("c");
    vault_with_block_map(&c, 512);
    (t, c)
}

/// A fresh unlock of `cipherdir` by the client whose state lives under `state`.
fn client_as(cipherdir: &Path, state: &Path, trust: Trust) -> veilfs_core::Result<Vault> {
    let mut v = reopen(cipherdir);
    v.remember(&KnownOptions { root: Some(state.to_path_buf()), trust })?;
    Ok(v)
}

fn client(cipherdir: &Path, state: &Path) -> Vault {
    client_as(cipherdir, state, Trust::Check).unwrap()
}

/// Overwrites the start of `name` with `data` in one write session, settled.
fn overwrite(v: &Vault, root: &CipherDir, name: &str, data: &[u8]) {
    let e = v.lookup(root, name.as_bytes()).unwrap().unwrap();
    let f = v.open_file(root, &e, libc::O_RDWR).unwrap();
    let size = f.plain_size().unwrap();
    f.write_at(data, 0, size).unwrap();
    f.settle().unwrap();
}

fn file_id(v: &Vault, root: &CipherDir, name: &str) -> [u8; 16] {
    let e = v.lookup(root, name.as_bytes()).unwrap().unwrap();
    *v.open_file(root, &e, libc::O_RDONLY).unwrap().id()
}

fn assert_rollback<T: std::fmt::Debug>(r: veilfs_core::Result<T>, what: &Path, needle: &str) {
    match r {
        Err(Error::Rollback { what: w, detail }) => {
            assert_eq!(Path::new(&w), what, "{detail}");
            assert!(detail.contains(needle), "{detail:?} should say {needle:?}");
        }
        other => panic!("expected a rollback naming {} ({needle}), got {other:?}", what.display()),
    }
}

/// Client A writes `f` (generation 1), keeps a copy of its ciphertext, writes a newer
/// version (generation 2); the old bytes are put back. Returns the old plaintext and the
/// ciphertext path.
fn roll_back_f(c: &Path, a: &Path) -> (Vec<u8>, PathBuf) {
    let v = client(c, a);
    let root = v.root().unwrap();
    let old = data(3000, 1);
    write_file(&v, &root, "f", &old);
    let cp = cipher_path(&v, &root, "f");
    let saved = std::fs::read(&cp).unwrap();
    overwrite(&v, &root, "f", &data(3000, 2));
    assert_eq!(read_file(&v, &root, "f").unwrap(), data(3000, 2));
    drop(v);
    std::fs::write(&cp, &saved).unwrap();
    (old, cp)
}

#[test]
fn whole_file_rollback_is_an_integrity_error_for_the_client_that_saw_the_newer_version() {
    let (t, c) = setup();
    let (old, cp) = roll_back_f(&c, &t.path().join("a"));
    let v = client(&c, &t.path().join("a"));
    let root = v.root().unwrap();
    let r = read_file(&v, &root, "f");
    assert_rollback(r, &cp, "rolled back: generation 1, this client saw 2");
    assert_eq!(Error::Rollback { what: String::new(), detail: String::new() }.errno(), libc::EIO);
    // A client that never saw the newer version trusts the file as it is (first use).
    let fresh = client(&c, &t.path().join("c2"));
    assert!(fresh.known().unwrap().first_use());
    assert_eq!(read_file(&fresh, &root, "f").unwrap(), old);
}

#[test]
fn config_rollback_is_refused_at_unlock_by_the_client_that_saw_the_newer_config() {
    let t = tempfile::tempdir().unwrap();
    let c = t.path().join("c");
    new_vault(&c);
    let a = t.path().join("a");
    let mut v = client(&c, &a);
    assert!(v.config().has_feature(veilfs_core::config::FEATURE_VERSIONS));
    let g = v.config().generation;
    assert!(g >= 1, "a new vault's config starts at generation 1");
    let conf = veilfs_core::VaultConfig::path_in(&c);
    let saved = std::fs::read(&conf).unwrap();
    // A password added (as `veilfs passwd --add` does): the config's generation goes up.
    let mut cfg = v.config().clone();
    let master = v.master_key().clone();
    cfg.add_password_slot(&master, &secrecy::SecretString::from("second".to_string()), FAST_KDF).unwrap();
    v.save_config(cfg).unwrap();
    assert_eq!(v.config().generation, g + 1);
    drop(v);
    std::fs::remove_file(&conf).unwrap();
    std::fs::write(&conf, &saved).unwrap();
    let r = client_as(&c, &a, Trust::Check);
    assert_rollback(r, &conf, &format!("config rolled back: generation {g}, this client saw {}", g + 1));
    // The config itself authenticates: a client without that memory opens it.
    assert!(client(&c, &t.path().join("b")).known().unwrap().first_use());
}

#[test]
fn a_config_without_the_versions_feature_keeps_its_bytes_and_has_no_generation() {
    let t = tempfile::tempdir().unwrap();
    let c = t.path().join("c");
    let mut v = new_vault(&c);
    let mut cfg = v.config().clone();
    cfg.features.retain(|f| f != veilfs_core::config::FEATURE_VERSIONS);
    cfg.generation = 0;
    v.save_config(cfg).unwrap();
    let text = std::fs::read_to_string(veilfs_core::VaultConfig::path_in(&c)).unwrap();
    assert!(!text.contains("generation"), "{text}");
    assert_eq!(reopen(&c).config().generation, 0);
}

#[test]
fn a_legitimate_edit_by_another_client_is_not_a_rollback_and_is_remembered() {
    let (t, c) = setup();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let va = client(&c, &a);
    let root = va.root().unwrap();
    write_file(&va, &root, "f", &data(2000, 1));
    let id = file_id(&va, &root, "f");
    let wa = va.known().unwrap().writer();
    drop(va);
    let vb = client(&c, &b);
    overwrite(&vb, &root, "f", &data(2000, 3));
    let wb = vb.known().unwrap().writer();
    assert_ne!(wa, wb);
    let gb = vb.known().unwrap().file(&id).unwrap();
    assert_eq!(gb, Seen { generation: 2, writer: wb }, "the header carries the writing client's ID");
    drop(vb);
    let va = client(&c, &a);
    assert_eq!(read_file(&va, &root, "f").unwrap(), data(2000, 3));
    assert_eq!(va.known().unwrap().file(&id), Some(gb), "A remembers B's newer version");
    drop(va);
    // Emptied by B (a shell's `>`), then written by a client that never saw the file: the
    // emptied file keeps a header of 0 blocks, so the generation keeps rising.
    let vb = client(&c, &b);
    let e = vb.lookup(&root, b"f").unwrap().unwrap();
    vb.open_file(&root, &e, libc::O_RDWR).unwrap().truncate(0, 2000).unwrap();
    drop(vb);
    let vd = client(&c, &t.path().join("d"));
    let e = vd.lookup(&root, b"f").unwrap().unwrap();
    let f = vd.open_file(&root, &e, libc::O_RDWR).unwrap();
    f.write_at(&data(100, 4), 0, 0).unwrap();
    f.settle().unwrap();
    drop((f, vd));
    let va = client(&c, &a);
    assert_eq!(read_file(&va, &root, "f").unwrap(), data(100, 4));
    assert_eq!(va.known().unwrap().file(&id).map(|s| s.generation), Some(4));
}

#[test]
fn a_rename_by_another_client_is_not_a_rollback_and_the_memory_follows_the_file() {
    let (t, c) = setup();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let va = client(&c, &a);
    let root = va.root().unwrap();
    write_file(&va, &root, "f", &data(1500, 1));
    let saved = std::fs::read(cipher_path(&va, &root, "f")).unwrap();
    drop(va);
    let vb = client(&c, &b);
    let e = vb.lookup(&root, b"f").unwrap().unwrap();
    vb.rename(&root, &e, &root, b"g", None).unwrap();
    overwrite(&vb, &root, "g", &data(1500, 2));
    drop(vb);
    let va = client(&c, &a);
    assert_eq!(read_file(&va, &root, "g").unwrap(), data(1500, 2));
    drop(va);
    // The state keys by file ID: the old content put back under the new name is caught.
    let cp = cipher_path(&reopen(&c), &root, "g");
    std::fs::write(&cp, &saved).unwrap();
    let va = client(&c, &a);
    assert_rollback(read_file(&va, &root, "g"), &cp, "rolled back: generation 1, this client saw 2");
}

#[test]
fn concurrent_sessions_of_two_clients_at_one_generation_are_not_a_rollback() {
    let (t, c) = setup();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let va = client(&c, &a);
    let root = va.root().unwrap();
    write_file(&va, &root, "f", &data(1000, 1));
    let id = file_id(&va, &root, "f");
    let vb = client(&c, &b);
    // Both open generation 1; each writes generation 2 (B last, over the same blocks).
    let open = |v: &Vault| v.open_file(&root, &v.lookup(&root, b"f").unwrap().unwrap(), libc::O_RDWR).unwrap();
    let (fa, fb) = (open(&va), open(&vb));
    fa.write_at(&data(1000, 2), 0, 1000).unwrap();
    fa.settle().unwrap();
    fb.write_at(&data(1000, 3), 0, 1000).unwrap();
    fb.settle().unwrap();
    let wa = va.known().unwrap().writer();
    drop((fa, fb, va, vb));
    let va = client(&c, &a);
    assert_eq!(read_file(&va, &root, "f").unwrap(), data(1000, 3));
    assert_eq!(va.known().unwrap().file(&id), Some(Seen { generation: 2, writer: wa }), "A's own record stays");
}

#[test]
fn allow_rollback_reads_the_older_file_and_leaves_the_memory_as_it_was() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let (old, cp) = roll_back_f(&c, &a);
    let v = client_as(&c, &a, Trust::AllowRollback).unwrap();
    let root = v.root().unwrap();
    assert_eq!(read_file(&v, &root, "f").unwrap(), old);
    drop(v);
    let v = client(&c, &a);
    assert_rollback(read_file(&v, &root, "f"), &cp, "this client saw 2");
}

#[test]
fn fsck_reports_a_rolled_back_file_and_accept_adopts_it() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let (old, cp) = roll_back_f(&c, &a);
    let v = client(&c, &a);
    let before = std::fs::read(&cp).unwrap();
    // Even with repair: an older version is whole and authentic, so it is reported and left
    // where it is (never moved to lost+found or salvaged).
    let r = Checker::new(&v, true, &|_| {}).run().unwrap();
    let p: Vec<_> = r.problems.iter().filter(|p| p.kind == ProblemKind::RolledBack).collect();
    assert_eq!(p.len(), 1, "{:?}", r.problems);
    assert_eq!(p[0].cipher_path, cp);
    assert!(p[0].repaired.is_none() && !r.is_clean());
    assert_eq!(std::fs::read(&cp).unwrap(), before, "left in place");
    drop(v);
    let v = client_as(&c, &a, Trust::Accept).unwrap();
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    drop(v);
    let v = client(&c, &a);
    let root = v.root().unwrap();
    assert_eq!(read_file(&v, &root, "f").unwrap(), old, "adopted: the older version is trusted now");
}

/// The log's records after the snapshot, one per change (config, then each file).
fn log_of(state: &Path, c: &Path) -> PathBuf {
    let v = reopen(c);
    let iv = v.config().root_iv().unwrap();
    state.join(veilfs_core::known::vault_id(&iv)).join(veilfs_core::known::LOG_NAME)
}

#[test]
fn a_torn_tail_of_the_client_state_loses_only_its_last_record() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let v = client(&c, &a);
    let root = v.root().unwrap();
    write_file(&v, &root, "f1", &data(600, 1));
    write_file(&v, &root, "f2", &data(600, 2));
    let (id1, id2) = (file_id(&v, &root, "f1"), file_id(&v, &root, "f2"));
    drop(v);
    let log = log_of(&a, &c);
    let len = std::fs::metadata(&log).unwrap().len();
    // A crash cut the last append in the middle of its last record.
    std::fs::OpenOptions::new().write(true).open(&log).unwrap().set_len(len - 10).unwrap();
    let v = client(&c, &a);
    let k = v.known().unwrap();
    assert!(k.file(&id1).is_some());
    assert_eq!(k.file(&id2), None, "the torn record is lost: f2 is trusted again when next seen");
    assert_eq!(std::fs::metadata(&log).unwrap().len() % 49, 0, "the torn bytes are cut off");
    assert_eq!(read_file(&v, &root, "f2").unwrap(), data(600, 2));
    drop(v);
    // Garbage after whole records (a torn page) is cut the same way.
    let mut bytes = std::fs::read(&log).unwrap();
    let whole = bytes.len();
    bytes.extend_from_slice(&[0xa5; 30]);
    std::fs::write(&log, &bytes).unwrap();
    let v = client(&c, &a);
    assert!(v.known().unwrap().file(&id1).is_some() && v.known().unwrap().file(&id2).is_some());
    drop(v);
    assert_eq!(std::fs::metadata(&log).unwrap().len() as usize, whole);
}

#[test]
fn a_client_state_from_another_vault_or_edited_is_refused() {
    let (t, c) = setup();
    let a = t.path().join("a");
    drop(client(&c, &a));
    let iv = reopen(&c).config().root_iv().unwrap();
    let dir = a.join(veilfs_core::known::vault_id(&iv));
    // Another vault's state put under this vault's ID.
    let other = t.path().join("other");
    vault_with_block_map(&other, 512);
    let b = t.path().join("b");
    drop(client(&other, &b));
    let other_iv = reopen(&other).config().root_iv().unwrap();
    let snap = dir.join(veilfs_core::known::SNAPSHOT_NAME);
    let mine = std::fs::read(&snap).unwrap();
    std::fs::copy(b.join(veilfs_core::known::vault_id(&other_iv)).join("known"), &snap).unwrap();
    let r = client_as(&c, &a, Trust::Check);
    assert!(matches!(&r, Err(Error::Invalid(m)) if m.contains("does not authenticate")), "{r:?}");
    // Edited by hand: the trusted-since time changed.
    let mut edited = mine.clone();
    edited[47] ^= 1;
    std::fs::write(&snap, &edited).unwrap();
    let r = client_as(&c, &a, Trust::Check);
    assert!(matches!(&r, Err(Error::Invalid(m)) if m.contains("does not authenticate")), "{r:?}");
    std::fs::write(&snap, &mine).unwrap();
    assert!(client_as(&c, &a, Trust::Check).is_ok());
}

/// Two clients changed `f` at once and the sync tool kept the other's version as a conflict
/// copy: the older version under the name reads without an alarm while the newer one is
/// shown beside it as the copy. The same older version with no newer one shown is a
/// rollback, and a copy of the older version itself does not excuse it.
#[test]
fn an_older_version_beside_a_conflict_copy_of_the_newer_is_a_conflict_not_a_rollback() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let v = client(&c, &a);
    let root = v.root().unwrap();
    let (old, newer) = (data(3000, 1), data(3000, 2));
    write_file(&v, &root, "f", &old);
    let cp = cipher_path(&v, &root, "f");
    let old_ct = std::fs::read(&cp).unwrap();
    overwrite(&v, &root, "f", &newer);
    let new_ct = std::fs::read(&cp).unwrap();
    drop(v);
    let name = cp.file_name().unwrap().to_str().unwrap().to_string();
    let (d, s) = name.split_once('.').unwrap();
    let copy = cp.with_file_name(format!("{d}.sync-conflict-20261128-101010-ABCDEFG.{s}"));
    std::fs::write(&cp, &old_ct).unwrap();
    std::fs::write(&copy, &new_ct).unwrap();
    let v = client(&c, &a);
    let root = v.root().unwrap();
    assert_eq!(read_file(&v, &root, "f").unwrap(), old, "the older version under the name reads");
    let (entries, bad) = v.list(&root).unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    let shown = entries.iter().find(|e| copy.ends_with(&e.on_disk)).expect("the copy is shown");
    let f = v.open_file(&root, shown, libc::O_RDONLY).unwrap();
    let mut buf = vec![0u8; 3000];
    assert_eq!(f.read_at(&mut buf, 0, 3000).unwrap(), 3000);
    assert!(buf == newer, "the copy holds the newer version");
    drop((f, v));
    // Without the newer version shown, the older one is a rollback again.
    std::fs::write(&copy, &old_ct).unwrap();
    let v = client(&c, &a);
    let root = v.root().unwrap();
    assert_rollback(read_file(&v, &root, "f"), &cp, "rolled back");
}

/// Client A writes `f` twice (generations 1 and 2) and the sync tool leaves both versions in
/// the top directory: `older_is_copy` false puts the older under the name and the newer in a
/// Syncthing conflict copy, true the other way round. Returns the older and newer plaintext,
/// the ciphertext paths of the name and of the copy, and the file ID both carry.
fn conflict_pair(c: &Path, a: &Path, older_is_copy: bool) -> (Vec<u8>, Vec<u8>, PathBuf, PathBuf, [u8; 16]) {
    let v = client(c, a);
    let root = v.root().unwrap();
    let (old, newer) = (data(3000, 1), data(3000, 2));
    write_file(&v, &root, "f", &old);
    let id = file_id(&v, &root, "f");
    let cp = cipher_path(&v, &root, "f");
    let old_ct = std::fs::read(&cp).unwrap();
    overwrite(&v, &root, "f", &newer);
    let new_ct = std::fs::read(&cp).unwrap();
    let name = cp.file_name().unwrap().to_str().unwrap().to_string();
    let (d, s) = name.split_once('.').unwrap();
    let copy = cp.with_file_name(format!("{d}.sync-conflict-20261128-101010-ABCDEFG.{s}"));
    let (under_name, in_copy) = if older_is_copy { (&new_ct, &old_ct) } else { (&old_ct, &new_ct) };
    std::fs::write(&cp, under_name).unwrap();
    std::fs::write(&copy, in_copy).unwrap();
    (old, newer, cp, copy, id)
}

/// The directory `name` of the top directory of `v`.
fn subdir(v: &Vault, name: &str) -> CipherDir {
    let root = v.root().unwrap();
    let e = v.lookup(&root, name.as_bytes()).unwrap().unwrap();
    v.open_dir(&root, &e).unwrap()
}

/// The user keeps both versions of a conflict and puts the older one aside in another
/// directory, where no newer version lies beside it: it moves as a file of its own (a fresh
/// file ID, in its entry and its content), so the client that saw the newer generation reads
/// it there without a rollback alarm, now and after a fresh unlock. Both ways round: the
/// older version under the name, and the older version in the conflict copy.
#[test]
fn an_older_version_moved_to_another_directory_gets_a_fresh_file_id_and_is_not_a_rollback() {
    for older_is_copy in [false, true] {
        let (t, c) = setup();
        let a = t.path().join("a");
        let (old, newer, cp, copy, id) = conflict_pair(&c, &a, older_is_copy);
        let v = client(&c, &a);
        let root = v.root().unwrap();
        v.mkdir(&root, b"old", 0o755).unwrap();
        let old_dir = subdir(&v, "old");
        let (entries, _) = v.list(&root).unwrap();
        let older_cipher = if older_is_copy { &copy } else { &cp };
        let e = entries.iter().find(|e| older_cipher.ends_with(&e.on_disk)).expect("the older version is listed");
        assert_eq!(e.identity, id);
        // What the file carries besides its content goes with it: an attribute (encrypted
        // again for the new ID), its mode and its modification time.
        v.set_xattr(&root, e, b"user.note", b"kept aside").unwrap();
        let times =
            [libc::timespec { tv_sec: 1_000_000, tv_nsec: 5 }, libc::timespec { tv_sec: 2_000_000, tv_nsec: 7 }];
        v.set_attrs(&root, e, Some(0o640), None, Some(&times)).unwrap();
        let moved = v.rename(&root, e, &old_dir, b"f-older", None).unwrap();
        assert_ne!(moved.identity, id, "the moved version has a file ID of its own");
        assert_eq!(v.xattrs(&old_dir, &moved).unwrap(), vec![(b"user.note".to_vec(), b"kept aside".to_vec())]);
        assert_eq!(moved.stat.st_mode & 0o7777, 0o640);
        assert_eq!((moved.stat.st_mtime, moved.stat.st_mtime_nsec), (2_000_000, 7));
        assert_eq!(read_file(&v, &old_dir, "f-older").unwrap(), old);
        assert_eq!(file_id(&v, &old_dir, "f-older"), moved.identity, "its content carries the new ID");
        assert!(!older_cipher.exists(), "the original is gone from the top directory");
        drop(v);
        let v = client(&c, &a);
        let old_dir = subdir(&v, "old");
        assert_eq!(read_file(&v, &old_dir, "f-older").unwrap(), old, "a fresh unlock reads it too");
        // The name that left has its tombstone (FORMAT §19): a client that listed the
        // directory before finds no deletion by a non-client, and nothing else wrong.
        let r = Checker::new(&v, false, &|_| {}).run().unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
        // The newer version stays where it was, with the file ID the client remembers.
        let root = v.root().unwrap();
        let (entries, _) = v.list(&root).unwrap();
        assert_eq!(entries.len(), 2, "{entries:?}");
        let newer_entry = entries.iter().find(|e| e.identity == id).expect("the newer version keeps its ID");
        let f = v.open_file(&root, newer_entry, libc::O_RDONLY).unwrap();
        let mut buf = vec![0u8; 3000];
        assert_eq!(f.read_at(&mut buf, 0, 3000).unwrap(), 3000);
        assert!(buf == newer, "older_is_copy {older_is_copy}");
    }
}

/// What the conflict rule does not excuse stays an alarm after a move: a file put back to an
/// older version with no newer one beside it moves with its file ID (it is the only version)
/// and reads as rolled back in the other directory too; and an older version whose only
/// neighbour is no newer (a copy of itself) refuses to move at all, so a move never gives a
/// rolled-back file a fresh ID that would hide it.
#[test]
fn a_rolled_back_file_moved_to_another_directory_is_still_a_rollback() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let (_, cp) = roll_back_f(&c, &a);
    let old_ct = std::fs::read(&cp).unwrap();
    let v = client(&c, &a);
    let root = v.root().unwrap();
    v.mkdir(&root, b"old", 0o755).unwrap();
    let old_dir = subdir(&v, "old");
    let e = v.lookup(&root, b"f").unwrap().unwrap();
    // A copy of the older version beside it: two versions, both older than this client saw.
    let name = cp.file_name().unwrap().to_str().unwrap().to_string();
    let (d, s) = name.split_once('.').unwrap();
    let copy = cp.with_file_name(format!("{d}.sync-conflict-20261128-101010-ABCDEFG.{s}"));
    std::fs::write(&copy, &old_ct).unwrap();
    let r = v.rename(&root, &e, &old_dir, b"f", None);
    assert_rollback(r, &cp, "rolled back");
    assert!(cp.exists() && copy.exists(), "nothing moved");
    assert!(v.list(&old_dir).unwrap().0.is_empty(), "no copy left in the target");
    std::fs::remove_file(&copy).unwrap();
    // Alone, it moves as it is, keeping its file ID, and is caught where it lands.
    let moved = v.rename(&root, &e, &old_dir, b"f", None).unwrap();
    assert_eq!(moved.identity, e.identity);
    let moved_cp = old_dir.path.join(&moved.on_disk);
    assert_rollback(read_file(&v, &old_dir, "f"), &moved_cp, "rolled back: generation 1, this client saw 2");
}

/// A conflict copy renamed within its directory (as `fsck --repair` and a user's `mv` there
/// do) keeps its file ID: the two versions still lie side by side, where the conflict rule
/// tells them apart whichever is newer, and no content is copied. Moved out afterwards, the
/// renamed older version is still found as one of two versions of its file ID (by its
/// binding, not its name) and gets a fresh file ID; a file with no other version keeps its ID
/// across directories (nothing is copied).
#[test]
fn a_renamed_conflict_copy_keeps_its_file_id_in_its_directory_and_gets_a_fresh_one_when_it_leaves() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let (old, _, _, copy, id) = conflict_pair(&c, &a, true);
    let v = client(&c, &a);
    let root = v.root().unwrap();
    let (entries, _) = v.list(&root).unwrap();
    let e = entries.iter().find(|e| copy.ends_with(&e.on_disk)).unwrap();
    let renamed = v.rename(&root, e, &root, b"f, their version", None).unwrap();
    assert_eq!(renamed.identity, id, "within the directory the ID stays");
    assert_eq!(read_file(&v, &root, "f, their version").unwrap(), old, "still a conflict, not a rollback");
    v.mkdir(&root, b"old", 0o755).unwrap();
    let old_dir = subdir(&v, "old");
    let moved = v.rename(&root, &renamed, &old_dir, b"f, their version", None).unwrap();
    assert_ne!(moved.identity, id);
    drop(v);
    let v = client(&c, &a);
    let old_dir = subdir(&v, "old");
    assert_eq!(read_file(&v, &old_dir, "f, their version").unwrap(), old);
    // An ordinary file moves as it is.
    let root = v.root().unwrap();
    write_file(&v, &root, "g", &data(100, 3));
    let g = v.lookup(&root, b"g").unwrap().unwrap();
    let ino = g.stat.st_ino;
    let moved = v.rename(&root, &g, &old_dir, b"g", None).unwrap();
    assert_eq!((moved.identity, moved.stat.st_ino), (g.identity, ino));
}

/// What keeps its file ID even when it is one of two versions: a version with another hard
/// link (a fresh ID would split the names of one file; it moves as one file), and an
/// exchange of two entries (RENAME_EXCHANGE moves both objects as they are). Where they land
/// they are left to the conflict rule (docs/SECURITY.md §4.2a says so).
#[test]
fn a_hard_linked_version_and_an_exchange_keep_their_file_id() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let (_, _, _, copy, id) = conflict_pair(&c, &a, true);
    let v = client(&c, &a);
    let root = v.root().unwrap();
    v.mkdir(&root, b"old", 0o755).unwrap();
    let old_dir = subdir(&v, "old");
    let (entries, _) = v.list(&root).unwrap();
    let e = entries.iter().find(|e| copy.ends_with(&e.on_disk)).unwrap().clone();
    assert!(v.needs_fresh_id(&root, &e, &old_dir).unwrap(), "a conflict copy leaving its directory");
    // Exchanged with a file of another directory: both objects move as they are.
    write_file(&v, &old_dir, "other", &data(10, 5));
    let other = v.lookup(&old_dir, b"other").unwrap().unwrap();
    let (a_new, b_new) = v.exchange_at(&root, &e, &old_dir, &other).unwrap();
    let (in_old, _) = v.list(&old_dir).unwrap();
    assert_eq!(in_old.iter().find(|x| x.on_disk == a_new).unwrap().identity, id);
    // Exchanged back, then given a second name: a version with two links keeps its ID.
    let there = in_old.into_iter().find(|x| x.on_disk == a_new).unwrap();
    let back = v.list(&root).unwrap().0.into_iter().find(|x| x.on_disk == b_new).unwrap();
    v.exchange_at(&old_dir, &there, &root, &back).unwrap();
    let (entries, _) = v.list(&root).unwrap();
    let e = entries.iter().find(|x| x.identity == id && x.stat.st_ino == e.stat.st_ino).unwrap().clone();
    v.link(&root, &e, &root, b"second name").unwrap();
    let e = v.lookup(&root, &e.name).unwrap().unwrap();
    assert_eq!(e.stat.st_nlink, 2);
    assert!(!v.needs_fresh_id(&root, &e, &old_dir).unwrap());
    let moved = v.rename(&root, &e, &old_dir, b"moved", None).unwrap();
    assert_eq!((moved.identity, moved.stat.st_ino), (id, e.stat.st_ino));
}

/// The limit of the conflict rule, pinned: when the *newer* version leaves the directory
/// (moved away, or deleted), nothing beside the older one is newer any more, and the client
/// that saw the newer reads the older one as rolled back (docs/SECURITY.md §4.2a says what to
/// do). Moving the older version aside first avoids it.
#[test]
fn the_older_version_left_alone_when_the_newer_leaves_reads_as_rolled_back() {
    for delete in [false, true] {
        let (t, c) = setup();
        let a = t.path().join("a");
        let (_, newer, cp, copy, _) = conflict_pair(&c, &a, true);
        let v = client(&c, &a);
        let root = v.root().unwrap();
        v.mkdir(&root, b"new", 0o755).unwrap();
        let new_dir = subdir(&v, "new");
        let e = v.lookup(&root, b"f").unwrap().unwrap();
        if delete {
            v.remove(&root, &e).unwrap();
        } else {
            v.rename(&root, &e, &new_dir, b"f", None).unwrap();
            assert_eq!(read_file(&v, &new_dir, "f").unwrap(), newer);
        }
        let (entries, _) = v.list(&root).unwrap();
        let older = entries.iter().find(|x| copy.ends_with(&x.on_disk)).unwrap();
        assert!(!cp.exists());
        assert_rollback(v.open_file(&root, older, libc::O_RDONLY).map(|_| ()), &copy, "rolled back");
    }
}

/// The states a crash can leave in a move with a fresh file ID, made by hand (the steps'
/// order is the claim: the copy is written under a partial name, flushed, put in place, and
/// only then is the original removed). Before the copy has its name: the original is as it
/// was, no listing shows the partial, and `fsck --repair` removes it. After, before the
/// original goes: both versions read (the original still beside the newer version, the copy
/// a file of its own), and fsck finds nothing wrong.
#[test]
fn a_move_with_a_fresh_file_id_cut_short_leaves_the_original_or_both_versions() {
    let (t, c) = setup();
    let a = t.path().join("a");
    let (old, _, cp, _, _) = conflict_pair(&c, &a, false);
    let v = client(&c, &a);
    let root = v.root().unwrap();
    v.mkdir(&root, b"old", 0o755).unwrap();
    let old_dir = subdir(&v, "old");
    let original = std::fs::read(&cp).unwrap();
    // The top directory's tombstone logs (FORMAT §19) as they were before the move.
    let logs = |dir: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("veilfs.D"))
            .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
            .collect()
    };
    let top = cp.parent().unwrap();
    let logs_before = logs(top);
    let e = v.lookup(&root, b"f").unwrap().unwrap();
    v.rename(&root, &e, &old_dir, b"f", None).unwrap();
    // Put back as a crash after the copy took its name would have left it: the original
    // there, and no tombstone record yet for its removal.
    std::fs::write(&cp, &original).unwrap();
    for (path, _) in logs(top) {
        match logs_before.iter().find(|(p, _)| *p == path) {
            Some((_, bytes)) => std::fs::write(&path, bytes).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
    }
    assert_eq!(read_file(&v, &root, "f").unwrap(), old);
    assert_eq!(read_file(&v, &old_dir, "f").unwrap(), old);
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    // A crash while the copy was written: a partial beside the files, shown nowhere.
    let partial = old_dir.path.join("veilfs.part.AAAAAAAAAAAAAAAA");
    std::fs::write(&partial, &original[..original.len() / 2]).unwrap();
    assert_eq!(v.list(&old_dir).unwrap().0.len(), 1);
    let r = Checker::new(&v, true, &|_| {}).run().unwrap();
    assert!(r.problems.iter().any(|p| p.cipher_path == partial && p.repaired.is_some()), "{:?}", r.problems);
    assert!(!partial.exists());
    assert_eq!(read_file(&v, &old_dir, "f").unwrap(), old);
}
