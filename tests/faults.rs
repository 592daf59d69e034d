//! A full disk through the mount: every writer type fills a vault on its own 64 MiB tmpfs, with
//! and without the kernel's write-back cache, and after unmount + remount every file must
//! authenticate completely (read whole, `veilfs export` exit 0) and hold at least what its
//! writer was told was stored — every acknowledged `write` without the write-back cache, what
//! an `fsync` or `close` confirmed with it — and the writer must have been told ENOSPC, never
//! EIO.
//!
//! The backing tmpfs is first filled to a few hundred KiB of free space with a plain file
//! beside the vault, so the writers reach the limit quickly (a full disk, not a big one).
//!
//! `bigger_than_the_disk_*` hold the mount to more: a 30 MiB file onto a 20 MiB tmpfs (or one
//! filled to 20 MiB free after the file was opened), written by an application that checks
//! every `write`, `fsync` and `close`, must be told ENOSPC — at `write` when the file was
//! opened on a disk low on space —, show the size it stored, and read back as a prefix of
//! what was written, without a run of zeros the writer never wrote, `fsck` clean.

mod common;
use common::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const MIB: usize = 1 << 20;
const WB: &[&str] = &[];
const NO_WB: &[&str] = &["--no-writeback"];

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn name(e: i32) -> &'static str {
    match e {
        0 => "ok",
        libc::ENOSPC => "ENOSPC",
        libc::EDQUOT => "EDQUOT",
        libc::EIO => "EIO",
        libc::EFBIG => "EFBIG",
        _ => "other errno",
    }
}

/// A vault on a 64 MiB tmpfs of its own, to fill. As root only: an ordinary user's tests
/// share one tmpfs (their TMPDIR), and filling it would fail the others (or fill a desktop's /tmp).
fn vault_on_64mib(extra: &[&str]) -> Option<Mounted> {
    if !root_only("fills its backing store, which must be a tmpfs of its own (only root mounts one)") {
        return None;
    }
    Mounted::new("64m", extra)
}

/// Deterministic, incompressible-looking content: byte `i` of every test file.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9 ^ u32::from(seed);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn statvfs(p: &Path) -> libc::statvfs {
    // SAFETY: a zeroed statvfs is a valid out-buffer; the path is NUL-terminated.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statvfs(c(p).as_ptr(), &mut sv) }, 0, "statvfs {}", p.display());
    sv
}

fn free_bytes(p: &Path) -> u64 {
    let sv = statvfs(p);
    sv.f_bavail * sv.f_frsize
}

/// Fills the backing tmpfs with a plain file beside the vault until `leave` bytes are free.
fn fill_backing(m: &Mounted, leave: u64) {
    let free = free_bytes(&m.tmpfs.path);
    let filler = m.tmpfs.path.join("filler");
    if free > leave {
        let o = run("fallocate", &["-l", &(free - leave).to_string(), filler.to_str().unwrap()]);
        assert!(o.status.success(), "fallocate filler: {}", text(&o));
    }
}

/// What a writer was told.
#[derive(Debug, Default)]
struct Told {
    /// Bytes `write` accepted.
    acked: u64,
    /// Bytes confirmed by a successful `fsync` (or, at the end, `close`).
    synced: u64,
    /// The first error (errno), from write, fsync, msync, fallocate or close.
    err: i32,
}

/// Opens `p` with `flags`, writes `pattern` in `chunk`-byte pieces until the first error
/// (fsync after every `sync_every` bytes when non-zero), then closes; reports what it was told.
fn writer(p: &Path, flags: i32, data: &[u8], chunk: usize, sync_every: usize) -> Told {
    // SAFETY: plain syscalls on a path and the fd they return.
    let fd = unsafe { libc::open(c(p).as_ptr(), libc::O_WRONLY | libc::O_CREAT | flags, 0o644) };
    assert!(fd >= 0, "open {}: {}", p.display(), errno());
    let mut t = Told::default();
    while (t.acked as usize) < data.len() {
        let piece = &data[t.acked as usize..(t.acked as usize + chunk).min(data.len())];
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::write(fd, piece.as_ptr().cast(), piece.len()) };
        if n < 0 {
            t.err = errno();
            break;
        }
        t.acked += n as u64;
        if sync_every > 0 && (t.acked as usize) / sync_every > t.synced as usize / sync_every {
            // SAFETY: plain syscall.
            if unsafe { libc::fsync(fd) } != 0 {
                t.err = errno();
                break;
            }
            t.synced = t.acked;
        }
    }
    // SAFETY: closes the fd opened above, once.
    let r = unsafe { libc::close(fd) };
    if r != 0 && t.err == 0 {
        t.err = errno();
    }
    if t.err == 0 {
        t.synced = t.acked;
    }
    t
}

/// Unmounts, remounts and checks `rel`: it reads back whole (every block authenticates), its
/// size is at least `min` (exactly `exact` when given), and it starts with `data[..min]`.
/// Then `veilfs export` of the vault must succeed.
fn check_after_remount(m: &mut Mounted, files: &[(&str, &[u8], u64, Option<u64>)]) {
    umount_and_wait(m);
    m.mount();
    for &(rel, data, min, exact) in files {
        let got = std::fs::read(m.m(rel)).unwrap_or_else(|e| {
            umount_and_wait(m);
            let at = format!("{}/{rel}", m.cipher.display());
            let o = run(&BIN, &["cat", &at, "--passfile", m.passfile.to_str().unwrap()]);
            let why = String::from_utf8_lossy(&o.stderr);
            panic!("{rel}: reading it whole after remount: {e}; veilfs cat: {why}")
        });
        let len = got.len() as u64;
        eprintln!("{rel}: {len} bytes after remount");
        if let Some(x) = exact {
            assert_eq!(len, x, "{rel}: size after remount (the writer was told {x} bytes were stored)");
        }
        assert!(len >= min, "{rel}: {len} bytes after remount, but {min} were confirmed to the writer");
        assert!(got[..min as usize] == data[..min as usize], "{rel}: confirmed data differs after remount");
        // Beyond what was confirmed, each byte is the writer's or a zero from a hole.
        let n = got.len().min(data.len());
        assert!(
            got[..n].iter().zip(&data[..n]).all(|(g, d)| g == d || *g == 0),
            "{rel}: bytes that are neither written nor zero"
        );
    }
    umount_and_wait(m);
    let out = Tmpfs::new("160m");
    let o = run(
        &BIN,
        &[
            "export",
            m.cipher.to_str().unwrap(),
            out.path.join("x").to_str().unwrap(),
            "--passfile",
            m.passfile.to_str().unwrap(),
            "-q",
        ],
    );
    assert!(o.status.success(), "export after a full disk: {}", text(&o));
    m.mount();
}

/// Unmounts and waits for the daemon to exit: `veilfs umount` returns once the kernel has
/// let go, but the daemon still declares the holes of files whose RELEASE the kernel dropped
/// (at `destroy`); a mount or an offline reader started before that sees them undeclared.
fn umount_and_wait(m: &mut Mounted) {
    let pid = daemon_pid(&m.mnt);
    m.umount();
    let t = std::time::Instant::now();
    while pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists()) {
        assert!(t.elapsed().as_secs() < 20, "the daemon did not exit after unmount");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn assert_enospc(what: &str, t: &Told) {
    assert!(
        t.err == libc::ENOSPC || t.err == libc::EDQUOT,
        "{what}: the writer must be told ENOSPC when the disk is full, got {} ({:?})",
        name(t.err),
        t
    );
}

// ---- dd --------------------------------------------------------------------------------

fn dd_100mb(extra: &[&str]) {
    let Some(mut m) = vault_on_64mib(extra) else { return };
    let data = pattern(100 * MIB, 1);
    let f = m.m("big");
    let mut child = std::process::Command::new("dd")
        .args([&format!("of={}", f.display()), "bs=1M", "iflag=fullblock"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(&data); // dd stops reading at its first error
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "dd of 100 MB onto 64 MiB succeeded: {err}");
    assert!(err.contains("No space left on device"), "dd must be told ENOSPC: {err}");
    assert!(!err.contains("Input/output error"), "dd was told EIO: {err}");
    // With the write-back cache dd's writes only reached the page cache; its close failed,
    // so nothing is promised. Without it, every acknowledged write is stored, and nothing
    // else: "N bytes (...) copied" counts them.
    let (min, exact) = if extra.is_empty() {
        (0, None)
    } else {
        let copied: u64 = err
            .lines()
            .find(|l| l.contains("bytes") && l.contains("copied"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("dd's byte count: {err}"));
        (copied, Some(copied))
    };
    check_after_remount(&mut m, &[("big", &data, min, exact)]);
}

#[test]
fn dd_100mb_onto_64mib_writeback() {
    dd_100mb(WB);
}

#[test]
fn dd_100mb_onto_64mib_no_writeback() {
    dd_100mb(NO_WB);
}

// ---- small writes, O_APPEND, echo -----------------------------------------------------

fn small_writes(extra: &[&str], flags: i32, chunk: usize, sync_every: usize) {
    let Some(mut m) = vault_on_64mib(extra) else { return };
    // An earlier file, written and closed before the disk fills: it must survive untouched.
    let old = pattern(300_000, 2);
    std::fs::write(m.m("old"), &old).unwrap();
    fill_backing(&m, 400 << 10);
    let data = pattern(2 * MIB, 3);
    let t = writer(&m.m("f"), flags, &data, chunk, sync_every);
    eprintln!("writer (chunk {chunk}, flags {flags:#x}, {extra:?}): {t:?}");
    assert_enospc("small writes", &t);
    let exact = (!extra.is_empty()).then_some(t.acked);
    check_after_remount(
        &mut m,
        &[("old", &old, old.len() as u64, Some(old.len() as u64)), ("f", &data, t.synced, exact)],
    );
}

#[test]
fn small_writes_fill_the_disk_writeback() {
    small_writes(WB, 0, 100, 64 << 10);
}

#[test]
fn small_writes_fill_the_disk_no_writeback() {
    small_writes(NO_WB, 0, 100, 0);
}

#[test]
fn o_append_writes_fill_the_disk_writeback() {
    small_writes(WB, libc::O_APPEND, 1000, 100_000);
}

#[test]
fn o_append_writes_fill_the_disk_no_writeback() {
    small_writes(NO_WB, libc::O_APPEND, 1000, 0);
}

/// `echo hello > file` on a mount whose backing store is full to the last page.
fn echo_on_full_mount(extra: &[&str]) {
    let Some(mut m) = vault_on_64mib(extra) else { return };
    // 8,098 bytes: its ciphertext (8,190 bytes) ends 2 bytes short of a page, so appending
    // to it needs a new page of the full tmpfs in the middle of its last block.
    let old = pattern(8098, 4);
    std::fs::write(m.m("old"), &old).unwrap();
    fill_backing(&m, 0);
    let t = writer(&m.m("old"), libc::O_APPEND, b"hello\n", 6, 0);
    assert_enospc("echo >> file", &t);
    // What the shell does, checking close too (sh itself ignores close errors: with the
    // write-back cache the ENOSPC only comes at close, so `echo` cannot report it).
    let t = writer(&m.m("echo"), libc::O_TRUNC, b"hello\n", 6, 0);
    assert_enospc("echo > file", &t);
    let o = run("bash", &["-c", &format!("echo hello > {}", m.m("echo2").display())]);
    if extra == NO_WB {
        assert!(!o.status.success(), "echo on a full mount without write-back cache must fail");
        assert!(text(&o).contains("No space left"), "echo: {}", text(&o));
    }
    let exact = (!extra.is_empty()).then_some(0);
    check_after_remount(
        &mut m,
        &[("old", &old, old.len() as u64, Some(old.len() as u64)), ("echo", b"hello\n", t.synced, exact)],
    );
    // Freed space makes the same write work.
    std::fs::remove_file(m.tmpfs.path.join("filler")).unwrap();
    let t = writer(&m.m("echo"), libc::O_TRUNC, b"hello\n", 6, 0);
    assert_eq!(t.err, 0, "{t:?}");
    check_after_remount(&mut m, &[("echo", b"hello\n", 6, Some(6))]);
}

#[test]
fn echo_on_a_full_mount_writeback() {
    echo_on_full_mount(WB);
}

#[test]
fn echo_on_a_full_mount_no_writeback() {
    echo_on_full_mount(NO_WB);
}

// ---- mmap -------------------------------------------------------------------------------

fn mmap_writes(extra: &[&str]) {
    let Some(mut m) = vault_on_64mib(extra) else { return };
    fill_backing(&m, 512 << 10);
    let len = 4 * MIB;
    let data = pattern(len, 5);
    let p = m.m("mapped");
    // SAFETY: plain syscalls; the mapping is used only while the fd is open and unmapped
    // before it is closed.
    let t = unsafe {
        let fd = libc::open(c(&p).as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o644);
        assert!(fd >= 0);
        // Growing by truncate stores only the last block: it fits.
        assert_eq!(libc::ftruncate(fd, len as i64), 0, "ftruncate: {}", errno());
        let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        assert!(map != libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(data.as_ptr(), map.cast::<u8>(), len);
        let mut t = Told::default();
        if libc::msync(map, len, libc::MS_SYNC) != 0 {
            t.err = errno();
        }
        libc::munmap(map, len);
        if libc::close(fd) != 0 && t.err == 0 {
            t.err = errno();
        }
        if t.err == 0 {
            t.synced = len as u64;
        }
        t
    };
    eprintln!("mmap writer {extra:?}: {t:?}");
    assert_enospc("mmap + msync", &t);
    // The truncate succeeded: the size stays; unstored pages read as zeros (holes).
    check_after_remount(&mut m, &[("mapped", &data, t.synced, Some(len as u64))]);
}

#[test]
fn mmap_writes_fill_the_disk_writeback() {
    mmap_writes(WB);
}

#[test]
fn mmap_writes_fill_the_disk_no_writeback() {
    mmap_writes(NO_WB);
}

// ---- fallocate and statfs ---------------------------------------------------------------

/// `statfs` counts plaintext bytes: a `fallocate` of all the free space it reports fits, and
/// then the disk is (nearly) full.
fn fallocate_all_free_space(extra: &[&str]) {
    let Some(mut m) = vault_on_64mib(extra) else { return };
    let old = pattern(3 * MIB + 123, 6);
    std::fs::write(m.m("old"), &old).unwrap();
    // With the write-back cache the kernel may still be sending old's pieces, out of order;
    // a piece that fills a hole below the file's end is written in a session whose log holds
    // its copy (and room for its commit) until the RELEASE after close ends it. Measured
    // before, statfs rightly counts that space as used and the test would find it left over.
    let t = std::time::Instant::now();
    while std::fs::read_dir(&m.cipher)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("veilfs.S."))
    {
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "old's write session did not end after its close");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let free = free_bytes(&m.mnt);
    let backing = free_bytes(&m.tmpfs.path);
    assert!(free < backing, "statfs must count plaintext bytes: {free} of {backing} backing bytes");
    let p = m.m("all");
    let o = run("fallocate", &["-l", &free.to_string(), p.to_str().unwrap()]);
    assert!(o.status.success(), "fallocate -l {free} (all the free space statfs reports): {}", text(&o));
    // Not much more than the overhead of a block's worth is left unreported.
    let left = free_bytes(&m.tmpfs.path);
    assert!(left < backing / 100 + (64 << 10), "statfs under-reports: {left} bytes left of {backing}");
    // One more MiB does not fit: ENOSPC, and the file keeps its size.
    // SAFETY: plain syscalls on a path and the fd they return.
    let e = unsafe {
        let fd = libc::open(c(&p).as_ptr(), libc::O_WRONLY);
        let r = libc::fallocate(fd, 0, 0, (free + MIB as u64) as i64);
        let e = if r != 0 { errno() } else { 0 };
        libc::close(fd);
        e
    };
    assert_eq!(name(e), "ENOSPC");
    let zeros = vec![0u8; free as usize];
    check_after_remount(
        &mut m,
        &[("old", &old, old.len() as u64, Some(old.len() as u64)), ("all", &zeros, free, Some(free))],
    );
}

#[test]
fn fallocate_all_free_space_statfs_reports_writeback() {
    fallocate_all_free_space(WB);
}

#[test]
fn fallocate_all_free_space_statfs_reports_no_writeback() {
    fallocate_all_free_space(NO_WB);
}

// ---- import -----------------------------------------------------------------------------

/// `veilfs import` onto a full disk: told ENOSPC, the file that did not fit is not left
/// under its name (cut off, it would look complete and a re-run would skip it), no
/// temporary file is left behind, and the files before and after it are whole.
#[test]
fn import_onto_a_full_disk() {
    let Some(mut m) = vault_on_64mib(WB) else { return };
    m.umount();
    let src = Tmpfs::new("160m");
    let tree = src.path.join("tree");
    std::fs::create_dir(&tree).unwrap();
    let (small, big) = (pattern(10_000, 7), pattern(100 * MIB, 8));
    std::fs::write(tree.join("a-small"), &small).unwrap();
    std::fs::write(tree.join("big"), &big).unwrap();
    std::fs::write(tree.join("c-after"), &small).unwrap();
    let o = run(
        &BIN,
        &[
            "import",
            tree.to_str().unwrap(),
            m.cipher.to_str().unwrap(),
            "--passfile",
            m.passfile.to_str().unwrap(),
            "-q",
        ],
    );
    let out = text(&o);
    assert!(!o.status.success(), "import of 100 MB onto 64 MiB succeeded: {out}");
    assert!(out.contains("No space left on device"), "import must report ENOSPC: {out}");
    m.mount();
    let names: Vec<String> =
        std::fs::read_dir(m.m("tree")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert!(!names.iter().any(|n| n == "big"), "a cut-off copy is left under the final name: {names:?}");
    assert!(!names.iter().any(|n| n.starts_with(".veilfs-import")), "temporary file left: {names:?}");
    let n = small.len() as u64;
    check_after_remount(&mut m, &[("tree/a-small", &small, n, Some(n)), ("tree/c-after", &small, n, Some(n))]);
}

// ---- a file bigger than the disk, by an application that checks every call ---------------

/// Where the writer of [`bigger_than_the_disk`] was first told of an error.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum At {
    #[default]
    Nowhere,
    Write,
    Fsync,
    Close,
}

/// Writes `data` to `fd` in 128 KiB `write`s, `fsync` after every `sync_every` bytes (when
/// not 0), then `close`; stops at the first error. `fd` is open already (so a test can fill
/// the disk after the open).
fn checking_writer(fd: i32, data: &[u8], sync_every: usize) -> (Told, At) {
    const CHUNK: usize = 128 << 10;
    let mut t = Told::default();
    let mut at = At::Nowhere;
    while (t.acked as usize) < data.len() {
        let piece = &data[t.acked as usize..(t.acked as usize + CHUNK).min(data.len())];
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::write(fd, piece.as_ptr().cast(), piece.len()) };
        if n < 0 {
            (t.err, at) = (errno(), At::Write);
            break;
        }
        t.acked += n as u64;
        if sync_every > 0 && (t.acked as usize).is_multiple_of(sync_every) {
            // SAFETY: plain syscall.
            if unsafe { libc::fsync(fd) } != 0 {
                (t.err, at) = (errno(), At::Fsync);
                break;
            }
            t.synced = t.acked;
        }
    }
    // SAFETY: closes the fd the caller opened, once.
    if unsafe { libc::close(fd) } != 0 && t.err == 0 {
        (t.err, at) = (errno(), At::Close);
    }
    if t.err == 0 {
        t.synced = t.acked;
    }
    (t, at)
}

/// The longest run of zero bytes in `got` where `data` is not all zeros: data the writer
/// gave that reads back as zeros (its offset and length). (A run of even 4 zeros in the
/// pattern is a one-in-four-billion chance.)
fn zero_run(got: &[u8], data: &[u8]) -> (usize, usize) {
    let (mut best, mut i) = ((0, 0), 0);
    while i < got.len().min(data.len()) {
        if got[i] != 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < got.len().min(data.len()) && got[i] == 0 {
            i += 1;
        }
        if data[start..i].iter().any(|&d| d != 0) && i - start > best.1 {
            best = (start, i - start);
        }
    }
    best
}

/// A 30 MiB file onto a vault whose backing store has room for about 20: the application
/// checks every `write`, `fsync` and `close`. What the mount must do:
/// - the writer is told ENOSPC — at `write` itself when the file was opened on a disk
///   already low on space (the mount then writes that file through, without the write-back
///   cache), else at the `fsync` or `close` after the write-back failed;
/// - what a successful `fsync` confirmed is there after a remount;
/// - the size the mount shows after `close` is the size stored, and stays so after a
///   remount;
/// - no byte the writer gave reads back as zero (no hole where a write was refused), every
///   block authenticates (`veilfs fsck` exit 0), and the file is a prefix of what was written.
///
/// `fill_after_open`: the backing store is roomy at open and fills after it (a file opened
/// before the disk ran low: the write-back cache keeps it). `sync_every`: bytes between two
/// `fsync`s (0: none, only `close`).
fn bigger_than_the_disk(extra: &[&str], fill_after_open: bool, sync_every: usize) -> Option<At> {
    if !root_only("fills its backing store, which must be a tmpfs of its own (only root mounts one)") {
        return None;
    }
    let mut m = Mounted::new(if fill_after_open { "160m" } else { "20m" }, extra)?;
    let data = pattern(30 * MIB, 9);
    let p = m.m("big");
    // SAFETY: a plain syscall on a NUL-terminated path.
    let fd = unsafe { libc::open(c(&p).as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644) };
    assert!(fd >= 0, "open: {}", errno());
    if fill_after_open {
        fill_backing(&m, 20 * MIB as u64);
    }
    let started = std::time::Instant::now();
    let (t, at) = checking_writer(fd, &data, sync_every);
    let took = started.elapsed();
    let shown_at_close = std::fs::metadata(&p).map(|s| s.len()).unwrap_or(0);
    // The kernel sends RELEASE after close returns, in the background: the mount's last word
    // on the file, which no application can wait for. After a write-back that failed, the
    // size the kernel kept (what was acknowledged) must give way to the size stored, which
    // is smaller: wait up to 5 s for it to change (a loaded machine may take a while to
    // answer RELEASE), then hold it to the size found after a remount.
    // Asked all along, so that some `stat`s come while RELEASE is being answered (one that
    // did once found the kernel's old inode again, with its old size, for good).
    let size_now = || std::fs::metadata(&p).map(|s| s.len()).unwrap_or_else(|e| panic!("stat after close: {e}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while at != At::Write && size_now() == t.acked && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    let shown = size_now();
    umount_and_wait(&mut m);
    let fsck = run(&BIN, &["fsck", m.cipher.to_str().unwrap(), "--passfile", m.passfile.to_str().unwrap()]);
    m.mount();
    let got = std::fs::read(&p).unwrap_or_else(|e| panic!("reading the file whole after remount: {e}"));
    let (zoff, zlen) = zero_run(&got, &data);
    eprintln!(
        "full disk {extra:?}, {}, fsync every {sync_every}: told {} at {at:?} after {} bytes acknowledged ({} fsynced) in {took:?}; \
         shown {shown_at_close} bytes at close, {shown} after its release, {} after remount; longest run of zeros {zlen} bytes at {zoff}; \
         fsck exit {:?}",
        if fill_after_open { "filled after open" } else { "low at open" },
        name(t.err),
        t.acked,
        t.synced,
        got.len(),
        fsck.status.code()
    );
    assert_enospc("a file bigger than the disk", &t);
    assert_eq!(zlen, 0, "{zlen} bytes the writer gave read back as zeros, from offset {zoff}");
    assert!(got.len() as u64 >= t.synced, "{} bytes after remount, {} were fsynced", got.len(), t.synced);
    assert!(got[..] == data[..got.len()], "the file after remount is not a prefix of what was written");
    assert_eq!(shown, got.len() as u64, "the size shown after close differs from the size stored");
    assert!(fsck.status.success(), "fsck after a full disk: {}", text(&fsck));
    if at == At::Write {
        assert_eq!(got.len() as u64, t.acked, "told ENOSPC at write(): exactly what was acknowledged is stored");
    }
    Some(at)
}

#[test]
fn bigger_than_the_disk_low_at_open_writeback() {
    let at = bigger_than_the_disk(WB, false, 4 * MIB);
    assert!(at.is_none_or(|a| a == At::Write), "a file opened on a disk low on space is told at write(): {at:?}");
}

#[test]
fn bigger_than_the_disk_low_at_open_no_writeback() {
    let at = bigger_than_the_disk(NO_WB, false, 4 * MIB);
    assert!(at.is_none_or(|a| a == At::Write), "without the write-back cache ENOSPC comes at write(): {at:?}");
}

#[test]
fn bigger_than_the_disk_filled_after_open_writeback() {
    bigger_than_the_disk(WB, true, 4 * MIB);
}

#[test]
fn bigger_than_the_disk_closed_without_fsync_writeback() {
    let at = bigger_than_the_disk(WB, false, 0);
    assert!(at.is_none_or(|a| a == At::Write), "a file opened on a disk low on space is told at write(): {at:?}");
}

#[test]
fn bigger_than_the_disk_filled_after_open_closed_without_fsync_writeback() {
    bigger_than_the_disk(WB, true, 0);
}
