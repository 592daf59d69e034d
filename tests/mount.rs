//! The mount, for real: every operation against a plain directory, what the ciphertext
//! reveals, concurrency, sparse and huge files, big directories, cp -a / rsync -a,
//! multi-user permissions, integrity errors, mount options and shutdown.

mod common;
use common::*;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno_of<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
    }
}

fn rc(r: libc::c_int) -> String {
    if r == 0 {
        "ok".into()
    } else {
        format!("errno {}", std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    }
}

/// Runs a fixed sequence of operations under `root` and records every observable outcome.
fn exercise(root: &Path) -> Vec<String> {
    let mut log = Vec::new();
    let p = |s: &str| root.join(s);
    macro_rules! note { ($($t:tt)*) => { log.push(format!($($t)*)) } }

    // Create, write at offsets, partial blocks, gaps past EOF.
    let f = OpenOptions::new().create(true).truncate(false).read(true).write(true).mode(0o640).open(p("a")).unwrap();
    f.write_all_at(b"hello", 0).unwrap();
    f.write_all_at(&vec![7u8; 5000], 4090).unwrap();
    f.write_all_at(b"far", 20000).unwrap();
    note!("size {}", f.metadata().unwrap().len());
    let mut buf = vec![0u8; 30000];
    let n = f.read_at(&mut buf, 0).unwrap();
    note!("read {n} sum {}", buf[..n].iter().map(|&b| b as u64).sum::<u64>());
    note!("mode {:o}", f.metadata().unwrap().mode());
    // Truncate down and up, odd sizes, far past EOF.
    for size in [10_000u64, 4096, 4097, 1, 0, 123_457, 5_000_000, 3] {
        f.set_len(size).unwrap();
        let mut all = Vec::new();
        File::open(p("a")).unwrap().read_to_end(&mut all).unwrap();
        note!("truncate {size}: len {} sum {}", all.len(), all.iter().map(|&b| b as u64).sum::<u64>());
    }
    drop(f);
    // O_APPEND, O_EXCL, O_TRUNC.
    let mut ap = OpenOptions::new().append(true).open(p("a")).unwrap();
    ap.write_all(b"-appended").unwrap();
    drop(ap);
    note!("after append {:?}", fs::read(p("a")).unwrap());
    note!("excl {}", errno_of(OpenOptions::new().write(true).create_new(true).open(p("a"))));
    OpenOptions::new().write(true).truncate(true).open(p("a")).unwrap();
    note!("after O_TRUNC len {}", fs::metadata(p("a")).unwrap().len());
    // Seek and read past EOF.
    fs::write(p("s"), b"0123456789").unwrap();
    let mut sf = File::open(p("s")).unwrap();
    sf.seek(SeekFrom::Start(7)).unwrap();
    let mut rest = String::new();
    sf.read_to_string(&mut rest).unwrap();
    note!("seek read {rest}");
    // Directories.
    fs::create_dir(p("d1")).unwrap();
    fs::create_dir(p("d2")).unwrap();
    fs::write(p("d1/x"), b"x").unwrap();
    note!("mkdir exists {}", errno_of(fs::create_dir(p("d1"))));
    note!("rmdir nonempty {}", errno_of(fs::remove_dir(p("d1"))));
    note!("unlink dir {}", errno_of(fs::remove_file(p("d1"))));
    note!("rmdir file {}", errno_of(fs::remove_dir(p("s"))));
    // Renames: across directories, onto existing, NOREPLACE, EXCHANGE, dir onto non-empty dir.
    fs::rename(p("d1/x"), p("d2/y")).unwrap();
    fs::write(p("d2/z"), b"zzz").unwrap();
    fs::rename(p("d2/y"), p("d2/z")).unwrap();
    note!("rename over: {:?}", fs::read(p("d2/z")).unwrap());
    fs::write(p("n1"), b"one").unwrap();
    fs::write(p("n2"), b"two").unwrap();
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            c(&p("n1")).as_ptr(),
            libc::AT_FDCWD,
            c(&p("n2")).as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    note!("noreplace {}", rc(r));
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            c(&p("n1")).as_ptr(),
            libc::AT_FDCWD,
            c(&p("d2/z")).as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    note!("exchange {} n1={:?} z={:?}", rc(r), fs::read(p("n1")).unwrap(), fs::read(p("d2/z")).unwrap());
    fs::create_dir(p("d3")).unwrap();
    fs::write(p("d3/f"), b"f").unwrap();
    note!("dir onto nonempty dir {}", errno_of(fs::rename(p("d1"), p("d3"))));
    note!("dir into itself {}", errno_of(fs::rename(p("d3"), p("d3/sub"))));
    note!("file onto dir {}", errno_of(fs::rename(p("n2"), p("d1"))));
    fs::rename(p("d3"), p("d1/moved")).unwrap();
    note!("moved dir content {:?}", fs::read(p("d1/moved/f")).unwrap());
    // Hard links share an inode and a link count.
    fs::hard_link(p("n2"), p("d1/n2link")).unwrap();
    let (m1, m2) = (fs::metadata(p("n2")).unwrap(), fs::metadata(p("d1/n2link")).unwrap());
    note!("hardlink same ino {} nlink {}", m1.ino() == m2.ino(), m1.nlink());
    fs::write(p("d1/n2link"), b"via link").unwrap();
    note!("through link {:?}", fs::read(p("n2")).unwrap());
    fs::remove_file(p("n2")).unwrap();
    note!("after unlink nlink {}", fs::metadata(p("d1/n2link")).unwrap().nlink());
    // Rename onto another link of the same inode is a no-op.
    fs::hard_link(p("d1/n2link"), p("d1/n2link2")).unwrap();
    fs::rename(p("d1/n2link"), p("d1/n2link2")).unwrap();
    note!("rename onto own link: both exist {} {}", p("d1/n2link").exists(), p("d1/n2link2").exists());
    // Symlinks.
    std::os::unix::fs::symlink("d1/moved/f", p("sl")).unwrap();
    std::os::unix::fs::symlink("/no/such/target/".repeat(50), p("dangling")).unwrap();
    note!("readlink {:?} len {}", fs::read_link(p("sl")).unwrap(), fs::symlink_metadata(p("dangling")).unwrap().len());
    note!("through symlink {:?}", fs::read(p("sl")).unwrap());
    // FIFO and socket.
    // SAFETY: valid C strings.
    note!("mkfifo {}", rc(unsafe { libc::mkfifo(c(&p("fifo")).as_ptr(), 0o600) }));
    // SAFETY: valid C string.
    note!("mknod sock {}", rc(unsafe { libc::mknod(c(&p("sock")).as_ptr(), libc::S_IFSOCK | 0o600, 0) }));
    note!("fifo type {:o}", fs::symlink_metadata(p("fifo")).unwrap().mode() & libc::S_IFMT);
    note!("sock type {:o}", fs::symlink_metadata(p("sock")).unwrap().mode() & libc::S_IFMT);
    // chmod, chown, utimens.
    fs::set_permissions(p("n1"), fs::Permissions::from_mode(0o604)).unwrap();
    // Root gives the file away; an ordinary user may only chown to itself (and its groups).
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = if is_root() { (1234, 5678) } else { unsafe { (libc::getuid(), libc::getgid()) } };
    std::os::unix::fs::chown(p("n1"), Some(uid), Some(gid)).unwrap();
    let t = [libc::timespec { tv_sec: 1_000_000, tv_nsec: 42 }, libc::timespec { tv_sec: 2_000_000, tv_nsec: 4242 }];
    // SAFETY: valid C string and timespec array.
    unsafe { libc::utimensat(libc::AT_FDCWD, c(&p("n1")).as_ptr(), t.as_ptr(), 0) };
    let m = fs::metadata(p("n1")).unwrap();
    note!(
        "meta {:o} {} {} {} {} {} {}",
        m.mode(),
        m.uid(),
        m.gid(),
        m.atime(),
        m.atime_nsec(),
        m.mtime(),
        m.mtime_nsec()
    );
    // SAFETY: valid C string.
    note!("access W {}", rc(unsafe { libc::access(c(&p("n1")).as_ptr(), libc::W_OK) }));
    // Extended attributes.
    note!("setxattr {}", sh(&format!("setfattr -n user.color -v blue {0} && setfattr -n user.empty {0} && getfattr -d --absolute-names {0} | grep user && setfattr -x user.color {0} && getfattr -n user.color {0}; echo $?", p("n1").display())).status.success());
    let o = sh(&format!("getfattr -d --absolute-names {} 2>&1 | grep user", p("n1").display()));
    note!("xattrs after remove: {}", String::from_utf8_lossy(&o.stdout).trim());
    // fallocate: extends size with zeros.
    let fa = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(p("fa")).unwrap();
    // SAFETY: valid fd.
    note!("fallocate {}", rc(unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&fa), 0, 0, 10_000) }));
    note!(
        "fallocate size {} zeros {}",
        fa.metadata().unwrap().len(),
        fs::read(p("fa")).unwrap().iter().all(|&b| b == 0)
    );
    let fd = std::os::fd::AsRawFd::as_raw_fd(&fa);
    // SAFETY: valid fd.
    let r = unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, 100_000) };
    note!("fallocate keep_size {}", rc(r));
    note!("keep_size size {}", fa.metadata().unwrap().len());
    // SEEK_DATA at 0 of a non-empty file, SEEK_HOLE at EOF.
    fa.write_all_at(&[1u8; 10_000], 0).unwrap();
    // SAFETY: valid fd.
    let d = unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&fa), 0, libc::SEEK_DATA) };
    // SAFETY: valid fd.
    let h = unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&fa), 0, libc::SEEK_HOLE) };
    note!("seek_data {d} seek_hole {h}");
    // flock and POSIX locks.
    let lf = File::create(p("lock")).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&lf);
    // SAFETY: valid fd.
    note!("flock ex {}", rc(unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) }));
    let other = File::open(p("lock")).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&other);
    // SAFETY: valid fd.
    let r = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
    note!("flock second {}", rc(r));
    // SAFETY: zeroed flock is valid; then filled.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_len = 10;
    // SAFETY: valid fd and flock struct.
    note!("posix lock {}", rc(unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) }));
    // Shared writable mmap.
    let mf = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(p("mm")).unwrap();
    mf.set_len(10_000).unwrap();
    // SAFETY: mapping a 10000-byte file we own, unmapped below.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            10_000,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&mf),
            0,
        );
        assert_ne!(ptr, libc::MAP_FAILED);
        let s = std::slice::from_raw_parts_mut(ptr as *mut u8, 10_000);
        s[5000..5005].copy_from_slice(b"mmap!");
        s[9999] = b'E';
        libc::msync(ptr, 10_000, libc::MS_SYNC);
        libc::munmap(ptr, 10_000);
    }
    drop(mf);
    let mm = fs::read(p("mm")).unwrap();
    note!("mmap wrote {:?} {}", &mm[5000..5005], mm[9999]);
    // Names: every byte but / and NUL, up to 255 bytes.
    let odd = std::ffi::OsStr::from_bytes(b"\x01\x7f\xff spaces\ttab\nnewline \xe2\x98\x83");
    fs::write(root.join(odd), b"odd").unwrap();
    fs::write(p(&"n".repeat(255)), b"long").unwrap();
    note!("long name too long {}", errno_of(fs::write(p(&"n".repeat(256)), b"x")));
    // Listing.
    let mut names: Vec<String> =
        fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    note!("listing {names:?}");
    let mut names: Vec<String> =
        fs::read_dir(p("d1")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    note!("listing d1 {names:?}");
    // statfs works.
    // SAFETY: zeroed statvfs is a valid out-buffer.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    note!("statvfs {} namemax {}", rc(unsafe { libc::statvfs(c(root).as_ptr(), &mut sv) }), sv.f_namemax);
    // Unlink an open file: still readable through the handle.
    fs::write(p("open-unlinked"), b"still here").unwrap();
    let mut ou = File::open(p("open-unlinked")).unwrap();
    fs::remove_file(p("open-unlinked")).unwrap();
    let mut s = String::new();
    ou.read_to_string(&mut s).unwrap();
    note!("open unlinked {s}");
    log
}

#[test]
fn operations_behave_like_a_plain_directory() {
    let Some(m) = Mounted::new("1g", &[]) else { return };
    let plain = exercise(&m.plain);
    let veil = exercise(&m.mnt);
    for (i, (a, b)) in plain.iter().zip(&veil).enumerate() {
        assert_eq!(a, b, "step {i} differs (left: plain tmpfs, right: veilfs)");
    }
    assert_eq!(plain.len(), veil.len());
}

#[test]
fn operations_without_writeback_cache() {
    let Some(m) = Mounted::new("1g", &["--no-writeback"]) else { return };
    let plain = exercise(&m.plain);
    let veil = exercise(&m.mnt);
    for (i, (a, b)) in plain.iter().zip(&veil).enumerate() {
        // Without the writeback cache SEEK_HOLE sees real holes; the generic answer differs only there.
        if a.starts_with("seek_data") {
            continue;
        }
        assert_eq!(a, b, "step {i} differs (left: plain tmpfs, right: veilfs --no-writeback)");
    }
}

#[test]
fn ciphertext_reveals_no_names_or_content_and_data_survives_remount() {
    let Some(mut m) = Mounted::new("1g", &[]) else { return };
    fs::create_dir_all(m.m("Secret Plans/Quarterly")).unwrap();
    fs::write(m.m("Secret Plans/Quarterly/merger-with-acme.txt"), "TOPSECRET merger price 42".repeat(1000)).unwrap();
    std::os::unix::fs::symlink("merger-with-acme.txt", m.m("Secret Plans/Quarterly/shortcut-name")).unwrap();
    sh(&format!("setfattr -n user.classified -v XATTRVALUE '{}'", m.m("Secret Plans").display()));
    m.remount();
    let dump = m.ciphertext_dump();
    for needle in
        [&b"Secret"[..], b"Quarterly", b"merger", b"TOPSECRET", b"shortcut", b"classified", b"XATTRVALUE", b"acme"]
    {
        assert!(!contains(&dump, needle), "{:?} is visible in the ciphertext", String::from_utf8_lossy(needle));
    }
    let x = sh(&format!("find {} -exec getfattr --absolute-names -d -m - {{}} + 2>/dev/null", m.cipher.display()));
    assert!(!contains(&x.stdout, b"XATTRVALUE") && !contains(&x.stdout, b"classified"), "xattr visible in ciphertext");
    assert!(contains(&x.stdout, b"user.veilfs."), "encrypted xattr stored on the ciphertext: {}", text(&x));
    assert_eq!(
        fs::read_to_string(m.m("Secret Plans/Quarterly/merger-with-acme.txt")).unwrap(),
        "TOPSECRET merger price 42".repeat(1000)
    );
    assert_eq!(fs::read_link(m.m("Secret Plans/Quarterly/shortcut-name")).unwrap(), Path::new("merger-with-acme.txt"));
    let o = sh(&format!("getfattr --only-values -n user.classified '{}'", m.m("Secret Plans").display()));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "XATTRVALUE");
}

/// The ciphertext files of a mount's root directory, largest first.
fn ciphertext_files_by_size(m: &Mounted) -> Vec<(u64, std::path::PathBuf)> {
    let mut v: Vec<_> = fs::read_dir(&m.cipher)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with("veilfs."))
        .map(|p| (fs::metadata(&p).unwrap().len(), p))
        .collect();
    v.sort_by(|a, b| b.cmp(a));
    v
}

#[test]
fn streamed_files_stay_fully_authenticated_and_only_real_holes_are_sparse() {
    // Write-back sends the 1 MiB pieces of a stream to several threads, so a piece often
    // arrives before the one below it. That must not mark the file SPARSE (in which zeroed
    // blocks would read as zeros instead of failing authentication). The SPARSE flag decides
    // that in a vault of v1 files; a block-map file authenticates its holes by their leaves
    // (`holes_read_as_zeros_and_a_written_block_replaced_by_zeros_is_an_integrity_error`).
    let Some(mut m) = Mounted::new("1g", &[]) else { return };
    m.umount();
    without_feature(&m.cipher, &m.passfile, veilfs_core::config::FEATURE_BLOCK_MAP);
    m.mount();
    for i in 0..3 {
        let o = sh(&format!(
            "dd if=/dev/zero of='{}' bs=4k count=16384 status=none && sync",
            m.m(&format!("s{i}")).display()
        ));
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = sh(&format!("printf x | dd of='{}' bs=1 seek=9000000 status=none", m.m("holey").display()));
    assert!(o.status.success(), "{}", text(&o));
    m.umount();
    let files = ciphertext_files_by_size(&m);
    assert_eq!(files.len(), 4);
    for (len, p) in &files[..3] {
        let h = fs::read(p).unwrap();
        assert_eq!(h[3] & 1, 0, "a streamed file ({len} bytes) was marked SPARSE");
    }
    let holey = fs::read(&files[3].1).unwrap();
    assert_eq!(holey[3] & 1, 1, "a file with a real hole must be marked SPARSE");
    // Zero one inner block of a streamed file: reading it must fail, not return zeros.
    let f = OpenOptions::new().write(true).open(&files[0].1).unwrap();
    f.write_all_at(&vec![0u8; 4096 + 28], 36 + 5 * (4096 + 28)).unwrap();
    drop(f);
    m.mount();
    let mut names: Vec<_> = (0..3).map(|i| m.m(&format!("s{i}"))).collect();
    names.retain(|p| fs::read(p).is_err());
    assert_eq!(names.len(), 1, "exactly the tampered file must fail to read");
    assert_eq!(fs::read(m.m("holey")).unwrap().len(), 9000001);
}

#[test]
fn syncfs_after_deleting_freshly_written_files_succeeds() {
    // With the write-back cache the kernel flushes the times of a file it wrote even after
    // the file was closed and deleted; that flush used to fail with ESTALE, which syncfs
    // then reported (found by stress-ng's io stressor).
    let Some(m) = Mounted::new("256m", &[]) else { return };
    let root = File::open(&m.mnt).unwrap();
    for round in 0..5 {
        for i in 0..200 {
            let p = m.m(&format!("f{i}"));
            let mut f = File::create(&p).unwrap();
            f.write_all(&[round as u8; 4096]).unwrap();
            drop(f);
            fs::remove_file(&p).unwrap();
        }
        // SAFETY: syncfs on a valid open fd.
        let r = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&root)) };
        assert_eq!(r, 0, "syncfs failed in round {round}: {}", std::io::Error::last_os_error());
    }
}

#[test]
fn concurrent_writers_leave_exactly_the_bytes_written() {
    let Some(m) = Mounted::new("2g", &[]) else { return };
    let path = m.m("shared");
    let chunk = 256 * 1024;
    let threads = 8;
    let f = File::create(&path).unwrap();
    f.set_len((chunk * threads) as u64).unwrap();
    drop(f);
    std::thread::scope(|s| {
        for t in 0..threads {
            let path = &path;
            s.spawn(move || {
                let f = OpenOptions::new().write(true).open(path).unwrap();
                // Unaligned pieces so neighbouring threads share blocks at the edges.
                let mut off = t * chunk;
                let end = (t + 1) * chunk;
                let mut i = 0u8;
                while off < end {
                    let len = (777 + 1000 * i as usize).min(end - off);
                    f.write_all_at(&vec![t as u8 + 1; len], off as u64).unwrap();
                    off += len;
                    i = i.wrapping_add(1) % 50;
                }
            });
        }
        // Many files at once, too.
        for t in 0..4 {
            let base = &m.mnt;
            s.spawn(move || {
                for i in 0..50 {
                    let data: Vec<u8> = (0..(i * 997 % 20000)).map(|x| (x * t + i) as u8).collect();
                    fs::write(base.join(format!("f-{t}-{i}")), &data).unwrap();
                    assert_eq!(fs::read(base.join(format!("f-{t}-{i}"))).unwrap(), data);
                }
            });
        }
    });
    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), chunk * threads);
    for t in 0..threads {
        assert!(data[t * chunk..(t + 1) * chunk].iter().all(|&b| b == t as u8 + 1), "region of thread {t} corrupted");
    }
}

#[test]
fn an_o_trunc_open_is_the_mounts_own_change_and_the_file_keeps_its_inode() {
    // CIPHERDIR's watch takes a close of a backing file that the mount did not note as its
    // own for someone else's rewrite, and gives the file a new inode. An O_TRUNC open closed
    // without a write was not noted: the kernel could then hold the old inode and the new one
    // at once, two open files of one backing file, each with its own block map in memory (a
    // write through one then failed with EIO, or lost the size the other had given it).
    for extra in [&[][..], &["--no-writeback"][..]] {
        let Some(m) = Mounted::new("64m", extra) else { return };
        let p = m.m("f");
        fs::write(&p, vec![7u8; 20_000]).unwrap();
        let ino = fs::metadata(&p).unwrap().ino();
        // That close's RELEASE (the kernel sends it after close returns) and its watch event
        // come first: the O_TRUNC open is then the file's only user.
        std::thread::sleep(Duration::from_millis(600));
        drop(OpenOptions::new().write(true).truncate(true).open(&p).unwrap());
        // The watch reads its events within a few milliseconds; give it ample time.
        std::thread::sleep(Duration::from_millis(600));
        let md = fs::metadata(&p).unwrap();
        assert_eq!((md.ino(), md.len()), (ino, 0), "{extra:?}: a new inode after the mount's own O_TRUNC");
        // One open file: a handle kept open and a write by path see one block map and size.
        let h = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        fs::write(&p, b"by path, longer than the handle's write").unwrap();
        h.write_all_at(b"handle", 0).unwrap();
        drop(h);
        assert_eq!(fs::read(&p).unwrap(), b"handleh, longer than the handle's write", "{extra:?}");
    }
}

#[test]
fn an_old_and_a_new_inode_of_one_backing_file_share_one_open_file() {
    // CIPHERDIR's watch gives a backing file rewritten in place by others a new inode while
    // the kernel may still hold the old one (here through an O_PATH descriptor, which opens
    // nothing in the daemon). Both inodes opened at once must share one open file: with a
    // block map in memory, two would go stale against each other (EIO, wrong sizes).
    let Some(m) = Mounted::new("64m", &["--no-writeback"]) else { return };
    let p = m.m("f");
    fs::write(&p, vec![7u8; 20_000]).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let opath = OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(&p).unwrap();
    // A sync tool rewrites the backing file in place (with the same bytes: still valid).
    let backing = fs::read_dir(&m.cipher)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.metadata().is_ok_and(|md| md.is_file() && md.len() > 20_000))
        .expect("the backing file")
        .path();
    let bytes = fs::read(&backing).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    fs::write(&backing, &bytes).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let old = OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&opath)))
        .unwrap();
    let new = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    assert_ne!(old.metadata().unwrap().ino(), new.metadata().unwrap().ino(), "the watch gave the file a new inode");
    new.set_len(30_000).unwrap();
    new.write_all_at(b"new", 25_000).unwrap();
    old.write_all_at(b"old", 0).unwrap();
    assert_eq!(old.metadata().unwrap().len(), 30_000, "the old inode sees the new one's size");
    old.set_len(6_000).unwrap();
    assert_eq!(new.metadata().unwrap().len(), 6_000, "the new inode sees the old one's truncate");
    drop((old, new, opath));
    let mut want = vec![7u8; 6_000];
    want[..3].copy_from_slice(b"old");
    assert_eq!(fs::read(&p).unwrap(), want);
}

#[test]
fn two_gib_sparse_file_and_absurd_truncate() {
    let Some(m) = Mounted::new("512m", &[]) else { return };
    let p = m.m("sparse");
    let f = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&p).unwrap();
    f.set_len(2 << 30).unwrap();
    f.write_all_at(b"middle", 1 << 30).unwrap();
    f.write_all_at(b"end", (2 << 30) - 3).unwrap();
    drop(f);
    let mut f = File::open(&p).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let (mut total, mut nonzero) = (0u64, Vec::new());
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            if b != 0 {
                nonzero.push((total + i as u64, b));
            }
        }
        total += n as u64;
    }
    assert_eq!(total, 2 << 30);
    let expect: Vec<(u64, u8)> = b"middle"
        .iter()
        .enumerate()
        .map(|(i, &b)| ((1 << 30) + i as u64, b))
        .chain(b"end".iter().enumerate().map(|(i, &b)| ((2 << 30) - 3 + i as u64, b)))
        .collect();
    assert_eq!(nonzero, expect);
    let used = fs::metadata(m.cipher.join(
        fs::read_dir(&m.cipher).unwrap().flatten().find(|e| e.metadata().unwrap().len() > 1 << 30).unwrap().file_name(),
    ))
    .unwrap()
    .blocks()
        * 512;
    assert!(used < 1 << 20, "2 GiB sparse file uses {used} bytes of ciphertext");
    // Absurd sizes: EFBIG or sparse, quickly, never gigabytes written.
    let t = Instant::now();
    let r = OpenOptions::new().write(true).open(&p).unwrap().set_len(999_999_999_999_999);
    assert!(t.elapsed() < Duration::from_secs(10));
    match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}"),
        Ok(()) => assert_eq!(fs::metadata(&p).unwrap().len(), 999_999_999_999_999),
    }
    let used = m.tmpfs.used();
    assert!(used < 64 << 20, "backing store holds {used} bytes");
}

#[test]
fn directory_with_100k_entries_lists_correctly() {
    let Some(m) = Mounted::new("2g", &[]) else { return };
    let dir = m.m("big");
    fs::create_dir(&dir).unwrap();
    let n = 100_000;
    for i in 0..n {
        File::create(dir.join(format!("entry-{i:06}"))).unwrap();
    }
    let mut names: Vec<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), n);
    names.sort();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(name, &format!("entry-{i:06}"));
    }
    assert!(dir.join("entry-054321").exists());
    assert!(!dir.join("entry-100000").exists());
}

/// A directory read in small `getdents` chunks while names are removed and added, and while
/// a second listing of it runs from the top, returns every name that was there throughout
/// exactly once and nothing that never was (tests/listing_churn.py), as tmpfs does. A locked
/// mount has no OPENDIR: its listings resume at the offset the kernel hands back in the
/// directory's newest snapshot (offsets are name cookies, not positions); a
/// `--shared-storage` mount keeps a snapshot per open directory.
#[test]
fn a_directory_listed_while_it_changes_returns_each_unchanged_name_exactly_once() {
    if !which("python3") {
        assert!(std::env::var("CI").is_err(), "python3 is needed");
        return;
    }
    for extra in [&[][..], &["--shared-storage"][..]] {
        let Some(m) = Mounted::new("64m", extra) else { return };
        let script = m.tmpfs.path.join("listing_churn.py");
        fs::write(&script, include_str!("listing_churn.py")).unwrap();
        for base in [&m.plain, &m.mnt] {
            let o = run("python3", &[script.to_str().unwrap(), base.join("churn").to_str().unwrap()]);
            assert!(o.status.success(), "{extra:?} {}: {}", base.display(), text(&o));
            assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n", "{extra:?} in {}", base.display());
        }
    }
}

fn make_rich_tree(root: &Path) {
    // Files of other owners only as root (an ordinary user cannot give files away).
    let chown = if is_root() { "chown 1000:1000 a/b/f5; chown -h 1001:1001 abs-link;" } else { "" };
    let o = sh(&format!(
        "set -e; cd {0}; mkdir -p a/b/c 'with space' empty; \
         for i in $(seq 1 40); do head -c $((i * 3001)) /dev/urandom > a/b/f$i; done; \
         cp -a /usr/share/doc/fuse3 docs 2>/dev/null || mkdir docs; \
         echo hi > 'with space/x y'; ln -s ../a/b/f1 'with space/rel-link'; ln -s /etc/hostname abs-link; \
         ln a/b/f2 a/hard2; mkfifo a/fifo; chmod 0751 a/b; chmod 0600 a/b/f3; chmod 4755 a/b/f4; {chown} \
         setfattr -n user.tag -v 'tagged' a/b/f6; setfattr -n user.bin -v 0xdeadbeef a; \
         find . -exec touch -h -d '2020-05-06 07:08:09.123456789' {{}} + ; \
         touch -h -d '2001-02-03 04:05:06.789' abs-link; touch -d '1999-12-31 23:59:59.123456789' a/b/f7",
        root.display()
    ));
    assert!(o.status.success(), "{}", text(&o));
}

fn assert_trees_equal(what: &str, a: &Path, b: &Path) {
    let o = run("diff", &["-r", "--no-dereference", "-x", "fifo", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(o.status.success(), "{what}: diff -r: {}", text(&o));
    // Owners, modes, times (ns), link counts, xattrs, symlink targets: one line per path.
    let meta = |root: &Path| {
        let o = sh(&format!(
            "cd {} && find . -path ./a -prune -o ! -type d -print0 | sort -z | xargs -0 stat -c '%n %f %u %g %h %s %Y' ; find . -type d -print0 | sort -z | xargs -0 stat -c '%n %f %u %g %Y' ; find . -exec getfattr -h -d --absolute-names {{}} + 2>/dev/null | sed 's|^# file: .*/\\./|# file: ./|'",
            root.display()
        ));
        String::from_utf8_lossy(&o.stdout).replace(&root.display().to_string(), "ROOT")
    };
    let (ma, mb) = (meta(a), meta(b));
    assert_eq!(ma, mb, "{what}: metadata differs");
    let nsec = |root: &Path| {
        String::from_utf8_lossy(
            &sh(&format!(
                "cd {} && find . -print0 | sort -z | xargs -0 stat -c '%n %y %i' | awk '{{print $1, $2, $3}}'",
                root.display()
            ))
            .stdout,
        )
        .into_owned()
    };
    assert_eq!(nsec(a), nsec(b), "{what}: timestamps differ");
    let links = |root: &Path| {
        fs::metadata(root.join("a/hard2")).unwrap().ino() == fs::metadata(root.join("a/b/f2")).unwrap().ino()
    };
    assert!(links(a) && links(b), "{what}: hard link lost");
}

#[test]
fn cp_a_and_rsync_a_round_trip_identically() {
    let Some(m) = Mounted::new("1g", &[]) else { return };
    let src = m.plain.join("src");
    fs::create_dir(&src).unwrap();
    make_rich_tree(&src);
    let o = run("cp", &["-a", src.to_str().unwrap(), m.m("cp").to_str().unwrap()]);
    assert!(o.status.success(), "cp -a: {}", text(&o));
    assert_trees_equal("cp -a in", &src, &m.m("cp"));
    if which("rsync") {
        let o = run("rsync", &["-aHAX", &format!("{}/", src.display()), &format!("{}/", m.m("rs").display())]);
        assert!(o.status.success(), "rsync: {}", text(&o));
        assert_trees_equal("rsync in", &src, &m.m("rs"));
        // And back out again.
        let back = m.plain.join("back");
        let o = run("rsync", &["-aHAX", &format!("{}/", m.m("rs").display()), &format!("{}/", back.display())]);
        assert!(o.status.success(), "rsync out: {}", text(&o));
        assert_trees_equal("rsync out", &src, &back);
        // An almost up-to-date tree: rsync -an finds exactly the changed file.
        fs::write(src.join("a/b/f9"), b"changed").unwrap();
        let o = run("rsync", &["-ain", &format!("{}/", src.display()), &format!("{}/", m.m("rs").display())]);
        assert_eq!(String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.contains("f9")).count(), 1, "{}", text(&o));
    } else {
        panic!("rsync is missing (apt-get install rsync)");
    }
}

#[test]
fn tampered_ciphertext_gives_eio_and_a_log_line() {
    let Some(mut m) = Mounted::new("256m", &[]) else { return };
    fs::write(m.m("victim"), vec![b'v'; 50_000]).unwrap();
    fs::write(m.m("other"), vec![b'o'; 50_000]).unwrap();
    m.umount();
    let victim = fs::read_dir(&m.cipher)
        .unwrap()
        .flatten()
        .filter(|e| e.metadata().unwrap().len() > 40_000)
        .map(|e| e.path())
        .collect::<Vec<_>>();
    assert_eq!(victim.len(), 2);
    let mut c = fs::read(&victim[0]).unwrap();
    c[20_000] ^= 1;
    fs::write(&victim[0], c).unwrap();
    // Foreground mount so the log line can be read.
    let log = m.tmpfs.path.join("log");
    let child = foreground_mount(&m, &log);
    let results: Vec<_> =
        ["victim", "other", "victim", "other"].iter().map(|n| fs::read(m.m(n)).map_err(|e| e.raw_os_error())).collect();
    assert_eq!(
        results.iter().filter(|r| *r == &Err(Some(libc::EIO))).count(),
        2,
        "exactly the tampered file gives EIO, each time: {results:?}"
    );
    assert!(results.iter().any(|r| r.as_ref().is_ok_and(|d| d.len() == 50_000)));
    let _ = run(&BIN, &["umount", m.mnt.to_str().unwrap()]);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let log = fs::read_to_string(&log).unwrap();
    let name = victim[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(log.contains("integrity error") && log.contains(&name), "log must name the ciphertext file: {log}");
    // One line for the incident, not one per request the reads made (readahead, retries).
    assert_eq!(log.lines().filter(|l| l.contains("integrity error")).count(), 1, "{log}");
    assert!(!log.contains("victim"), "no plaintext names in the log at default verbosity: {log}");
}

/// A daemon on a machine with neither journal nor syslog (no /dev/log: a container) logs to
/// a file, and names it when it mounts; an integrity error is found there, once.
#[test]
fn daemon_without_journal_or_syslog_logs_to_a_file_it_names() {
    if Path::new("/dev/log").exists() || Path::new("/run/systemd/journal/socket").exists() {
        eprintln!("skipped: this machine has syslog or a journal");
        return;
    }
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    fs::write(m.m("victim"), vec![b'v'; 50_000]).unwrap();
    m.umount();
    let victim = fs::read_dir(&m.cipher).unwrap().flatten().find(|e| e.metadata().unwrap().len() > 40_000).unwrap();
    let mut c = fs::read(victim.path()).unwrap();
    c[20_000] ^= 1;
    fs::write(victim.path(), c).unwrap();
    let log = m.tmpfs.path.join("veilfs.log");
    let o = std::process::Command::new(&BIN)
        .args([
            "mount",
            m.cipher.to_str().unwrap(),
            m.mnt.to_str().unwrap(),
            "--passfile",
            m.passfile.to_str().unwrap(),
        ])
        .env("VEILFS_LOG_FILE", &log)
        .output()
        .unwrap();
    let _guard = UnmountOnDrop(m.mnt.clone());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&format!("the mount logs to {}", log.display())), "{}", text(&o));
    for _ in 0..2 {
        assert_eq!(errno_of(fs::read(m.m("victim"))), format!("errno {}", libc::EIO));
    }
    let o = run(&BIN, &["umount", m.mnt.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let logged = fs::read_to_string(&log).unwrap();
    let name = victim.file_name().to_string_lossy().into_owned();
    let lines: Vec<&str> = logged.lines().filter(|l| l.contains("integrity error")).collect();
    assert!(lines.len() == 1 && lines[0].contains(&name), "one line naming {name}: {logged}");
    assert_eq!(fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);
}

/// Attack: someone who can write the ciphertext swaps two entries' bindings (`D1.S1`,
/// `D2.S2` become `D1.S2`, `D2.S1`: each name now promises the other file) after the mount
/// verified both, so the name cipher's memo holds both verdicts. Each is checked again under
/// its new name: EIO and one log line each, naming the swapped ciphertext entry.
#[test]
fn entries_swapped_in_the_ciphertext_after_the_mount_verified_them_give_eio() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    fs::create_dir(m.m("d")).unwrap();
    fs::write(m.m("d/a"), b"alpha").unwrap();
    fs::write(m.m("d/b"), b"bravo").unwrap();
    m.umount();
    let log = m.tmpfs.path.join("log");
    // Shared storage: the mount reads the directory again when it changed behind it.
    let child = foreground_mount_with(&m, &log, &["--shared-storage"]);
    let _guard = UnmountOnDrop(m.mnt.clone());
    assert_eq!(fs::read(m.m("d/a")).unwrap(), b"alpha");
    assert_eq!(fs::read(m.m("d/b")).unwrap(), b"bravo");
    let backing = fs::read_dir(&m.cipher).unwrap().flatten().find(|e| e.file_type().unwrap().is_dir()).unwrap().path();
    let mut entries: Vec<String> = fs::read_dir(&backing)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with("veilfs."))
        .collect();
    entries.sort();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let ((d1, s1), (d2, s2)) = (entries[0].rsplit_once('.').unwrap(), entries[1].rsplit_once('.').unwrap());
    let swapped = [format!("{d1}.{s2}"), format!("{d2}.{s1}")];
    fs::rename(backing.join(&entries[0]), backing.join("tmp")).unwrap();
    fs::rename(backing.join(&entries[1]), backing.join(&swapped[0])).unwrap();
    fs::rename(backing.join("tmp"), backing.join(&swapped[1])).unwrap();
    // The kernel forgets its nodes, so both names are looked up again.
    sh("sync; echo 2 > /proc/sys/vm/drop_caches");
    for n in ["d/a", "d/b"] {
        assert_eq!(errno_of(fs::read(m.m(n))), format!("errno {}", libc::EIO), "{n}");
    }
    let _ = run(&BIN, &["umount", m.mnt.to_str().unwrap()]);
    assert!(child.wait_with_output().unwrap().status.success());
    let log = fs::read_to_string(&log).unwrap();
    for name in &swapped {
        let lines = log.lines().filter(|l| l.contains("integrity error") && l.contains(name.as_str())).count();
        assert!(lines >= 1, "a log line naming {name}: {log}");
    }
}

#[test]
fn iv_name_copied_from_another_directory_gives_eio_and_one_log_line() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    fs::create_dir(m.m("d1")).unwrap();
    fs::create_dir(m.m("d2")).unwrap();
    fs::write(m.m("d2/y"), b"y").unwrap();
    m.umount();
    // The backing d2 is the directory with a file in it; its IV name is replaced by d1's.
    let dirs = iv_copies(&m.cipher);
    let (d1, d2): (Vec<_>, Vec<_>) =
        dirs.iter().filter(|(d, _)| *d != m.cipher).partition(|(d, _)| fs::read_dir(d).unwrap().count() == 1);
    let ((_, c1), (d2, c2)) = (&d1[0], &d2[0]);
    fs::remove_file(d2.join(&c2[0].0)).unwrap();
    fs::write(d2.join(&c1[0].0), b"").unwrap();
    let log = m.tmpfs.path.join("log");
    let child = foreground_mount(&m, &log);
    assert_eq!(errno_of(fs::read(m.m("d2/y"))), format!("errno {}", libc::EIO));
    assert_eq!(fs::read_dir(m.m("d1")).unwrap().count(), 0, "d1 itself is fine");
    let _ = run(&BIN, &["umount", m.mnt.to_str().unwrap()]);
    assert!(child.wait_with_output().unwrap().status.success());
    let log = fs::read_to_string(&log).unwrap();
    let copied = d2.join(&c1[0].0).display().to_string();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("integrity error")).collect();
    assert!(lines.len() == 1 && lines[0].contains(&copied), "one line naming {copied}: {log}");
}

/// mkdir, rename (into another directory, over an empty one) and rmdir of directories through
/// a mount, across a remount: every backing directory keeps exactly one IV copy of the
/// vault's form (docs/FORMAT.md §7.1).
fn directory_ops_keep_one_iv_copy_each(iv_in_name: bool) {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    if !iv_in_name {
        m.umount();
        without_iv_in_name(&m.cipher, &m.passfile);
        m.mount();
    }
    fs::create_dir_all(m.m("a/b/c")).unwrap();
    fs::write(m.m("a/b/c/f"), b"deep").unwrap();
    fs::create_dir(m.m("e")).unwrap();
    fs::rename(m.m("a/b"), m.m("b2")).unwrap();
    assert_eq!(errno_of(fs::remove_dir(m.m("b2"))), format!("errno {}", libc::ENOTEMPTY));
    fs::rename(m.m("b2"), m.m("e")).unwrap();
    fs::remove_dir(m.m("a")).unwrap();
    fs::create_dir(m.m("a")).unwrap();
    m.remount();
    assert_eq!(fs::read(m.m("e/c/f")).unwrap(), b"deep");
    let mut top: Vec<String> =
        fs::read_dir(&m.mnt).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    top.sort();
    assert_eq!(top, ["a", "e"]);
    fs::remove_file(m.m("e/c/f")).unwrap();
    fs::remove_dir(m.m("e/c")).unwrap();
    m.umount();
    let dirs = iv_copies(&m.cipher);
    assert_eq!(dirs.len(), 3, "the top, a and e: {dirs:?}");
    for (d, copies) in dirs {
        match iv_in_name {
            true => assert!(copies.len() == 1 && copies[0].0.starts_with("veilfs.diriv.") && copies[0].1 == 0),
            false => assert_eq!(copies, [("veilfs.diriv".to_string(), 16)], "{}", d.display()),
        }
    }
}

#[test]
fn directories_made_renamed_and_removed_through_a_mount_keep_one_iv_name_each() {
    directory_ops_keep_one_iv_copy_each(true);
}

#[test]
fn directories_of_a_vault_without_iv_in_name_keep_their_iv_file_through_a_mount() {
    directory_ops_keep_one_iv_copy_each(false);
}

#[test]
fn mount_errors_are_clear_and_mount_nothing() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    let other = m.tmpfs.path.join("mnt2");
    fs::create_dir(&other).unwrap();
    let wrong = m.tmpfs.path.join("wrong");
    common::write_passfile(&wrong, "nope");
    // A second writer of a mounted vault is refused before any password (the vault lock)...
    let o = run(
        &BIN,
        &["mount", m.cipher.to_str().unwrap(), other.to_str().unwrap(), "--passfile", wrong.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(9), "{}", text(&o));
    // ...and so is a --shared-storage mount beside one that caches...
    let cipher = m.cipher.clone();
    let shared = |pass: &Path| {
        let (c, o, p) = (cipher.to_str().unwrap(), other.to_str().unwrap(), pass.to_str().unwrap());
        run(&BIN, &["mount", c, o, "--passfile", p, "--shared-storage"])
    };
    let o = shared(&wrong);
    assert_eq!(o.status.code(), Some(9), "{}", text(&o));
    // ...while a wrong password for a vault nobody holds is exit 3.
    m.umount();
    let o = shared(&wrong);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    m.mount();
    let o = run(
        &BIN,
        &[
            "mount",
            m.cipher.to_str().unwrap(),
            m.tmpfs.path.join("nowhere").to_str().unwrap(),
            "--passfile",
            m.passfile.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(4), "a missing mount point is a wrong path: {}", text(&o));
    let o = run(
        &BIN,
        &[
            "mount",
            m.tmpfs.path.join("novault").to_str().unwrap(),
            other.to_str().unwrap(),
            "--passfile",
            m.passfile.to_str().unwrap(),
        ],
    );
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let o = run(
        &BIN,
        &["mount", m.cipher.to_str().unwrap(), m.mnt.to_str().unwrap(), "--passfile", m.passfile.to_str().unwrap()],
    );
    // A mount point that is a mount is fine (mounts stack), but this vault is in use there.
    assert_eq!(o.status.code(), Some(9), "already mounted: {}", text(&o));
    assert!(
        !sh(&format!("grep -q ' {} ' /proc/mounts", other.display())).status.success(),
        "nothing mounted on failure"
    );
}

#[test]
fn read_only_mount_refuses_changes() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    fs::write(m.m("f"), b"data").unwrap();
    m.umount();
    m.extra = vec!["--read-only".into()];
    m.mount();
    assert_eq!(fs::read(m.m("f")).unwrap(), b"data");
    assert_eq!(fs::write(m.m("g"), b"x").unwrap_err().raw_os_error(), Some(libc::EROFS));
    assert_eq!(OpenOptions::new().write(true).open(m.m("f")).unwrap_err().raw_os_error(), Some(libc::EROFS));
}

#[test]
fn sigterm_and_idle_unmount_cleanly() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    fs::write(m.m("f"), b"flushed on shutdown").unwrap();
    let mounted = |m: &Mounted| sh(&format!("grep -q ' {} ' /proc/mounts", m.mnt.display())).status.success();
    let pid = String::from_utf8_lossy(&run("pgrep", &["-f", &format!("veilfs mount {}", m.cipher.display())]).stdout)
        .trim()
        .to_string();
    assert!(!pid.is_empty(), "daemon pid");
    run("kill", &["-TERM", pid.lines().next().unwrap()]);
    let t = Instant::now();
    while mounted(&m) {
        assert!(t.elapsed() < Duration::from_secs(10), "SIGTERM did not unmount");
        std::thread::sleep(Duration::from_millis(50));
    }
    m.umount(); // bookkeeping only
    m.extra = vec!["--idle".into(), "2s".into()];
    m.mount();
    assert_eq!(fs::read(m.m("f")).unwrap(), b"flushed on shutdown");
    let t = Instant::now();
    while mounted(&m) {
        assert!(t.elapsed() < Duration::from_secs(20), "--idle did not unmount");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(t.elapsed() >= Duration::from_secs(1));
}

#[test]
fn shared_storage_sees_changes_from_another_mount() {
    let Some(m) = Mounted::new("128m", &["--shared-storage"]) else { return };
    let second = m.tmpfs.path.join("second");
    fs::create_dir(&second).unwrap();
    let o = m.mount_cmd(&second);
    assert!(o.status.success(), "{}", text(&o));
    let res = std::panic::catch_unwind(|| {
        fs::write(m.m("from-first"), b"one").unwrap();
        assert_eq!(fs::read(second.join("from-first")).unwrap(), b"one");
        fs::write(second.join("from-first"), b"changed in second").unwrap();
        assert_eq!(fs::read(m.m("from-first")).unwrap(), b"changed in second");
        fs::rename(second.join("from-first"), second.join("renamed")).unwrap();
        assert!(m.m("renamed").exists() && !m.m("from-first").exists());
        fs::create_dir(second.join("dir")).unwrap();
        fs::write(m.m("dir/inner"), b"inner").unwrap();
        assert_eq!(fs::read(second.join("dir/inner")).unwrap(), b"inner");
    });
    let _ = run(&BIN, &["umount", second.to_str().unwrap()]);
    res.unwrap();
}

/// Runs `script` as uid/gid 1000 (or 1001) with `sh -c`, returning "ok" or the failing step.
fn as_user(uid: u32, script: &str) -> String {
    let o =
        run("setpriv", &[&format!("--reuid={uid}"), &format!("--regid={uid}"), "--clear-groups", "sh", "-c", script]);
    format!("{} {}", o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).trim())
}

fn strip_root(lines: Vec<String>, root: &Path) -> Vec<String> {
    lines.into_iter().map(|l| l.replace(&root.display().to_string(), "ROOT")).collect()
}

fn multi_user_script(root: &Path) -> Vec<String> {
    let r = root.display();
    let mut out = Vec::new();
    sh(&format!("mkdir -p {r}/shared {r}/private && chmod 1777 {r}/shared && chmod 0700 {r}/private && mkdir -p {r}/sgid && chgrp 1001 {r}/sgid && chmod 2777 {r}/sgid"));
    out.push(as_user(1000, &format!("echo a > {r}/shared/alice && stat -c '%u %g %a' {r}/shared/alice")));
    out.push(as_user(1001, &format!("rm {r}/shared/alice 2>&1; echo rm=$?")));
    out.push(as_user(1001, &format!("echo x >> {r}/shared/alice 2>&1; echo append=$?")));
    out.push(as_user(1001, &format!("cat {r}/shared/alice >/dev/null 2>&1; echo read=$?")));
    out.push(as_user(1000, &format!("chmod 600 {r}/shared/alice; echo chmod=$?")));
    out.push(as_user(1001, &format!("cat {r}/shared/alice >/dev/null 2>&1; echo read=$?")));
    out.push(as_user(1001, &format!("chmod 777 {r}/shared/alice 2>&1; echo chmod=$?")));
    out.push(as_user(1000, &format!("chown 1001 {r}/shared/alice 2>&1; echo chown=$?")));
    out.push(as_user(1000, &format!("ls {r}/private >/dev/null 2>&1; echo ls=$?")));
    out.push(as_user(1000, &format!("touch {r}/private/x 2>&1; echo touch=$?")));
    out.push(as_user(1000, &format!("mkdir {r}/shared/adir && stat -c '%u %g %a' {r}/shared/adir")));
    out.push(as_user(
        1000,
        &format!("touch {r}/sgid/f && mkdir {r}/sgid/d && stat -c '%u %g %a' {r}/sgid/f {r}/sgid/d"),
    ));
    out.push(as_user(1000, &format!("rm {r}/shared/alice && echo removed")));
    out.push(as_user(1000, &format!("ln -s /etc/passwd {r}/shared/sl && stat -c '%u %g' {r}/shared/sl -L >/dev/null && stat -c '%u %g' {r}/shared/sl")));
    out.push(as_user(1001, &format!("touch -d 2000-01-01 {r}/shared/adir 2>&1; echo utime=$?")));
    out
}

#[test]
fn multi_user_permissions_match_a_local_filesystem() {
    if !root_only("acts as uids 1000 and 1001 (setpriv needs CAP_SETUID) in a mount shared through --allow-other") {
        return;
    }
    let Some(m) = Mounted::new("64m", &["--allow-other"]) else { return };
    if !which("setpriv") {
        panic!("setpriv (util-linux) is needed");
    }
    // The plain reference must be reachable by other users too.
    fs::set_permissions(&m.tmpfs.path, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&m.plain, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&m.mnt, fs::Permissions::from_mode(0o755)).unwrap();
    let plain = strip_root(multi_user_script(&m.plain), &m.plain);
    let veil = strip_root(multi_user_script(&m.mnt), &m.mnt);
    assert_eq!(plain, veil, "left: plain tmpfs, right: veilfs");
}

/// Runs the Python `script` with the case directory as its argument in a fresh directory of
/// tmpfs and of the mount, once with the write-back cache and once without, and compares what
/// it prints. Leaves the mount without the write-back cache.
fn same_as_tmpfs_in_both_cache_modes(m: &mut Mounted, script: &str) {
    for (case, extra) in [("wb", None), ("nowb", Some("--no-writeback"))] {
        if let Some(opt) = extra {
            m.umount();
            m.extra.push(opt.to_string());
            m.mount();
        }
        let run = |r: &Path| {
            let dir = r.join(case);
            fs::create_dir(&dir).unwrap();
            let o = std::process::Command::new("python3").arg("-c").arg(script).arg(&dir).output().unwrap();
            assert!(o.status.success(), "{case} in {}: {}", r.display(), text(&o));
            sh(&format!("chmod -R u+rwx {}", dir.display()));
            text(&o)
        };
        let (plain, veil) = (run(&m.plain), run(&m.mnt));
        assert_eq!(plain, veil, "{case}: left: plain tmpfs, right: veilfs");
    }
}

/// Prints what each call gave (`ok`, a value, or the error), for [`same_as_tmpfs_in_both_cache_modes`].
const PY_TRY: &str = r"import os, sys
os.chdir(sys.argv[1])
def t(name, f):
    try:
        r = f()
        print(name, 'ok' if r is None else r)
    except OSError as e:
        print(name, e.strerror)
";

/// A file whose first name the mount knows lies in a directory its owner may no longer search
/// (chmod 0600 while the file is open), used through its other name and the open fd: Linux
/// needs no name for that, the daemon does. A daemon that is not root got EACCES at its own
/// backing step by that name: link and removexattr failed with EACCES, and with the write-back
/// cache the kernel's flush of the file's times failed, which made a later close EIO (fsx seeds
/// 5110828998909097518, 4769455689665124616, 6269957571406070883, as an ordinary user).
#[test]
fn a_file_whose_directory_denies_its_owner_search_works_through_its_other_name_as_on_tmpfs() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    let script = format!(
        "{PY_TRY}\
os.mkdir('d')\n\
with open('d/f', 'wb') as f: f.write(b'x' * 100)\n\
os.link('d/f', 'top')\n\
fd = os.open('d/f', os.O_RDWR)\n\
os.chmod('d', 0o600)\n\
t('pwrite', lambda: os.pwrite(fd, b'y' * 5000, 10))\n\
t('fstat', lambda: oct(os.fstat(fd).st_mode))\n\
t('fchmod', lambda: os.fchmod(fd, 0o640))\n\
t('fsetxattr', lambda: os.setxattr(fd, 'user.a', b'1'))\n\
t('close', lambda: os.close(fd))\n\
t('utime top', lambda: os.utime('top', (1, 2)))\n\
t('chmod top', lambda: os.chmod('top', 0o600))\n\
t('setxattr top', lambda: os.setxattr('top', 'user.b', b'2'))\n\
t('removexattr top', lambda: os.removexattr('top', 'user.b'))\n\
t('removexattr top again', lambda: os.removexattr('top', 'user.b'))\n\
t('getxattr top', lambda: os.getxattr('top', 'user.a'))\n\
t('link top', lambda: os.link('top', 'top2'))\n\
t('stat top2', lambda: (oct(os.stat('top2').st_mode), os.stat('top2').st_size, os.stat('top2').st_nlink))\n\
t('read top2', lambda: open('top2', 'rb').read().count(b'y'))\n\
fd = os.open('top', os.O_WRONLY | os.O_APPEND)\n\
t('append', lambda: os.write(fd, b'z' * 10))\n\
t('close', lambda: os.close(fd))\n\
t('mtime top', lambda: int(os.stat('top').st_mtime) > 2)\n"
    );
    same_as_tmpfs_in_both_cache_modes(&mut m, &script);
}

/// A set-group-id file (group-executable, so Linux clears the bit at a write by its owner)
/// written with a hole before the chmod, then closed: tmpfs keeps the bit, since nothing is
/// written after the chmod. A daemon that is not root cleared it at its own header write when
/// the last handle closed (declaring the hole), which the backing filesystem takes for a write
/// by an unprivileged process (fsx seed 15151829520160468, as an ordinary user).
#[test]
fn setgid_bits_survive_the_daemons_header_write_at_the_last_close_as_on_tmpfs() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    let script = format!(
        "{PY_TRY}\
fd = os.open('sg', os.O_RDWR | os.O_CREAT, 0o640)\n\
os.pwrite(fd, b'z', 100000)\n\
os.chmod('sg', 0o2750)\n\
t('close', lambda: os.close(fd))\n\
t('mode', lambda: oct(os.stat('sg').st_mode))\n\
fd = os.open('su', os.O_RDWR | os.O_CREAT, 0o755)\n\
os.pwrite(fd, b'z', 3)\n\
os.chmod('su', 0o4755)\n\
t('fallocate', lambda: os.posix_fallocate(fd, 0, 50000))\n\
t('mode', lambda: oct(os.stat('su').st_mode))\n\
t('fsync', lambda: os.fsync(fd))\n\
t('close', lambda: os.close(fd))\n\
t('mode', lambda: oct(os.stat('su').st_mode))\n"
    );
    same_as_tmpfs_in_both_cache_modes(&mut m, &script);
    m.remount();
    let modes = |r: &Path| text(&sh(&format!("cd {} && stat -c '%n %a %s' */s?", r.display())));
    assert_eq!(modes(&m.plain), modes(&m.mnt));
}

/// Directories whose mode denies their owner (allowed on Linux: the owner still sees, stats,
/// lists or removes them as the mode says), files written through a handle opened before a
/// chmod to 0400 or with mode 0200, and a set-group-id file written through a shared mapping
/// (Linux keeps the bit). A daemon running as root never noticed either; a user's own
/// mount (scripts/test-nonroot.sh runs this file as an ordinary user) showed such directories
/// as missing after a remount, refused `rmdir` with EACCES instead of ENOTEMPTY, and cleared
/// the bit at its own backing write.
#[test]
fn directories_denying_their_owner_and_setgid_mmap_writes_behave_as_on_tmpfs_across_a_remount() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    let dirs = "d0:000 d100:100 d300:300 d500:500 d600:600 d644:644";
    let setup = |r: &Path| {
        let o = sh(&format!(
            "cd {} && for x in {dirs}; do d=${{x%:*}}; mkdir $d && echo $d > $d/f && mkdir $d/sub; done && \
             mkdir e0 e500 && chmod 000 e0 && chmod 500 e500 && \
             head -c 5000 /dev/zero > sg && chmod 2750 sg && \
             for x in {dirs}; do chmod ${{x#*:}} ${{x%:*}}; done",
            r.display()
        ));
        assert!(o.status.success(), "setup in {}: {}", r.display(), text(&o));
    };
    let mmap_write =
        "python3 -c 'import mmap,os; fd=os.open(\"sg\",os.O_RDWR); m=mmap.mmap(fd,0); m[100:200]=b\"y\"*100; \
                      m.flush(); m.close(); os.close(fd)'";
    let check = |r: &Path| -> Vec<String> {
        let script = format!(
            "cd {} && echo top: $(ls) && for x in {dirs}; do d=${{x%:*}}; echo == $d; stat -c '%a %F' $d; \
             ls $d 2>&1; cat $d/f 2>&1; ls $d/sub 2>&1; rmdir $d 2>&1; done; \
             rmdir e0 2>&1 && echo e0 removed; rmdir e500 2>&1 && echo e500 removed; \
             stat -c '%a' sg; {mmap_write} && stat -c '%a' sg; \
             echo abc > w && chmod 200 w && echo xyz > w && echo write-only written; chmod 600 w; cat w; \
             exec 3>>w2; chmod 400 w2; echo late >&3; exec 3>&-; chmod 600 w2; cat w2; echo top: $(ls)",
            r.display()
        );
        text(&sh(&script)).lines().map(str::to_string).collect()
    };
    setup(&m.plain);
    setup(&m.mnt);
    m.remount();
    let plain = check(&m.plain);
    // The one known difference (README, "Known differences of a user's mount"): a mount
    // opens directories without asking the daemon (no OPENDIR), so a directory that denies
    // its owner read opens and its first read fails, where tmpfs refuses the open. `ls`
    // fails with EACCES either way; only its wording names the step.
    let veil: Vec<String> = check(&m.mnt)
        .into_iter()
        .map(|l| match l.strip_prefix("ls: reading directory ") {
            Some(rest) if rest.ends_with(": Permission denied") => format!("ls: cannot open directory {rest}"),
            _ => l,
        })
        .collect();
    assert_eq!(plain, veil, "left: plain tmpfs, right: veilfs (after a remount)");
    // And once more after the checks changed things (removed directories stay removed).
    m.remount();
    let o = |r: &Path| text(&sh(&format!("cd {} && ls && stat -c '%n %a' *", r.display())));
    assert_eq!(o(&m.plain), o(&m.mnt));
    // Leave nothing the tmpfs teardown cannot remove.
    for r in [&m.plain, &m.mnt] {
        sh(&format!("chmod -R u+rwx {}", r.display()));
    }
}

// ---------------------------------------------------------------------------------------
// A mount that holds the vault lock lets the kernel cache names and attributes
// for an hour; every change must still be seen at once (crates/veilfs-fuse/src/lib.rs,
// "Caching"). Each check reads through `stat` in another process, after that process has
// seen the old state (so the kernel cached it).
// ---------------------------------------------------------------------------------------

/// `stat -c FMT path` in another process: what any program would see now (or the error).
fn stat_fmt(fmt: &str, p: &Path) -> String {
    let o = run("stat", &["-c", fmt, p.to_str().unwrap()]);
    if o.status.success() {
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    } else {
        "missing".to_string()
    }
}

/// The backing file of the only regular file of the vault's top directory that is not
/// the vault's own (config, lock).
fn only_backing_file(m: &Mounted) -> std::path::PathBuf {
    let files: Vec<_> = fs::read_dir(&m.cipher)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_file() && !e.file_name().to_string_lossy().starts_with("veilfs."))
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

/// The kernel really caches on a mount that holds the lock (a change made to the backing
/// store behind the mount's back stays unseen: so the checks below are not vacuous), and
/// every change made through the mount is seen at once by another process: mode, owner,
/// times, size and modification time after a write and a truncation, a rename over a name,
/// a new link's count, an unlink, an xattr's change time, and the access time a read moves.
/// These reach the kernel in replies or by its own bookkeeping (no invalidation of ours).
#[test]
fn a_caching_mount_caches_and_every_change_through_it_is_seen_at_once() {
    let Some(m) = Mounted::new("64m", &[]) else { return };
    let f = m.m("f");
    // Written and fsynced: the header's settling (which has the kernel drop the attributes it
    // caches) happens inside the fsync, not at a RELEASE that may come after the stat below.
    let mut w = File::create(&f).unwrap();
    w.write_all(b"0123456789").unwrap();
    w.sync_all().unwrap();
    drop(w);
    let all = "%a %u %g %s %Y %h";
    let before = stat_fmt(all, &f);
    // Behind the mount's back: the cached mode stays (an hour).
    let backing = only_backing_file(&m);
    fs::set_permissions(&backing, fs::Permissions::from_mode(0o604)).unwrap();
    assert_eq!(stat_fmt(all, &f), before, "the kernel caches attributes");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(stat_fmt("%a", &f), "640", "chmod");
    if is_root() {
        std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
        assert_eq!(stat_fmt("%u %g", &f), "1234 5678", "chown");
    }
    let old = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    File::options().write(true).open(&f).unwrap().set_times(fs::FileTimes::new().set_modified(old)).unwrap();
    assert_eq!(stat_fmt("%Y", &f), "1000000000", "utimens");
    OpenOptions::new().append(true).open(&f).unwrap().write_all(b"abcde").unwrap();
    let (size, mtime) = stat_fmt("%s %Y", &f).split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).unwrap();
    assert_eq!(size, "15", "size after a write");
    assert_ne!(mtime, "1000000000", "mtime after a write");
    File::options().write(true).open(&f).unwrap().set_len(3).unwrap();
    assert_eq!(stat_fmt("%s", &f), "3", "ftruncate");
    fs::write(m.m("g"), b"gg").unwrap();
    assert_eq!(stat_fmt("%s", &m.m("g")), "2");
    fs::rename(m.m("g"), &f).unwrap();
    assert_eq!((stat_fmt("%s", &f), stat_fmt("%s", &m.m("g"))), ("2".into(), "missing".into()), "rename over");
    assert_eq!(stat_fmt("%h", &f), "1");
    fs::hard_link(&f, m.m("h")).unwrap();
    assert_eq!((stat_fmt("%h", &f), stat_fmt("%h", &m.m("h"))), ("2".into(), "2".into()), "link count");
    fs::remove_file(m.m("h")).unwrap();
    assert_eq!((stat_fmt("%h", &f), stat_fmt("%h", &m.m("h"))), ("1".into(), "missing".into()), "unlink");
    let ctime = stat_fmt("%.9Z", &f);
    std::thread::sleep(Duration::from_millis(20));
    xattr_set(&f, "user.cached", b"v").unwrap();
    assert_ne!(stat_fmt("%.9Z", &f), ctime, "change time after setxattr");
    // Only `user.` attributes are stored: `ls -l` learns that from one answer per device
    // instead of asking for every file (two round trips each).
    for name in ["security.selinux", "system.posix_acl_access"] {
        assert_eq!(xattr_get(&f, name).map_err(|e| e.raw_os_error()), Err(Some(libc::EOPNOTSUPP)), "{name}");
    }
    // relatime: an access time older than the modification time moves at the next read.
    let (a, t) = (std::time::UNIX_EPOCH + Duration::from_secs(1000), std::time::UNIX_EPOCH + Duration::from_secs(2000));
    File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_times(fs::FileTimes::new().set_accessed(a).set_modified(t))
        .unwrap();
    assert_eq!(stat_fmt("%X", &f), "1000");
    assert_eq!(run("cat", &[f.to_str().unwrap()]).stdout, b"gg");
    let atime: i64 = stat_fmt("%X", &f).parse().unwrap();
    assert!(atime > 2000, "access time after a read: {atime}");
    fs::remove_file(&f).unwrap();
    assert_eq!(stat_fmt("%a", &f), "missing", "unlink of the last name");
    // A name looked up while missing is cached as missing: creating it must still show it.
    fs::write(&f, b"back").unwrap();
    assert_eq!(stat_fmt("%s", &f), "4", "a name created after a negative lookup");
}

/// The changes the daemon makes on its own reach the kernel by invalidation: the set-id bits
/// a user's write clears (without `invalidate_attr` in `do_write` the cached 4777 stayed),
/// and, on a mount without the writeback cache (where the kernel takes the times the daemon
/// gives), the change time that settling the file's header at its last close moves (without
/// the one in `release_file`, the change time of the write stayed). Settling keeps the
/// modification time of the last write: it is bookkeeping, not a change of content.
#[test]
fn changes_the_daemon_makes_itself_are_seen_at_once_on_a_caching_mount() {
    if !root_only("a write by another user (setpriv) in a mount shared through --allow-other") {
        return;
    }
    let Some(m) = Mounted::new("64m", &["--allow-other"]) else { return };
    fs::set_permissions(&m.tmpfs.path, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&m.mnt, fs::Permissions::from_mode(0o755)).unwrap();
    let f = m.m("suid");
    fs::write(&f, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o4777)).unwrap();
    assert_eq!(stat_fmt("%a", &f), "4777");
    let user = TestUser::new("vfc");
    let o = user.sh(10, &format!("echo more >> {}", f.display()));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(stat_fmt("%a", &f), "777", "set-user-id cleared by the user's write");
    drop(m);

    let Some(m) = Mounted::new("64m", &["--no-writeback"]) else { return };
    let f = m.m("tail");
    fs::write(&f, b"first").unwrap();
    let old = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    File::options().write(true).open(&f).unwrap().set_times(fs::FileTimes::new().set_modified(old)).unwrap();
    let backing = only_backing_file(&m);
    let mut w = OpenOptions::new().append(true).open(&f).unwrap();
    w.write_all(b" and more").unwrap();
    // The kernel caches the time of the write; the header is settled after the close.
    let written = stat_fmt("%.9Y", &f);
    assert_ne!(written, "1000000000.000000000");
    let changed = stat_fmt("%.9Z", &backing);
    drop(w);
    let backing_ctime = || stat_fmt("%.9Z", &backing);
    let t = Instant::now();
    while backing_ctime() == changed {
        assert!(t.elapsed() < Duration::from_secs(5), "the header was never settled");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stat_fmt("%.9Y", &backing), written, "settling keeps the time of the last write");
    assert_eq!(stat_fmt("%.9Y %.9Z", &f), stat_fmt("%.9Y %.9Z", &backing), "the change time settling moved");
}

/// A time set right after the last close of a file the daemon settles then (a hole it has not
/// declared yet, here) is the file's time: the kernel sends RELEASE in the background, so the
/// SETATTR of `utimensat` often reaches the daemon first, and settling must not move the
/// modification time it set (`cp -p`, `tar x` and `rsync -t` set times that way). Found by
/// fsx (seed 5883631910206636339, no writeback): the time of the settle replaced the set one.
#[test]
fn a_time_set_right_after_the_last_close_is_kept_when_the_daemon_settles_the_file() {
    for opts in [&["--no-writeback"][..], &[][..]] {
        let Some(m) = Mounted::new("64m", opts) else { return };
        for i in 0..200i64 {
            let f = m.m(&format!("f{}", i % 8));
            let w = File::create(&f).unwrap();
            w.write_all_at(b"end", 3 * 4096 + 100).unwrap();
            w.write_all_at(b"start", 0).unwrap();
            drop(w);
            let omit = libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT };
            let t = [omit, libc::timespec { tv_sec: 1_000_000_000 + i, tv_nsec: 123_456_789 }];
            // SAFETY: valid C string and timespec array.
            assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c(&f).as_ptr(), t.as_ptr(), 0) }, 0);
            // For a while after: the RELEASE (and its settle) comes meanwhile.
            let expect = format!("{}.123456789", 1_000_000_000 + i);
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(20) {
                assert_eq!(stat_fmt("%.9Y", &f), expect, "{opts:?}: round {i}: the time set after the last close");
            }
        }
    }
}

/// A vault in a synced folder: Syncthing keeps the losing side of a conflicting edit as a
/// copy of the ciphertext file under `D.sync-conflict-<date>-<time>-<device>.S`, and two
/// machines that make one name each give two valid entries for it. The mount, `ls`, `cat`
/// and `export` show every version: the copy as `report (sync-conflict-…).txt`, a copy of
/// that copy as `report (sync-conflict-…, sync-conflict-…).txt`, the older of two entries as
/// `photos (conflict)`; a copy can be renamed like any file.
#[test]
fn conflict_copies_and_two_entries_for_one_name_are_all_shown_and_readable() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    fs::write(m.m("report.txt"), "version A").unwrap();
    fs::create_dir(m.m("photos")).unwrap();
    fs::write(m.m("photos/one.jpg"), "first machine").unwrap();
    m.umount();
    let entries = user_entries(&m.cipher);
    let file = entries.iter().find(|p| p.is_file()).unwrap().clone();
    let dir = entries.iter().find(|p| p.is_dir()).unwrap().clone();
    // Syncthing: the other machine's version arrives as a copy; this one's goes on changing.
    fs::copy(&file, syncthing_copy_name(&file)).unwrap();
    // And a copy of that copy (a third machine's version, kept by an older Syncthing).
    let nested = copy_name_with(&file, &format!(".{SYNCTHING_PART}.{SYNCTHING_PART_2}"));
    fs::copy(&file, &nested).unwrap();
    // The other machine made "photos" too: a second directory entry for the same name.
    let aside = m.tmpfs.path.join("aside");
    fs::rename(&dir, &aside).unwrap();
    m.mount();
    fs::create_dir(m.m("photos")).unwrap();
    fs::write(m.m("photos/two.jpg"), "second machine").unwrap();
    fs::write(m.m("report.txt"), "version B, edited here").unwrap();
    m.umount();
    fs::rename(&aside, &dir).unwrap();

    let copy_name = format!("report ({SYNCTHING_PART}).txt");
    let nested_name = format!("report ({SYNCTHING_PART}, {SYNCTHING_PART_2}).txt");
    let expect = |root: &Path| {
        let mut names: Vec<String> =
            fs::read_dir(root).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(
            names,
            ["photos", "photos (conflict)", copy_name.as_str(), nested_name.as_str(), "report.txt"],
            "in {}",
            root.display()
        );
        assert_eq!(fs::read_to_string(root.join("report.txt")).unwrap(), "version B, edited here");
        assert_eq!(fs::read_to_string(root.join(&copy_name)).unwrap(), "version A");
        assert_eq!(fs::read_to_string(root.join(&nested_name)).unwrap(), "version A");
        let mut photos: Vec<(String, String)> = ["photos", "photos (conflict)"]
            .iter()
            .flat_map(|d| fs::read_dir(root.join(d)).unwrap().flatten().map(|e| e.path()))
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), fs::read_to_string(&p).unwrap()))
            .collect();
        photos.sort();
        assert_eq!(photos, [("one.jpg".into(), "first machine".into()), ("two.jpg".into(), "second machine".into())]);
    };
    m.mount();
    expect(&m.mnt);
    m.umount();

    // The offline tools show the same, with exit code 0.
    let v = m.cipher.to_str().unwrap();
    let pf = m.passfile.to_str().unwrap();
    let o = run(&BIN, &["ls", "-R", v, "--passfile", pf]);
    assert!(o.status.success(), "ls: {}", text(&o));
    assert!(text(&o).contains(&copy_name) && text(&o).contains("photos (conflict)"), "{}", text(&o));
    assert!(text(&o).contains(&nested_name), "{}", text(&o));
    for name in [&copy_name, &nested_name] {
        let o = run(&BIN, &["cat", &format!("{v}/{name}"), "--passfile", pf]);
        assert!(o.status.success(), "cat: {}", text(&o));
        assert_eq!(o.stdout, b"version A");
    }
    let out = m.tmpfs.path.join("exported");
    let o = run(&BIN, &["export", v, out.to_str().unwrap(), "--passfile", pf]);
    assert!(o.status.success(), "export: {}", text(&o));
    expect(&out);

    // A copy is a file like any other: renamed, it becomes an ordinary entry.
    m.mount();
    fs::rename(m.m(&copy_name), m.m("report, their version.txt")).unwrap();
    assert_eq!(fs::read_to_string(m.m("report, their version.txt")).unwrap(), "version A");
    assert!(!m.m(&copy_name).exists());
    m.umount();
    assert!(!syncthing_copy_name(&file).exists(), "the copy's ciphertext name is gone");
    m.mount();
    assert_eq!(fs::read_to_string(m.m("report, their version.txt")).unwrap(), "version A");
    assert_eq!(fs::read_to_string(m.m("report.txt")).unwrap(), "version B, edited here");
}

/// OneDrive's and old ownCloud clients' conflict copies of short entries (`D-HOST.S`,
/// `D_conflict-<date>-<time>.S`) are well-formed entry names that do not decrypt; the mount
/// finds them as copies when it lists the directory, before any READDIR: a lookup of the
/// shown name reads the copy's content, and the listing shows each copy once under its shown
/// name (not as an undecryptable entry). One whose original was removed is shown as well; a
/// copy renamed is an ordinary entry.
#[test]
fn onedrive_and_owncloud_copies_of_short_entries_are_shown_under_their_names() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    fs::write(m.m("report.txt"), "version A").unwrap();
    fs::write(m.m("plan.md"), "the plan, a longer file").unwrap();
    m.umount();
    let mut files = user_entries(&m.cipher);
    files.sort_by_key(|p| fs::metadata(p).unwrap().len());
    let (report, plan) = (files[0].clone(), files[1].clone());
    fs::copy(&report, copy_name_with(&report, "-DESKTOP-AB12")).unwrap();
    fs::rename(&plan, copy_name_with(&plan, OWNCLOUD_PART)).unwrap();
    m.mount();
    let (rc, pc) = ("report (DESKTOP-AB12).txt", "plan (conflict-20261127-101010).md");
    assert_eq!(fs::read_to_string(m.m(rc)).unwrap(), "version A", "a lookup before any listing");
    fs::write(m.m("report.txt"), "version B").unwrap();
    let mut names: Vec<String> =
        fs::read_dir(&m.mnt).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, [pc, rc, "report.txt"]);
    assert_eq!(fs::read_to_string(m.m(pc)).unwrap(), "the plan, a longer file");
    assert_eq!(fs::read_to_string(m.m(rc)).unwrap(), "version A");
    assert_eq!(fs::read_to_string(m.m("report.txt")).unwrap(), "version B");
    // Renamed, a copy becomes an ordinary entry.
    fs::rename(m.m(rc), m.m("report, theirs.txt")).unwrap();
    assert_eq!(fs::read_to_string(m.m("report, theirs.txt")).unwrap(), "version A");
    m.umount();
    assert!(!copy_name_with(&report, "-DESKTOP-AB12").exists(), "the copy's ciphertext name is gone");
    m.mount();
    assert_eq!(fs::read_to_string(m.m("report, theirs.txt")).unwrap(), "version A");
}

/// A `--shared-storage` mount of a vault with `block-map` keeps one write session per open
/// file (docs/FORMAT.md §5.10), not one per call: while the file is open for writing, its
/// header is UNSETTLED and a second shared-storage mount reads what was written so far (by the
/// session's log); `fsync` and the last close settle it (no UNSETTLED, no log), and a file
/// written in many calls has the generation of its first write and one session per
/// `fsync`/close.
#[test]
fn a_shared_storage_mount_of_a_block_map_vault_keeps_one_session_per_open_file() {
    let Some(m) = Mounted::new("128m", &["--shared-storage"]) else { return };
    let cipher_file = |cipher: &Path| -> (Vec<u8>, usize) {
        let mut files = Vec::new();
        let mut logs = 0;
        for e in fs::read_dir(cipher).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(veilfs_core::stash::STASH_PREFIX) {
                logs += 1;
            } else if e.metadata().unwrap().is_file() && !name.starts_with("veilfs.") {
                files.push(fs::read(e.path()).unwrap());
            }
        }
        assert_eq!(files.len(), 1);
        (files.pop().unwrap(), logs)
    };
    let generation = |c: &[u8]| u64::from_be_bytes(c[20..28].try_into().unwrap());
    let d: Vec<u8> = (0..(3u32 << 20) + 5).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let f = OpenOptions::new().create(true).truncate(true).write(true).open(m.m("f")).unwrap();
    for (i, piece) in d.chunks(64 << 10).enumerate() {
        f.write_all_at(piece, (i << 16) as u64).unwrap();
    }
    let (c, logs) = cipher_file(&m.cipher);
    assert!(c[3] & 2 != 0 && logs == 1, "one session open across the writes");
    // A second client reads the file as written so far, by the session's log.
    let other = m.tmpfs.path.join("other");
    fs::create_dir(&other).unwrap();
    let o = m.mount_cmd(&other);
    assert!(o.status.success(), "second mount: {}", text(&o));
    let seen = fs::read(other.join("f"));
    lazy_unmount(&other);
    assert!(seen.unwrap() == d, "the other mount reads what was written");
    f.sync_all().unwrap();
    let (c, logs) = cipher_file(&m.cipher);
    assert!(c[3] & 2 == 0 && logs == 0, "settled by fsync, no log left");
    assert_eq!(generation(&c), 2, "the first write, then one session for all the others");
    f.write_all_at(b"after the fsync", 100).unwrap();
    drop(f);
    // RELEASE reaches the daemon after close(2) returns.
    let t = Instant::now();
    let (c, logs) = loop {
        let (c, logs) = cipher_file(&m.cipher);
        if (c[3] & 2 == 0 && logs == 0) || t.elapsed() > Duration::from_secs(10) {
            break (c, logs);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(c[3] & 2 == 0 && logs == 0, "settled by the last close, no log left");
    assert_eq!(generation(&c), 3);
    let mut want = d;
    want[100..115].copy_from_slice(b"after the fsync");
    assert!(fs::read(m.m("f")).unwrap() == want);
}

/// Attack: someone who can write the ciphertext puts back an older copy of a whole file (its
/// header, map and blocks: valid ciphertext of that older version) after this machine's mount
/// wrote a newer one. The next mount, which remembers the newer generation (its client state,
/// here under a temporary `VEILFS_STATE_DIR`), gives EIO and one log line naming the
/// ciphertext file; `veilfs cat` exits 6, and `cat --allow-rollback` reads the older version.
#[test]
fn a_whole_file_put_back_to_an_older_version_gives_eio_and_a_log_line_on_the_mount() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    m.umount();
    let state = m.tmpfs.path.join("state");
    m.env.push(("VEILFS_STATE_DIR".into(), state.display().to_string()));
    m.mount();
    fs::write(m.m("f"), b"the older version").unwrap();
    m.umount();
    let backing = fs::read_dir(&m.cipher)
        .unwrap()
        .flatten()
        .find(|e| e.metadata().unwrap().is_file() && !e.file_name().to_string_lossy().starts_with("veilfs."))
        .unwrap()
        .path();
    let old = fs::read(&backing).unwrap();
    m.mount();
    fs::write(m.m("f"), b"the newer version").unwrap();
    m.umount();
    fs::write(&backing, &old).unwrap();
    let log = m.tmpfs.path.join("log");
    let child = foreground_mount(&m, &log);
    let _guard = UnmountOnDrop(m.mnt.clone());
    assert_eq!(errno_of(fs::read(m.m("f"))), format!("errno {}", libc::EIO));
    let _ = run(&BIN, &["umount", m.mnt.to_str().unwrap()]);
    assert!(child.wait_with_output().unwrap().status.success());
    let log = fs::read_to_string(&log).unwrap();
    let name = backing.file_name().unwrap().to_str().unwrap();
    let lines: Vec<_> = log.lines().filter(|l| l.contains("rolled back: generation") && l.contains(name)).collect();
    assert!(!lines.is_empty(), "a log line naming {name}: {log}");
    let cat = |extra: &[&str]| {
        std::process::Command::new(&BIN)
            .args(["cat", &format!("{}/f", m.cipher.display()), "--passfile", m.passfile.to_str().unwrap()])
            .args(extra)
            .env("VEILFS_STATE_DIR", &state)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let o = cat(&[]);
    assert_eq!(o.status.code(), Some(6), "{}", text(&o));
    assert!(text(&o).contains("rolled back"), "{}", text(&o));
    let o = cat(&["--allow-rollback"]);
    assert_eq!((o.status.code(), o.stdout.as_slice()), (Some(0), &b"the older version"[..]), "{}", text(&o));
}

/// Attacks: someone who can write the ciphertext but is no client deletes an entry this
/// machine's mount saw, and puts back an entry the mount deleted (its tombstone still there,
/// docs/FORMAT.md §19). The next mount, which remembers the directory's entries (its client
/// state under a temporary `VEILFS_STATE_DIR`), logs one line naming the directory for the
/// deletion (the listing itself works: the other entries are fine) and gives EIO, with a log
/// line naming the ciphertext file, for the resurrected entry.
#[test]
fn a_deletion_by_a_non_client_is_logged_and_a_resurrected_entry_gives_eio_on_the_mount() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    m.umount();
    let state = m.tmpfs.path.join("state");
    m.env.push(("VEILFS_STATE_DIR".into(), state.display().to_string()));
    m.mount();
    let mut backing = Vec::new();
    for n in ["f", "g", "r"] {
        let before = user_entries(&m.cipher);
        fs::write(m.m(n), n).unwrap();
        backing.push(user_entries(&m.cipher).into_iter().find(|p| !before.contains(p)).unwrap());
    }
    let saved_r = fs::read(&backing[2]).unwrap();
    m.umount();
    // A fresh mount lists the directory (and remembers its entries), then deletes r.
    m.mount();
    assert_eq!(fs::read_dir(&m.mnt).unwrap().count(), 3);
    fs::remove_file(m.m("r")).unwrap();
    m.umount();
    let tombs: Vec<_> = fs::read_dir(&m.cipher)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("veilfs.D."))
        .collect();
    assert_eq!(tombs.len(), 1, "one tombstone for the deletion of r");
    fs::remove_file(&backing[1]).unwrap();
    fs::write(&backing[2], &saved_r).unwrap();
    let log = m.tmpfs.path.join("log");
    let child = foreground_mount(&m, &log);
    let _guard = UnmountOnDrop(m.mnt.clone());
    let mut names: Vec<String> =
        fs::read_dir(&m.mnt).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    // g is gone; r is refused where its node would be made (READDIRPLUS leaves it out, as any
    // entry that fails its check).
    assert_eq!(names, ["f"]);
    assert_eq!(fs::read(m.m("f")).unwrap(), b"f");
    assert_eq!(errno_of(fs::read(m.m("r"))), format!("errno {}", libc::EIO));
    let _ = run(&BIN, &["umount", m.mnt.to_str().unwrap()]);
    assert!(child.wait_with_output().unwrap().status.success());
    let log = fs::read_to_string(&log).unwrap();
    let dir = m.cipher.display().to_string();
    let missing: Vec<_> =
        log.lines().filter(|l| l.contains("missing without a tombstone") && l.contains(&dir)).collect();
    assert_eq!(missing.len(), 1, "one log line naming the directory: {log}");
    let r_name = backing[2].file_name().unwrap().to_str().unwrap();
    assert!(
        log.lines().any(|l| l.contains("resurrected") && l.contains(r_name)),
        "a log line naming the resurrected entry {r_name}: {log}"
    );
}

/// The user keeps both versions of a conflict and puts the older one aside: `mv` of the
/// conflict copy holding it into another directory of the mount. The machine that saw the
/// newer version (its client state under a temporary `VEILFS_STATE_DIR`) reads the moved file
/// back with no EIO, during the mount and after a remount: it moved as a file of its own,
/// under a fresh file ID, so no newer version of it is expected there. The newer version
/// stays readable under its name, and putting the older ciphertext back under that name is
/// still EIO: with no newer version beside it, it is a rollback as before.
#[test]
fn mv_of_an_older_conflict_copy_into_another_directory_reads_back_without_eio() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    m.umount();
    let state = m.tmpfs.path.join("state");
    m.env.push(("VEILFS_STATE_DIR".into(), state.display().to_string()));
    m.mount();
    fs::write(m.m("notes.txt"), b"the older version").unwrap();
    fs::create_dir(m.m("old")).unwrap();
    m.umount();
    let file = user_entries(&m.cipher).into_iter().find(|p| p.is_file()).unwrap();
    let older = fs::read(&file).unwrap();
    m.mount();
    fs::write(m.m("notes.txt"), b"the newer version").unwrap();
    m.umount();
    let newer = fs::read(&file).unwrap();
    // The other machine's (older) version arrives as Syncthing's conflict copy.
    fs::write(syncthing_copy_name(&file), &older).unwrap();
    m.mount();
    let copy_name = format!("notes ({SYNCTHING_PART}).txt");
    assert_eq!(fs::read(m.m(&copy_name)).unwrap(), b"the older version", "a conflict, not a rollback");
    // A reader that holds the copy open meanwhile keeps reading it, as after a `mv` across
    // file systems.
    let held = fs::File::open(m.m(&copy_name)).unwrap();
    let o = run("mv", &[m.m(&copy_name).to_str().unwrap(), m.m("old/").to_str().unwrap()]);
    assert!(o.status.success(), "mv: {}", text(&o));
    let moved = m.m(&format!("old/{copy_name}"));
    assert_eq!(fs::read(&moved).unwrap(), b"the older version");
    let mut buf = [0u8; 17];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"the older version");
    drop(held);
    assert!(!m.m(&copy_name).exists());
    assert_eq!(fs::read(m.m("notes.txt")).unwrap(), b"the newer version");
    m.umount();
    assert!(!syncthing_copy_name(&file).exists(), "the copy's ciphertext is gone from the top directory");
    m.mount();
    assert_eq!(fs::read(&moved).unwrap(), b"the older version", "after a remount");
    assert_eq!(fs::read(m.m("notes.txt")).unwrap(), b"the newer version");
    m.umount();
    fs::write(&file, &older).unwrap();
    m.mount();
    assert_eq!(errno_of(fs::read(m.m("notes.txt"))), format!("errno {}", libc::EIO));
    assert_eq!(fs::read(&moved).unwrap(), b"the older version");
    m.umount();
    // The other way round: the older version under the name, the newer in the copy. The
    // name itself is no copy; the move finds the version beside it by its file ID.
    fs::write(syncthing_copy_name(&file), &newer).unwrap();
    m.mount();
    assert_eq!(fs::read(m.m("notes.txt")).unwrap(), b"the older version", "a conflict again");
    fs::rename(m.m("notes.txt"), m.m("old/notes, older.txt")).unwrap();
    assert_eq!(fs::read(m.m("old/notes, older.txt")).unwrap(), b"the older version");
    m.umount();
    m.mount();
    assert_eq!(fs::read(m.m("old/notes, older.txt")).unwrap(), b"the older version");
    assert_eq!(fs::read(m.m(&copy_name)).unwrap(), b"the newer version");
}

/// A vault with the feature `block-map` (docs/FORMAT.md §5.10, every new vault) through
/// the mount: `cp` of a file of several groups, an overwrite in the middle, an append past a
/// hole and a truncate read back as on a plain directory, during the mount and after a
/// remount, and every file on disk is header v2.
#[test]
fn a_vault_with_block_map_reads_back_what_cp_and_writes_put_in() {
    let Some(mut m) = Mounted::new("256m", &[]) else { return };
    let d: Vec<u8> = (0..(3 << 20) + 123).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    fs::write(m.plain.join("src"), &d).unwrap();
    let o = run("cp", &[m.plain.join("src").to_str().unwrap(), m.m("big").to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let mut want = d.clone();
    let f = OpenOptions::new().write(true).open(m.m("big")).unwrap();
    f.write_all_at(b"in the middle", 1_000_000).unwrap();
    want[1_000_000..1_000_013].copy_from_slice(b"in the middle");
    f.write_all_at(b"after a hole", 5 << 20).unwrap();
    want.resize(5 << 20, 0);
    want.extend_from_slice(b"after a hole");
    drop(f);
    fs::write(m.m("small"), b"small").unwrap();
    let f = OpenOptions::new().write(true).open(m.m("small")).unwrap();
    f.set_len(2).unwrap();
    drop(f);
    assert!(fs::read(m.m("big")).unwrap() == want);
    assert_eq!(fs::read(m.m("small")).unwrap(), b"sm");
    m.umount();
    m.mount();
    assert!(fs::read(m.m("big")).unwrap() == want, "after a remount");
    assert_eq!(fs::metadata(m.m("big")).unwrap().len(), want.len() as u64);
    assert_eq!(fs::read(m.m("small")).unwrap(), b"sm");
    m.umount();
    let mut files = 0;
    for e in fs::read_dir(&m.cipher).unwrap().flatten() {
        let md = e.metadata().unwrap();
        if md.is_file() && md.len() > 0 && !e.file_name().to_string_lossy().starts_with("veilfs.") {
            assert_eq!(&fs::read(e.path()).unwrap()[..2], &[0, 2], "{:?} is header v2", e.file_name());
            files += 1;
        }
    }
    assert_eq!(files, 2);
    // Every write session ended (at the last close, FORMAT.md §5.10): no log is left.
    let logs: Vec<_> = (fs::read_dir(&m.cipher).unwrap().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(veilfs_core::stash::STASH_PREFIX))
        .map(|e| e.file_name())
        .collect();
    assert!(logs.is_empty(), "write-session logs left: {logs:?}");
}
