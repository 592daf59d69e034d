//! Linux's sizes through the engine (feature `overflow`, docs/FORMAT.md §8.1, §16.1): symlink
//! targets up to 4095 bytes and xattr values up to 65536 bytes, their overflow pieces carried
//! by link, rename, exchange and removal, crash leftovers found and repaired by fsck, and
//! vaults made before the feature keeping their limits with an error that says so.

use crate::common::*;
use veilfs_core::fsck::{Checker, ProblemKind};
use veilfs_core::symlink::{target_file_name, TARGET_FILE_PREFIX};
use veilfs_core::CipherDir;

fn side_files(dir: &CipherDir) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&dir.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(TARGET_FILE_PREFIX))
        .collect();
    v.sort();
    v
}

fn errno<T: std::fmt::Debug>(r: veilfs_core::Result<T>) -> i32 {
    r.unwrap_err().errno()
}

#[test]
fn symlink_targets_up_to_4095_bytes_round_trip_and_their_side_file_follows_the_object() {
    let t = tempfile::tempdir().unwrap();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    let (_, d) = v.mkdir(&root, b"d", 0o755).unwrap();
    let long = vec![b'x'; 4095];
    let s = v.symlink(&root, b"s", &long).unwrap();
    assert_eq!(side_files(&root), [target_file_name(&s.identity)]);
    assert_eq!(v.readlink(&root, &s).unwrap(), long);
    assert_eq!(errno(v.symlink(&root, b"t", &[b'x'; 4096])), libc::ENAMETOOLONG);
    // A short target stays inline: no side file.
    v.symlink(&root, b"short", b"/etc").unwrap();
    assert_eq!(side_files(&root).len(), 1);
    // A hard link in another directory gets the side file there too; removing one link
    // keeps it for the other.
    let l = v.link(&root, &s, &d, b"l").unwrap();
    assert_eq!(side_files(&d).len(), 1);
    v.remove(&root, &v.lookup(&root, b"s").unwrap().unwrap()).unwrap();
    assert!(side_files(&root).is_empty(), "the last user in root is gone");
    assert_eq!(v.readlink(&d, &l).unwrap(), long);
    // Rename within a directory leaves it alone; across directories carries it.
    let l2 = v.rename(&d, &l, &d, b"l2", None).unwrap();
    assert_eq!(v.readlink(&d, &l2).unwrap(), long);
    let back = v.rename(&d, &l2, &root, b"back", None).unwrap();
    assert_eq!((side_files(&root).len(), side_files(&d).len()), (1, 0));
    assert_eq!(v.readlink(&root, &back).unwrap(), long);
    // Exchange with a file in another directory.
    let f = write_file(&v, &d, "f", b"file");
    let (_on_a, _on_b) = v.exchange_at(&root, &back, &d, &f).unwrap();
    let moved = v.lookup(&d, b"f").unwrap().unwrap();
    assert_eq!(v.readlink(&d, &moved).unwrap(), long);
    assert_eq!((side_files(&root).len(), side_files(&d).len()), (0, 1));
    // Replaced by a rename over it: its side file goes with it.
    let g = write_file(&v, &d, "g", b"g");
    v.rename(&d, &g, &d, b"f", Some(&moved)).unwrap();
    assert!(side_files(&d).is_empty());
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

#[test]
fn xattr_values_up_to_65536_bytes_round_trip_and_replace_their_continuation() {
    let t = xattr_tempdir();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    let f = write_file(&v, &root, "f", b"data");
    let overhead = v.xattr_cipher().value_overhead();
    for len in [0, 100, 65536 - overhead - 1, 65536 - overhead, 65536 - overhead + 1, 65536] {
        let value = data(len, len as u8);
        v.set_xattr(&root, &f, b"user.big", &value).unwrap();
        assert_eq!(v.xattrs(&root, &f).unwrap(), [(b"user.big".to_vec(), value)], "{len} bytes");
        assert!(v.xattr_leftovers(&root, &f).unwrap().is_empty(), "{len}: the old continuation is gone");
    }
    assert_eq!(errno(v.set_xattr(&root, &f, b"user.big", &[0; 65537])), libc::E2BIG);
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

#[test]
fn a_vault_without_the_feature_keeps_its_limits_and_says_so() {
    let t = xattr_tempdir();
    let v = vault_without_overflow(t.path());
    let root = v.root().unwrap();
    assert_eq!(v.max_target(), 3027);
    v.symlink(&root, b"fits", &[b'x'; 3027]).unwrap();
    let e = v.symlink(&root, b"long", &[b'x'; 3028]).unwrap_err();
    assert_eq!(e.errno(), libc::ENAMETOOLONG);
    assert!(e.to_string().contains("before the feature \"overflow\""), "{e}");
    let f = write_file(&v, &root, "f", b"data");
    v.set_xattr(&root, &f, b"user.v", &[1; 65508]).unwrap();
    let e = v.set_xattr(&root, &f, b"user.v", &[1; 65509]).unwrap_err();
    assert_eq!(e.errno(), libc::E2BIG);
    assert!(e.to_string().contains("before the feature \"overflow\""), "{e}");
}

#[test]
fn fsck_repairs_an_unused_side_file_and_an_unused_continuation() {
    let t = xattr_tempdir();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    let s = v.symlink(&root, b"s", &[b'y'; 4000]).unwrap();
    let f = write_file(&v, &root, "f", b"data");
    v.set_xattr(&root, &f, b"user.big", &data(65536, 1)).unwrap();
    // What a crash leaves: a side file of a symlink that never appeared, a continuation of
    // a value that never replaced the old one.
    let side = target_file_name(&s.identity);
    std::fs::copy(root.path.join(&side), root.path.join(target_file_name(&[9; 16]))).unwrap();
    let fp = root.path.join(&f.on_disk);
    set_raw(&fp, &format!("user.veilfs.+{}", "A".repeat(43)), &[0]);
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    let mut kinds: Vec<_> = r.problems.iter().map(|p| p.kind).collect();
    kinds.sort_by_key(|k| format!("{k:?}"));
    assert_eq!(kinds, [ProblemKind::OrphanSideFile, ProblemKind::OrphanXattrPiece], "{:?}", r.problems);
    let r = Checker::new(&v, true, &|_| {}).run().unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    let r = Checker::new(&v, false, &|_| {}).run().unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(v.readlink(&root, &s).unwrap(), [b'y'; 4000]);
    assert_eq!(v.xattrs(&root, &f).unwrap()[0].1, data(65536, 1));
}

fn set_raw(p: &std::path::Path, name: &str, value: &[u8]) {
    let (c, n) = (std::ffi::CString::new(p.to_str().unwrap()).unwrap(), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid C strings and a readable value buffer.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}
