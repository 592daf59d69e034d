//! The operation layer driven directly, without /dev/fuse or root: what each request does to
//! a real vault on a temporary directory. The real-mount tests (tests/mount.rs, fsx, stress)
//! cover the kernel's side.

use crate::inodes::ROOT;
use crate::ops::{Activity, Caller, FsOptions, SetAttr, VeilFs};
use std::sync::Arc;
use std::time::Duration;
use veilfs_core::kdf::Argon2Params;
use veilfs_core::{InitOptions, Vault};

const ME: Caller = Caller { uid: 0, gid: 0, pid: 0 };

fn fs() -> (tempfile::TempDir, VeilFs) {
    let t = tempfile::tempdir().unwrap();
    let kdf = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };
    let pw = secrecy::SecretString::from("pw".to_string());
    let (vault, _) = Vault::create(t.path(), &pw, &InitOptions { kdf, ..InitOptions::default() }).unwrap();
    let opts = FsOptions {
        read_only: false,
        shared_storage: false,
        ttl: Duration::from_secs(1),
        negative_ttl: Duration::ZERO,
        writeback: false,
        noatime: false,
        strictatime: false,
        check_permissions: true,
    };
    let fs = VeilFs::new(Arc::new(vault), opts, Arc::new(Activity::default())).unwrap();
    (t, fs)
}

fn write(fs: &VeilFs, parent: u64, name: &str, data: &[u8]) -> u64 {
    let (node, _, fh) = fs.do_create(parent, name.as_bytes(), 0o644, libc::O_RDWR, ME).unwrap();
    assert_eq!(fs.do_write(fh, 0, data, None).unwrap(), data.len());
    fs.do_release(fh);
    node.id
}

fn read(fs: &VeilFs, parent: u64, name: &str) -> std::io::Result<Vec<u8>> {
    let (node, _) = fs.do_lookup(parent, name.as_bytes(), ME)?;
    let (fh, _) = fs.do_open(node.id, libc::O_RDONLY, ME)?;
    let mut out = Err(std::io::Error::from_raw_os_error(libc::EIO));
    fs.do_read(fh, 0, 1 << 20, |r| out = r.map(|d| d.to_vec()));
    fs.do_release(fh);
    out
}

fn names(fs: &VeilFs, dir: u64) -> Vec<String> {
    let (_, snap, _) = fs.listing(dir, 0, 0, ME).unwrap();
    let mut n: Vec<String> = snap.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).collect();
    n.sort();
    n
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.unwrap_err().raw_os_error().unwrap()
}

#[test]
fn create_write_read_and_list() {
    let (_t, fs) = fs();
    write(&fs, ROOT, "a", b"hello");
    write(&fs, ROOT, &"long".repeat(50), &[7; 9000]);
    assert_eq!(read(&fs, ROOT, "a").unwrap(), b"hello");
    assert_eq!(read(&fs, ROOT, &"long".repeat(50)).unwrap(), vec![7; 9000]);
    assert_eq!(names(&fs, ROOT), ["a".to_string(), "long".repeat(50)]);
    assert_eq!(errno(fs.do_create(ROOT, b"a", 0o644, libc::O_RDWR | libc::O_EXCL, ME)), libc::EEXIST);
    assert_eq!(errno(fs.do_lookup(ROOT, b"missing", ME)), libc::ENOENT);
}

#[test]
fn rename_replace_noreplace_and_exchange() {
    let (_t, fs) = fs();
    let (d, _) = fs.do_mkdir(ROOT, b"d", 0o755, ME).unwrap();
    write(&fs, ROOT, "a", b"A");
    write(&fs, ROOT, "b", b"B");
    write(&fs, d.id, "c", b"C");
    // Replace.
    fs.do_rename(ROOT, b"a", ROOT, b"b", 0, ME).unwrap();
    assert_eq!(read(&fs, ROOT, "b").unwrap(), b"A");
    assert_eq!(errno(read(&fs, ROOT, "a")), libc::ENOENT);
    // NOREPLACE.
    write(&fs, ROOT, "a", b"A2");
    assert_eq!(errno(fs.do_rename(ROOT, b"a", ROOT, b"b", libc::RENAME_NOREPLACE, ME)), libc::EEXIST);
    // EXCHANGE across directories, long names too.
    let long = "x".repeat(200);
    fs.do_rename(ROOT, b"a", ROOT, long.as_bytes(), 0, ME).unwrap();
    fs.do_rename(ROOT, long.as_bytes(), d.id, b"c", libc::RENAME_EXCHANGE, ME).unwrap();
    assert_eq!(read(&fs, ROOT, &long).unwrap(), b"C");
    assert_eq!(read(&fs, d.id, "c").unwrap(), b"A2");
    // A directory into itself, a directory over a file, a file over a non-empty directory.
    assert_eq!(errno(fs.do_rename(ROOT, b"d", d.id, b"inside", 0, ME)), libc::EINVAL);
    assert_eq!(errno(fs.do_rename(ROOT, b"d", ROOT, b"b", 0, ME)), libc::ENOTDIR);
    assert_eq!(errno(fs.do_rename(ROOT, b"b", ROOT, b"d", 0, ME)), libc::EISDIR);
    let (e, _) = fs.do_mkdir(ROOT, b"e", 0o755, ME).unwrap();
    assert_eq!(errno(fs.do_rename(ROOT, b"e", ROOT, b"d", 0, ME)), libc::ENOTEMPTY);
    fs.do_rename(ROOT, b"d", ROOT, b"e", 0, ME).unwrap();
    assert_eq!(read(&fs, e.id, "c").map_err(|e| e.raw_os_error()), Err(Some(libc::ENOENT)));
    let (e2, _) = fs.do_lookup(ROOT, b"e", ME).unwrap();
    assert_eq!(read(&fs, e2.id, "c").unwrap(), b"A2");
    assert_eq!(names(&fs, ROOT), ["b".to_string(), "e".to_string(), long]);
}

#[test]
fn remove_files_directories_and_links() {
    let (_t, fs) = fs();
    let (d, _) = fs.do_mkdir(ROOT, b"d", 0o755, ME).unwrap();
    let a = write(&fs, d.id, "a", b"A");
    fs.do_link(a, ROOT, b"hard", ME).unwrap();
    fs.do_symlink(ROOT, b"s", b"target", ME).unwrap();
    assert_eq!(errno(fs.do_remove(ROOT, b"d", true, ME)), libc::ENOTEMPTY);
    assert_eq!(errno(fs.do_remove(ROOT, b"d", false, ME)), libc::EISDIR);
    assert_eq!(errno(fs.do_remove(ROOT, b"hard", true, ME)), libc::ENOTDIR);
    fs.do_remove(d.id, b"a", false, ME).unwrap();
    fs.do_remove(ROOT, b"d", true, ME).unwrap();
    assert_eq!(read(&fs, ROOT, "hard").unwrap(), b"A");
    let (s, _) = fs.do_lookup(ROOT, b"s", ME).unwrap();
    assert_eq!(fs.do_readlink(s.id).unwrap(), b"target");
    fs.do_remove(ROOT, b"s", false, ME).unwrap();
    assert_eq!(names(&fs, ROOT), ["hard"]);
}

#[test]
fn setattr_truncates_and_changes_modes_through_verified_handles() {
    let (_t, fs) = fs();
    let a = write(&fs, ROOT, "a", &[1; 10_000]);
    let attr =
        fs.do_setattr(a, &SetAttr { size: Some(4000), mode: Some(0o600), ..SetAttr::default() }, None, ME).unwrap();
    assert_eq!((attr.size, attr.perm), (4000, 0o600));
    assert_eq!(read(&fs, ROOT, "a").unwrap(), vec![1; 4000]);
    fs.do_setxattr(a, b"user.k", b"v", 0, ME).unwrap();
    assert_eq!(fs.do_getxattr(a, b"user.k", ME).unwrap(), b"v");
    assert_eq!(fs.do_listxattr(a).unwrap(), b"user.k\0");
}

/// A listing without a directory handle (no OPENDIR) resumes at the offset the kernel hands
/// back: the cookie of the last name it got, looked up in the directory's newest listing.
/// Names removed and added between two READDIRs, and a second listing started from the top
/// meanwhile (which takes a new snapshot), never make a name that was there throughout go
/// missing or come twice, which positional offsets into a changed listing would.
#[test]
fn a_listing_resumed_after_changes_returns_each_unchanged_name_exactly_once() {
    let (_t, fs) = fs();
    for i in 0..200 {
        write(&fs, ROOT, &format!("f{i}"), b"");
    }
    let (_, snap, start) = fs.listing(ROOT, 0, 0, ME).unwrap();
    assert_eq!((snap.len(), start), (200, 0));
    assert!(snap.windows(2).all(|w| w[0].cookie < w[1].cookie) && snap[0].cookie > 2);
    let mut seen: Vec<String> = snap[..70].iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).collect();
    let resume = snap[69].cookie;
    // Remove names on both sides of the resume point, add new ones, and start a second
    // listing from the top, which replaces the directory's snapshot.
    let gone: Vec<String> =
        [&snap[10], &snap[69], &snap[70], &snap[150]].iter().map(|e| String::from_utf8_lossy(&e.name).into()).collect();
    for g in &gone {
        fs.do_remove(ROOT, g.as_bytes(), false, ME).unwrap();
    }
    for i in 0..50 {
        write(&fs, ROOT, &format!("new{i}"), b"");
    }
    let (_, other, _) = fs.listing(ROOT, 0, 0, ME).unwrap();
    assert_eq!(other.len(), 246);
    let (_, snap2, start2) = fs.listing(ROOT, 0, resume, ME).unwrap();
    seen.extend(snap2[start2..].iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()));
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "a name came twice");
    for i in 0..200 {
        let n = format!("f{i}");
        assert!(gone.contains(&n) || seen.contains(&n), "{n} was there throughout and went missing");
    }
    // The call that finds nothing left drops the kept listing; resuming then lists afresh.
    let last = snap2.last().unwrap().cookie;
    let (_, _, end) = fs.listing(ROOT, 0, last, ME).unwrap();
    assert_eq!(end, snap2.len());
    assert!(fs.nodes.get(ROOT).unwrap().dir().unwrap().listing.lock().is_none());
}
