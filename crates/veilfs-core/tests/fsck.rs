//! `fsck` through the engine: every crash leftover the engine can produce is found and
//! repaired, damage is found and moved to lost+found, and a check never writes.

use crate::common::*;
use std::os::fd::AsFd;
use veilfs_core::fsck::{Checker, ProblemKind, Report};
use veilfs_core::names::DIRIV_NAME;
use veilfs_core::{sys, EntryKind, Vault};

fn check(v: &Vault, repair: bool) -> Report {
    Checker::new(v, repair, &|_| {}).run().unwrap()
}

fn kinds(r: &Report) -> Vec<ProblemKind> {
    let mut k: Vec<_> = r.problems.iter().map(|p| p.kind).collect();
    k.sort_by_key(|k| format!("{k:?}"));
    k
}

/// Every ciphertext byte and name, to prove a check writes nothing.
fn snapshot(p: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for e in walk(p) {
        let data = if e.is_file() { std::fs::read(&e).unwrap() } else { Vec::new() };
        out.push((e.display().to_string(), data));
    }
    out.sort();
    out
}

fn walk(p: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap().flatten() {
        out.push(e.path());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

#[test]
fn a_clean_vault_checks_clean_and_every_object_is_counted() {
    let t = tempfile::tempdir().unwrap();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    write_file(&v, &root, "a", &data(10_000, 1));
    let (_, sub) = v.mkdir(&root, b"d", 0o755).unwrap();
    write_file(&v, &sub, &"L".repeat(200), &data(5, 2));
    v.symlink(&sub, b"s", b"target").unwrap();
    let a = v.lookup(&root, b"a").unwrap().unwrap();
    v.set_xattr(&root, &a, b"user.k", b"v").unwrap();
    let r = check(&v, false);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!((r.dirs, r.files, r.symlinks, r.bytes), (2, 2, 1, 10_005));
    assert!(r.is_clean());
}

#[test]
fn every_crash_leftover_is_found_without_writing_and_repaired() {
    crash_leftovers(true);
}

#[test]
fn every_crash_leftover_is_found_and_repaired_in_a_vault_without_iv_in_name() {
    crash_leftovers(false);
}

fn crash_leftovers(iv_in_name: bool) {
    let t = tempfile::tempdir().unwrap();
    let v = vault_of_iv_form(t.path(), iv_in_name);
    let root = v.root().unwrap();
    let a = write_file(&v, &root, "a", b"old a");
    let b = write_file(&v, &root, "b", b"new a");
    // An interrupted rename of b over a: b's object already carries a's name, the old a
    // is still there.
    let (_, b_as_a) = v.rebind(&root, b"a", &b).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    sys::renameat2(root.fd(), b.on_disk.as_bytes(), root.fd(), b_as_a.as_bytes(), libc::RENAME_NOREPLACE).unwrap();
    // An interrupted mkdir: a directory under a temporary name with its IV copy.
    sys::mkdirat(root.fd(), b"veilfs.tmp.AAAAAAAAAAAAAAAA", 0o700).unwrap();
    let tmp = sys::open_dir_at(root.fd(), b"veilfs.tmp.AAAAAAAAAAAAAAAA").unwrap();
    v.iv_copy().write(tmp.as_fd(), &[7; 16]).unwrap();
    // A long name whose entry is gone but whose side file stayed (a crash inside unlink).
    let long = "x".repeat(200);
    let l = write_file(&v, &root, &long, b"long");
    sys::unlinkat(root.fd(), l.on_disk.as_bytes(), false).unwrap();
    // A directory whose IV copy is missing (a crash right after mkdir, old format writers).
    let (_, d) = v.mkdir(&root, b"d", 0o755).unwrap();
    write_file(&v, &d, "inside", b"inside");
    v.iv_copy().remove(d.fd(), &d.iv).unwrap();

    let before = snapshot(t.path());
    let r = check(&v, false);
    assert_eq!(snapshot(t.path()), before, "a check without --repair wrote something");
    assert_eq!(
        kinds(&r),
        [ProblemKind::MissingDirIv, ProblemKind::OrphanSideFile, ProblemKind::TempName],
        "{:#?}",
        r.problems
    );
    // The interrupted rename left two valid entries for "a": a conflict, as when two machines
    // make one name, shown and reported (not damage), the older as "a (conflict)".
    let shown: Vec<_> = r.conflicts.iter().map(|c| (c.plain_path.clone(), c.tool)).collect();
    assert_eq!(shown, [(Some("a (conflict)".into()), "veilfs")]);
    assert!(!r.is_clean());
    assert!(r.problems.iter().all(|p| p.kind.is_crash_leftover()));

    let r = check(&v, true);
    assert!(r.is_clean(), "{:#?}", r.problems);
    // Clean afterwards, the newer entry won, and nothing was lost: the older a is an ordinary
    // entry under the name it was shown as, the temporary directory is in lost+found, bound
    // to the identity it carries.
    let again = check(&v, false);
    assert!(again.problems.is_empty() && again.conflicts.is_empty(), "{:#?}", again.problems);
    let root = v.root().unwrap();
    assert_eq!(read_file(&v, &root, "a").unwrap(), b"new a");
    assert_eq!(read_file(&v, &root, "a (conflict)").unwrap(), b"old a");
    assert_eq!(
        read_file(&v, &v.open_dir(&root, &v.lookup(&root, b"d").unwrap().unwrap()).unwrap(), "inside").unwrap(),
        b"inside"
    );
    let lf = v.lost_found().unwrap();
    let (entries, bad) = v.list(&lf).unwrap();
    assert!(bad.is_empty());
    let mut found: Vec<(EntryKind, Vec<u8>)> = Vec::new();
    for e in &entries {
        let content = if e.kind == EntryKind::File {
            read_file(&v, &lf, &String::from_utf8_lossy(&e.name)).unwrap()
        } else {
            Vec::new()
        };
        found.push((e.kind, content));
    }
    found.sort_by_key(|(k, c)| (*k as u8, c.clone()));
    assert_eq!(found, [(EntryKind::Dir, Vec::new())]);
    let _ = a;
}

#[test]
fn damage_is_found_and_moved_to_lost_found_keeping_what_authenticates() {
    damage(true);
}

#[test]
fn damage_is_found_and_moved_to_lost_found_in_a_vault_without_iv_in_name() {
    damage(false);
}

fn damage(iv_in_name: bool) {
    let t = tempfile::tempdir().unwrap();
    let v = vault_of_iv_form(t.path(), iv_in_name);
    let root = v.root().unwrap();
    write_file(&v, &root, "good", &data(9000, 1));
    write_file(&v, &root, "bad", &data(9000, 2));
    let (_, d1) = v.mkdir(&root, b"d1", 0o755).unwrap();
    let (_, d2) = v.mkdir(&root, b"d2", 0o755).unwrap();
    write_file(&v, &d2, "y", b"y");
    // A flipped bit in a block; a directory IV copied from another directory; a sync
    // tool's conflict copy of a file.
    let bad = cipher_path(&v, &root, "bad");
    let mut c = std::fs::read(&bad).unwrap();
    c[100] ^= 1;
    std::fs::write(&bad, c).unwrap();
    copy_iv_copy(&v, &d1, &d2);
    let good = cipher_path(&v, &root, "good");
    std::fs::copy(&good, root.path.join("conflict copy of good")).unwrap();

    let r = check(&v, false);
    assert_eq!(kinds(&r), [ProblemKind::Damaged, ProblemKind::Damaged, ProblemKind::Foreign], "{:#?}", r.problems);
    for name in [bad.file_name().unwrap().to_str().unwrap(), DIRIV_NAME, "conflict copy of good"] {
        assert!(r.problems.iter().any(|p| p.cipher_path.to_string_lossy().contains(name)), "{name} named");
    }
    let r = check(&v, true);
    assert!(r.problems.iter().all(|p| p.repaired.is_some()), "{:#?}", r.problems);
    // Afterwards the vault is clean; the damaged file is still reported, kept in lost+found.
    let again = check(&v, false);
    assert!(again.is_clean(), "{:#?}", again.problems);
    assert_eq!(again.problems.len(), 1, "{:#?}", again.problems);
    assert_eq!(again.problems[0].repaired.as_deref(), Some("kept in /lost+found"));
    // d2's IV copy was rewritten from its entry: y reads again. The conflict copy is
    // readable in lost+found (bound to its header's ID); the damaged file is kept there.
    let root = v.root().unwrap();
    let d2 = v.open_dir(&root, &v.lookup(&root, b"d2").unwrap().unwrap()).unwrap();
    assert_eq!(read_file(&v, &d2, "y").unwrap(), b"y");
    let lf = v.lost_found().unwrap();
    let (entries, _) = v.list(&lf).unwrap();
    let readable: Vec<bool> =
        entries.iter().map(|e| read_file(&v, &lf, &String::from_utf8_lossy(&e.name)).is_ok()).collect();
    assert_eq!(readable.len(), 2);
    assert_eq!(readable.iter().filter(|r| **r).count(), 1, "the conflict copy reads, the damaged file does not");
}

/// A sync tool renamed a backing directory on a conflict (its entry name no longer parses):
/// `--repair` moves it to lost+found bound to the IV its copy carries, so its subtree reads.
/// With `iv-in-name` an IV name copied in beside the right one does not mislead it.
fn renamed_directory_keeps_its_subtree(iv_in_name: bool) {
    let t = tempfile::tempdir().unwrap();
    let v = vault_of_iv_form(t.path(), iv_in_name);
    let root = v.root().unwrap();
    let (e, d) = v.mkdir(&root, b"d", 0o755).unwrap();
    write_file(&v, &d, "inside", b"kept");
    let (_, other) = v.mkdir(&root, b"other", 0o755).unwrap();
    if iv_in_name {
        v.iv_copy().write(d.fd(), &other.iv).unwrap();
    }
    std::fs::rename(root.path.join(&e.on_disk), root.path.join("d.sync-conflict-20260101")).unwrap();
    let r = check(&v, true);
    assert!(r.is_clean(), "{:#?}", r.problems);
    let lf = v.lost_found().unwrap();
    let (entries, bad) = v.list(&lf).unwrap();
    assert!(bad.is_empty() && entries.len() == 1, "{bad:?}");
    let moved = v.open_dir(&lf, &entries[0]).unwrap();
    assert_eq!(read_file(&v, &moved, "inside").unwrap(), b"kept");
}

#[test]
fn directory_renamed_by_a_sync_tool_keeps_its_subtree_in_lost_found() {
    renamed_directory_keeps_its_subtree(true);
    renamed_directory_keeps_its_subtree(false);
}

#[test]
fn extra_and_wrong_iv_names_are_reported_and_repaired() {
    let t = tempfile::tempdir().unwrap();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    let (_, d1) = v.mkdir(&root, b"d1", 0o755).unwrap();
    let (_, d2) = v.mkdir(&root, b"d2", 0o755).unwrap();
    let (_, d3) = v.mkdir(&root, b"d3", 0o755).unwrap();
    write_file(&v, &d3, "z", b"z");
    // d1: a copy of d2's IV name beside its own, and an old-form IV file (both extra).
    v.iv_copy().write(d1.fd(), &d2.iv).unwrap();
    sys::write_new_file(d1.fd(), DIRIV_NAME.as_bytes(), &d2.iv, 0o400).unwrap();
    // d3: its IV name replaced by a FIFO.
    let at = v.iv_copy().name(&d3.iv);
    sys::unlinkat(d3.fd(), at.as_bytes(), false).unwrap();
    sys::mknodat(d3.fd(), at.as_bytes(), libc::S_IFIFO | 0o600, 0).unwrap();

    let before = snapshot(t.path());
    let r = check(&v, false);
    assert_eq!(snapshot(t.path()), before, "a check without --repair wrote something");
    assert_eq!(kinds(&r), [ProblemKind::Damaged; 3], "{:#?}", r.problems);
    for p in [d1.path.join(v.iv_copy().name(&d2.iv)), d1.path.join(DIRIV_NAME), d3.path.join(&at)] {
        assert!(r.problems.iter().any(|x| x.cipher_path == p), "{} reported: {:#?}", p.display(), r.problems);
    }
    let r = check(&v, true);
    assert!(r.is_clean(), "{:#?}", r.problems);
    let again = check(&v, false);
    assert!(again.problems.is_empty(), "{:#?}", again.problems);
    let names = |d: &veilfs_core::CipherDir| {
        let mut n: Vec<String> =
            std::fs::read_dir(&d.path).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        n.retain(|n| n.starts_with(DIRIV_NAME));
        n
    };
    assert_eq!(names(&d1), [v.iv_copy().name(&d1.iv)]);
    assert_eq!(names(&d3), [at.as_str()]);
    assert!(std::fs::symlink_metadata(d3.path.join(&at)).unwrap().is_file());
    assert_eq!(read_file(&v, &d3, "z").unwrap(), b"z");
}

// Files with a block map (FORMAT.md §5.10): damage, salvage and the session logs' leftovers.

const MB: u64 = 512;

fn block_map_vault() -> (tempfile::TempDir, Vault, veilfs_core::CipherDir) {
    let t = tempfile::tempdir().unwrap();
    let v = vault_with_block_map(t.path(), MB as u32);
    let root = v.root().unwrap();
    (t, v, root)
}

fn put(p: &std::path::Path, off: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new().write(true).open(p).unwrap().write_all_at(bytes, off).unwrap();
}

/// The session logs in the vault's top directory.
fn logs(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    (std::fs::read_dir(dir).unwrap().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(veilfs_core::stash::STASH_PREFIX))
        .map(|e| e.path())
        .collect()
}

/// A file left UNSETTLED by a session cut short (a write at `off`); its log's bytes.
fn cut_short_session(v: &Vault, root: &veilfs_core::CipherDir, name: &str, d: &[u8], off: u64) -> Vec<u8> {
    write_file(v, root, name, d);
    let e = v.lookup(root, name.as_bytes()).unwrap().unwrap();
    let f = v.open_file(root, &e, libc::O_RDWR).unwrap();
    f.set_defer_sparse(true);
    f.write_at(b"session", off, d.len() as u64).unwrap();
    drop(f);
    let c = std::fs::read(cipher_path(v, root, name)).unwrap();
    let id: [u8; 16] = c[4..20].try_into().unwrap();
    std::fs::read(v.root_path().join(veilfs_core::stash::stash_name(&id))).unwrap()
}

#[test]
fn repair_of_a_block_map_file_with_a_rolled_back_block_salvages_every_other_block() {
    use veilfs_core::content::blockmap::MapLayout;
    let l = MapLayout::new(MB, 28);
    let (t, v, root) = block_map_vault();
    let mut d = data(20 * MB as usize, 1);
    write_file(&v, &root, "f", &d);
    let p = cipher_path(&v, &root, "f");
    let old = std::fs::read(&p).unwrap();
    let e = v.lookup(&root, b"f").unwrap().unwrap();
    v.open_file(&root, &e, libc::O_RDWR).unwrap().write_at(b"newer", 5 * MB, d.len() as u64).unwrap();
    let at = l.block_offset(5) as usize;
    put(&p, at as u64, &old[at..at + (MB + 28) as usize]);

    let before = snapshot(t.path());
    let r = check(&v, false);
    assert_eq!(snapshot(t.path()), before, "a check without --repair wrote something");
    assert_eq!(kinds(&r), [ProblemKind::Damaged], "{:#?}", r.problems);
    assert!(r.problems[0].detail.contains("block 5 is not the version"), "{:#?}", r.problems);
    let r = check(&v, true);
    let done = r.problems[0].repaired.clone().unwrap_or_default();
    assert!(done.contains("moved to /lost+found") && done.contains("lost byte ranges: 2560..3072"), "{done}");
    assert!(done.contains("rollback"), "{done}");
    // The salvaged copy has every other block; the original is kept in lost+found, bound to
    // its header's ID, so salvage (and nothing else) still reads it.
    d[5 * MB as usize..6 * MB as usize].fill(0);
    assert!(read_file(&v, &root, "f").unwrap() == d);
    let again = check(&v, false);
    assert!(again.is_clean() && again.problems.len() == 1, "{:#?}", again.problems);
    let lf = v.lost_found().unwrap();
    let (entries, _) = v.list(&lf).unwrap();
    assert_eq!(entries.len(), 1);
    let f = v.open_for_salvage(&lf, &entries[0]).unwrap();
    let s = f.salvage(|_| Ok(())).unwrap();
    assert_eq!((s.kept, s.lost), (19 * MB, vec![(5 * MB, 6 * MB)]));
}

#[test]
fn a_session_log_left_beside_a_settled_block_map_file_is_a_crash_leftover_removed_on_repair() {
    let (t, v, root) = block_map_vault();
    let d = data(8 * MB as usize, 2);
    let log = cut_short_session(&v, &root, "f", &d, 3 * MB);
    // Settled (as a writer's open would), then the log as a crash after the settled header
    // and before the log's removal leaves it.
    let e = v.lookup(&root, b"f").unwrap().unwrap();
    assert!(v.open_file(&root, &e, libc::O_RDWR).unwrap().recover_tail().unwrap().is_some());
    assert!(logs(t.path()).is_empty());
    let c = std::fs::read(cipher_path(&v, &root, "f")).unwrap();
    let log_path = v.root_path().join(veilfs_core::stash::stash_name(&c[4..20].try_into().unwrap()));
    std::fs::write(&log_path, &log).unwrap();

    let before = snapshot(t.path());
    let r = check(&v, false);
    assert_eq!(snapshot(t.path()), before);
    assert_eq!(kinds(&r), [ProblemKind::OrphanSideFile], "{:#?}", r.problems);
    assert!(r.problems[0].detail.contains("write-session log") && r.problems[0].kind.is_crash_leftover());
    assert_eq!(r.problems[0].cipher_path, log_path);
    assert!(check(&v, true).is_clean());
    assert!(!log_path.exists());
    assert!(check(&v, false).problems.is_empty());
}

#[test]
fn a_log_of_another_file_beside_an_unsettled_block_map_file_is_a_stray_log_removed_on_repair() {
    let (t, v, root) = block_map_vault();
    let d = data(8 * MB as usize, 3);
    // g's log, taken while g was UNSETTLED; g is then settled (its log goes).
    let g_log = cut_short_session(&v, &root, "g", &d, 2 * MB);
    let e = v.lookup(&root, b"g").unwrap().unwrap();
    v.open_file(&root, &e, libc::O_RDWR).unwrap().recover_tail().unwrap();
    // f is UNSETTLED and its log is replaced by g's.
    cut_short_session(&v, &root, "f", &d, 6 * MB);
    let f_log = logs(t.path()).pop().unwrap();
    std::fs::write(&f_log, &g_log).unwrap();
    // h is UNSETTLED with its own log, and a block the session did not touch is damaged:
    // its log stays with it through the repair (its original, in lost+found, needs it).
    cut_short_session(&v, &root, "h", &d, 6 * MB);
    let h_log = logs(t.path()).into_iter().find(|p| *p != f_log).unwrap();
    let l = veilfs_core::content::blockmap::MapLayout::new(MB, 28);
    put(&cipher_path(&v, &root, "h"), l.block_offset(1) + 50, &[0x42]);

    let r = check(&v, false);
    assert_eq!(kinds(&r), [ProblemKind::Damaged, ProblemKind::Damaged, ProblemKind::StrayLog], "{:#?}", r.problems);
    let stray = r.problems.iter().find(|p| p.kind == ProblemKind::StrayLog).unwrap();
    assert_eq!(stray.cipher_path, f_log);
    assert!(!stray.kind.is_crash_leftover());
    let r = check(&v, true);
    assert!(r.is_clean(), "{:#?}", r.problems);
    assert!(!f_log.exists(), "the stray log is removed");
    assert!(h_log.exists(), "h's log stays with h");
    // f is salvaged without a log that reads it: the block its session wrote is kept,
    // unchecked; h by its log, losing only the damaged block.
    let fr = r.problems.iter().find(|p| p.plain_path.as_deref() == Some(std::path::Path::new("f"))).unwrap();
    assert!(fr.repaired.as_deref().unwrap().contains("not checked against the block map"), "{fr:#?}");
    let mut want = d.clone();
    want[6 * MB as usize..6 * MB as usize + 7].copy_from_slice(b"session");
    assert!(read_file(&v, &root, "f").unwrap() == want);
    want[MB as usize..2 * MB as usize].fill(0);
    assert!(read_file(&v, &root, "h").unwrap() == want);
    let again = check(&v, false);
    assert!(again.is_clean(), "{:#?}", again.problems);
    assert!(again.problems.iter().all(|p| p.kind == ProblemKind::Damaged), "{:#?}", again.problems);
}

#[test]
fn bytes_appended_to_a_block_map_file_are_named_and_repair_keeps_every_block() {
    let (_t, v, root) = block_map_vault();
    let d = data(10 * MB as usize - 7, 4);
    write_file(&v, &root, "f", &d);
    write_file(&v, &root, "g", b"g");
    let p = cipher_path(&v, &root, "f");
    let mut c = std::fs::read(&p).unwrap();
    c.extend_from_slice(b"appended");
    std::fs::write(&p, &c).unwrap();
    // A header alone, of another file: not this file's header.
    let g = std::fs::read(cipher_path(&v, &root, "g")).unwrap();
    let e = write_file(&v, &root, "e", b"");
    std::fs::write(root.path.join(&e.on_disk), &g[..92]).unwrap();

    let r = check(&v, false);
    assert_eq!(kinds(&r), [ProblemKind::Damaged, ProblemKind::Damaged], "{:#?}", r.problems);
    let f = r.problems.iter().find(|x| x.cipher_path == p).unwrap();
    assert!(f.detail.contains("8 ciphertext bytes follow") && f.detail.contains("every block authenticates"), "{f:#?}");
    let other = r.problems.iter().find(|x| x.cipher_path != p).unwrap();
    assert!(other.detail.contains("another file"), "{other:#?}");
    let r = check(&v, true);
    let f = r.problems.iter().find(|x| x.cipher_path == p).unwrap();
    assert!(f.repaired.as_deref().unwrap().contains("lost byte ranges: none"), "{f:#?}");
    assert!(read_file(&v, &root, "f").unwrap() == d);
}
