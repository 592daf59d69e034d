//! veilfs-fuse: the FUSE adapter. Maps kernel requests (inodes, handles, operations) onto the
//! core library; holds no cryptography of its own.
//!
//! Modules: `ops` (what each operation does), `fs` (the fuser `Filesystem` shell), `inodes`
//! (node ids ↔ backing objects), `dirs` (per-directory fd, IV and name index), `handles`,
//! `rangelock` (block-range locking for parallel writers), `attr` (stat conversion).

#![warn(missing_docs)]

mod attr;
mod dirs;
mod fs;
mod handles;
mod inodes;
mod ops;
mod rangelock;
#[cfg(test)]
mod tests;

pub use fs::MAX_WRITE;
pub use ops::{Activity, FsOptions, VeilFs};

use std::path::Path;
use std::sync::Arc;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Behaviour options.
    pub fs: FsOptions,
    /// Let other users in (the kernel checks permissions: default_permissions).
    pub allow_other: bool,
    /// Worker threads.
    pub threads: usize,
    /// Shown as the mount's source in /proc/mounts.
    pub fsname: String,
}

/// Mounts `vault` at `mountpoint`; returns once the mount is live (the kernel's INIT is
/// answered). Run the returned session with `run()`.
pub fn mount(
    vault: Arc<veilfs_core::Vault>,
    mountpoint: &Path,
    cfg: &MountConfig,
    activity: Arc<Activity>,
) -> std::io::Result<fuser::Session<VeilFs>> {
    let fs = VeilFs::new(vault, cfg.fs.clone(), activity)?;
    let mut options = vec![
        fuser::MountOption::FSName(cfg.fsname.clone()),
        // Not MountOption::Subtype: fuser's own mount(2) (root) drops it and the mount shows
        // type `fuse`; as a kernel option the kernel sets the subtype (`fuse.veilfs`), and
        // fusermount3 (non-root) gets the same `subtype=veilfs` text either way.
        fuser::MountOption::CUSTOM("subtype=veilfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
    ];
    if cfg.fs.read_only {
        options.push(fuser::MountOption::RO);
    }
    let mut config = fuser::Config::default();
    config.mount_options = options;
    config.acl = if cfg.allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    config.n_threads = Some(cfg.threads.max(1));
    config.clone_fd = true;
    fuser::Session::new(fs, mountpoint, &config)
}
