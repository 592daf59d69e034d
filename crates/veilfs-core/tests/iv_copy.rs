//! A directory's IV copy (docs/FORMAT.md §7.1) in both forms: the empty file named
//! `veilfs.diriv.<b64(iv)>` of vaults with `iv-in-name`, and the 16-byte `veilfs.diriv` of
//! vaults made before it. Attacks on it are integrity errors naming the ciphertext path, a
//! removed copy is a crash leftover that is restored, and both forms keep reading and writing.

use crate::common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use veilfs_core::diriv::IvCopy;
use veilfs_core::names::{DIRIV_NAME, DIRIV_NAME_PREFIX};
use veilfs_core::{CipherDir, Error, Vault};

/// Names in the backing directory `dir` that belong to an IV copy (either form).
fn iv_names(dir: &CipherDir) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(&dir.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(DIRIV_NAME))
        .collect();
    out.sort();
    out
}

fn assert_integrity<T: std::fmt::Debug>(r: veilfs_core::Result<T>, needles: &[&str]) {
    match r {
        Err(Error::Auth { what, detail }) => {
            let msg = format!("{what}: {detail}");
            for n in needles {
                assert!(msg.contains(n), "integrity error {msg:?} should mention {n:?}");
            }
        }
        other => panic!("expected an integrity error, got {other:?}"),
    }
}

/// A vault of the form asked for with directory `d` holding file `f`.
fn with_dir(t: &std::path::Path, iv_in_name: bool) -> (Vault, CipherDir, CipherDir) {
    let v = vault_of_iv_form(t, iv_in_name);
    let root = v.root().unwrap();
    let (_, d) = v.mkdir(&root, b"d", 0o755).unwrap();
    write_file(&v, &d, "f", b"inside d");
    (v, root, d)
}

fn open_d(v: &Vault, root: &CipherDir) -> veilfs_core::Result<CipherDir> {
    v.open_dir(root, &v.lookup(root, b"d").unwrap().unwrap())
}

#[test]
fn a_new_vault_keeps_each_iv_in_an_empty_0400_file_named_after_it() {
    let t = tempfile::tempdir().unwrap();
    let (v, root, d) = with_dir(t.path(), true);
    assert_eq!(v.iv_copy(), IvCopy::Name);
    assert!(v.config().has_feature(veilfs_core::config::FEATURE_IV_IN_NAME));
    for dir in [&root, &d] {
        let name = format!("{DIRIV_NAME_PREFIX}{}", veilfs_core::names::b64_encode(&dir.iv));
        assert_eq!(iv_names(dir), [name.as_str()]);
        let m = std::fs::symlink_metadata(dir.path.join(&name)).unwrap();
        assert!(m.is_file() && m.len() == 0 && m.blocks() == 0, "{m:?}");
        assert_eq!(m.permissions().mode() & 0o7777, 0o400);
    }
}

#[test]
fn iv_name_copied_from_another_directory_is_an_integrity_error_naming_it() {
    let t = tempfile::tempdir().unwrap();
    let (v, root, d) = with_dir(t.path(), true);
    let (_, other) = v.mkdir(&root, b"other", 0o755).unwrap();
    copy_iv_copy(&v, &other, &d);
    let copied = iv_copy_path(&v, &other).file_name().unwrap().to_str().unwrap().to_string();
    assert_integrity(open_d(&v, &root), &[&format!("{}/{copied}", d.path.display()), "copied from another directory"]);
    // Nothing was "restored" over the evidence, and the listing through the parent still works.
    assert_eq!(iv_names(&d), [copied]);
    assert_eq!(v.list(&root).unwrap().0.len(), 2);
}

#[test]
fn planted_fifo_directory_or_symlink_as_the_iv_copy_is_an_integrity_error_not_a_hang() {
    for iv_in_name in [true, false] {
        for plant in ["fifo", "directory", "symlink"] {
            let t = tempfile::tempdir().unwrap();
            let (v, root, d) = with_dir(t.path(), iv_in_name);
            let at = iv_copy_path(&v, &d);
            std::fs::remove_file(&at).unwrap();
            match plant {
                "fifo" => veilfs_core::sys::mknodat(
                    d.fd(),
                    at.file_name().unwrap().as_encoded_bytes(),
                    libc::S_IFIFO | 0o600,
                    0,
                )
                .unwrap(),
                "directory" => std::fs::create_dir(&at).unwrap(),
                _ => std::os::unix::fs::symlink("/dev/zero", &at).unwrap(),
            }
            let name = at.file_name().unwrap().to_str().unwrap().to_string();
            assert_integrity(open_d(&v, &root), &[&name]);
            assert!(std::fs::symlink_metadata(&at).is_ok(), "{plant} left in place ({iv_in_name})");
        }
    }
}

#[test]
fn removed_iv_copy_is_read_without_writing_it() {
    // A reader never writes: in a synced folder the copy may still be on its way, and a
    // reader that restored it would race the sync tool. `fsck --repair` restores it.
    for iv_in_name in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let (v, root, d) = with_dir(t.path(), iv_in_name);
        let at = iv_copy_path(&v, &d);
        std::fs::remove_file(&at).unwrap();
        let d2 = open_d(&v, &root).unwrap();
        assert_eq!(read_file(&v, &d2, "f").unwrap(), b"inside d");
        assert!(std::fs::symlink_metadata(&at).is_err(), "written by a reader ({iv_in_name})");
        assert!(!v.verify_diriv(&d2).unwrap());
        v.restore_diriv(&d2).unwrap();
        assert!(v.verify_diriv(&d2).unwrap());
    }
}

#[test]
fn a_directory_is_empty_with_only_its_own_iv_copy() {
    for iv_in_name in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let (v, root, d) = with_dir(t.path(), iv_in_name);
        let f = v.lookup(&d, b"f").unwrap().unwrap();
        v.remove_entry(&d, &f.on_disk, f.kind, &f.identity).unwrap();
        // Another directory's IV copy inside makes it non-empty: it is not ours to delete.
        let (_, other) = v.mkdir(&root, b"other", 0o755).unwrap();
        if iv_in_name {
            v.iv_copy().write(d.fd(), &other.iv).unwrap();
            let e = v.lookup(&root, b"d").unwrap().unwrap();
            let r = v.remove_entry(&root, &e.on_disk, e.kind, &e.identity);
            assert_eq!(r.unwrap_err().errno(), libc::ENOTEMPTY);
            v.iv_copy().remove(d.fd(), &other.iv).unwrap();
        }
        let e = v.lookup(&root, b"d").unwrap().unwrap();
        v.remove_entry(&root, &e.on_disk, e.kind, &e.identity).unwrap();
        assert!(v.lookup(&root, b"d").unwrap().is_none());
        assert!(std::fs::symlink_metadata(&d.path).is_err());
        // Renaming a directory over an empty one, then removing it.
        let (_, a) = v.mkdir(&root, b"a", 0o755).unwrap();
        write_file(&v, &a, "x", b"x");
        v.mkdir(&root, b"b", 0o755).unwrap();
        let ea = v.lookup(&root, b"a").unwrap().unwrap();
        let eb = v.lookup(&root, b"b").unwrap().unwrap();
        v.rename(&root, &ea, &root, b"b", Some(&eb)).unwrap();
        let b = v.open_dir(&root, &v.lookup(&root, b"b").unwrap().unwrap()).unwrap();
        assert_eq!(read_file(&v, &b, "x").unwrap(), b"x");
        assert_eq!(iv_names(&b), [v.iv_copy().name(&b.iv)]);
    }
}

#[test]
fn old_vault_without_iv_in_name_still_reads_and_writes_its_iv_file() {
    let t = tempfile::tempdir().unwrap();
    let (v, root, d) = with_dir(t.path(), false);
    assert_eq!(v.iv_copy(), IvCopy::File);
    let v = reopen(t.path());
    let root2 = v.root().unwrap();
    let (_, sub) = v.mkdir(&open_d(&v, &root2).unwrap(), b"sub", 0o700).unwrap();
    write_file(&v, &sub, "g", b"deeper");
    for dir in [&root, &d, &sub] {
        assert_eq!(iv_names(dir), [DIRIV_NAME]);
        assert_eq!(std::fs::read(dir.path.join(DIRIV_NAME)).unwrap(), dir.iv);
    }
    assert_eq!(read_file(&v, &d, "f").unwrap(), b"inside d");
    assert_eq!(read_file(&v, &sub, "g").unwrap(), b"deeper");
    // An empty `veilfs.diriv` (a crash between creating and writing it, or a sync tool still
    // writing it) is read past, not written by a reader; the repair restores it.
    std::fs::remove_file(sub.path.join(DIRIV_NAME)).unwrap();
    std::fs::write(sub.path.join(DIRIV_NAME), b"").unwrap();
    let d2 = open_d(&v, &root2).unwrap();
    let sub2 = v.open_dir(&d2, &v.lookup(&d2, b"sub").unwrap().unwrap()).unwrap();
    assert_eq!(read_file(&v, &sub2, "g").unwrap(), b"deeper");
    assert_eq!(std::fs::read(sub2.path.join(DIRIV_NAME)).unwrap(), b"");
    v.restore_diriv(&sub2).unwrap();
    assert_eq!(std::fs::read(sub2.path.join(DIRIV_NAME)).unwrap(), sub.iv);
}
