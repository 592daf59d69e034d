//! Attacks on a mounted vault and on the offline tools, each test named by its attack:
//! an ordinary user of a root `--allow-other` mount who swaps the ciphertext behind their own
//! files for links and FIFOs; FIFOs, devices and links planted where the format keeps its
//! small files; and a password left in the memory of the daemon or of an offline command,
//! whether it came from standard input or was typed at the prompt of a real pseudo-terminal.
//! docs/SECURITY.md §8 names them.

mod common;
use common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Everything about a file or directory an attacker could try to change.
fn fingerprint(p: &Path) -> String {
    let m = fs::symlink_metadata(p).unwrap();
    let content = if m.is_file() { fs::read(p).unwrap() } else { Vec::new() };
    let o = run("getfattr", &["-d", "-m", "-", "--absolute-names", p.to_str().unwrap()]);
    format!(
        "mode {:o} owner {}:{} size {} mtime {}.{} ctime {}.{} content {:?} xattrs {}",
        m.mode(),
        m.uid(),
        m.gid(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        content,
        String::from_utf8_lossy(&o.stdout)
    )
}

/// The one backing directory owned by `uid` directly under `cipher`.
fn backing_dir_of(cipher: &Path, uid: u32) -> PathBuf {
    let dirs: Vec<PathBuf> = fs::read_dir(cipher)
        .unwrap()
        .flatten()
        .filter(|e| e.metadata().is_ok_and(|m| m.is_dir() && m.uid() == uid))
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "one ciphertext directory owned by the user: {dirs:?}");
    dirs[0].clone()
}

#[test]
fn user_swapping_ciphertext_for_links_and_fifos_cannot_touch_root_files_through_a_root_mount() {
    if !root_only("the attack is on root's --allow-other mount, by a second user made with useradd") {
        return;
    }
    let Some(m) = Mounted::new("128m", &["--allow-other"]) else { return };
    for p in [&m.tmpfs.path, &m.mnt, &m.cipher] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let user = TestUser::new("vfatk");
    // Root's files outside the vault: what the attacker aims at.
    let victim = m.tmpfs.path.join("victim");
    fs::create_dir(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(victim.join("secret"), b"root's secret\n").unwrap();
    fs::set_permissions(victim.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir(victim.join("dir")).unwrap();
    fs::set_permissions(victim.join("dir"), fs::Permissions::from_mode(0o700)).unwrap();
    assert!(sh(&format!("setfattr -n user.owner -v root {}", victim.join("secret").display())).status.success());
    let before: Vec<String> = ["secret", "dir"].iter().map(|n| fingerprint(&victim.join(n))).collect();

    // The user's own directory in the vault, and a root directory that must stay usable.
    let home = m.m("home");
    fs::create_dir(&home).unwrap();
    assert!(run("chown", &[&format!("{0}:{0}", user.name), home.to_str().unwrap()]).status.success());
    fs::create_dir(m.m("rootdir")).unwrap();
    fs::write(m.m("rootdir/keep"), b"still here").unwrap();
    let o = user.sh(20, &format!("cd {} && for i in 0 1 2 3; do echo data$i > f$i; mkdir d$i; done", home.display()));
    assert!(o.status.success(), "{}", text(&o));
    let backing = backing_dir_of(&m.cipher, user.uid);

    let secs = 20;
    // The attacker, in the ciphertext of their own directory: every entry in turn becomes a
    // symlink to root's file or directory, a FIFO, or a hard link to root's file.
    let swapper = format!(
        r#"cd {b} || exit 1; end=$(( $(date +%s) + {secs} )); i=0
        while [ $(date +%s) -lt $end ]; do
          for e in $(ls | grep -v '^veilfs\.'); do
            case $((i % 5)) in
              0) ln -sfn {v}/secret "$e" ;;
              1) rm -rf "$e"; mkfifo "$e" ;;
              2) rm -rf "$e"; ln {v}/secret "$e" ;;
              3) rm -rf "$e"; ln -s {v}/dir "$e" ;;
              4) rm -rf "$e"; ln -s {v} "$e" ;;
            esac
            i=$((i+1))
          done
        done 2>/dev/null; echo swapped $i"#,
        b = backing.display(),
        v = victim.display()
    );
    // The same user, through the mount: every metadata and data operation on their files.
    let operator = format!(
        r#"cd {h} || exit 1; end=$(( $(date +%s) + {secs} )); i=0
        while [ $(date +%s) -lt $end ]; do
          i=$((i+1)); echo new$i > n$i; mkdir m$i
          for f in *; do
            chmod 0666 "$f"; chmod 4777 "$f"; chmod 0777 "$f"; chgrp {u} "$f"; chown {u} "$f"
            touch -d 2001-01-01 "$f"; touch "$f"; truncate -s 0 "$f"; truncate -s 9 "$f"
            setfattr -n user.x -v y "$f"; setfattr -x user.owner "$f"; getfattr -d "$f"
            cat "$f"; echo x >> "$f"; echo y > "$f"; ls -la "$f"; readlink "$f"
            ln "$f" "$f.h"; mv "$f" "$f.m"; mv "$f.m" "$f"; rm -f "$f.h"; rmdir "$f"; mkdir "$f/sub"
          done
        done >/dev/null 2>&1; echo operated $i"#,
        h = home.display(),
        u = user.name
    );
    let (swapped, operated, responsive) = std::thread::scope(|s| {
        let a = s.spawn(|| user.sh(secs + 30, &swapper));
        let b = s.spawn(|| user.sh(secs + 30, &operator));
        // Meanwhile other users (root here) keep being served: the mount never freezes.
        let t = Instant::now();
        let mut checks = 0;
        while t.elapsed() < Duration::from_secs(secs as u64) {
            let o = run_timeout(10, "cat", &[m.m("rootdir/keep").to_str().unwrap()]);
            assert!(o.is_some_and(|o| o.stdout == b"still here"), "the mount stopped answering other users");
            let o = run_timeout(10, "ls", &["-la", m.mnt.to_str().unwrap()]);
            assert!(o.is_some_and(|o| o.status.success()), "listing the mount hung or failed");
            checks += 1;
            std::thread::sleep(Duration::from_millis(300));
        }
        (a.join().unwrap(), b.join().unwrap(), checks)
    });
    eprintln!("{} / {} / {responsive} responsiveness checks", text(&swapped).trim(), text(&operated).trim());
    assert!(text(&swapped).contains("swapped"), "the swapper ran: {}", text(&swapped));
    assert!(text(&operated).contains("operated"), "the operator finished in time: {}", text(&operated));
    let after: Vec<String> = ["secret", "dir"].iter().map(|n| fingerprint(&victim.join(n))).collect();
    assert_eq!(before, after, "root's files outside the vault changed");
    // And the mount still works for everyone.
    fs::write(m.m("rootdir/after"), b"ok").unwrap();
    assert_eq!(fs::read(m.m("rootdir/after")).unwrap(), b"ok");
}

/// What gets planted where, in a copy of a vault made by [`planted_vault`].
#[derive(Clone, Copy, Debug)]
enum Plant {
    Fifo,
    LinkToDevZero,
    LinkToRootFile,
    Directory,
}

/// A vault with a directory `d` (holding `x`), a long-named file, a file `f` and a symlink
/// `s`, unmounted; returns the fixture and the ciphertext paths of each object.
struct Planted {
    m: Mounted,
    diriv: PathBuf,
    side: PathBuf,
    content: PathBuf,
    link: PathBuf,
}

const LONG: &str = "a-long-name-that-needs-a-side-file-because-it-is-longer-than-one-hundred-and-forty-two-bytes-once-encrypted-and-bound-to-its-directory-entry-xxxxxxxxxxx";

fn planted_vault() -> Option<Planted> {
    let mut m = Mounted::new("64m", &[])?;
    fs::create_dir(m.m("d")).unwrap();
    fs::write(m.m("d/x"), b"x").unwrap();
    fs::write(m.m(LONG), b"long").unwrap();
    fs::write(m.m("f"), b"file").unwrap();
    std::os::unix::fs::symlink("target", m.m("s")).unwrap();
    m.umount();
    let find = |pred: &dyn Fn(&fs::Metadata, &str) -> bool| -> PathBuf {
        fs::read_dir(&m.cipher)
            .unwrap()
            .flatten()
            .find(|e| pred(&e.metadata().unwrap(), &e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .expect("ciphertext object")
    };
    let dir = find(&|md, _| md.is_dir());
    let side = find(&|_, n| n.starts_with("veilfs.N."));
    let content = find(&|md, n| md.is_file() && !n.starts_with("veilfs.") && md.len() == cipher_size(4));
    let link = fs::read_dir(&m.cipher).unwrap().flatten().find(|e| e.file_type().unwrap().is_symlink()).unwrap().path();
    // The directory's IV copy: the name `veilfs.diriv.<b64(iv)>` of a new vault (F§7.1).
    let diriv = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("veilfs.diriv"))
        .expect("IV copy")
        .path();
    Some(Planted { diriv, side, content, link, m })
}

fn plant(at: &Path, what: Plant, victim: &Path) {
    fs::remove_file(at).unwrap();
    let ok = match what {
        Plant::Fifo => run("mkfifo", &[at.to_str().unwrap()]).status.success(),
        Plant::LinkToDevZero => std::os::unix::fs::symlink("/dev/zero", at).is_ok(),
        Plant::LinkToRootFile => std::os::unix::fs::symlink(victim, at).is_ok(),
        Plant::Directory => fs::create_dir(at).is_ok(),
    };
    assert!(ok, "planting {what:?} at {}", at.display());
}

fn restore(at: &Path, saved: &Path) {
    let _ = fs::remove_dir(at);
    let _ = fs::remove_file(at);
    assert!(run("cp", &["-a", saved.to_str().unwrap(), at.to_str().unwrap()]).status.success());
}

#[test]
fn fifos_links_and_directories_planted_in_the_ciphertext_are_integrity_errors_never_hangs() {
    let Some(mut p) = planted_vault() else { return };
    let m = &p.m;
    let victim = m.tmpfs.path.join("root-file");
    fs::write(&victim, b"root").unwrap();
    let save = m.tmpfs.path.join("saved");
    fs::create_dir(&save).unwrap();
    let cipher = m.cipher.to_str().unwrap().to_string();
    let pass = m.passfile.to_str().unwrap().to_string();
    let out = m.tmpfs.path.join("out");
    let mnt = m.mnt.clone();
    let mut cases = 0;
    let objects = [(p.diriv.clone(), "d/x"), (p.side.clone(), LONG), (p.content.clone(), "f"), (p.link.clone(), "s")];
    for (at, plaintext) in &objects {
        let (at, plaintext) = (at, *plaintext);
        let saved = save.join(at.file_name().unwrap());
        let _ = fs::remove_file(&saved);
        assert!(run("cp", &["-a", at.to_str().unwrap(), saved.to_str().unwrap()]).status.success());
        for what in [Plant::Fifo, Plant::LinkToDevZero, Plant::LinkToRootFile, Plant::Directory] {
            plant(at, what, &victim);
            let label = format!("{what:?} as {}", at.display());
            // Offline: every tool (export, cat, ls, fsck) finishes, says which ciphertext file,
            // exits 6.
            let _ = fs::remove_dir_all(&out);
            let target = format!("{cipher}/{plaintext}");
            for args in [
                vec!["export", &cipher, out.to_str().unwrap(), "--passfile", &pass],
                vec!["cat", &target, "--passfile", &pass],
                vec!["ls", "-l", &cipher, "--passfile", &pass],
                vec!["fsck", &cipher, "--passfile", &pass],
            ] {
                let o = run_timeout(30, &BIN, &args).unwrap_or_else(|| panic!("{label}: veilfs {args:?} hung"));
                let err = String::from_utf8_lossy(&o.stderr);
                let expect_name = at.file_name().unwrap().to_string_lossy();
                // `ls` of the top directory does not open d's IV file or f's content, and
                // `cat` of a symlink is refused before anything is read.
                // A long name's side file only serves listings: a lookup by name computes
                // what it holds, so `cat` of that file still works.
                let touched = match args[0] {
                    "ls" => *at == p.side || *at == p.link,
                    "cat" => *at != p.link && *at != p.side,
                    _ => true,
                };
                if touched {
                    assert_eq!(o.status.code(), Some(6), "{label}: veilfs {args:?}: {err}");
                    assert!(
                        err.contains(&*expect_name) || err.contains(at.parent().unwrap().to_str().unwrap()),
                        "{label}: veilfs {args:?} names the ciphertext: {err}"
                    );
                } else {
                    assert!(o.status.code().is_some(), "{label}: veilfs {args:?} crashed");
                }
            }
            // Through the mount: the same object fails with EIO; the mount keeps answering.
            p.m.mount();
            let o = run_timeout(20, "cat", &[mnt.join(plaintext).to_str().unwrap()]);
            let o = o.unwrap_or_else(|| panic!("{label}: reading through the mount hung"));
            assert!(o.status.success() == (*at == p.side), "{label}: reading through the mount: {}", text(&o));
            let o = run_timeout(20, "ls", &["-laR", mnt.to_str().unwrap()]);
            assert!(o.is_some(), "{label}: listing the mount hung");
            let o = run_timeout(20, "cat", &[mnt.join("d/../f").to_str().unwrap()]);
            assert!(o.is_some(), "{label}: the mount stopped answering");
            p.m.umount();
            restore(at, &saved);
            cases += 1;
        }
    }
    assert_eq!(cases, 16);
    assert_eq!(fs::read(&victim).unwrap(), b"root", "the root file outside the vault is untouched");
}

/// A device node swapped behind a live mount (here /dev/null for the first disk) is never
/// the new device: a mount that asks the daemon again (`--attr-timeout 1`) gets an integrity
/// error; so does a locked mount once its watch of CIPHERDIR has reported the change (a
/// handle opened before may keep the attributes it verified, never the new device's).
#[test]
fn device_node_replaced_under_a_live_mount_is_an_integrity_error_not_a_new_device() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    for args in [&["--attr-timeout", "1"][..], &[]] {
        let Some(m) = Mounted::new("64m", args) else { return };
        let null = m.m("null");
        assert!(run("mknod", &[null.to_str().unwrap(), "c", "1", "3"]).status.success());
        // An O_PATH handle: its stat asks the mount (GETATTR) about the node it knows, without a
        // new LOOKUP of the name.
        let handle = std::os::unix::fs::OpenOptionsExt::custom_flags(fs::OpenOptions::new().read(true), libc::O_PATH)
            .open(&null)
            .unwrap();
        let st = handle.metadata().unwrap();
        assert!(st.file_type().is_char_device() && st.rdev() == libc::makedev(1, 3), "{st:?}");
        // Behind the mount (which knows the node now), /dev/null becomes the first disk.
        let backing = fs::read_dir(&m.cipher)
            .unwrap()
            .flatten()
            .find(|e| e.file_type().unwrap().is_char_device())
            .unwrap()
            .path();
        fs::remove_file(&backing).unwrap();
        assert!(run("mknod", &[backing.to_str().unwrap(), "c", "8", "0"]).status.success());
        std::thread::sleep(Duration::from_millis(1500)); // past a 1 s attribute cache
        let got = handle.metadata().map(|st| st.rdev()).map_err(|e| e.raw_os_error());
        let mut by_name = fs::symlink_metadata(&null).map(|st| st.rdev()).map_err(|e| e.raw_os_error());
        if args.is_empty() {
            // A locked mount's kernel may keep the attributes it verified for the handle, but
            // the mount's watch of CIPHERDIR has it look the name up again: the error, never
            // the new device.
            assert!(matches!(got, Ok(d) if d == libc::makedev(1, 3)) || got == Err(Some(libc::EIO)), "{got:?}");
            let t = Instant::now();
            while by_name != Err(Some(libc::EIO)) && t.elapsed() < Duration::from_secs(10) {
                assert_eq!(by_name, Ok(libc::makedev(1, 3)), "lookup of the node before the watch reported it");
                std::thread::sleep(Duration::from_millis(100));
                by_name = fs::symlink_metadata(&null).map(|st| st.rdev()).map_err(|e| e.raw_os_error());
            }
            assert_eq!(by_name, Err(Some(libc::EIO)), "lookup of the replaced node once the watch reported it");
        } else {
            assert_eq!(got, Err(Some(libc::EIO)), "stat of the replaced node");
            assert_eq!(by_name, Err(Some(libc::EIO)), "lookup of the replaced node");
        }
    }
}

#[test]
fn a_config_that_is_a_fifo_or_endless_is_refused_at_once() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    m.umount();
    let conf = m.cipher.join("veilfs.conf");
    let saved = m.tmpfs.path.join("conf");
    fs::copy(&conf, &saved).unwrap();
    for what in [Plant::Fifo, Plant::LinkToDevZero, Plant::Directory] {
        plant(&conf, what, Path::new("/"));
        for args in [
            vec!["info", m.cipher.to_str().unwrap()],
            vec!["ls", m.cipher.to_str().unwrap(), "--passfile", m.passfile.to_str().unwrap()],
        ] {
            let t = Instant::now();
            let o = run_timeout(20, &BIN, &args).unwrap_or_else(|| panic!("{what:?}: veilfs {args:?} hung"));
            assert!(t.elapsed() < Duration::from_secs(5), "{what:?}: took {:?}", t.elapsed());
            assert!(!o.status.success(), "{what:?}: veilfs {args:?} succeeded");
            assert!(text(&o).contains("veilfs.conf"), "{what:?}: names the config: {}", text(&o));
        }
        let _ = fs::remove_dir(&conf);
        let _ = fs::remove_file(&conf);
        fs::copy(&saved, &conf).unwrap();
    }
    // A huge config is refused before it is parsed (a new file: the copy is read-only, 0400).
    fs::remove_file(&conf).unwrap();
    fs::write(&conf, vec![b' '; 2 << 20]).unwrap();
    let o = run(&BIN, &["info", m.cipher.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
}

#[test]
fn password_given_on_stdin_leaves_no_copy_in_the_daemon_memory() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    m.umount();
    // The vault's password is fixed by the fixture; change it to a unique one first.
    let pw = unique_password(&m);
    let o =
        sh(&format!("printf '%s\\n' '{pw}' | {BIN} mount {} {} --password-stdin", m.cipher.display(), m.mnt.display()));
    assert!(o.status.success(), "mount: {}", text(&o));
    let pid = daemon_pid(&m.mnt).expect("the mount daemon");
    fs::write(m.m("f"), b"use the mount a little").unwrap();
    let copies = password_copies(pid, &pw);
    let _ = run(&BIN, &["umount", m.mnt.to_str().unwrap()]);
    assert_eq!(copies, (0, 0), "copies of the password (whole, first 8 bytes) in the daemon's memory");
}

/// A password of this test run only, with a distinctive first 8 bytes, set on the vault of
/// `m` (unmounted).
fn unique_password(m: &Mounted) -> String {
    let pw = format!("pw-{:016x}-unique", std::process::id() as u64 * 0x9e37_79b9_7f4a_7c15);
    let o = sh(&format!(
        "printf '%s\\n%s\\n' '{PASSWORD}' '{pw}' | {BIN} passwd {} --password-stdin --kdf-memory 8 --kdf-iterations 1",
        m.cipher.display()
    ));
    assert!(o.status.success(), "passwd: {}", text(&o));
    pw
}

/// Copies of `pw` in process `pid`: whole, and of its first 8 bytes (what a growing buffer
/// leaves behind at each reallocation).
fn password_copies(pid: u32, pw: &str) -> (usize, usize) {
    (scan_memory(pid, pw.as_bytes()), scan_memory(pid, &pw.as_bytes()[..8]))
}

#[test]
fn password_typed_at_the_prompt_leaves_no_copy_in_the_daemon_memory() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    m.umount();
    let pw = unique_password(&m);
    let (cipher, mnt) = (m.cipher.to_str().unwrap(), m.mnt.to_str().unwrap());
    let Some(session) = on_pty(&[&BIN, "mount", cipher, mnt], &[&pw]) else { return };
    let (code, out) = session.finish();
    let _unmount = UnmountOnDrop(m.mnt.clone());
    assert_eq!(code, 0, "mount at the prompt: {out}");
    assert!(out.contains("Password: ") && !out.contains(&pw), "prompted without echo: {out:?}");
    let pid = daemon_pid(&m.mnt).expect("the mount daemon");
    fs::write(m.m("f"), b"use the mount a little").unwrap();
    let copies = password_copies(pid, &pw);
    let _ = run(&BIN, &["umount", mnt]);
    assert_eq!(copies, (0, 0), "copies of the typed password (whole, first 8 bytes) in the daemon's memory");
}

#[test]
fn password_typed_at_the_prompt_leaves_no_copy_in_an_offline_command_after_unlock() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    m.umount();
    let pw = unique_password(&m);
    // `passwd` has unlocked the vault with the typed password and asks for the new one.
    let Some(session) = on_pty(&[&BIN, "passwd", m.cipher.to_str().unwrap()], &[&pw]) else { return };
    let copies = password_copies(session.pid, &pw);
    let asking = fs::read_to_string(format!("/proc/{}/cmdline", session.pid)).is_ok();
    let _ = run("kill", &["-KILL", &session.pid.to_string()]);
    let (_, out) = session.finish();
    assert!(asking && out.contains("New password: "), "passwd unlocked and asks for the new password: {out}");
    assert_eq!(copies, (0, 0), "copies of the typed password (whole, first 8 bytes) in passwd's memory");
}

/// How often `needle` occurs in the readable memory of process `pid`.
fn scan_memory(pid: u32, needle: &[u8]) -> usize {
    use std::os::unix::fs::FileExt;
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut hits = 0;
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (range, perms) = (parts.next().unwrap(), parts.next().unwrap());
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (u64::from_str_radix(a, 16).unwrap(), u64::from_str_radix(b, 16).unwrap());
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.read_exact_at(&mut buf, a).is_ok() {
            hits += buf.windows(needle.len()).filter(|w| *w == needle).count();
        }
    }
    hits
}

/// The directories directly under `dir` that are vault entries (not `veilfs.*` files).
fn entry_dirs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("veilfs."))
        .collect();
    v.sort();
    v
}

/// A user of a root `--allow-other` mount plants an exchange intent record (`veilfs.xchg.<r>`,
/// with a made-up MAC) and her own file under the temporary name `veilfs.tmp.<r>` in the
/// ciphertext of her directory; the record names a root-owned 0700 directory at the top of
/// the vault. After an unclean exit the crash sweep, running as root, used to move root's
/// directory into hers and her file into the vault's top directory. A second record, planted
/// in a root-owned directory (by anyone with write access to the ciphertext, such as a sync
/// peer: where the least-rights rule alone would let root act), names the same directory.
/// Both must be reported as damage (one log line each, fsck exit 6) and nothing may move.
#[test]
fn a_planted_exchange_record_is_reported_and_never_executed() {
    if !root_only("the attack is on root's --allow-other mount, by a second user made with useradd") {
        return;
    }
    let Some(mut m) = Mounted::new("64m", &["--allow-other"]) else { return };
    for p in [&m.tmpfs.path, &m.mnt, &m.cipher] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let user = TestUser::new("vfxchg");
    let home = m.m("home");
    fs::create_dir(&home).unwrap();
    assert!(run("chown", &[&format!("{0}:{0}", user.name), home.to_str().unwrap()]).status.success());
    let hers = backing_dir_of(&m.cipher, user.uid);
    let before_root = entry_dirs(&m.cipher);
    fs::create_dir(m.m("secret")).unwrap();
    fs::write(m.m("secret/key"), b"root's key\n").unwrap();
    fs::set_permissions(m.m("secret"), fs::Permissions::from_mode(0o700)).unwrap();
    let secret = entry_dirs(&m.cipher).into_iter().find(|n| !before_root.contains(n)).expect("secret's backing dir");
    let before_rootdir = entry_dirs(&m.cipher);
    fs::create_dir(m.m("rootdir")).unwrap();
    let rootdir = m.cipher.join(entry_dirs(&m.cipher).into_iter().find(|n| !before_rootdir.contains(n)).unwrap());
    // A crash, so that the next mount runs the crash sweep.
    m.kill_daemon();

    let forged_mac = "mac=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let record = |r: &str| format!("a_dir=\na={secret}\na_new=stolen{r}\nb_new=planted{r}\n{forged_mac}\n");
    let o = user.sh(
        10,
        &format!(
            "cd {} && printf 'hers\\n' > veilfs.tmp.PLANTED && printf '%s' '{}' > veilfs.xchg.PLANTED",
            hers.display(),
            record("1")
        ),
    );
    assert!(o.status.success(), "the user plants in her backing directory: {}", text(&o));
    fs::write(rootdir.join("veilfs.tmp.PEER"), b"peer's\n").unwrap();
    fs::write(rootdir.join("veilfs.xchg.PEER"), record("2")).unwrap();
    let tree_before = dump_tree(&m.cipher);

    let o = m.mount_output();
    let said = text(&o);
    assert!(said.contains("did not end cleanly"), "the mount found a crashed writer: {said}");
    m.umount();
    let tree_after = dump_tree(&m.cipher);
    assert!(m.cipher.join(&secret).is_dir(), "root's directory left the top of the vault");
    assert!(!hers.join("stolen1").exists() && !m.cipher.join("planted1").exists(), "the sweep executed her record");
    assert!(!rootdir.join("stolen2").exists() && !m.cipher.join("planted2").exists(), "the sweep executed a record");
    assert!(tree_after == tree_before, "the sweep changed the ciphertext tree");
    for r in ["veilfs.xchg.PLANTED", "veilfs.xchg.PEER"] {
        let lines = said.lines().filter(|l| l.contains(r)).count();
        assert_eq!(lines, 1, "the sweep names {r} in one log line: {said}");
    }

    let o = run(&BIN, &["fsck", m.cipher.to_str().unwrap(), "--passfile", m.passfile.to_str().unwrap()]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(6), "fsck: {out}");
    for r in ["veilfs.xchg.PLANTED", "veilfs.xchg.PEER"] {
        let lines: Vec<&str> = out.lines().filter(|l| l.contains(r)).collect();
        assert_eq!(lines.len(), 1, "fsck names {r} in one line: {out}");
        assert!(lines[0].contains("damaged"), "{r} is reported as damage: {}", lines[0]);
    }
    assert!(dump_tree(&m.cipher) == tree_after, "fsck without --repair changed the tree");

    // A repair leaves both records where they are, and acts on the objects around them with
    // their directories' owner's rights: her file under a temporary name does not go into
    // root's lost+found (two owners: refused and said), root's own one does.
    let o = run(&BIN, &["fsck", "--repair", m.cipher.to_str().unwrap(), "--passfile", m.passfile.to_str().unwrap()]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(6), "fsck --repair: {out}");
    assert!(hers.join("veilfs.xchg.PLANTED").exists() && rootdir.join("veilfs.xchg.PEER").exists(), "{out}");
    assert!(m.cipher.join(&secret).is_dir() && !hers.join("stolen1").exists(), "{out}");
    assert!(hers.join("veilfs.tmp.PLANTED").exists(), "her file went into root's lost+found: {out}");
    let refused: Vec<&str> = out.lines().filter(|l| l.contains("veilfs.tmp.PLANTED")).collect();
    assert!(refused.len() == 1 && refused[0].contains("different users"), "the refusal is said: {out}");
    assert!(!rootdir.join("veilfs.tmp.PEER").exists(), "root's own leftover went to lost+found: {out}");
}

/// A root-owned directory `victim` (0700) holding a root-owned `canary` (0600) in `at`: what
/// a user aims at through a plaintext tree that root imports or exports.
fn root_victim(at: &Path) -> (PathBuf, PathBuf) {
    let victim = at.join("victim");
    fs::create_dir(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
    let canary = victim.join("canary");
    fs::write(&canary, b"ROOT-ONLY CANARY\n").unwrap();
    fs::set_permissions(&canary, fs::Permissions::from_mode(0o600)).unwrap();
    (victim, canary)
}

/// Runs `veilfs args` with a time limit; panics if it hangs.
fn veilfs_within(secs: u64, args: &[&str]) -> std::process::Output {
    run_timeout(secs, &BIN, args).unwrap_or_else(|| panic!("veilfs {args:?} hung (killed after {secs} s)"))
}

/// Whether any regular file under `p` (symlinks not followed) holds `needle`.
fn tree_holds(p: &Path, needle: &[u8]) -> bool {
    let m = fs::symlink_metadata(p).unwrap();
    if m.is_dir() {
        return fs::read_dir(p).unwrap().flatten().any(|e| tree_holds(&e.path(), needle));
    }
    m.is_file() && contains(&fs::read(p).unwrap(), needle)
}

/// Runs `swapper` (a shell script that ends by printing `swapped N`) as `user` while root
/// runs `step(run)` again and again for `secs` seconds; returns N and the number of runs.
fn race(user: &TestUser, swapper: &str, secs: u32, mut step: impl FnMut(usize)) -> (u64, usize) {
    let (swapped, runs) = std::thread::scope(|s| {
        let a = s.spawn(|| user.sh(secs + 30, swapper));
        let start = Instant::now();
        let mut runs = 0;
        while start.elapsed() < Duration::from_secs(secs as u64) {
            step(runs);
            runs += 1;
        }
        (a.join().unwrap(), runs)
    });
    let swapped = text(&swapped);
    let n = swapped.trim().strip_prefix("swapped ").and_then(|n| n.parse().ok());
    let n = n.unwrap_or_else(|| panic!("the swapper did not finish: {swapped}"));
    eprintln!("{n} swaps during {runs} runs");
    assert!(n >= 1000, "too few swaps to mean anything: {n}");
    (n, runs)
}

#[test]
fn export_destination_swapped_for_symlink_changes_no_root_file() {
    if !root_only("the attack is on root's export, by a second user made with useradd") {
        return;
    }
    let t = Tmpfs::new("128m");
    fs::set_permissions(&t.path, fs::Permissions::from_mode(0o755)).unwrap();
    let user = TestUser::new("vfexp");
    let (victim, canary) = root_victim(&t.path);
    let before = (fingerprint(&victim), fingerprint(&canary));
    // Her tree, which root put in the vault: directories of mode 0777 holding her files.
    let src = t.path.join("src");
    for d in 0..4 {
        let dir = src.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..8 {
            fs::write(dir.join(format!("f{f}")), format!("her file {d}/{f}\n")).unwrap();
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    }
    assert!(run("chown", &["-R", &format!("{0}:{0}", user.name), src.to_str().unwrap()]).status.success());
    let (cipher, _, pass) = new_vault(&t.path.join("v"));
    let (c, p) = (cipher.to_str().unwrap(), pass.to_str().unwrap());
    let o = veilfs_within(60, &["import", src.to_str().unwrap(), c, "--passfile", p]);
    assert!(o.status.success(), "import: {}", text(&o));
    // Root restores it: `dest/src` is hers, as in a restore into /home.
    let dest = t.path.join("dest");
    let d = dest.to_str().unwrap();
    let o = veilfs_within(60, &["export", c, d, "--passfile", p]);
    assert!(o.status.success(), "export: {}", text(&o));
    for owned in ["src", "src/d0", "src/d0/f0"] {
        assert_eq!(fs::metadata(dest.join(owned)).unwrap().uid(), user.uid, "owner of {owned} restored");
    }

    // She empties her directories (so every run writes into them again) and swaps each for
    // a symlink to root's file, then to root's directory, then puts it back, in a tight loop
    // (perl: a shell's forks would swap a hundred times slower).
    let secs = 15;
    let swapper = r#"exec perl -e '
        chdir "@DEST@/src" or die; my ($end, $i, $n) = (time + @SECS@, 0, 0);
        while (time < $end) {
          for my $d (qw(d0 d1 d2 d3)) {
            $i++;
            if (opendir(my $h, $d)) { unlink map { "$d/$_" } grep { !/^[.]/ } readdir $h }
            rename($d, ".old$i");
            symlink("@CANARY@", $d) and $n++; unlink $d;
            symlink("@VICTIM@", $d) and $n++; unlink $d;
            rename(".old$i", $d);
          }
        }
        print "swapped $n\n"'"#
        .replace("@DEST@", d)
        .replace("@SECS@", &secs.to_string())
        .replace("@CANARY@", canary.to_str().unwrap())
        .replace("@VICTIM@", victim.to_str().unwrap());
    // Root re-runs the export meanwhile: resumes, and --overwrite runs.
    race(&user, &swapper, secs, |run| {
        let mut args = vec!["export", c, d, "--passfile", p];
        if run % 2 == 1 {
            args.push("--overwrite");
        }
        veilfs_within(30, &args);
    });
    let names: Vec<_> = fs::read_dir(&victim).unwrap().flatten().map(|e| e.file_name()).collect();
    let after = (fingerprint(&victim), fingerprint(&canary));
    assert!(
        names == ["canary"] && before == after,
        "root's files outside the destination changed: {} holds {names:?}; before {before:?}; after {after:?}",
        victim.display()
    );
}

#[test]
fn import_source_swapped_for_symlink_stores_nothing_unreadable_as_hers() {
    if !root_only("the attack is on root's import, by a second user made with useradd") {
        return;
    }
    // renameat2(2), for RENAME_EXCHANGE from perl.
    let renameat2 = match std::env::consts::ARCH {
        "x86_64" => 316,
        "aarch64" => 276,
        arch => return eprintln!("SKIPPED: renameat2's number on {arch} not known to this test"),
    };
    let t = Tmpfs::new("128m");
    fs::set_permissions(&t.path, fs::Permissions::from_mode(0o755)).unwrap();
    let user = TestUser::new("vfimp");
    let (victim, canary) = root_victim(&t.path);
    // Her tree: files `f0`..`f7`, and directories `d0`..`d3` each holding a file named like
    // root's; beside it, where the tree does not reach, for each a symlink to root's file, a
    // FIFO, a symlink to root's directory, to swap in.
    let (src, stash) = (t.path.join("src"), t.path.join("stash"));
    fs::create_dir(&src).unwrap();
    fs::create_dir(&stash).unwrap();
    for i in 0..8 {
        fs::write(src.join(format!("f{i}")), b"her file\n").unwrap();
        std::os::unix::fs::symlink(&canary, stash.join(format!("l{i}"))).unwrap();
        assert!(run("mkfifo", &[stash.join(format!("p{i}")).to_str().unwrap()]).status.success());
    }
    for i in 0..4 {
        fs::create_dir(src.join(format!("d{i}"))).unwrap();
        fs::write(src.join(format!("d{i}/canary")), b"her file\n").unwrap();
        std::os::unix::fs::symlink(&victim, stash.join(format!("dl{i}"))).unwrap();
    }
    fs::write(src.join("static"), b"her file\n").unwrap();
    for p in [&src, &stash] {
        assert!(run("chown", &["-R", &format!("{0}:{0}", user.name), p.to_str().unwrap()]).status.success());
    }
    let (cipher, _, pass) = new_vault(&t.path.join("v"));
    let (c, p, s) = (cipher.to_str().unwrap(), pass.to_str().unwrap(), src.to_str().unwrap());

    // She exchanges each of her files with its symlink to root's file and back, then with
    // its FIFO and back, and each of her directories with its symlink to root's directory
    // and back, each an atomic renameat2(RENAME_EXCHANGE), in a tight loop (perl: a shell's
    // forks would swap a thousand times slower).
    let secs = 15;
    let swapper = r#"exec perl -e '
        chdir "@SRC@" or die; my ($end, $n) = (time + @SECS@, 0);
        my @f = map { ["f$_", "@ST@/l$_", "@ST@/p$_"] } 0..7;
        my @d = map { ["d$_", "@ST@/dl$_"] } 0..3;
        sub x { syscall(@NR@, -100, $_[0], -100, $_[1], 2) == 0 and $n++ }
        while (time < $end) {
          for my $k (0..3) {
            x($_->[0], $_->[1]) for @f; x($_->[0], $_->[1]) for @d;
            x($_->[0], $_->[1]) for @f; x($_->[0], $_->[1]) for @d;
            x($_->[0], $_->[2]) for @f; x($_->[0], $_->[2]) for @f;
          }
        }
        print "swapped $n\n"'"#
        .replace("@SRC@", s)
        .replace("@SECS@", &secs.to_string())
        .replace("@ST@", stash.to_str().unwrap())
        .replace("@NR@", &renameat2.to_string());
    // Root backs her tree up again and again, each run into a new directory of the vault
    // (so every file is read anew), every other run also merging into one directory with
    // --overwrite. A FIFO must never hang the import.
    let (_, runs) = race(&user, &swapper, secs, |run| {
        let to = format!("{c}/backup{run}");
        let mut args = vec!["import", s, &to, "--passfile", p];
        veilfs_within(10, &args);
        if run % 2 == 1 {
            args[2] = c;
            args.push("--overwrite");
            veilfs_within(10, &args);
        }
    });
    // What the vault holds, exported: root's file's content is nowhere in it.
    let out = t.path.join("out");
    let o = veilfs_within(60, &["export", c, out.to_str().unwrap(), "--passfile", p]);
    assert!(o.status.success(), "export: {}", text(&o));
    assert!(out.join(format!("backup{}/static", runs - 1)).is_file(), "the imports ran");
    assert!(!tree_holds(&out, b"ROOT-ONLY CANARY"), "the vault holds the content of root's file");
}

/// Attack: forge a sync tool's conflict copy to inject a name or content. A copy is shown only
/// if its original entry's binding verifies for the object that is there, and a file's
/// content must carry the identity that binding promises: a copy named with one entry's `D`
/// and another's binding is not shown (an integrity error: exit code 6 offline), and a copy
/// whose name verifies but that holds another file's bytes reads as EIO (exit code 6), never
/// as that content. (docs/SECURITY.md, "Conflict copies".)
#[test]
fn a_forged_conflict_copy_injects_neither_a_name_nor_content() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    fs::write(m.m("a.txt"), "content of a").unwrap();
    fs::write(m.m("b.txt"), "content of b, which the attacker wants shown as a's").unwrap();
    m.umount();
    let mut files = user_entries(&m.cipher);
    files.sort_by_key(|p| fs::metadata(p).unwrap().len());
    let (a, b) = (files[0].clone(), files[1].clone());
    let split = |p: &Path| {
        let n = p.file_name().unwrap().to_str().unwrap().to_string();
        let dot = n.rfind('.').unwrap();
        (n[..dot].to_string(), n[dot + 1..].to_string())
    };
    let ((_, sa), (db, _)) = (split(&a), split(&b));
    let (v, pf) = (m.cipher.to_str().unwrap().to_string(), m.passfile.to_str().unwrap().to_string());
    let names = |m: &Mounted| {
        let mut n: Vec<String> =
            fs::read_dir(&m.mnt).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    };

    // b's name with a's binding (and a's bytes): the binding is for another name. Also with
    // OneDrive's `-HOST`, which makes another well-formed key: b's `D` decrypts once the part
    // is taken out, but a's binding does not verify for it, so the name stays an entry that
    // does not decrypt. And as a copy of a copy: every part taken out, the same check.
    for forged in [
        format!("{db}.{SYNCTHING_PART}.{sa}"),
        format!("{db}-LAPTOP.{sa}"),
        format!("{db}.{SYNCTHING_PART}.{SYNCTHING_PART_2}.{sa}"),
        format!("{db} (1) (2).{sa}"),
    ] {
        let forged = m.cipher.join(forged);
        fs::copy(&a, &forged).unwrap();
        m.mount();
        assert_eq!(names(&m), ["a.txt", "b.txt"]);
        assert_eq!(fs::read_to_string(m.m("b.txt")).unwrap(), "content of b, which the attacker wants shown as a's");
        m.umount();
        let forged_name = forged.file_name().unwrap().to_str().unwrap();
        for args in [vec!["ls", &v], vec!["export", &v, "/nonexistent-never-written"], vec!["conflicts", &v]] {
            let o = run(&BIN, &[&args[..], &["--passfile", &pf]].concat());
            if args[0] == "conflicts" {
                assert!(!text(&o).contains("/b ("), "not listed as a copy: {}", text(&o));
                continue;
            }
            assert_eq!(o.status.code(), Some(6), "{args:?}: {}", text(&o));
            assert!(text(&o).contains(forged_name), "{args:?} names the forged copy: {}", text(&o));
        }
        fs::remove_file(&forged).unwrap();
    }

    // a's name and binding, b's bytes: shown under a's copy name, but never readable; as a
    // copy of a copy too.
    let swapped = syncthing_copy_name(&a);
    fs::copy(&b, &swapped).unwrap();
    let copy_name = format!("a ({SYNCTHING_PART}).txt");
    let nested = copy_name_with(&a, " (1) (2)");
    fs::copy(&b, &nested).unwrap();
    let nested_name = "a (1, 2).txt";
    m.mount();
    assert_eq!(names(&m), [nested_name, copy_name.as_str(), "a.txt", "b.txt"]);
    for name in [copy_name.as_str(), nested_name] {
        assert_eq!(fs::read(m.m(name)).map_err(|e| e.raw_os_error()), Err(Some(libc::EIO)), "{name}");
    }
    assert_eq!(fs::read_to_string(m.m("a.txt")).unwrap(), "content of a");
    m.umount();
    for name in [copy_name.as_str(), nested_name] {
        let o = run(&BIN, &["cat", &format!("{v}/{name}"), "--passfile", &pf]);
        assert_eq!(o.status.code(), Some(6), "cat: {}", text(&o));
        assert!(o.stdout.is_empty(), "no content of b: {:?}", String::from_utf8_lossy(&o.stdout));
    }
}
