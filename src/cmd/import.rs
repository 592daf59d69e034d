//! `veilfs import`: encrypt a plaintext tree into a vault without mounting.

use super::UnlockArgs;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use veilfs_core::{CipherDir, Entry, EntryKind, Vault};

/// Arguments of `veilfs import`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Like `cp -a SRC DEST`: if DEST is an existing directory of the vault, SRC is copied into it \
under its own name; otherwise DEST names the copy. A SRC ending in `/.` copies the contents of SRC. \
Existing entries are never overwritten (reported, skipped). Modes, times, symlinks and hard links are kept; \
owners too when run as root. The vault must not be mounted (exit code 9), unless with --shared-storage.")]
pub struct Args {
    /// Plaintext file or directory to encrypt.
    pub src: PathBuf,
    /// CIPHERDIR, optionally followed by a path inside the vault.
    pub dest: PathBuf,
    #[command(flatten)]
    pub unlock: UnlockArgs,
    #[command(flatten)]
    pub lock: super::LockArgs,
}

struct Importer<'a> {
    vault: &'a Vault,
    links: HashMap<(u64, u64), (Rc<CipherDir>, Entry)>,
    errors: usize,
    /// Regular files and their bytes encrypted (for the summary line).
    files: u64,
    bytes: u64,
    pb: indicatif::ProgressBar,
    is_root: bool,
    /// Temporary names handed out (see [`Importer::copy_file`]).
    seq: u64,
}

/// Total bytes of regular files under `p` (for the progress bar).
fn total_bytes(p: &Path) -> u64 {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            std::fs::read_dir(p).map(|it| it.flatten().map(|e| total_bytes(&e.path())).sum()).unwrap_or(0)
        }
        Ok(m) if m.is_file() => m.len(),
        _ => 0,
    }
}

/// Sets mode, owner (when `chown`) and times of a freshly created `entry` of `dir` from the
/// source's metadata, through a verified handle on it (never through a planted link).
fn apply_meta(vault: &Vault, dir: &CipherDir, entry: &Entry, m: &std::fs::Metadata, chown: bool) -> Result<()> {
    let ts = |s: i64, ns: i64| libc::timespec { tv_sec: s, tv_nsec: ns };
    let times = [ts(m.atime(), m.atime_nsec()), ts(m.mtime(), m.mtime_nsec())];
    vault.set_attrs(dir, entry, Some(m.mode()), chown.then_some((m.uid(), m.gid())), Some(&times))?;
    Ok(())
}

/// The `user.*` extended attributes of `src` (not following a symlink).
fn user_xattrs(src: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let c = std::ffi::CString::new(src.as_os_str().as_bytes())?;
    let mut names = vec![0u8; 65536];
    // SAFETY: valid C string; the buffer describes writable memory.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOTSUP) { Ok(Vec::new()) } else { Err(e) };
    }
    let mut out = Vec::new();
    for name in names[..n as usize].split(|&b| b == 0).filter(|s| s.starts_with(b"user.")) {
        let cn = std::ffi::CString::new(name)?;
        let mut value = vec![0u8; 65536];
        // SAFETY: valid C strings; the buffer describes writable memory.
        let v = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
        if v < 0 {
            return Err(std::io::Error::last_os_error());
        }
        value.truncate(v as usize);
        out.push((name.to_vec(), value));
    }
    Ok(out)
}

impl Importer<'_> {
    /// Encrypts the regular file `src` as `name` in `dir`. The content is written under a
    /// temporary name, renamed to `name` only once complete: a full disk or an interrupted
    /// import never leaves a cut-off file under the final name, where it would look complete
    /// (and a re-run would skip it). After an error the temporary file is removed.
    fn copy_file(&mut self, src: &Path, dir: &CipherDir, name: &[u8]) -> Result<Entry> {
        let mut input = std::fs::File::open(src)?;
        self.seq += 1;
        let tmp = format!(".veilfs-import-{}-{}", std::process::id(), self.seq);
        let (entry, file) = self.vault.create_file(dir, tmp.as_bytes(), 0o600)?;
        let mut copy = || -> Result<u64> {
            let mut buf = vec![0u8; 1 << 20];
            let mut size = 0u64;
            loop {
                let n = std::io::Read::read(&mut input, &mut buf)?;
                if n == 0 {
                    return Ok(size);
                }
                size = file.write_at(&buf[..n], size, size)?;
                self.pb.inc(n as u64);
            }
        };
        let done = copy().and_then(|size| Ok((size, self.vault.rename(dir, &entry, dir, name, None)?)));
        match done {
            Ok((size, entry)) => {
                self.files += 1;
                self.bytes += size;
                Ok(entry)
            }
            Err(e) => {
                if let Err(r) = self.vault.remove(dir, &entry) {
                    self.pb.suspend(|| eprintln!("veilfs: import: could not remove the partial copy {tmp}: {r}"));
                }
                Err(e)
            }
        }
    }

    /// Copies the `user.*` attributes of `src` onto `entry` (encrypted like the mount does).
    fn copy_xattrs(&self, src: &Path, dir: &CipherDir, entry: &Entry) -> Result<()> {
        for (name, value) in user_xattrs(src).with_context(|| format!("reading the attributes of {}", src.display()))? {
            self.vault.set_xattr(dir, entry, &name, &value)?;
        }
        Ok(())
    }

    fn fail(&mut self, what: &Path, e: impl std::fmt::Display) {
        self.errors += 1;
        self.pb.suspend(|| eprintln!("veilfs: import: {}: {e}", what.display()));
    }

    fn import(&mut self, src: &Path, dir: &Rc<CipherDir>, name: &[u8]) {
        if let Err(e) = self.import_one(src, dir, name) {
            self.fail(src, format!("{e:#}"));
        }
    }

    fn import_one(&mut self, src: &Path, dir: &Rc<CipherDir>, name: &[u8]) -> Result<()> {
        let m = std::fs::symlink_metadata(src)?;
        let ft = m.file_type();
        if !ft.is_dir() && m.nlink() > 1 {
            if let Some((first_dir, first)) = self.links.get(&(m.dev(), m.ino())) {
                self.vault.link(first_dir, first, dir, name)?;
                return Ok(());
            }
        }
        let existing = self.vault.lookup(dir, name)?;
        let entry = if ft.is_dir() {
            let sub = match existing {
                Some(e) if e.kind == EntryKind::Dir => self.vault.open_dir(dir, &e)?,
                Some(_) => anyhow::bail!("exists in the vault and is not a directory; skipped"),
                None => self.vault.mkdir_unchecked(dir, name, 0o700)?.1,
            };
            let sub = Rc::new(sub);
            let mut children: Vec<_> = std::fs::read_dir(src)?.collect::<std::io::Result<_>>()?;
            children.sort_by_key(|e| e.file_name());
            for c in children {
                self.import(&c.path(), &sub, c.file_name().as_bytes());
            }
            let e = self.vault.lookup(dir, name)?.context("directory vanished during import")?;
            self.copy_xattrs(src, dir, &e)?;
            apply_meta(self.vault, dir, &e, &m, self.is_root)?;
            return Ok(());
        } else if existing.is_some() {
            anyhow::bail!("already exists in the vault; skipped (nothing is overwritten)");
        } else if ft.is_file() {
            self.copy_file(src, dir, name)?
        } else if ft.is_symlink() {
            let target = std::fs::read_link(src)?;
            self.vault.symlink(dir, name, target.as_os_str().as_bytes())?
        } else {
            self.vault.mknod(dir, name, m.mode(), m.rdev())?
        };
        if entry.kind != EntryKind::Symlink {
            self.copy_xattrs(src, dir, &entry)?;
        }
        apply_meta(self.vault, dir, &entry, &m, self.is_root)?;
        if !ft.is_dir() && m.nlink() > 1 {
            self.links.insert((m.dev(), m.ino()), (dir.clone(), entry));
        }
        Ok(())
    }
}

/// Runs `veilfs import`.
pub fn run(a: Args) -> Result<i32> {
    let t = crate::target::split(&a.dest)?;
    std::fs::symlink_metadata(&a.src).with_context(|| format!("{}", a.src.display()))?;
    let _lock = a.lock.take(&t.cipherdir, "import")?;
    let vault = a.unlock.open(&t.cipherdir)?;
    let contents_only = a.src.as_os_str().as_bytes().ends_with(b"/.");
    let (parent, entry) = vault.resolve(&t.inner).map_err(|e| super::plain_path_error(e, &a.dest))?;
    let src_name = a.src.canonicalize()?.file_name().map(|n| n.as_bytes().to_vec());
    // Where the copy goes: (directory, name) or "into this directory" for `/.` sources.
    let (dest_dir, dest_name): (Rc<CipherDir>, Option<Vec<u8>>) = match entry {
        Some(e) if e.kind == EntryKind::Dir => {
            (Rc::new(vault.open_dir(&parent, &e)?), if contents_only { None } else { src_name })
        }
        Some(_) => anyhow::bail!("{} already exists in the vault; nothing is overwritten", t.inner.display()),
        None if t.inner.as_os_str().is_empty() => (Rc::new(parent), if contents_only { None } else { src_name }),
        None => {
            let last = t.inner.file_name().context("bad destination")?.as_bytes().to_vec();
            (Rc::new(parent), Some(last))
        }
    };
    let pb = super::progress(total_bytes(&a.src), "importing");
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let mut imp = Importer { vault: &vault, links: HashMap::new(), errors: 0, files: 0, bytes: 0, pb, is_root, seq: 0 };
    match dest_name {
        Some(name) => imp.import(&a.src, &dest_dir, &name),
        None => {
            let mut children: Vec<_> = std::fs::read_dir(&a.src)?.collect::<std::io::Result<_>>()?;
            children.sort_by_key(|e| e.file_name());
            for c in children {
                imp.import(&c.path(), &dest_dir, c.file_name().as_bytes());
            }
        }
    }
    imp.pb.finish_and_clear();
    super::summary("imported", imp.files, imp.bytes, &super::count(imp.errors, "error"));
    Ok(if imp.errors > 0 { crate::exit::OTHER } else { crate::exit::OK })
}
