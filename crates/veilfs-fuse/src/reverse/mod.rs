//! The reverse front end: a read-only FUSE view of the ciphertext of a plaintext directory
//! (`veilfs mount --reverse`). Every on-disk step (what the view holds, names, identities,
//! sealing) is `veilfs_core::reverse`'s; this module only keeps node ids and handles and
//! answers the kernel. `ops.rs` holds the requests as plain `io::Result` functions (driven by
//! the unit tests without /dev/fuse), `fs.rs` the fuser `Filesystem` shell.
//!
//! Lock order: `nodes` and `handles` are leaves, held only for a lookup, an insert or a
//! removal, never while the plaintext is read.

mod fs;
mod ops;

pub use ops::ReverseFs;

use crate::ops::Activity;
use std::path::Path;
use std::sync::Arc;
use veilfs_core::reverse::ReverseVault;

/// Mounts the reverse view of `rv` at `mountpoint` (always read-only); returns once the mount
/// is live. Run the returned session with `run()` or `spawn()`.
pub fn mount_reverse(
    rv: Arc<ReverseVault>,
    mountpoint: &Path,
    cfg: &crate::MountConfig,
    activity: Arc<Activity>,
) -> std::io::Result<fuser::Session<ReverseFs>> {
    let fs = ReverseFs::new(rv, cfg.fs.ttl, activity)?;
    let mut options = vec![
        fuser::MountOption::FSName(cfg.fsname.clone()),
        fuser::MountOption::CUSTOM("subtype=veilfs-reverse".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    let flags = veilfs_core::sys::process::MountFlags { read_only: true, noatime: true, ..cfg.flags };
    options.extend(crate::generic_options(&flags));
    let mut config = fuser::Config::default();
    config.mount_options = options;
    config.acl = if cfg.allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    config.n_threads = Some(cfg.threads.max(1));
    config.clone_fd = true;
    fuser::Session::new(fs, mountpoint, &config)
}
