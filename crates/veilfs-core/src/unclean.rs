//! The host-local mark of a vault held for writing: how the next writer on this machine learns
//! that the last one did not end cleanly (crashed, was killed, lost power), so that the mount
//! runs the crash sweep ([`crate::settle`]) before serving.
//!
//! Why not in CIPHERDIR: CIPHERDIR may be a synced folder, and a mark there would travel to the
//! other machines, where it means nothing (their writers did not crash) or blocks (the old lock
//! file, which named its holder, refused every other machine while it existed, and stayed
//! behind after a crash). So the mark lives in this user's state directory, one small file per
//! vault: `$VEILFS_STATE_DIR`, else `/var/lib/veilfs` for root, else
//! `$XDG_STATE_HOME/veilfs` (default `~/.local/state/veilfs`), under `held/`, named by a hash
//! of CIPHERDIR's canonical path. A writer sets it (written and synced before it writes the
//! vault) once it holds the lock, and removes it when it lets go cleanly, unless a crash it
//! found is not swept yet (a read-only mount or an import do not sweep: the next mount does).
//! A mark that exists when a writer takes the lock was left by a writer that did not end
//! cleanly: the lock (`flock`) says no live writer of this machine holds the vault.
//!
//! Limits, by design: a crash is seen by the next writer of the same user on the same machine
//! at the same path (another user, another machine or a moved vault runs no sweep; the rules
//! of docs/FORMAT.md §5.8 still read the files correctly, only a size the kernel caches may be
//! the longer one until the file is next written). Where no mark can be kept (no state
//! directory can be made), every writer sweeps: safe, and slower on a large tree.

use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The state directory of this user (see the module docs); `None` when nothing names one.
pub fn state_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VEILFS_STATE_DIR").filter(|v| !v.is_empty()) {
        return Some(p.into());
    }
    if crate::sys::euid() == 0 {
        return Some("/var/lib/veilfs".into());
    }
    std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| Path::new(&h).join(".local/state")))
        .map(|s| s.join("veilfs"))
}

/// A set mark (or none could be kept); see the module docs.
#[derive(Debug)]
pub struct UncleanMark {
    path: Option<PathBuf>,
}

impl UncleanMark {
    /// Sets the mark of the vault at `cipherdir` in `state` (see [`state_dir`]); returns it and
    /// whether the last writer did not end cleanly (a mark was there already, or none can be
    /// kept and so none can say otherwise).
    pub fn set(cipherdir: &Path, state: Option<&Path>, command: &str) -> (UncleanMark, bool) {
        let Some(state) = state else {
            tracing::warn!(
                "no state directory (HOME is not set): cannot tell whether the last writer of {} ended cleanly; \
                 running the crash sweep to be safe",
                cipherdir.display()
            );
            return (UncleanMark { path: None }, true);
        };
        let canonical = cipherdir.canonicalize().unwrap_or_else(|_| cipherdir.to_path_buf());
        let dir = state.join("held");
        let path = dir.join(mark_name(&canonical));
        let was_there = path.symlink_metadata().is_ok();
        let text = format!("cipherdir={}\npid={}\ncommand={command}\n", canonical.display(), std::process::id());
        match write_mark(&dir, &path, text.as_bytes()) {
            Ok(()) => (UncleanMark { path: Some(path) }, was_there),
            Err(e) => {
                tracing::warn!(
                    "cannot keep the crash mark {}: {e}; cannot tell whether the last writer of {} ended cleanly, \
                     running the crash sweep to be safe",
                    path.display(),
                    cipherdir.display()
                );
                (UncleanMark { path: None }, true)
            }
        }
    }

    /// Removes the mark: this writer ends cleanly and leaves no crash state behind.
    pub fn clear(self) {
        if let Some(p) = &self.path {
            if let Err(e) = std::fs::remove_file(p) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove the crash mark {}: {e}", p.display());
                }
            }
        }
    }
}

/// The mark's file name: 32 hex digits of SHA-256 of the canonical path.
fn mark_name(canonical: &Path) -> String {
    let h = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    h[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes the mark durably: it must survive a power loss that the writes after it do not.
fn write_mark(dir: &Path, path: &Path, text: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(text)?;
    f.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_left_behind_says_unclean_and_a_cleared_one_does_not() {
        let state = tempfile::tempdir().unwrap();
        let vault = tempfile::tempdir().unwrap();
        let (m, unclean) = UncleanMark::set(vault.path(), Some(state.path()), "mount");
        assert!(!unclean, "a first writer finds no mark");
        let (m2, unclean) = UncleanMark::set(vault.path(), Some(state.path()), "mount");
        assert!(unclean, "a mark that is there was left by a writer that did not let go");
        drop(m2); // dropped without clear: as a crash leaves it
        drop(m);
        let (m, unclean) = UncleanMark::set(vault.path(), Some(state.path()), "import");
        assert!(unclean);
        m.clear();
        let (m, unclean) = UncleanMark::set(vault.path(), Some(state.path()), "mount");
        assert!(!unclean, "cleared: the last writer ended cleanly");
        // Another vault has its own mark.
        let other = tempfile::tempdir().unwrap();
        let (o, unclean) = UncleanMark::set(other.path(), Some(state.path()), "mount");
        assert!(!unclean);
        o.clear();
        m.clear();
        assert_eq!(std::fs::read_dir(state.path().join("held")).unwrap().count(), 0);
    }

    #[test]
    fn without_a_place_for_marks_every_writer_sweeps() {
        let vault = tempfile::tempdir().unwrap();
        assert!(UncleanMark::set(vault.path(), None, "mount").1);
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(UncleanMark::set(vault.path(), Some(file.path()), "mount").1, "a state dir that is a file");
    }
}
