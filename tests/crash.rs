//! The crash matrix: the mount daemon (or an offline command) dies at every named
//! crash point of `veilfs_core::crash::POINTS`, and at random moments under load; then the
//! vault is remounted and checked.
//!
//! Needs a build with crash points: `cargo test --release --features failpoints --test crash`
//! (scripts/test.sh runs it). A point "dies" by `abort()`: no destructor, no unmount, as
//! after `SIGKILL`. After each crash the test checks:
//! - the point was reached (the daemon died; else the matrix would test nothing);
//! - every byte fsynced before the crash reads back bit-exact;
//! - the object the interrupted operation worked on reads back old, new, or (data written
//!   after the last fsync) a prefix of new — and every file of the tree reads without an
//!   integrity error, except at the points listed in `KNOWN_TORN` (printed, with the reason);
//! - `veilfs fsck --repair` leaves a vault that `veilfs fsck` finds clean, and every file
//!   outside lost+found reads.
//!
//! It prints the matrix (point, what was checked, result) for docs and the closing note.
#![cfg(feature = "failpoints")]

mod common;

use common::*;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

const LONG: &str = "llllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllll";

/// Points where a crash can still leave a block that does not authenticate, with the
/// reason (the format's own gap, docs/FORMAT.md §15 Q2); fsck --repair salvages them.
const KNOWN_TORN: &[(&str, &str)] = &[];

/// Points only a writer without `"ordered-growth"` passes (a first write's header alone,
/// before its blocks): these run in a vault made before that feature, which keeps the older
/// order and crash rules (docs/FORMAT.md §5.7, §5.8).
const OLD_VAULT_POINTS: &[&str] = &["file.header_alone"];

/// The points of a block-map file's write session that an overwrite in place passes (its
/// start, its log, a torn block, its commit, its map, its settled header at the fsync).
const MAP_OVERWRITE_POINTS: &[&str] = &[
    "map.session_logged",
    "map.session_started",
    "map.blocks_logged",
    "map.torn_block",
    "map.blocks_written",
    "map.committed",
    "map.torn_map",
    "map.map_written",
    "map.settled",
];

/// Points of the block-map writer's write session (docs/FORMAT.md §5.10): these run in a
/// vault with `"block-map"` (every new vault), whose baseline files carry a map; every other
/// point in a vault of v1 files.
fn in_map_vault(point: &str) -> bool {
    point.starts_with("map.")
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn synced() -> Vec<u8> {
    pattern(1, 10_000)
}
fn old() -> Vec<u8> {
    pattern(2, 20_000)
}
fn df() -> Vec<u8> {
    pattern(3, 3_000)
}
fn long() -> Vec<u8> {
    pattern(4, 500)
}
fn added() -> Vec<u8> {
    pattern(5, 50_000)
}

/// The tree every case starts from, written through a clean mount and unmounted.
fn baseline(m: &mut Mounted) {
    let w = |rel: &str, data: &[u8]| {
        let mut f = fs::File::create(m.m(rel)).unwrap();
        f.write_all(data).unwrap();
        f.sync_all().unwrap();
    };
    fs::create_dir(m.m("d")).unwrap();
    fs::create_dir(m.m("e")).unwrap();
    w("synced", &synced());
    w("old", &old());
    w("d/f", &df());
    w(LONG, &long());
    std::os::unix::fs::symlink(long_target('l'), m.m("ls")).unwrap();
    xattr_set(&m.m("old"), "user.big", &big_value(6)).unwrap();
    m.umount();
}

fn get_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    xattr_get(p, name).ok()
}

/// A symlink target too long to be stored inline (feature `overflow`: it lives in a side file).
fn long_target(c: char) -> String {
    c.to_string().repeat(4000)
}

fn big_value(seed: u8) -> Vec<u8> {
    pattern(seed, 65536)
}

/// What the operation interrupted at `point` does (through the mount at `mnt`).
fn operate(point: &str, mnt: &Path) {
    let p = |rel: &str| mnt.join(rel);
    let write_at = |rel: &str, off: u64, data: &[u8], create: bool| -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new().write(true).create(create).truncate(false).open(p(rel))?;
        f.seek(SeekFrom::Start(off))?;
        f.write_all(data)?;
        f.sync_all()
    };
    let _ = match point {
        "file.header_alone" => write_at("h", 100_000, &added()[..5_000], true),
        "file.before_header" => write_at("h", 0, &added()[..5_000], true),
        "file.reseal_alone" | "file.settle_sparse" => write_at("old", 200_000, &added()[..5_000], false),
        "file.torn_write" | "file.after_write" | "file.growth_logged" | "file.grown" | "file.torn_reseal" => {
            write_at("old", 20_000, &added(), false)
        }
        "file.tail_stashed" => write_at("old", 19_000, &added()[..500], false),
        "file.inner_stashed" | "file.torn_inner" => write_at("old", 2_000, &added()[..10_000], false),
        "file.shrink_resealed" => fs::OpenOptions::new().write(true).open(p("old")).and_then(|f| f.set_len(10_001)),
        // A write session of a file with a block map: growth (new blocks out, the old final
        // block not yet re-sealed), or an overwrite in place.
        "map.grown" => write_at("old", 20_000, &added(), false),
        m if MAP_OVERWRITE_POINTS.contains(&m) => write_at("old", 2_000, &added()[..10_000], false),
        "vault.create" => fs::File::create(p("c1")).map(drop),
        "vault.side_file" => fs::File::create(p(&LONG.replace('l', "n"))).map(drop),
        "vault.mkdir_temp" | "vault.mkdir_diriv" => fs::create_dir(p("nd")),
        "vault.rename" => fs::rename(p("old"), p("d/f")),
        "vault.exchange" => {
            let (a, b) = (
                CString::new(p("old").as_os_str().as_bytes()).unwrap(),
                CString::new(p("d/f").as_os_str().as_bytes()).unwrap(),
            );
            // SAFETY: valid C strings; renameat2 with AT_FDCWD and absolute paths.
            let r = unsafe {
                libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE)
            };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
        "vault.link" => fs::hard_link(p("old"), p("old2")),
        "vault.remove_temp" => fs::remove_dir(p("e")),
        "vault.remove_side" => fs::remove_file(p(LONG)),
        "vault.xattr" => xattr_set(&p("old"), "user.x", b"value"),
        "vault.symlink_side" => std::os::unix::fs::symlink(long_target('n'), p("ls2")),
        "vault.carry_side" => fs::rename(p("ls"), p("d/ls")),
        "vault.drop_side" => fs::remove_file(p("ls")),
        "vault.xattr_more" | "vault.xattr_drop_more" => xattr_set(&p("old"), "user.big", &big_value(7)),
        other => panic!("no operation for crash point {other}"),
    };
}

fn read(p: &Path) -> Result<Vec<u8>, String> {
    fs::read(p).map_err(|e| e.to_string())
}

/// Old, new, or a prefix of new at least as long as what was fsynced.
fn old_new_or_prefix(got: &[u8], old: &[u8], new: &[u8]) -> Result<&'static str, String> {
    if got == old {
        Ok("old")
    } else if got == new {
        Ok("new")
    } else if got.len() >= old.len() && new.starts_with(got) {
        Ok("prefix")
    } else {
        Err(format!("neither old ({} B) nor new ({} B) nor a prefix: {} B", old.len(), new.len(), got.len()))
    }
}

/// Checks the object the operation worked on; returns "old"/"new"/"prefix" or what is wrong.
fn verdict(point: &str, mnt: &Path) -> Result<&'static str, String> {
    let p = |rel: &str| mnt.join(rel);
    let absent_or = |rel: &str, want: &[u8]| -> Result<&'static str, String> {
        match fs::symlink_metadata(p(rel)) {
            Err(_) => Ok("old"),
            Ok(_) => (read(&p(rel))? == want).then_some("new").ok_or_else(|| format!("{rel}: unexpected content")),
        }
    };
    match point {
        "file.header_alone" => {
            let mut new = vec![0u8; 100_000];
            new.extend_from_slice(&added()[..5_000]);
            match fs::symlink_metadata(p("h")) {
                Err(_) => Ok("old"),
                Ok(_) => old_new_or_prefix(&read(&p("h"))?, &[], &new),
            }
        }
        "file.reseal_alone" | "file.settle_sparse" => {
            let mut new = old();
            new.resize(200_000, 0);
            new.extend_from_slice(&added()[..5_000]);
            old_new_or_prefix(&read(&p("old"))?, &old(), &new)
        }
        "file.before_header" => match fs::symlink_metadata(p("h")) {
            Err(_) => Ok("old"),
            Ok(_) => old_new_or_prefix(&read(&p("h"))?, &[], &added()[..5_000]),
        },
        "file.torn_write" | "file.after_write" | "file.growth_logged" | "file.grown" | "file.torn_reseal"
        | "map.grown" => {
            let mut new = old();
            new.extend_from_slice(&added());
            old_new_or_prefix(&read(&p("old"))?, &old(), &new)
        }
        "file.tail_stashed" => {
            // A rewrite of the final block that does not grow the file: old or new.
            let mut new = old();
            new[19_000..19_500].copy_from_slice(&added()[..500]);
            let got = read(&p("old"))?;
            match () {
                _ if got == old() => Ok("old"),
                _ if got == new => Ok("new"),
                _ => Err(format!("old: {} B, neither old nor new", got.len())),
            }
        }
        m if m == "file.inner_stashed" || m == "file.torn_inner" || MAP_OVERWRITE_POINTS.contains(&m) => {
            // An overwrite inside the file, not fsynced: each block old or new, as on a
            // kernel filesystem (a torn block reads as written, from its record, FORMAT.md §5.9).
            let mut new = old();
            new[2_000..12_000].copy_from_slice(&added()[..10_000]);
            let got = read(&p("old"))?;
            if got == old() {
                return Ok("old");
            }
            if got == new {
                return Ok("new");
            }
            let each = got.len() == new.len()
                && got.chunks(4096).enumerate().all(|(i, b)| {
                    let r = i * 4096..i * 4096 + b.len();
                    b == &old()[r.clone()] || b == &new[r]
                });
            each.then_some("old/new by block").ok_or_else(|| "a block is neither old nor new".into())
        }
        "file.shrink_resealed" => {
            let got = read(&p("old"))?;
            if got == old() {
                Ok("old")
            } else if got == old()[..10_001] {
                Ok("new")
            } else {
                Err(format!("old: {} B, neither old nor cut", got.len()))
            }
        }
        "vault.create" => absent_or("c1", b""),
        "vault.side_file" => absent_or(&LONG.replace('l', "n"), b""),
        "vault.mkdir_temp" | "vault.mkdir_diriv" => match fs::read_dir(p("nd")) {
            Err(_) => Ok("old"),
            Ok(mut it) => it.next().is_none().then_some("new").ok_or("nd: not empty".into()),
        },
        "vault.rename" => {
            let (o, f) = (read(&p("old")).ok(), read(&p("d/f"))?);
            match (o, f) {
                (Some(o), f) if o == old() && f == df() => Ok("old"),
                (None, f) if f == old() => Ok("new"),
                (o, f) => Err(format!("old: {:?} B, d/f: {} B", o.map(|o| o.len()), f.len())),
            }
        }
        "vault.exchange" => {
            let (o, f) = (read(&p("old"))?, read(&p("d/f"))?);
            if o == old() && f == df() {
                Ok("old")
            } else if o == df() && f == old() {
                Ok("new")
            } else {
                Err(format!("old: {} B, d/f: {} B", o.len(), f.len()))
            }
        }
        "vault.link" => {
            (read(&p("old"))? == old()).then_some(()).ok_or("old changed")?;
            absent_or("old2", &old())
        }
        "vault.remove_temp" => match fs::read_dir(p("e")) {
            Err(_) => Ok("new"),
            Ok(mut it) => it.next().is_none().then_some("old").ok_or("e: not empty".into()),
        },
        "vault.remove_side" => match fs::symlink_metadata(p(LONG)) {
            Err(_) => Ok("new"),
            Ok(_) => (read(&p(LONG))? == long()).then_some("old").ok_or("long: changed".into()),
        },
        "vault.xattr" => match get_xattr(&p("old"), "user.x") {
            None => Ok("old"),
            Some(v) if v == b"value" => Ok("new"),
            Some(_) => Err("user.x: wrong value".into()),
        },
        "vault.symlink_side" => match fs::read_link(p("ls2")) {
            Err(_) => Ok("old"),
            Ok(t) if t.as_os_str() == long_target('n').as_str() => Ok("new"),
            Ok(_) => Err("ls2: wrong target".into()),
        },
        "vault.carry_side" => {
            let target = |rel: &str| fs::read_link(p(rel)).map(|t| t.as_os_str() == long_target('l').as_str());
            match (target("ls"), target("d/ls")) {
                (Ok(true), Err(_)) => Ok("old"),
                (Err(_), Ok(true)) => Ok("new"),
                (a, b) => Err(format!("ls: {a:?}, d/ls: {b:?}")),
            }
        }
        "vault.drop_side" => match fs::read_link(p("ls")) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok("new"),
            Ok(t) if t.as_os_str() == long_target('l').as_str() => Ok("old"),
            other => Err(format!("ls: {other:?}")),
        },
        "vault.xattr_more" | "vault.xattr_drop_more" => match get_xattr(&p("old"), "user.big") {
            Some(v) if v == big_value(6) => Ok("old"),
            Some(v) if v == big_value(7) => Ok("new"),
            other => Err(format!("user.big: {:?} bytes, neither old nor new", other.map(|v| v.len()))),
        },
        other => panic!("no verdict for crash point {other}"),
    }
}

/// Reads every file under `dir` (skipping lost+found when asked); returns the failures.
fn read_all(dir: &Path, skip_lost_found: bool) -> Vec<String> {
    let mut bad = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return vec![format!("{}: cannot list", dir.display())];
    };
    for e in rd {
        let Ok(e) = e else {
            bad.push(format!("{}: readdir failed", dir.display()));
            continue;
        };
        let path = e.path();
        if skip_lost_found && e.file_name() == "lost+found" {
            continue;
        }
        match fs::symlink_metadata(&path) {
            Err(x) => bad.push(format!("{}: {x}", path.display())),
            Ok(md) if md.is_dir() => bad.extend(read_all(&path, false)),
            Ok(md) if md.is_file() => {
                let mut buf = Vec::new();
                if let Err(x) = fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut buf)) {
                    bad.push(format!("{}: {x}", path.display()));
                }
            }
            Ok(_) => {}
        }
    }
    bad
}

fn fsck(m: &Mounted, repair: bool) -> (i32, String) {
    let (c, p) = (m.cipher.to_str().unwrap(), m.passfile.to_str().unwrap());
    let mut args = vec!["fsck", c, "--passfile", p];
    if repair {
        args.push("--repair");
    }
    let o = run(&BIN, &args);
    (o.status.code().unwrap_or(-1), text(&o))
}

fn wait_dead(mnt: &Path) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if daemon_pid(mnt).is_none() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

struct Row {
    point: String,
    verdict: String,
    read_errors: Vec<String>,
    fsck_before: i32,
    repaired_clean: bool,
    after_repair_errors: Vec<String>,
}

/// Runs one case: baseline, crash at `point` (with `action`), checks. Panics on a broken
/// invariant that no known gap explains.
fn crash_case(point: &str, action: &str) -> Option<Row> {
    let mut m = Mounted::new("64m", &[])?;
    if !in_map_vault(point) {
        // The other points are the v1 file writer's (inner-block stash, unsettled tails):
        // they run in a vault made with `init --no-block-map`.
        m.umount();
        without_feature(&m.cipher, &m.passfile, veilfs_core::config::FEATURE_BLOCK_MAP);
        m.mount();
    }
    baseline(&mut m);
    if OLD_VAULT_POINTS.contains(&point) {
        without_feature(&m.cipher, &m.passfile, veilfs_core::config::FEATURE_ORDERED_GROWTH);
    }
    m.env = vec![("FAILPOINTS".into(), format!("{point}={action}"))];
    if point == "config.rewrite" {
        let newpass = m.tmpfs.path.join("newpass");
        common::write_passfile(&newpass, "new password");
        let o = std::process::Command::new(&BIN)
            .args(["passwd", m.cipher.to_str().unwrap(), "--passfile", m.passfile.to_str().unwrap()])
            .args(["--new-passfile", newpass.to_str().unwrap(), "--kdf-memory", "8", "--kdf-iterations", "1"])
            .envs(m.env.iter().cloned())
            .output()
            .unwrap();
        assert!(!o.status.success() && text(&o).contains("crash point"), "passwd did not reach {point}: {}", text(&o));
        m.env.clear();
        // The old password still opens the vault (the new config never replaced the old one).
        m.mount();
        assert_eq!(read(&m.m("synced")).unwrap(), synced());
        m.umount();
        let (code, _) = fsck(&m, false);
        fsck(&m, true);
        let (clean, out) = fsck(&m, false);
        return Some(Row {
            point: point.into(),
            verdict: "old".into(),
            read_errors: vec![],
            fsck_before: code,
            repaired_clean: clean == 0,
            after_repair_errors: vec![out].into_iter().filter(|_| clean != 0).collect(),
        });
    }
    m.mount();
    m.env.clear();
    let mnt = m.mnt.clone();
    operate(point, &mnt);
    assert!(wait_dead(&mnt), "{point}: the daemon did not die, so the point was never reached");
    m.umount();
    let (fsck_before, _) = fsck(&m, false);
    m.mount();
    let got = read(&m.m("synced"));
    assert!(
        got.as_deref() == Ok(&synced()[..]),
        "{point}: fsynced data lost or unreadable: {:?}",
        got.map(|g| g.len())
    );
    let verdict = match verdict(point, &mnt) {
        Ok(v) => v.to_string(),
        Err(e) => format!("BROKEN: {e}"),
    };
    let read_errors = read_all(&mnt, false);
    m.umount();
    let (code, out) = fsck(&m, true);
    let (clean, out2) = fsck(&m, false);
    assert!(clean == 0, "{point}: fsck after --repair (exit {code}: {out}) still finds: {out2}");
    m.mount();
    let mut after_repair_errors = read_all(&mnt, true);
    // What --repair salvaged is old, new or a prefix, like a clean crash (or the object is
    // absent, moved to lost+found whole).
    if let Err(e) = self::verdict(point, &mnt) {
        if !e.contains("No such file") {
            after_repair_errors.push(format!("salvaged object: {e}"));
        }
    }
    if read(&m.m("synced")).as_deref() != Ok(&synced()[..]) {
        after_repair_errors.push("synced changed by --repair".into());
    }
    m.umount();
    Some(Row {
        point: point.into(),
        verdict,
        read_errors,
        fsck_before,
        repaired_clean: clean == 0,
        after_repair_errors,
    })
}

#[test]
fn crash_at_every_point_loses_nothing_fsynced_and_fsck_repairs_the_rest() {
    println!("\n| point | object after remount | files that fail to read | fsck before repair | after --repair |");
    println!("|---|---|---|---|---|");
    let mut broken = Vec::new();
    let mut n = 0;
    // CRASH_POINTS=prefix runs only the points whose name starts with it (e.g. `map.`).
    let only = std::env::var("CRASH_POINTS").unwrap_or_default();
    for point in veilfs_core::crash::POINTS.iter().filter(|p| p.starts_with(&only)) {
        let action = if point.starts_with("file.torn_") || point.starts_with("map.torn_") { "return" } else { "panic" };
        let Some(r) = crash_case(point, action) else { return };
        n += 1;
        println!(
            "| {} | {} | {} | exit {} | {} |",
            r.point,
            r.verdict,
            if r.read_errors.is_empty() { "none".to_string() } else { r.read_errors.join("; ") },
            r.fsck_before,
            if r.repaired_clean && r.after_repair_errors.is_empty() {
                format!("clean, all read{}", if r.read_errors.is_empty() { "" } else { ", salvaged" })
            } else {
                format!("NOT CLEAN: {:?}", r.after_repair_errors)
            },
        );
        let known = KNOWN_TORN.iter().find(|(p, _)| *p == r.point);
        let torn = r.verdict.starts_with("BROKEN") || !r.read_errors.is_empty();
        if torn && known.is_none() {
            broken.push(format!("{}: {} / {:?}", r.point, r.verdict, r.read_errors));
        }
        if !r.after_repair_errors.is_empty() {
            broken.push(format!("{} after repair: {:?}", r.point, r.after_repair_errors));
        }
    }
    println!("{n} points × 1 crash each");
    assert!(broken.is_empty(), "crash consistency broken at:\n{}", broken.join("\n"));
}

/// A torn fill of a hole the same write session made (FORMAT.md §5.9, hole records): a first
/// write far past the end leaves blocks 0..9 holes, a second fills blocks 0..=2 and is torn
/// in block 1. (`--no-writeback`: the kernel's write-back would send the lower pages first.)
/// After the crash the file reads, each block as written or zeros, and fsck --repair is clean.
#[test]
fn torn_fill_of_a_hole_reads_as_zeros_not_an_error() {
    let Some(mut m) = Mounted::new("64m", &["--no-writeback"]) else { return };
    m.umount();
    // Hole records are the v1 file format's (a block-map file's holes are zero leaves, and its
    // torn blocks read from copy records: point map.torn_block).
    without_feature(&m.cipher, &m.passfile, veilfs_core::config::FEATURE_BLOCK_MAP);
    m.env = vec![("FAILPOINTS".into(), "file.torn_inner=return".into())];
    m.mount();
    m.env.clear();
    let (fill, far) = (pattern(11, 12_288), pattern(12, 5_000));
    {
        let mut f = fs::File::create(m.m("h")).unwrap();
        f.seek(SeekFrom::Start(40_000)).unwrap();
        f.write_all(&far).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        let _ = f.write_all(&fill);
    }
    assert!(wait_dead(&m.mnt), "the daemon did not die at file.torn_inner");
    m.umount();
    m.mount();
    let got = read(&m.m("h")).unwrap_or_else(|e| panic!("a torn fill of a hole reads as an error: {e}"));
    let mut new = fill.clone();
    new.resize(40_000, 0);
    new.extend_from_slice(&far);
    assert_eq!(got.len(), new.len());
    for (i, b) in got.chunks(4096).enumerate() {
        let want = &new[i * 4096..i * 4096 + b.len()];
        assert!(b == want || b.iter().all(|&x| x == 0), "block {i} is neither written nor zeros");
    }
    assert!(got[4096..8192].iter().all(|&x| x == 0), "block 1 (torn) reads as the hole it was");
    assert_eq!(&got[..4096], &fill[..4096], "block 0 was written whole before the tear");
    m.umount();
    fsck(&m, true);
    assert_eq!(fsck(&m, false).0, 0, "fsck --repair left problems");
}

/// SIGKILL of the daemon at random moments while a writer appends and fsyncs: every fsynced
/// byte reads back, and what a torn tail leaves `fsck --repair` salvages to a prefix.
#[test]
fn sigkill_under_load_keeps_every_fsynced_byte() {
    sigkill_rounds(false);
}

/// The same in a vault with `"block-map"`: the kill lands anywhere in the write sessions
/// (their logs, blocks, commits, map blocks, headers), and the file always reads — with
/// every fsynced byte — without fsck's salvage (docs/FORMAT.md §5.10).
#[test]
fn sigkill_under_load_of_a_block_map_file_reads_every_fsynced_byte_without_repair() {
    sigkill_rounds(true);
}

fn sigkill_rounds(block_map: bool) {
    let rounds = 4;
    let mut torn = 0;
    for round in 0..rounds {
        let Some(mut m) = Mounted::new("256m", &[]) else { return };
        if !block_map {
            m.umount();
            without_feature(&m.cipher, &m.passfile, veilfs_core::config::FEATURE_BLOCK_MAP);
            m.mount();
        }
        let path = m.m("log");
        let synced_len = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let s2 = synced_len.clone();
        let writer = std::thread::spawn(move || {
            let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(&path) else { return };
            let chunk = pattern(9, 3 * 4096 + 1000);
            let mut written = 0u64;
            for i in 0.. {
                // Each chunk is the pattern's continuation: content = pattern over the file.
                let piece: Vec<u8> = (0..chunk.len()).map(|j| pattern_at(written + j as u64)).collect();
                if f.write_all(&piece).is_err() {
                    return;
                }
                written += piece.len() as u64;
                if i % 4 == 3 {
                    if f.sync_all().is_err() {
                        return;
                    }
                    s2.store(written, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        // The kill must find the file made: on a loaded machine the writer's open can come
        // later than the whole random wait (the file then never existed, nothing was fsynced,
        // and no round was tested).
        let made = Instant::now();
        while !m.m("log").exists() && made.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // A pseudo-random moment between 150 and 650 ms (no rand crate in the tests).
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        std::thread::sleep(Duration::from_millis(150 + (nanos as u64 + round * 97) % 500));
        let pid = daemon_pid(&m.mnt).expect("daemon running");
        // SAFETY: kill(2) of the daemon's pid.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        writer.join().unwrap();
        assert!(wait_dead(&m.mnt));
        m.umount();
        let synced = synced_len.load(std::sync::atomic::Ordering::SeqCst);
        m.mount();
        let first = fs::read(m.m("log"));
        m.umount();
        let got = match first {
            Ok(g) => g,
            Err(_) => {
                torn += 1;
                fsck(&m, true);
                assert_eq!(fsck(&m, false).0, 0, "round {round}: fsck --repair left problems");
                m.mount();
                let g = fs::read(m.m("log")).unwrap_or_else(|e| panic!("round {round}: salvaged file unreadable: {e}"));
                m.umount();
                g
            }
        };
        assert!(got.len() as u64 >= synced, "round {round}: {} bytes back, {synced} were fsynced", got.len());
        let bad = got.iter().enumerate().position(|(i, &b)| b != pattern_at(i as u64));
        assert!(bad.is_none(), "round {round}: byte {} differs ({synced} fsynced, {} read)", bad.unwrap(), got.len());
        println!("round {round}: {synced} B fsynced, {} B read back", got.len());
    }
    println!("{rounds} random kills under load, {torn} left a torn tail that fsck --repair salvaged");
    assert!(!block_map || torn == 0, "a crash of a block-map file needed fsck's salvage");
}

/// Random 4 KiB overwrites of one block-map file from three threads, the daemon killed
/// (SIGKILL) at a random moment: the kernel's write-back sends them from several daemon
/// threads, which put their blocks in place at once, outside the map lock (each one's copy
/// records kept in the log while it is in flight). After a remount the file reads whole
/// without repair, every block as a version written to it and none older than the last
/// fsync saw.
#[test]
fn sigkill_under_random_overwrites_of_a_block_map_file_reads_every_block_without_repair() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
    const BLOCKS: usize = 2048;
    const THREADS: usize = 3;
    // Block `n` at version `v`: (n, v) repeated, so what a block holds says which it is.
    let block = |n: usize, v: u32| -> Vec<u8> {
        let unit = [(n as u32).to_le_bytes(), v.to_le_bytes()].concat();
        unit.repeat(4096 / unit.len())
    };
    for round in 0..3u64 {
        let Some(mut m) = Mounted::new("256m", &[]) else { return };
        let path = m.m("db");
        fs::write(&path, (0..BLOCKS).flat_map(|n| block(n, 0)).collect::<Vec<u8>>()).unwrap();
        let written: std::sync::Arc<Vec<AtomicU32>> =
            std::sync::Arc::new((0..BLOCKS).map(|_| AtomicU32::new(0)).collect());
        let synced: std::sync::Arc<Vec<AtomicU32>> =
            std::sync::Arc::new((0..BLOCKS).map(|_| AtomicU32::new(0)).collect());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (path, written, synced, stop) = (path.clone(), written.clone(), synced.clone(), stop.clone());
                std::thread::spawn(move || {
                    use std::os::unix::fs::FileExt;
                    let Ok(f) = fs::OpenOptions::new().write(true).open(&path) else { return };
                    let mut x = 0x9e3779b97f4a7c15u64 ^ (round << 8 | t as u64);
                    for i in 0u64.. {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Each thread its own blocks (the mount orders overlapping writes).
                        let n = (x as usize % (BLOCKS / THREADS)) * THREADS + t;
                        let v = written[n].load(SeqCst) + 1;
                        if stop.load(SeqCst) || f.write_all_at(&block(n, v), n as u64 * 4096).is_err() {
                            return;
                        }
                        written[n].store(v, SeqCst);
                        if t == 0 && i % 64 == 63 {
                            // What an fsync covers: the writes done before it starts.
                            let seen: Vec<u32> = written.iter().map(|w| w.load(SeqCst)).collect();
                            if f.sync_all().is_err() {
                                return;
                            }
                            for (s, v) in synced.iter().zip(seen) {
                                s.store(v, SeqCst);
                            }
                        }
                    }
                })
            })
            .collect();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        std::thread::sleep(Duration::from_millis(200 + (nanos as u64 + round * 97) % 500));
        let pid = daemon_pid(&m.mnt).expect("daemon running");
        // SAFETY: kill(2) of the daemon's pid.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        stop.store(true, SeqCst);
        for w in writers {
            w.join().unwrap();
        }
        assert!(wait_dead(&m.mnt));
        m.umount();
        m.mount();
        let got = fs::read(m.m("db"));
        m.umount();
        let got = got.unwrap_or_else(|e| panic!("round {round}: the file does not read without repair: {e}"));
        assert_eq!(got.len(), BLOCKS * 4096, "round {round}");
        let mut newer = 0;
        for (n, b) in got.chunks(4096).enumerate() {
            let v = u32::from_le_bytes(b[4..8].try_into().unwrap());
            assert_eq!(b, block(n, v), "round {round}: block {n} is no version written to it");
            let (lo, hi) = (synced[n].load(SeqCst), written[n].load(SeqCst));
            // `hi + 1`: a write the kill cut short may be in place although never acknowledged.
            assert!(lo <= v && v <= hi + 1, "round {round}: block {n} at version {v}, fsynced {lo}, written {hi}");
            newer += usize::from(v > lo);
        }
        println!("round {round}: {newer} blocks newer than the last fsync");
    }
}

fn pattern_at(i: u64) -> u8 {
    (i.wrapping_mul(131) >> 3) as u8 ^ (i as u8)
}
