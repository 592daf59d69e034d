//! POSIX behaviour the standard suites check, each compared with a kernel filesystem: the
//! same operations run on the mount and on a tmpfs (the `plain` directory beside the vault,
//! or a tmpfs mounted with the same option), and both must answer alike (issue 12).

mod common;
use common::*;
use std::fs;
use std::os::unix::fs::{DirEntryExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// Every entry of `dir` whose inode number from readdir (`d_ino`) is not its `st_ino`, and
/// how many entries there were. The whole listing is read before the first `stat` (a lookup
/// between two READDIR requests makes the kernel ask the next one with attributes).
fn dino_mismatches(dir: &Path) -> (usize, Vec<String>) {
    let listed: Vec<(std::path::PathBuf, u64)> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap()).map(|e| (e.path(), e.ino())).collect();
    let bad: Vec<String> = listed
        .iter()
        .filter_map(|(p, d_ino)| {
            let st_ino = fs::symlink_metadata(p).unwrap().ino();
            (*d_ino != st_ino).then(|| format!("{:?}: d_ino {d_ino} st_ino {st_ino}", p.file_name().unwrap()))
        })
        .collect();
    (listed.len(), bad)
}

/// A directory of `n` entries with long names (so a listing takes several READDIR requests,
/// and the kernel asks for the later ones without attributes): files, directories, symlinks
/// and hard links.
fn populate(dir: &Path, n: usize) {
    fs::create_dir(dir).unwrap();
    for i in 0..n {
        let p = dir.join(format!("{i:04}-{}", "x".repeat(120)));
        match i % 4 {
            0 | 1 => fs::write(&p, b"x").unwrap(),
            2 => fs::create_dir(&p).unwrap(),
            _ => std::os::unix::fs::symlink("target", &p).unwrap(),
        }
    }
    fs::hard_link(dir.join(format!("0000-{}", "x".repeat(120))), dir.join("hardlink")).unwrap();
}

/// READDIR (without attributes) gives every entry its real inode number, the one `stat`
/// gives: on a fresh mount (the kernel asks READDIRPLUS only for the first part of a large
/// listing), again from the kernel's cached listing, and after the entries were looked up.
#[test]
fn readdir_inode_numbers_are_the_stat_inode_numbers() {
    let Some(mut m) = Mounted::new("64m", &[]) else { return };
    populate(&m.m("d"), 400);
    populate(&m.plain.join("d"), 400);
    m.remount();
    for (what, dir) in [("tmpfs", m.plain.join("d")), ("fresh mount", m.m("d")), ("cached listing", m.m("d"))] {
        let (n, bad) = dino_mismatches(&dir);
        assert_eq!(n, 401, "{what}");
        assert!(
            bad.is_empty(),
            "{what}: {} of {n} entries with another d_ino: {:?}",
            bad.len(),
            &bad[..bad.len().min(3)]
        );
    }
    // A listing the kernel asks for without attributes from the start: its entries are
    // known already (looked up just now).
    m.remount();
    let names: Vec<_> = fs::read_dir(m.m("d")).unwrap().map(|e| e.unwrap().path()).collect();
    let inos: Vec<u64> = names.iter().map(|p| fs::symlink_metadata(p).unwrap().ino()).collect();
    let again: Vec<u64> = names.iter().map(|p| fs::symlink_metadata(p).unwrap().ino()).collect();
    assert_eq!(inos, again, "inode numbers stay");
    let (_, bad) = dino_mismatches(&m.m("d"));
    assert!(bad.is_empty(), "after lookups: {} entries with another d_ino: {:?}", bad.len(), &bad[..bad.len().min(3)]);
}
