//! `veilfs ls`: decrypted listing of a vault directory.

use super::UnlockArgs;
use anyhow::Result;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use veilfs_core::EntryKind;

/// Arguments of `veilfs ls`.
#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "The path after CIPHERDIR may be plaintext (docs/2024) or the ciphertext directory itself \
(as `find CIPHERDIR` shows it). Entries whose names fail authentication are listed on stderr with their \
ciphertext names."
)]
pub struct Args {
    /// CIPHERDIR, optionally followed by a directory inside the vault.
    pub dir: PathBuf,
    /// Long format, as `ls -ln` prints it: mode, links, owner and group ids, size (a
    /// symlink's is its plaintext target's length), local modification time.
    #[arg(short, long)]
    pub long: bool,
    /// With -l, sizes in powers of 1024 (1.5K, 234M, 2.0G).
    #[arg(short = 'h', long = "human-readable", requires = "long")]
    pub human: bool,
    /// Print help (-h is --human-readable here, as in ls).
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// Show each entry's ciphertext name too.
    #[arg(short = 'c', long)]
    pub cipher_names: bool,
    /// List subdirectories recursively, as `ls -R` does: each directory under a
    /// `PATH:` line, a blank line between them.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
}

/// `ls -l`'s mode string: type character, then rwx triplets with set-id and sticky bits.
pub fn mode_string(mode: u32) -> String {
    let ty = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(ty);
    for (shift, special, set, unset) in
        [(6, libc::S_ISUID, 's', 'S'), (3, libc::S_ISGID, 's', 'S'), (0, libc::S_ISVTX, 't', 'T')]
    {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, mode & special != 0) {
            (true, true) => set,
            (false, true) => unset,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// A modification time as `ls -l` shows it in the local time zone: "Nov 23 10:44" within
/// six months of now, "Nov 23  2025" otherwise.
pub fn ls_time(secs: i64, tz: &jiff::tz::TimeZone, now: i64) -> String {
    let Ok(ts) = jiff::Timestamp::from_second(secs) else { return secs.to_string() };
    let recent = (now - secs).abs() < 183 * 24 * 3600;
    ts.to_zoned(tz.clone()).strftime(if recent { "%b %e %H:%M" } else { "%b %e  %Y" }).to_string()
}

/// Runs `veilfs ls`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.dir)?;
    let vault = a.unlock.open(&t.cipherdir)?;
    let plain_err = |e: veilfs_core::Error| super::plain_path_error(e, &a.dir);
    // A ciphertext path exists on disk as given; a plaintext one does not.
    let inner = if !t.inner.as_os_str().is_empty() && t.cipherdir.join(&t.inner).exists() {
        vault.decrypt_path(&t.inner)?
    } else {
        t.inner.clone()
    };
    let (parent, entry) = vault.resolve(&inner).map_err(plain_err)?;
    let dir = match entry {
        Some(e) if e.kind == EntryKind::Dir => vault.open_dir(&parent, &e).map_err(plain_err)?,
        Some(e) => {
            // Like ls: a file argument lists that file.
            return Ok(match print_entry(&a, &vault, &parent, &e) {
                None => crate::exit::OK,
                Some(err) => {
                    eprintln!("veilfs: ls: {}: {err}", a.dir.display());
                    crate::exit::INTEGRITY
                }
            });
        }
        None if inner.as_os_str().is_empty() => parent,
        None => return Err(super::not_found(&a.dir).into()),
    };
    let mut damaged = 0;
    list_dir(&a, &vault, &dir, &a.dir, true, &mut damaged).map_err(plain_err)?;
    Ok(if damaged == 0 { crate::exit::OK } else { crate::exit::INTEGRITY })
}

/// Lists directory `dir` (named `label` in messages and `-R` headers), then with `-R` each
/// subdirectory in name order; counts entries that failed authentication in `damaged`.
fn list_dir(
    a: &Args,
    vault: &veilfs_core::Vault,
    dir: &veilfs_core::CipherDir,
    label: &std::path::Path,
    first: bool,
    damaged: &mut usize,
) -> veilfs_core::Result<()> {
    let (mut entries, bad) = vault.list(dir)?;
    entries.sort_by(|x, y| x.name.cmp(&y.name));
    if a.recursive {
        if !first {
            println!();
        }
        println!("{}:", label.display());
    }
    for e in &entries {
        if let Some(err) = print_entry(a, vault, dir, e) {
            *damaged += 1;
            eprintln!("veilfs: ls: {}/{}: {err}", label.display(), String::from_utf8_lossy(&e.name));
        }
    }
    for b in &bad {
        *damaged += 1;
        let why = match &b.error {
            veilfs_core::Error::Auth { detail, .. } | veilfs_core::Error::Rollback { detail, .. } => detail.clone(),
            other => other.to_string(),
        };
        if b.on_disk.is_empty() {
            // A finding on the directory itself (entries deleted by a non-client).
            eprintln!("veilfs: ls: {}: integrity error: {why}", label.display());
        } else {
            eprintln!(
                "veilfs: ls: {}: integrity error in the entry with ciphertext name {}: {why}",
                label.display(),
                String::from_utf8_lossy(&b.on_disk)
            );
        }
    }
    if a.recursive {
        for e in entries.iter().filter(|e| e.kind == EntryKind::Dir) {
            let sub_label = label.join(std::ffi::OsStr::from_bytes(&e.name));
            match vault.open_dir(dir, e) {
                Ok(sub) => list_dir(a, vault, &sub, &sub_label, false, damaged)?,
                Err(err @ veilfs_core::Error::Auth { .. }) => {
                    *damaged += 1;
                    eprintln!("veilfs: ls: {}: {err}", sub_label.display());
                }
                Err(err) => return Err(err),
            }
        }
    }
    Ok(())
}

/// Prints one entry; returns the integrity error of a symlink whose target fails to decrypt
/// (its line is still printed, without a target).
fn print_entry(
    a: &Args,
    vault: &veilfs_core::Vault,
    dir: &veilfs_core::CipherDir,
    e: &veilfs_core::Entry,
) -> Option<veilfs_core::Error> {
    let mut line = String::new();
    let mut failed = None;
    if a.long {
        let target = if e.kind == EntryKind::Symlink {
            vault.readlink(dir, e).map_err(|err| failed = Some(err)).ok()
        } else {
            None
        };
        let st = &e.stat;
        let size = match e.kind {
            EntryKind::File => vault.content().plain_size_lenient(st.st_size as u64),
            EntryKind::Symlink => target.as_ref().map_or(0, |t| t.len() as u64),
            _ => st.st_size as u64,
        };
        let mut mode = st.st_mode;
        if mode & libc::S_IFMT == 0 {
            mode |= match e.kind {
                EntryKind::Dir => libc::S_IFDIR,
                EntryKind::Symlink => libc::S_IFLNK,
                _ => libc::S_IFREG,
            };
        }
        let size = if a.human { super::human_size(size) } else { size.to_string() };
        let tz = jiff::tz::TimeZone::system();
        let now = jiff::Timestamp::now().as_second();
        line.push_str(&format!(
            "{} {:>3} {:>5} {:>5} {:>8} {} ",
            mode_string(mode),
            st.st_nlink,
            st.st_uid,
            st.st_gid,
            size,
            ls_time(st.st_mtime, &tz, now)
        ));
        line.push_str(&String::from_utf8_lossy(&e.name));
        if let Some(t) = target {
            line.push_str(&format!(" -> {}", String::from_utf8_lossy(&t)));
        }
    } else {
        line.push_str(&String::from_utf8_lossy(&e.name));
    }
    if a.cipher_names {
        line.push_str(&format!("\t{}", e.on_disk));
    }
    println!("{line}");
    failed
}

#[cfg(test)]
mod tests {
    use super::mode_string;

    #[test]
    fn mode_strings_like_ls() {
        assert_eq!(mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(mode_string(libc::S_IFDIR | 0o700), "drwx------");
        assert_eq!(mode_string(libc::S_IFLNK | 0o777), "lrwxrwxrwx");
        assert_eq!(mode_string(libc::S_IFIFO | 0o640), "prw-r-----");
        assert_eq!(mode_string(libc::S_IFDIR | 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(libc::S_IFREG | 0o4754), "-rwsr-xr--");
        assert_eq!(mode_string(libc::S_IFREG | 0o2640), "-rw-r-S---");
    }
}
