//! One verdict per tampering, whichever front end meets it: each attack of the tamper
//! catalogue (crates/veilfs-core/tests/tamper.rs) plus hard-link substitution, a forged
//! duplicate entry, a directory IV copied from another directory and special files changed
//! behind their entries (a FIFO made a socket, a device given another number, two devices
//! swapped) is applied to a copy of one vault, and the mount, `veilfs cat` (`ls -l` for
//! symlinks and special files), `veilfs export` and `veilfs fsck` must agree. The overflow
//! pieces of long symlink targets and xattr values (feature `overflow`) are swapped, removed
//! and cut short too; `veilfs cat` does not read attributes, so it reads such a file whole.
//! The catalogue runs on a vault of v1 files (`init --no-block-map`) and on a new vault, whose
//! files carry a block map (docs/FORMAT.md §5.10); on the latter, a file's own older block,
//! older header and older final block put back are judged too. Deletions by someone who is
//! not a client and an entry put back after a client deleted it are judged for a client that
//! remembers the directories (docs/FORMAT.md §18, §19).

mod common;
use common::*;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use veilfs_core::content::blockmap::MapLayout;

/// What reading the probed object through the mount must give.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mount {
    /// EIO (an integrity error), or ENOENT where the attack removed the name itself.
    Fails(i32),
    /// The original content: the attack must not hide it.
    Reads,
}

struct Case {
    name: &'static str,
    /// The plaintext path probed by the mount and by `veilfs cat` (or `ls -l` for symlinks).
    probe: &'static str,
    mount: Mount,
    /// Exit code of `veilfs cat` (`ls -l` for a symlink probe).
    cat: i32,
    tamper: fn(&Objects),
    /// Only for files with a block map: in a vault of v1 files this tampering is not detected
    /// (docs/SECURITY.md §4).
    map_only: bool,
}

/// Ciphertext paths of the objects of the vault.
struct Objects {
    cipher: PathBuf,
    a: PathBuf,
    b: PathBuf,
    d1: PathBuf,
    d2: PathBuf,
    x: PathBuf,
    s1: PathBuf,
    s2: PathBuf,
    /// Two symlinks whose 4000-byte targets live in side files (feature `overflow`).
    sl1: PathBuf,
    sl2: PathBuf,
    /// A file with two 65536-byte attributes, `user.a` and `user.b`, each with a continuation.
    xf: PathBuf,
    /// A FIFO and two character devices (1:3 and 1:5).
    fifo: PathBuf,
    null: PathBuf,
    zero: PathBuf,
    /// A file grown in a second write session, and its header as it stood during that session
    /// (UNSETTLED: what a sync peer saw then).
    g: PathBuf,
    g_unsettled_header: Vec<u8>,
    /// Whether files carry a block map (header v2, map blocks between the blocks).
    map: bool,
    /// `a`'s ciphertext before a second write session overwrote part of blocks 1 and 2.
    a_before: Vec<u8>,
}

impl Objects {
    fn header_len(&self) -> usize {
        if self.map {
            veilfs_core::content::blockmap::HEADER_V2_LEN
        } else {
            36
        }
    }

    /// Where block `n` starts in a file.
    fn block_start(&self, n: u64) -> usize {
        (if self.map { MapLayout::new(4096, 28).block_offset(n) } else { 36 + n * BLOCK }) as usize
    }

    /// The full block `n` of ciphertext `c`.
    fn block(&self, c: &[u8], n: u64) -> Vec<u8> {
        c[self.block_start(n)..self.block_start(n) + BLOCK as usize].to_vec()
    }

    fn put_block(&self, c: &mut [u8], n: u64, b: &[u8]) {
        let s = self.block_start(n);
        c[s..s + b.len()].copy_from_slice(b);
    }
}

/// Special files of the vault: probed by `lstat` through the mount and `veilfs ls -l`.
const SPECIALS: [&str; 3] = ["fifo", "null", "zero"];

const BLOCK: u64 = 4096 + 28;

fn patch(p: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut c = fs::read(p).unwrap();
    f(&mut c);
    fs::write(p, c).unwrap();
}

fn swap_files(p: &Path, q: &Path) {
    let (a, b) = (fs::read(p).unwrap(), fs::read(q).unwrap());
    fs::write(p, b).unwrap();
    fs::write(q, a).unwrap();
}

/// The target side file of the long symlink `link` (its backing target is `b64(ID)`).
fn target_file(link: &Path) -> PathBuf {
    link.with_file_name(format!("veilfs.T.{}", fs::read_link(link).unwrap().display()))
}

/// The backing continuations of `p`, by name.
fn continuations(p: &Path) -> Vec<String> {
    xattr_list(p).unwrap().into_iter().filter(|n| n.starts_with("user.veilfs.+")).collect()
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "an older copy of a block put back (block rollback)",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: true,
            tamper: |o| {
                let old = o.block(&o.a_before, 1);
                patch(&o.a, |c| o.put_block(c, 1, &old))
            },
        },
        Case {
            name: "the older header with the newer body",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: true,
            tamper: |o| patch(&o.a, |c| c[..o.header_len()].copy_from_slice(&o.a_before[..o.header_len()])),
        },
        Case {
            name: "the newer header with an older final block",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: true,
            tamper: |o| {
                let s = o.block_start(2);
                patch(&o.a, |c| c[s..].copy_from_slice(&o.a_before[s..]))
            },
        },
        Case {
            name: "a header copied during a write session put back, the file cut at a block boundary",
            probe: "g",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                patch(&o.g, |c| {
                    c[..o.header_len()].copy_from_slice(&o.g_unsettled_header);
                    c.truncate(o.block_start(1) + BLOCK as usize);
                })
            },
        },
        Case {
            name: "bit flip in a block",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| patch(&o.a, |c| c[5000] ^= 1),
        },
        Case {
            name: "blocks swapped within a file",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                patch(&o.a, |c| {
                    let (b0, b1) = (o.block(c, 0), o.block(c, 1));
                    o.put_block(c, 0, &b1);
                    o.put_block(c, 1, &b0);
                })
            },
        },
        Case {
            name: "block copied from another file",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                let other = o.block(&fs::read(&o.b).unwrap(), 1);
                patch(&o.a, |c| o.put_block(c, 1, &other))
            },
        },
        Case {
            name: "headers swapped between files",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                let hb = fs::read(&o.b).unwrap()[..o.header_len()].to_vec();
                patch(&o.a, |c| c[..o.header_len()].copy_from_slice(&hb))
            },
        },
        Case {
            name: "contents swapped between files",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| swap_files(&o.a, &o.b),
        },
        Case {
            name: "truncated file",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                let f = fs::OpenOptions::new().write(true).open(&o.a).unwrap();
                f.set_len(o.block_start(1) as u64 + 100).unwrap();
            },
        },
        Case {
            name: "entry moved to another directory",
            probe: "d1/x",
            mount: Mount::Fails(libc::ENOENT),
            cat: 4,
            map_only: false,
            tamper: |o| fs::rename(&o.x, o.d2.join(o.x.file_name().unwrap())).unwrap(),
        },
        Case {
            name: "directory IV copied from another directory",
            probe: "d2/y",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                // The IV name (F§7.1) of d1 in place of d2's own.
                let iv_of = |d: &Path| {
                    fs::read_dir(d)
                        .unwrap()
                        .flatten()
                        .find(|e| e.file_name().to_string_lossy().starts_with("veilfs.diriv"))
                        .unwrap()
                };
                fs::remove_file(iv_of(&o.d2).path()).unwrap();
                let from = iv_of(&o.d1);
                fs::copy(from.path(), o.d2.join(from.file_name())).unwrap();
            },
        },
        Case {
            name: "symlink targets swapped",
            probe: "s1",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                let (t1, t2) = (fs::read_link(&o.s1).unwrap(), fs::read_link(&o.s2).unwrap());
                fs::remove_file(&o.s1).unwrap();
                fs::remove_file(&o.s2).unwrap();
                std::os::unix::fs::symlink(t2, &o.s1).unwrap();
                std::os::unix::fs::symlink(t1, &o.s2).unwrap();
            },
        },
        Case {
            name: "long symlink target file swapped between two links",
            probe: "sl1",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| swap_files(&target_file(&o.sl1), &target_file(&o.sl2)),
        },
        Case {
            name: "long symlink target file removed",
            probe: "sl1",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| fs::remove_file(target_file(&o.sl1)).unwrap(),
        },
        Case {
            name: "long symlink target file truncated",
            probe: "sl1",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| patch(&target_file(&o.sl1), |c| c.truncate(c.len() - 1)),
        },
        // `veilfs cat` reads contents only: it exits 0 on these (the file's data is intact).
        Case {
            name: "xattr continuation swapped between two attributes",
            probe: "xf",
            mount: Mount::Fails(libc::EIO),
            cat: 0,
            map_only: false,
            tamper: |o| {
                let more = continuations(&o.xf);
                let (a, b) = (xattr_get(&o.xf, &more[0]).unwrap(), xattr_get(&o.xf, &more[1]).unwrap());
                xattr_set(&o.xf, &more[0], &b).unwrap();
                xattr_set(&o.xf, &more[1], &a).unwrap();
            },
        },
        Case {
            name: "xattr continuation removed",
            probe: "xf",
            mount: Mount::Fails(libc::EIO),
            cat: 0,
            map_only: false,
            tamper: |o| continuations(&o.xf).iter().for_each(|n| xattr_remove(&o.xf, n).unwrap()),
        },
        Case {
            name: "xattr continuation truncated",
            probe: "xf",
            mount: Mount::Fails(libc::EIO),
            cat: 0,
            map_only: false,
            tamper: |o| {
                for n in continuations(&o.xf) {
                    let v = xattr_get(&o.xf, &n).unwrap();
                    xattr_set(&o.xf, &n, &v[..v.len() - 1]).unwrap();
                }
            },
        },
        Case {
            name: "file replaced by a directory",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                fs::remove_file(&o.a).unwrap();
                fs::create_dir(&o.a).unwrap();
            },
        },
        Case {
            name: "hard link to another file under a file's name",
            probe: "a",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                fs::remove_file(&o.a).unwrap();
                fs::hard_link(&o.b, &o.a).unwrap();
            },
        },
        Case {
            name: "forged duplicate entry, newer than the real one",
            probe: "a",
            mount: Mount::Reads,
            cat: 0,
            map_only: false,
            tamper: |o| {
                let name = o.a.file_name().unwrap().to_str().unwrap();
                let key = name.rsplit_once('.').unwrap().0;
                let forged = o.cipher.join(format!("{key}.{}", "A".repeat(43)));
                std::thread::sleep(std::time::Duration::from_millis(20));
                fs::copy(&o.b, forged).unwrap();
            },
        },
        Case {
            name: "FIFO swapped to socket",
            probe: "fifo",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                fs::remove_file(&o.fifo).unwrap();
                drop(std::os::unix::net::UnixListener::bind(&o.fifo).unwrap());
            },
        },
        Case {
            name: "device number changed",
            probe: "null",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                // /dev/null (1:3) becomes the first disk (8:0), same type and name.
                fs::remove_file(&o.null).unwrap();
                assert!(run("mknod", &[o.null.to_str().unwrap(), "c", "8", "0"]).status.success());
            },
        },
        Case {
            name: "two specials swapped",
            probe: "null",
            mount: Mount::Fails(libc::EIO),
            cat: 6,
            map_only: false,
            tamper: |o| {
                let tmp = o.cipher.join("swap");
                fs::rename(&o.null, &tmp).unwrap();
                fs::rename(&o.zero, &o.null).unwrap();
                fs::rename(&tmp, &o.zero).unwrap();
            },
        },
    ]
}

fn encrypt_path(m: &Mounted, plain: &str) -> PathBuf {
    let o = run(&BIN, &["encrypt-path", m.cipher.to_str().unwrap(), plain, "--passfile", m.passfile.to_str().unwrap()]);
    assert!(o.status.success(), "encrypt-path {plain}: {}", text(&o));
    m.cipher.join(String::from_utf8_lossy(&o.stdout).trim())
}

#[test]
fn every_tampering_gets_the_same_verdict_from_the_mount_cat_export_and_fsck() {
    verdicts(false);
}

#[test]
fn every_tampering_and_rollback_inside_a_file_gets_the_same_verdict_in_a_vault_with_block_maps() {
    verdicts(true);
}

fn verdicts(map: bool) {
    let Some(mut m) = Mounted::new("128m", &[]) else { return };
    if !map {
        m.umount();
        without_feature(&m.cipher, &m.passfile, veilfs_core::config::FEATURE_BLOCK_MAP);
        m.mount();
    }
    let (mut a, b) = ((0..10_000u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>(), vec![b'b'; 10_000]);
    fs::write(m.m("a"), &a).unwrap();
    fs::write(m.m("b"), &b).unwrap();
    fs::create_dir(m.m("d1")).unwrap();
    fs::create_dir(m.m("d2")).unwrap();
    fs::write(m.m("d1/x"), b"x").unwrap();
    fs::write(m.m("d2/y"), b"y").unwrap();
    std::os::unix::fs::symlink("target-one", m.m("s1")).unwrap();
    std::os::unix::fs::symlink("target-two", m.m("s2")).unwrap();
    std::os::unix::fs::symlink("1".repeat(4000), m.m("sl1")).unwrap();
    std::os::unix::fs::symlink("2".repeat(4000), m.m("sl2")).unwrap();
    fs::write(m.m("xf"), b"x").unwrap();
    xattr_set(&m.m("xf"), "user.a", &[b'a'; 65536]).unwrap();
    xattr_set(&m.m("xf"), "user.b", &[b'b'; 65536]).unwrap();
    for args in [vec!["fifo", "p"], vec!["null", "c", "1", "3"], vec!["zero", "c", "1", "5"]] {
        let path = m.m(args[0]);
        let o = run("mknod", &[&[path.to_str().unwrap()], &args[1..]].concat());
        assert!(o.status.success(), "mknod {args:?} through the mount: {}", text(&o));
    }
    fs::write(m.m("g"), vec![b'g'; 12_288]).unwrap();
    let null = fs::symlink_metadata(m.m("null")).unwrap();
    assert!(null.file_type().is_char_device() && null.rdev() == libc::makedev(1, 3), "{null:?}");
    assert!(fs::symlink_metadata(m.m("fifo")).unwrap().file_type().is_fifo());
    m.umount();
    let o = Objects {
        cipher: m.cipher.clone(),
        a: encrypt_path(&m, "a"),
        b: encrypt_path(&m, "b"),
        d1: encrypt_path(&m, "d1"),
        d2: encrypt_path(&m, "d2"),
        x: encrypt_path(&m, "d1/x"),
        s1: encrypt_path(&m, "s1"),
        s2: encrypt_path(&m, "s2"),
        sl1: encrypt_path(&m, "sl1"),
        sl2: encrypt_path(&m, "sl2"),
        xf: encrypt_path(&m, "xf"),
        fifo: encrypt_path(&m, "fifo"),
        null: encrypt_path(&m, "null"),
        zero: encrypt_path(&m, "zero"),
        g: encrypt_path(&m, "g"),
        g_unsettled_header: Vec::new(),
        map,
        a_before: Vec::new(),
    };
    // A second write session grows g; its header is copied while the session is open. (No
    // write-back cache, so the write reaches the daemon at once.)
    m.extra = vec!["--no-writeback".into()];
    m.mount();
    let mut o = o;
    {
        use std::io::Write;
        let mut f = fs::OpenOptions::new().append(true).open(m.m("g")).unwrap();
        f.write_all(&[b'h'; 10_000]).unwrap();
        o.g_unsettled_header = fs::read(&o.g).unwrap()[..o.header_len()].to_vec();
    }
    // A second write session changes a in its blocks 1 and 2 (the final one): its older
    // ciphertext is what a sync peer kept and can put back.
    o.a_before = fs::read(&o.a).unwrap();
    assert_eq!(o.a_before[..2], [0, if map { 2 } else { 1 }], "a carries header v{}", if map { 2 } else { 1 });
    {
        let f = fs::OpenOptions::new().write(true).open(m.m("a")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"newer", 5000).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"newer", 9000).unwrap();
        a[5000..5005].copy_from_slice(b"newer");
        a[9000..9005].copy_from_slice(b"newer");
    }
    m.umount();
    m.extra.clear();
    assert_eq!(o.g_unsettled_header[3] & 2, 2, "the growing session set UNSETTLED");
    assert_eq!(fs::read(&o.g).unwrap()[3] & 2, 0, "the last close settled g");
    // Untouched, every front end accepts them: the verdicts below are about the tampering.
    let (c, pf) = (m.cipher.to_str().unwrap(), m.passfile.to_str().unwrap());
    for p in SPECIALS {
        let ls = run(&BIN, &["ls", "-l", &format!("{c}/{p}"), "--passfile", pf]);
        assert!(ls.status.success(), "ls -l {p}: {}", text(&ls));
    }
    let fsck = run(&BIN, &["fsck", c, "--passfile", pf]);
    assert!(fsck.status.success(), "fsck of the untouched vault: {}", text(&fsck));
    let pristine = m.tmpfs.path.join("pristine");
    assert!(run("cp", &["-a", m.cipher.to_str().unwrap(), pristine.to_str().unwrap()]).status.success());
    let (cipher, pass) = (m.cipher.to_str().unwrap().to_string(), m.passfile.to_str().unwrap().to_string());
    let out = m.tmpfs.path.join("out");
    let mut verdicts = Vec::new();
    for case in cases().into_iter().filter(|c| map || !c.map_only) {
        fs::remove_dir_all(&m.cipher).unwrap();
        assert!(run("cp", &["-a", pristine.to_str().unwrap(), &cipher]).status.success());
        (case.tamper)(&o);
        let _ = fs::remove_dir_all(&out);
        let target = format!("{cipher}/{}", case.probe);
        let special = SPECIALS.contains(&case.probe);
        let cat_args: Vec<&str> = if case.probe.starts_with('s') {
            vec!["ls", "-l", &cipher, "--passfile", &pass]
        } else if special {
            vec!["ls", "-l", &target, "--passfile", &pass]
        } else {
            vec!["cat", &target, "--passfile", &pass]
        };
        let cat = run(&BIN, &cat_args);
        let export = run(&BIN, &["export", &cipher, out.to_str().unwrap(), "--passfile", &pass]);
        let fsck = run(&BIN, &["fsck", &cipher, "--json", "--passfile", &pass]);
        m.mount();
        let probe = m.m(case.probe);
        let mounted = if case.probe.starts_with('s') {
            fs::read_link(&probe).map(|_| Vec::new())
        } else if case.probe == "xf" {
            xattr_get(&probe, "user.a").and_then(|_| xattr_get(&probe, "user.b")).map(|_| a.clone())
        } else if special {
            fs::symlink_metadata(&probe).map(|_| Vec::new())
        } else {
            fs::read(&probe)
        };
        m.umount();
        let got_mount = match &mounted {
            Ok(data) => {
                assert_eq!(data, &a, "{}: the mount read the real a", case.name);
                Mount::Reads
            }
            Err(e) => Mount::Fails(e.raw_os_error().unwrap_or(-1)),
        };
        if case.mount == Mount::Reads {
            assert_eq!(cat.stdout, a, "{}: cat printed the real a", case.name);
        }
        let report: serde_json::Value = serde_json::from_slice(&fsck.stdout)
            .unwrap_or_else(|e| panic!("{}: fsck --json: {e}: {}", case.name, text(&fsck)));
        verdicts.push(format!(
            "{}: mount {:?} (want {:?}), cat {:?} (want {}), export {:?}, fsck {:?} with {} problem(s)",
            case.name,
            got_mount,
            case.mount,
            cat.status.code(),
            case.cat,
            export.status.code(),
            fsck.status.code(),
            report["problems"].as_array().map_or(0, |p| p.len())
        ));
        let ok = got_mount == case.mount
            && cat.status.code() == Some(case.cat)
            && export.status.code() == Some(6)
            && fsck.status.code() == Some(6)
            && report["clean"] == false;
        assert!(
            ok,
            "{}\ncat: {}\nexport: {}\nfsck: {}",
            verdicts.last().unwrap(),
            text(&cat),
            text(&export),
            text(&fsck)
        );
    }
    eprintln!("{}", verdicts.join("\n"));
}

/// Attacks on what exists, judged by a client that listed every directory before (its state
/// under a temporary `VEILFS_STATE_DIR`, shared by the mount and the commands as on one
/// machine): a file deleted by someone who is not a client, a subtree deleted so, and an
/// entry put back after the client deleted it. A deletion is a finding on its directory:
/// the mount lists what is there and logs one line naming the directory, `ls` of it, `export`
/// and `fsck` exit 6. The resurrected entry is refused: EIO through the mount with one log line
/// naming its ciphertext file, `cat`, `export` and `fsck` exit 6. The client's own deletion
/// beforehand is no finding.
#[test]
fn deletions_and_a_resurrected_entry_get_the_same_verdict_from_the_mount_ls_cat_export_and_fsck() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    m.umount();
    let state = m.tmpfs.path.join("state");
    m.env.push(("VEILFS_STATE_DIR".into(), state.display().to_string()));
    m.mount();
    fs::create_dir_all(m.m("d1")).unwrap();
    fs::create_dir_all(m.m("d2/deep")).unwrap();
    for f in ["f", "r", "keep", "d1/x", "d2/y", "d2/deep/z"] {
        fs::write(m.m(f), f).unwrap();
    }
    m.umount();
    let (f, r, d2) = (encrypt_path(&m, "f"), encrypt_path(&m, "r"), encrypt_path(&m, "d2"));
    let saved_r = fs::read(&r).unwrap();
    // The client lists every directory (and remembers their entries), then deletes r.
    m.mount();
    for d in ["", "d1", "d2", "d2/deep"] {
        assert!(fs::read_dir(m.m(d)).unwrap().count() > 0);
    }
    fs::remove_file(m.m("r")).unwrap();
    m.umount();
    let (cipher, pass) = (m.cipher.to_str().unwrap().to_string(), m.passfile.to_str().unwrap().to_string());
    let cli = |args: &[&str]| {
        std::process::Command::new(&BIN)
            .args(args)
            .env("VEILFS_STATE_DIR", &state)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let o = cli(&["fsck", &cipher, "--passfile", &pass]);
    assert!(o.status.success(), "the client's own deletion is no finding: {}", text(&o));
    let pristine = m.tmpfs.path.join("pristine");
    let pristine_state = m.tmpfs.path.join("pristine-state");
    for (from, to) in [(&m.cipher, &pristine), (&state, &pristine_state)] {
        assert!(run("cp", &["-a", from.to_str().unwrap(), to.to_str().unwrap()]).status.success());
    }
    type Tamper<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Tamper)> = vec![
        ("deleted file", Box::new(|| fs::remove_file(&f).unwrap())),
        ("deleted subtree", Box::new(|| fs::remove_dir_all(&d2).unwrap())),
        ("resurrected entry", Box::new(|| fs::write(&r, &saved_r).unwrap())),
    ];
    let out = m.tmpfs.path.join("out");
    let mut verdicts = Vec::new();
    for (name, tamper) in cases {
        for (from, to) in [(&pristine, &m.cipher), (&pristine_state, &state)] {
            fs::remove_dir_all(to).unwrap();
            assert!(run("cp", &["-a", from.to_str().unwrap(), to.to_str().unwrap()]).status.success());
        }
        tamper();
        let resurrected = name == "resurrected entry";
        let probe = if resurrected {
            cli(&["cat", &format!("{cipher}/r"), "--passfile", &pass])
        } else {
            cli(&["ls", &cipher, "--passfile", &pass])
        };
        let _ = fs::remove_dir_all(&out);
        let export = cli(&["export", &cipher, out.to_str().unwrap(), "--passfile", &pass]);
        let fsck = cli(&["fsck", &cipher, "--passfile", &pass]);
        let log = m.tmpfs.path.join(format!("log-{}", name.replace(' ', "-")));
        let child = foreground_mount(&m, &log);
        let guard = UnmountOnDrop(m.mnt.clone());
        let mut names: Vec<String> =
            fs::read_dir(&m.mnt).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        let read_r = fs::read(m.m("r")).map_err(|e| e.raw_os_error());
        drop(guard);
        assert!(child.wait_with_output().unwrap().status.success());
        let logged = fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = logged.lines().filter(|l| l.contains("integrity error")).collect();
        let named = if resurrected {
            r.file_name().unwrap().to_string_lossy().into_owned()
        } else {
            let dir = if name == "deleted file" { &m.cipher } else { d2.parent().unwrap() };
            format!("integrity error in {}:", dir.display())
        };
        verdicts.push(format!(
            "{name}: mount lists {names:?}, reads r {:?}, {} log line(s); {} {:?}, export {:?}, fsck {:?}",
            read_r.as_ref().map(|d| d.len()),
            lines.len(),
            if resurrected { "cat" } else { "ls" },
            probe.status.code(),
            export.status.code(),
            fsck.status.code()
        ));
        let want_names: Vec<&str> = match name {
            "deleted file" => vec!["d1", "d2", "keep"],
            "deleted subtree" => vec!["d1", "f", "keep"],
            _ => vec!["d1", "d2", "f", "keep"],
        };
        let ok = names == want_names
            && read_r.as_ref().err() == Some(&Some(if resurrected { libc::EIO } else { libc::ENOENT }))
            && lines.len() == 1
            && lines[0].contains(&named)
            && probe.status.code() == Some(6)
            && export.status.code() == Some(6)
            && fsck.status.code() == Some(6)
            && text(&fsck).contains(if resurrected { "resurrected" } else { "deleted by a non-client" });
        assert!(
            ok,
            "{}\nlog: {logged}\nprobe: {}\nexport: {}\nfsck: {}",
            verdicts.last().unwrap(),
            text(&probe),
            text(&export),
            text(&fsck)
        );
    }
    eprintln!("{}", verdicts.join("\n"));
}
