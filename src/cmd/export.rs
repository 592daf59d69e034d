//! `veilfs export`: decrypt a vault (or part of it) into a plain folder without mounting.
//! Also the disaster-recovery tool: a damaged file is reported by name and skipped, and
//! everything else still comes out.

use super::UnlockArgs;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use veilfs_core::{CipherDir, Entry, EntryKind, Vault};

/// Arguments of `veilfs export`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Like `cp -a`: modes, times, symlinks, hard links and user.* extended attributes are \
kept, owners too when run as root. Set-user-id and set-group-id bits of files and device nodes are not restored \
unless --preserve-special is given: whoever could write the ciphertext chose them. Files that fail \
authentication (tampered or damaged) are named on stderr and left out; the rest is exported and the exit \
code is 6.")]
pub struct Args {
    /// CIPHERDIR, optionally followed by a plaintext path inside the vault.
    pub src: PathBuf,
    /// Destination folder (created if missing).
    pub dest: PathBuf,
    /// Also restore set-user-id/set-group-id bits of files and recreate device nodes.
    #[arg(long)]
    pub preserve_special: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
}

struct Exporter<'a> {
    vault: &'a Vault,
    links: HashMap<(u64, u64), (PathBuf, veilfs_core::Identity)>,
    damaged: usize,
    errors: usize,
    /// Regular files and their bytes written (for the summary line).
    files: u64,
    bytes: u64,
    pb: indicatif::ProgressBar,
    is_root: bool,
    preserve_special: bool,
    /// Set-id bits not restored and device nodes not made (without --preserve-special).
    withheld: usize,
    /// Attributes the destination could not hold.
    xattrs_lost: usize,
    /// Directories whose times are set after their contents.
    dir_times: Vec<(PathBuf, libc::stat)>,
}

fn set_times(path: &Path, st: &libc::stat, follow: bool) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let ts = [
        libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
        libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
    ];
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: valid C string and two-element timespec array.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), flags) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Exporter<'_> {
    fn note(&mut self, what: &str, e: &anyhow::Error) {
        let integrity = crate::exit::classify(e) == crate::exit::INTEGRITY;
        if integrity {
            self.damaged += 1;
        } else {
            self.errors += 1;
        }
        let label = if integrity { "DAMAGED, not exported" } else { "error" };
        self.pb.suspend(|| eprintln!("veilfs: export: {what}: {label}: {e:#}"));
    }

    fn export_dir(&mut self, dir: &CipherDir, dest: &Path) {
        let (entries, bad) = match self.vault.list(dir) {
            Ok(x) => x,
            Err(e) => return self.note(&dest.display().to_string(), &e.into()),
        };
        for b in bad {
            let e: anyhow::Error = b.error.into();
            self.note(&format!("{} (ciphertext entry {})", dest.display(), String::from_utf8_lossy(&b.on_disk)), &e);
        }
        for e in entries {
            let out = dest.join(OsStr::from_bytes(&e.name));
            if let Err(err) = self.export_entry(dir, &e, &out) {
                self.note(&format!("{} (ciphertext {})", out.display(), dir.path.join(&e.on_disk).display()), &err);
            }
        }
    }

    fn export_entry(&mut self, dir: &CipherDir, e: &Entry, out: &Path) -> Result<()> {
        let st = e.stat;
        if e.kind != EntryKind::Dir && st.st_nlink > 1 {
            // Another name of an inode already exported: a link, but only if this name
            // promises the same identity (a hard link planted under another file's name
            // is read and verified like any file, and fails).
            if let Some((first, id)) = self.links.get(&(st.st_dev, st.st_ino)) {
                if *id == e.identity {
                    std::fs::hard_link(first, out)?;
                    return Ok(());
                }
            }
        }
        match e.kind {
            EntryKind::Dir => {
                let sub = self.vault.open_dir(dir, e)?;
                match std::fs::create_dir(out) {
                    Ok(()) => {}
                    Err(x) if x.kind() == std::io::ErrorKind::AlreadyExists && out.is_dir() => {}
                    Err(x) => return Err(x.into()),
                }
                std::fs::set_permissions(out, std::fs::Permissions::from_mode(0o700))?;
                self.export_dir(&sub, out);
                self.copy_xattrs(dir, e, out)?;
                self.finish_meta(out, &st, true)?;
                self.dir_times.push((out.to_path_buf(), st));
                return Ok(());
            }
            EntryKind::File => {
                if let Err(err) = self.export_file(dir, e, out) {
                    let _ = std::fs::remove_file(out);
                    return Err(err);
                }
            }
            EntryKind::Symlink => {
                let target = self.vault.readlink(dir, e)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), out)?;
            }
            // Type and (in a vault with `special-kinds`) device number were verified with the
            // entry's binding (Vault::verified_identity), from this same `stat`.
            EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice => {
                if e.kind.is_device() && !self.preserve_special {
                    self.withheld += 1;
                    self.pb.suspend(|| {
                        eprintln!(
                            "veilfs: export: {}: device node not made (--preserve-special makes it)",
                            out.display()
                        )
                    });
                    return Ok(());
                }
                let c = std::ffi::CString::new(out.as_os_str().as_bytes())?;
                // SAFETY: valid C string; mode and rdev come from the backing stat.
                if unsafe { libc::mknod(c.as_ptr(), st.st_mode, st.st_rdev) } < 0 {
                    return Err(std::io::Error::last_os_error()).context("mknod");
                }
            }
        }
        if e.kind != EntryKind::Symlink {
            self.copy_xattrs(dir, e, out)?;
        }
        self.finish_meta(out, &st, e.kind != EntryKind::Symlink)?;
        if st.st_nlink > 1 {
            self.links.insert((st.st_dev, st.st_ino), (out.to_path_buf(), e.identity));
        }
        Ok(())
    }

    fn export_file(&mut self, dir: &CipherDir, e: &Entry, out: &Path) -> Result<()> {
        let f = self.vault.open_file(dir, e, libc::O_RDONLY)?;
        let mut w = std::fs::OpenOptions::new().write(true).create_new(true).open(out)?;
        let pb = &self.pb;
        let off = f.stream(|piece| -> Result<()> {
            std::io::Write::write_all(&mut w, piece)?;
            pb.inc(piece.len() as u64);
            Ok(())
        })?;
        self.files += 1;
        self.bytes += off;
        Ok(())
    }

    /// Copies the `user.*` attributes of `e` onto `out`; a destination that cannot hold them
    /// is counted (and said once at the end), not an error.
    fn copy_xattrs(&mut self, dir: &CipherDir, e: &Entry, out: &Path) -> Result<()> {
        let c = std::ffi::CString::new(out.as_os_str().as_bytes())?;
        for (name, value) in self.vault.xattrs(dir, e)? {
            let n = std::ffi::CString::new(name)?;
            // SAFETY: valid C strings and a readable value buffer.
            let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
            if r < 0 {
                let err = std::io::Error::last_os_error();
                if matches!(err.raw_os_error(), Some(libc::ENOTSUP | libc::EPERM)) {
                    self.xattrs_lost += 1;
                    continue;
                }
                return Err(err).with_context(|| format!("setting an extended attribute on {}", out.display()));
            }
        }
        Ok(())
    }

    fn finish_meta(&mut self, out: &Path, st: &libc::stat, chmod: bool) -> Result<()> {
        if self.is_root {
            std::os::unix::fs::lchown(out, Some(st.st_uid), Some(st.st_gid))?;
        }
        if chmod {
            let mut mode = st.st_mode & 0o7777;
            let set_id = libc::S_ISUID | libc::S_ISGID;
            // A directory's set-group-id bit only passes its group on; a file's runs code as
            // its owner or group, so it comes back only when asked for.
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR && mode & set_id != 0 && !self.preserve_special {
                mode &= !set_id;
                self.withheld += 1;
                self.pb.suspend(|| {
                    eprintln!(
                        "veilfs: export: {}: set-user-id/set-group-id bit not restored (--preserve-special restores it)",
                        out.display()
                    )
                });
            }
            std::fs::set_permissions(out, std::fs::Permissions::from_mode(mode))?;
        }
        set_times(out, st, false)?;
        Ok(())
    }
}

/// Runs `veilfs export`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.src)?;
    let vault = a.unlock.open(&t.cipherdir)?;
    let (parent, entry) = vault.resolve(&t.inner).map_err(|e| super::plain_path_error(e, &a.src))?;
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let total = match &entry {
        Some(e) if e.kind == EntryKind::Dir => {
            super::plain_bytes_under(&parent.path.join(&e.on_disk), &vault.content().layout)
        }
        Some(e) => vault.content().layout.plain_size_lenient(e.stat.st_size as u64),
        None => super::plain_bytes_under(&parent.path, &vault.content().layout),
    };
    let pb = super::progress(total, "exporting");
    let mut ex = Exporter {
        vault: &vault,
        links: HashMap::new(),
        damaged: 0,
        errors: 0,
        files: 0,
        bytes: 0,
        pb,
        is_root,
        preserve_special: a.preserve_special,
        withheld: 0,
        xattrs_lost: 0,
        dir_times: Vec::new(),
    };
    match entry {
        None if t.inner.as_os_str().is_empty() => {
            std::fs::create_dir_all(&a.dest).with_context(|| format!("creating {}", a.dest.display()))?;
            ex.export_dir(&parent, &a.dest);
        }
        None => return Err(super::not_found(&a.src).into()),
        Some(e) => {
            let out = if a.dest.is_dir() { a.dest.join(OsStr::from_bytes(&e.name)) } else { a.dest.clone() };
            if let Err(err) = ex.export_entry(&parent, &e, &out) {
                ex.note(&out.display().to_string(), &err);
            }
        }
    }
    // Directory times last: writing into a directory changes its mtime.
    for (p, st) in std::mem::take(&mut ex.dir_times).iter().rev() {
        let _ = set_times(p, st, false);
    }
    ex.pb.finish_and_clear();
    if ex.xattrs_lost > 0 {
        eprintln!(
            "veilfs: export: {} extended attribute(s) not kept: {} cannot hold user.* attributes",
            ex.xattrs_lost,
            a.dest.display()
        );
    }
    let errors = match ex.damaged {
        0 => super::count(ex.errors, "error"),
        n => format!("{} left out, {}", super::count(n, "damaged item"), super::count(ex.errors, "other error")),
    };
    super::summary("exported", ex.files, ex.bytes, &errors);
    Ok(if ex.damaged > 0 {
        crate::exit::INTEGRITY
    } else if ex.errors > 0 {
        crate::exit::OTHER
    } else {
        crate::exit::OK
    })
}
