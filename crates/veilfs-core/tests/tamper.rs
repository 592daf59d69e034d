//! An attacker who can write the ciphertext: every modification below must be detected
//! with an integrity error that names what failed, never returned as data.

use crate::common::*;
use std::os::unix::fs::FileExt;
use veilfs_core::{EntryKind, Error, Secret, Vault};

const B: usize = 4096;
const CB: u64 = 4096 + 28;
const H: u64 = 36;

/// A vault in the v1 file format (header v1, no block map): the layout constants below are
/// that format's; block-map files have their own tamper tests (block_map.rs).
fn setup() -> (tempfile::TempDir, Vault) {
    let t = tempfile::tempdir().unwrap();
    let v = new_v1_vault(t.path());
    (t, v)
}

#[test]
fn bit_flip_anywhere_in_a_block_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "f", &data(3 * B, 1));
    let p = cipher_path(&v, &root, "f");
    let orig = std::fs::read(&p).unwrap();
    // Every byte of block 1 (nonce, ciphertext, tag) and a sample of the others.
    let positions: Vec<u64> = (H + CB..H + 2 * CB).chain((0..orig.len() as u64).step_by(97)).collect();
    for pos in positions {
        let mut bad = orig.clone();
        bad[pos as usize] ^= 0x20;
        std::fs::write(&p, &bad).unwrap();
        let r = read_file(&v, &root, "f");
        assert!(matches!(r, Err(Error::Auth { .. })), "flip at byte {pos} not detected: {r:?}");
    }
    std::fs::write(&p, &orig).unwrap();
    assert_eq!(read_file(&v, &root, "f").unwrap(), data(3 * B, 1));
    // The error names the file and the block.
    let mut bad = orig.clone();
    bad[(H + CB + 100) as usize] ^= 1;
    std::fs::write(&p, &bad).unwrap();
    assert_auth(read_file(&v, &root, "f"), "block 1");
    assert_auth(read_file(&v, &root, "f"), p.file_name().unwrap().to_str().unwrap());
}

#[test]
fn block_moved_within_file_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "f", &data(3 * B, 2));
    let p = cipher_path(&v, &root, "f");
    let mut c = std::fs::read(&p).unwrap();
    let (a, b) = ((H) as usize, (H + CB) as usize);
    let blk0: Vec<u8> = c[a..a + CB as usize].to_vec();
    let blk1: Vec<u8> = c[b..b + CB as usize].to_vec();
    c[a..a + CB as usize].copy_from_slice(&blk1);
    c[b..b + CB as usize].copy_from_slice(&blk0);
    std::fs::write(&p, &c).unwrap();
    assert_auth(read_file(&v, &root, "f"), "block 0");
}

#[test]
fn block_moved_to_another_file_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "a", &data(2 * B, 3));
    write_file(&v, &root, "b", &data(2 * B, 4));
    let (pa, pb) = (cipher_path(&v, &root, "a"), cipher_path(&v, &root, "b"));
    let cb = std::fs::read(&pb).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&pa).unwrap();
    f.write_all_at(&cb[H as usize..(H + CB) as usize], H).unwrap();
    assert_auth(read_file(&v, &root, "a"), "block 0");
}

#[test]
fn header_swapped_between_files_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "a", &data(100, 5));
    write_file(&v, &root, "b", &data(100, 6));
    let (pa, pb) = (cipher_path(&v, &root, "a"), cipher_path(&v, &root, "b"));
    let (ca, cb) = (std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
    let mut na = cb[..H as usize].to_vec();
    na.extend_from_slice(&ca[H as usize..]);
    std::fs::write(&pa, na).unwrap();
    assert_auth(read_file(&v, &root, "a"), "belongs to another file");
}

#[test]
fn swapped_file_contents_are_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "salary.txt", b"alice: 100");
    write_file(&v, &root, "public.txt", b"nothing to see");
    let (pa, pb) = (cipher_path(&v, &root, "salary.txt"), cipher_path(&v, &root, "public.txt"));
    let tmp = pa.with_extension("tmp");
    std::fs::rename(&pa, &tmp).unwrap();
    std::fs::rename(&pb, &pa).unwrap();
    std::fs::rename(&tmp, &pb).unwrap();
    assert_auth(read_file(&v, &root, "salary.txt"), "belongs to another file");
    assert_auth(read_file(&v, &root, "public.txt"), "belongs to another file");
}

#[test]
fn swapped_contents_of_empty_and_full_files_are_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "full", b"data");
    v.create_file(&root, b"empty", 0o644).unwrap();
    let (pf, pe) = (cipher_path(&v, &root, "full"), cipher_path(&v, &root, "empty"));
    std::fs::write(&pe, std::fs::read(&pf).unwrap()).unwrap();
    assert_auth(read_file(&v, &root, "empty"), "belongs to another file");
}

#[test]
fn entry_moved_to_another_directory_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    let (_e, sub) = v.mkdir(&root, b"sub", 0o755).unwrap();
    write_file(&v, &root, "secret", b"top secret");
    let p = cipher_path(&v, &root, "secret");
    std::fs::rename(&p, sub.path.join(p.file_name().unwrap())).unwrap();
    let (good, bad) = v.list(&sub).unwrap();
    assert!(good.is_empty(), "a moved entry must not decrypt in its new directory");
    assert_eq!(bad.len(), 1);
    assert!(matches!(bad[0].error, Error::Auth { .. }), "{:?}", bad[0].error);
    assert!(v.lookup(&sub, b"secret").unwrap().is_none());
}

#[test]
fn entry_moved_with_its_directory_iv_is_detected() {
    // The attacker moves an entry to another directory *and* copies the source directory's
    // IV copy there (the IV name, or the old 16-byte file), so the name would decrypt: the
    // target directory's own binding catches it, naming the copied IV.
    for iv_in_name in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let v = vault_of_iv_form(t.path(), iv_in_name);
        let root = v.root().unwrap();
        let (_a, da) = v.mkdir(&root, b"a", 0o755).unwrap();
        let (_b, db) = v.mkdir(&root, b"b", 0o755).unwrap();
        write_file(&v, &da, "x", b"from a");
        copy_iv_copy(&v, &da, &db);
        let e = v.lookup(&root, b"b").unwrap().unwrap();
        let copied = iv_copy_path(&v, &da).file_name().unwrap().to_str().unwrap().to_string();
        assert_auth(v.open_dir(&root, &e), "copied from another directory");
        assert_auth(v.open_dir(&root, &e), &format!("{}/{copied}", db.path.display()));
    }
}

#[test]
fn truncation_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "f", &data(3 * B + 10, 7));
    let p = cipher_path(&v, &root, "f");
    let orig = std::fs::read(&p).unwrap();
    // At a block boundary (the classic undetected truncation), inside a block, inside the
    // header, and right after the header.
    for cut in [H + 2 * CB, H + CB, H + CB + 1000, H + 3 * CB + 5, 20] {
        std::fs::write(&p, &orig[..cut as usize]).unwrap();
        let r = read_file(&v, &root, "f");
        assert!(matches!(r, Err(Error::Auth { .. })), "truncation to {cut} bytes not detected: {r:?}");
    }
    // Cut to the header alone, or to nothing: an empty file (FORMAT.md §5.3, §5.6; what a
    // crash after a first write's header leaves). No more than a cut to 0 bytes gives.
    for cut in [H, 0] {
        std::fs::write(&p, &orig[..cut as usize]).unwrap();
        assert_eq!(read_file(&v, &root, "f").unwrap(), b"", "cut to {cut} bytes");
    }
}

#[test]
fn zero_blocks_are_not_holes_in_ordinary_files() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "f", &data(3 * B, 8));
    let p = cipher_path(&v, &root, "f");
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&vec![0u8; CB as usize], H + CB).unwrap();
    assert_auth(read_file(&v, &root, "f"), "block 1");
}

#[test]
fn sparse_flag_cannot_be_set_by_an_attacker() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "f", &data(3 * B, 9));
    let p = cipher_path(&v, &root, "f");
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&[0, 1], 2).unwrap(); // flags := SPARSE
    f.write_all_at(&vec![0u8; CB as usize], H + CB).unwrap();
    assert_auth(read_file(&v, &root, "f"), "header authentication failed");
}

#[test]
fn symlink_target_swap_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    let a = v.symlink(&root, b"a", b"/etc/passwd").unwrap();
    let b = v.symlink(&root, b"b", b"/home/me").unwrap();
    let pa = root.path.join(&a.on_disk);
    let target_b = std::fs::read_link(root.path.join(&b.on_disk)).unwrap();
    std::fs::remove_file(&pa).unwrap();
    std::os::unix::fs::symlink(target_b, &pa).unwrap();
    assert_auth(v.readlink(&root, &a), "does not belong");
}

#[test]
fn file_replaced_by_directory_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    let e = write_file(&v, &root, "f", b"x");
    let p = root.path.join(&e.on_disk);
    std::fs::remove_file(&p).unwrap();
    std::fs::create_dir(&p).unwrap();
    let (good, bad) = v.list(&root).unwrap();
    assert!(good.is_empty());
    assert!(matches!(bad[0].error, Error::Auth { .. }));
}

#[test]
fn edited_config_fields_are_detected_and_nothing_is_written() {
    let t = tempfile::tempdir().unwrap();
    new_vault(t.path());
    let cfg_path = t.path().join("veilfs.conf");
    let orig = std::fs::read_to_string(&cfg_path).unwrap();
    let edits: &[(&str, &str)] = &[
        ("\"creator\": \"veilfs", "\"creator\": \"evilfs"),
        ("\"block_size\": 4096", "\"block_size\": 8192"),
        ("\"cipher\": \"AES-256-GCM\"", "\"cipher\": \"XChaCha20-Poly1305\""),
        ("\"name-binding\",\n", ""),
        ("\"iterations\": 1", "\"iterations\": 2"),
        ("\"memory_kib\": 64", "\"memory_kib\": 128"),
    ];
    for (from, to) in edits {
        assert!(orig.contains(from), "test setup: {from:?} not in config");
        let edited = orig.replacen(from, to, 1);
        let mut perms = std::fs::metadata(&cfg_path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
        std::fs::set_permissions(&cfg_path, perms).unwrap();
        std::fs::write(&cfg_path, &edited).unwrap();
        let r = Vault::open(t.path(), &Secret::Password(password()), None);
        match r {
            Err(Error::Config { detail, .. }) => assert!(!detail.is_empty()),
            Err(Error::WrongPassword) => assert!(to.contains("iterations") || to.contains("memory"), "{from} → {r:?}"),
            other => panic!("edit {from:?} → {to:?} was not detected: {other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&cfg_path).unwrap(), edited, "unlocking must not write the config");
    }
    // Flip the root IV: MAC failure.
    let iv_edit = orig.replacen("\"root_dir_iv\": \"", "\"root_dir_iv\": \"A", 1);
    let iv_edit = {
        // Keep it 22 characters of base64url so only the MAC can tell.
        let start = iv_edit.find("\"root_dir_iv\": \"").unwrap() + 16;
        let mut s = iv_edit.clone();
        s.replace_range(start..start + 23, &iv_edit[start..start + 22]);
        s
    };
    std::fs::write(&cfg_path, &iv_edit).unwrap();
    assert!(matches!(Vault::open(t.path(), &Secret::Password(password()), None), Err(Error::Config { .. })));
    // Restore: opens again.
    std::fs::write(&cfg_path, &orig).unwrap();
    reopen(t.path());
}

#[test]
fn wrong_password_is_a_clear_error_and_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    new_vault(t.path());
    let before = std::fs::read(t.path().join("veilfs.conf")).unwrap();
    let r = Vault::open(t.path(), &Secret::Password(secrecy::SecretString::from("wrong".to_string())), None);
    assert!(matches!(r, Err(Error::WrongPassword)), "{r:?}");
    assert_eq!(std::fs::read(t.path().join("veilfs.conf")).unwrap(), before);
}

#[test]
fn damaged_config_is_a_clear_error() {
    let t = tempfile::tempdir().unwrap();
    new_vault(t.path());
    let p = t.path().join("veilfs.conf");
    let orig = std::fs::read(&p).unwrap();
    std::fs::write(&p, &orig[..orig.len() / 2]).unwrap();
    match Vault::open(t.path(), &Secret::Password(password()), None) {
        Err(Error::Config { detail, .. }) => assert!(detail.contains("damaged"), "{detail}"),
        other => panic!("{other:?}"),
    }
}

/// Replaces the backing object of `name` in `dir` with a new node of `mode` and `rdev`.
fn replace_node(v: &Vault, dir: &veilfs_core::CipherDir, name: &str, mode: u32, rdev: libc::dev_t) {
    let on_disk = v.lookup(dir, name.as_bytes()).unwrap().unwrap().on_disk;
    veilfs_core::sys::unlinkat(dir.fd(), on_disk.as_bytes(), false).unwrap();
    veilfs_core::sys::mknodat(dir.fd(), on_disk.as_bytes(), mode | 0o644, rdev).unwrap();
}

/// A FIFO and two character devices, `null` (1:3) and `zero` (1:5). Device nodes need
/// CAP_MKNOD: these tests run as root, like the mount tests.
fn with_specials(v: &Vault) -> veilfs_core::CipherDir {
    let root = v.root().unwrap();
    v.mknod(&root, b"fifo", libc::S_IFIFO | 0o644, 0).unwrap();
    for (name, minor) in [("null", 3), ("zero", 5)] {
        v.mknod(&root, name.as_bytes(), libc::S_IFCHR | 0o644, libc::makedev(1, minor))
            .unwrap_or_else(|e| panic!("mknod of a device (needs root): {e}"));
    }
    root
}

#[test]
fn fifo_turned_into_a_socket_or_a_device_is_detected() {
    let (_t, v) = setup();
    let root = with_specials(&v);
    let e = v.lookup(&root, b"fifo").unwrap().unwrap();
    assert_eq!(e.kind, EntryKind::Fifo);
    for (mode, rdev) in
        [(libc::S_IFSOCK, 0), (libc::S_IFCHR, libc::makedev(8, 0)), (libc::S_IFBLK, libc::makedev(8, 0))]
    {
        veilfs_core::sys::unlinkat(root.fd(), e.on_disk.as_bytes(), false).unwrap();
        veilfs_core::sys::mknodat(root.fd(), e.on_disk.as_bytes(), mode | 0o644, rdev).unwrap();
        assert_auth(v.lookup(&root, b"fifo"), "changed type");
        let (_, bad) = v.list(&root).unwrap();
        assert_eq!(bad.len(), 1, "the listing reports it: {bad:?}");
    }
}

#[test]
fn device_number_changed_is_detected() {
    let (_t, v) = setup();
    let root = with_specials(&v);
    let e = v.lookup(&root, b"null").unwrap().unwrap();
    assert_eq!((e.kind, e.stat.st_rdev), (EntryKind::CharDevice, libc::makedev(1, 3)));
    // /dev/null becomes the first disk under the same entry.
    replace_node(&v, &root, "null", libc::S_IFCHR, libc::makedev(8, 0));
    assert_auth(v.lookup(&root, b"null"), "8:0 differs from the 1:3 its entry promises");
    // The same node as a block device: the type is bound too.
    replace_node(&v, &root, "zero", libc::S_IFBLK, libc::makedev(1, 5));
    assert_auth(v.lookup(&root, b"zero"), "changed type");
}

#[test]
fn two_device_nodes_swapped_are_detected() {
    let (_t, v) = setup();
    let root = with_specials(&v);
    let (a, b) = (cipher_path(&v, &root, "null"), cipher_path(&v, &root, "zero"));
    let tmp = a.with_file_name("swap");
    std::fs::rename(&a, &tmp).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&tmp, &b).unwrap();
    assert_auth(v.lookup(&root, b"null"), "1:5 differs from the 1:3");
    assert_auth(v.lookup(&root, b"zero"), "1:3 differs from the 1:5");
}

#[test]
fn vault_without_special_kinds_opens_and_still_lacks_their_protection() {
    let t = tempfile::tempdir().unwrap();
    let v = legacy_vault(t.path());
    assert_eq!(v.names().specials(), veilfs_core::names::SpecialBinding::Shared);
    let root = with_specials(&v);
    let v = reopen(t.path());
    let (good, bad) = v.list(&root).unwrap();
    assert!(bad.is_empty() && good.len() == 3, "{bad:?}");
    // What such a vault lacks (docs/FORMAT.md §9): every special file is one kind, and a
    // device's number is not bound. These go unnoticed there, and are caught in a new vault.
    replace_node(&v, &root, "fifo", libc::S_IFSOCK, 0);
    replace_node(&v, &root, "null", libc::S_IFCHR, libc::makedev(8, 0));
    let fifo = v.lookup(&root, b"fifo").unwrap().unwrap();
    let null = v.lookup(&root, b"null").unwrap().unwrap();
    assert_eq!((fifo.kind, null.stat.st_rdev), (EntryKind::Socket, libc::makedev(8, 0)));
}

/// Two overflowing symlinks (feature `overflow`, FORMAT.md §8.1) in `root`: their entries and
/// target side files.
fn long_symlinks(v: &Vault, root: &veilfs_core::CipherDir) -> (veilfs_core::Entry, veilfs_core::Entry) {
    let a = v.symlink(root, b"a", &[b'a'; 4000]).unwrap();
    let b = v.symlink(root, b"b", &[b'b'; 4000]).unwrap();
    (a, b)
}

fn side(root: &veilfs_core::CipherDir, e: &veilfs_core::Entry) -> std::path::PathBuf {
    root.path.join(veilfs_core::symlink::target_file_name(&e.identity))
}

#[test]
fn symlink_target_file_swapped_between_two_links_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    let (a, b) = long_symlinks(&v, &root);
    let (pa, pb) = (side(&root, &a), side(&root, &b));
    let (ca, cb) = (std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
    std::fs::remove_file(&pa).unwrap();
    std::fs::write(&pa, &cb).unwrap();
    assert_auth(v.readlink(&root, &a), "does not belong");
    // The side file's ID prefix changed to match: the block is sealed under b's key.
    let mut forged = cb.clone();
    forged[..16].copy_from_slice(&ca[..16]);
    std::fs::write(&pa, &forged).unwrap();
    assert_auth(v.readlink(&root, &a), "block 0");
    // The backing symlinks swapped instead (each naming the other's side file).
    let (la, lb) = (root.path.join(&a.on_disk), root.path.join(&b.on_disk));
    let tb = std::fs::read_link(&lb).unwrap();
    std::fs::remove_file(&la).unwrap();
    std::os::unix::fs::symlink(&tb, &la).unwrap();
    assert_auth(v.readlink(&root, &a), "does not belong");
}

#[test]
fn symlink_target_file_removed_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    let (a, _) = long_symlinks(&v, &root);
    std::fs::remove_file(side(&root, &a)).unwrap();
    assert_auth(v.readlink(&root, &a), "is missing");
}

#[test]
fn symlink_target_file_truncated_is_detected() {
    let (_t, v) = setup();
    let root = v.root().unwrap();
    let (a, _) = long_symlinks(&v, &root);
    let p = side(&root, &a);
    let c = std::fs::read(&p).unwrap();
    for len in [0, 16, 16 + 28, c.len() - 1] {
        std::fs::write(&p, &c[..len]).unwrap();
        assert!(matches!(v.readlink(&root, &a), Err(Error::Auth { .. })), "cut to {len} bytes");
    }
}

/// A file with two overflowing attributes (`user.a`, `user.b`) on tmpfs, and a second file
/// with one; returns the vault, the entries and the backing paths.
fn long_xattrs() -> (tempfile::TempDir, Vault, veilfs_core::Entry, std::path::PathBuf, std::path::PathBuf) {
    let t = xattr_tempdir();
    let v = new_vault(t.path());
    let root = v.root().unwrap();
    let f = write_file(&v, &root, "f", b"data");
    let g = write_file(&v, &root, "g", b"data");
    v.set_xattr(&root, &f, b"user.a", &data(65536, 1)).unwrap();
    v.set_xattr(&root, &f, b"user.b", &data(65536, 2)).unwrap();
    v.set_xattr(&root, &g, b"user.a", &data(65536, 3)).unwrap();
    let (pf, pg) = (root.path.join(&f.on_disk), root.path.join(&g.on_disk));
    (t, v, f, pf, pg)
}

/// The backing continuations of `p`: (name, value), in list order.
fn continuations(p: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    raw_xattrs(p).into_iter().filter(|(n, _)| n.starts_with(veilfs_core::xattr::MORE_PREFIX)).collect()
}

fn raw_xattrs(p: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let mut list = vec![0u8; 65536];
    // SAFETY: valid C string and a writable buffer of the given length.
    let n = unsafe { libc::listxattr(c.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
    assert!(n >= 0);
    list.truncate(n as usize);
    let mut out = Vec::new();
    for name in list.split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let cn = std::ffi::CString::new(name).unwrap();
        let mut buf = vec![0u8; 65536];
        // SAFETY: valid C strings and a writable buffer of the given length.
        let r = unsafe { libc::getxattr(c.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(r >= 0);
        buf.truncate(r as usize);
        out.push((String::from_utf8(name.to_vec()).unwrap(), buf));
    }
    out
}

fn set_raw(p: &std::path::Path, name: &str, value: &[u8]) {
    let (c, n) = (std::ffi::CString::new(p.to_str().unwrap()).unwrap(), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid C strings and a readable value buffer.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

fn remove_raw(p: &std::path::Path, name: &str) {
    let (c, n) = (std::ffi::CString::new(p.to_str().unwrap()).unwrap(), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }, 0);
}

#[test]
fn xattr_continuation_swapped_between_two_attributes_is_detected() {
    let (_t, v, f, pf, _) = long_xattrs();
    let root = v.root().unwrap();
    let more = continuations(&pf);
    assert_eq!(more.len(), 2);
    // Each continuation's value put under the other's name.
    set_raw(&pf, &more[0].0, &more[1].1);
    set_raw(&pf, &more[1].0, &more[0].1);
    assert_auth(v.xattrs(&root, &f), "xattr value failed authentication");
}

#[test]
fn xattr_continuation_moved_to_another_object_is_detected() {
    let (_t, v, _, pf, pg) = long_xattrs();
    let root = v.root().unwrap();
    let g = v.lookup(&root, b"g").unwrap().unwrap();
    // g's user.a gets f's first part and continuation (same plaintext name, other object).
    let fa = raw_xattrs(&pf);
    for (n, _) in raw_xattrs(&pg) {
        remove_raw(&pg, &n);
    }
    for (n, val) in &fa {
        set_raw(&pg, n, val);
    }
    assert_auth(v.xattrs(&root, &g), "xattr name failed authentication");
}

#[test]
fn xattr_continuation_removed_is_detected() {
    let (_t, v, f, pf, _) = long_xattrs();
    let root = v.root().unwrap();
    remove_raw(&pf, &continuations(&pf)[0].0);
    assert_auth(v.xattrs(&root, &f), "xattr value failed authentication");
}

#[test]
fn xattr_continuation_truncated_is_detected() {
    let (_t, v, f, pf, _) = long_xattrs();
    let root = v.root().unwrap();
    let (name, value) = continuations(&pf).remove(0);
    set_raw(&pf, &name, &value[..value.len() - 1]);
    assert_auth(v.xattrs(&root, &f), "xattr value failed authentication");
}

#[test]
fn unsettled_flag_cannot_be_set_by_an_attacker() {
    // UNSETTLED would let a file cut at a block boundary read as a prefix (FORMAT.md §5.8).
    let (_t, v) = setup();
    let root = v.root().unwrap();
    write_file(&v, &root, "f", &data(3 * B + 10, 10));
    let p = cipher_path(&v, &root, "f");
    let orig = std::fs::read(&p).unwrap();
    let mut forged = orig[..(H + 2 * CB) as usize].to_vec();
    forged[3] |= 2; // flags := UNSETTLED
    std::fs::write(&p, &forged).unwrap();
    assert_auth(read_file(&v, &root, "f"), "header authentication failed");
}

#[test]
fn file_written_by_a_mount_session_and_settled_is_cut_at_a_block_boundary_detected() {
    // A writer session sets UNSETTLED (the mount's mode: defer on); the last close clears it,
    // and from then on truncation at a block boundary is detected as in any file.
    let (_t, v) = setup();
    let root = v.root().unwrap();
    let (_e, f) = v.create_file(&root, b"f", 0o644).unwrap();
    f.set_defer_sparse(true);
    let d = data(3 * B + 10, 11);
    f.write_at(&d[..B], 0, 0).unwrap();
    f.write_at(&d[B..], B as u64, B as u64).unwrap();
    let p = cipher_path(&v, &root, "f");
    assert_eq!(std::fs::read(&p).unwrap()[3] & 2, 2, "a growing write session sets UNSETTLED");
    f.settle().unwrap();
    drop(f);
    let orig = std::fs::read(&p).unwrap();
    assert_eq!(orig[3] & 2, 0, "settle clears UNSETTLED");
    assert_eq!(read_file(&v, &root, "f").unwrap(), d);
    for cut in [H + 2 * CB, H + CB] {
        std::fs::write(&p, &orig[..cut as usize]).unwrap();
        assert_auth(read_file(&v, &root, "f"), "");
    }
}

/// A file of 6 full blocks and 10 bytes written in two write sessions of the mount's kind:
/// the first writes 2 blocks, the second grows the file to its size. Returns the data, the
/// header as it stood during the second session (UNSETTLED: what a sync peer saw then) and
/// the settled ciphertext.
fn grown_in_a_session(v: &Vault, root: &veilfs_core::CipherDir) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (_e, f) = v.create_file(root, b"f", 0o644).unwrap();
    f.set_defer_sparse(true);
    let d = data(6 * B + 10, 12);
    f.write_at(&d[..2 * B], 0, 0).unwrap();
    f.settle().unwrap();
    f.write_at(&d[2 * B..], 2 * B as u64, 2 * B as u64).unwrap();
    let p = cipher_path(v, root, "f");
    let during = std::fs::read(&p).unwrap()[..H as usize].to_vec();
    assert_eq!(during[3] & 2, 2, "a growing write session sets UNSETTLED");
    f.settle().unwrap();
    drop(f);
    let settled = std::fs::read(&p).unwrap();
    assert_eq!(settled[3] & 2, 0, "settle clears UNSETTLED");
    (d, during, settled)
}

#[test]
fn a_header_copied_during_a_write_session_and_put_back_cannot_cut_the_settled_file() {
    // The attack: the UNSETTLED header of a past write session put back on the settled file,
    // and the file cut at a block boundary. Every block left authenticates as an inner block;
    // with "ordered-growth" none of them ends a file (FORMAT.md §5.8), so no cut reads as a
    // shorter file: an integrity error, for a reader and for a writer's settling alike.
    let (_t, v) = setup();
    let root = v.root().unwrap();
    let (_, during, settled) = grown_in_a_session(&v, &root);
    let p = cipher_path(&v, &root, "f");
    for blocks in 1..=6u64 {
        let mut c = during.clone();
        c.extend_from_slice(&settled[H as usize..(H + blocks * CB) as usize]);
        std::fs::write(&p, &c).unwrap();
        assert_auth(read_file(&v, &root, "f"), "no block at its end authenticates");
        let e = v.lookup(&root, b"f").unwrap().unwrap();
        assert_auth(v.open_file(&root, &e, libc::O_RDWR).map(drop), "no block at its end authenticates");
        assert_eq!(std::fs::read(&p).unwrap(), c, "nothing settled the cut file");
    }
    // The replayed header on the whole file reads the whole file.
    let mut c = during.clone();
    c.extend_from_slice(&settled[H as usize..]);
    std::fs::write(&p, &c).unwrap();
    assert_eq!(read_file(&v, &root, "f").unwrap().len(), 6 * B + 10);
}

#[test]
fn vault_without_ordered_growth_opens_and_keeps_the_old_crash_rules() {
    // A vault made before "ordered-growth": it opens, its writer keeps the old order, and
    // its reader the old rules, under which a full inner block ends an unsettled file. So
    // there, the replayed header still cuts the file (the weakness docs/SECURITY.md §4.1a
    // names for such vaults).
    let t = tempfile::tempdir().unwrap();
    let v = vault_without(t.path(), veilfs_core::config::FEATURE_ORDERED_GROWTH);
    assert!(!v.content().ordered());
    let root = v.root().unwrap();
    let (d, during, settled) = grown_in_a_session(&v, &root);
    let v = reopen(t.path());
    assert_eq!(read_file(&v, &root, "f").unwrap(), d);
    let p = cipher_path(&v, &root, "f");
    let mut c = during.clone();
    c.extend_from_slice(&settled[H as usize..(H + 3 * CB) as usize]);
    std::fs::write(&p, &c).unwrap();
    assert_eq!(read_file(&v, &root, "f").unwrap(), d[..3 * B], "the old rules read the cut as a prefix");
}
