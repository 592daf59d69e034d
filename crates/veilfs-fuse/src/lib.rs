//! veilfs-fuse: the FUSE adapter. Maps kernel requests (inodes, handles, operations) onto the
//! core library's tree engine (`veilfs_core::Vault`); holds no cryptography and builds no
//! on-disk name of its own.
//!
//! # Lock order
//!
//! Requests run on several worker threads. A thread that holds more than one lock takes them
//! in this order, and never the other way round:
//!
//! 1. `DirState::ops` of a directory (namespace changes: create, unlink, rename, …). A
//!    rename takes the two directories' locks in node-id order.
//! 2. `OpenDir::entries` (a directory handle's listing snapshot).
//! 3. `DirState::index` (read or write), then `DirState::stamp`.
//! 4. A `FileState`'s open-file lock (`acquire`, `adopt`, `release`: the file's shared open
//!    `CryptFile`; held while the file is opened or settled).
//! 5. A `FileState`'s size lock (`sized`: shared, for I/O inside the size; `resizing`:
//!    exclusive, to change the size), then its block-range locks (`blocks`).
//! 6. `NodeTable::nodes` or `NodeTable::ids`: one at a time, never together, and no other
//!    lock is taken while one is held (a new directory's node is built before `nodes` is
//!    locked for the insert).
//! 7. Leaves, held only for a copy or an insert: `Node::links`, `Node::gone`, the `Handles`
//!    tables, `DirState::listing` (the listing READDIR serves without a handle), a
//!    `FileState`'s note of its own last state (`note_own`), the watch's table of watched
//!    directories (`watch::Watcher`), the caller-credential switch of `sys::act_as` (per
//!    thread, no lock).
//!
//! The watch's thread (`watch.rs`) takes a directory's `ops` lock, then its index (read), then
//! the node table, as a request would; it tells the kernel only after releasing them all.
//!
//! I/O on the backing store happens under 1, 4 and 5, never under 3's write lock except the
//! directory listing that (re)builds an index.
//!
//! # Caching
//!
//! A mount that holds the vault lock is CIPHERDIR's only writer, so the kernel may cache
//! names, attributes and "no such name" answers for long (`FsOptions::ttl`, an hour by
//! default) and keep pages and directory listings across opens. Every change must then reach
//! the kernel, in one of three ways:
//!
//! - the reply of the request that made it carries the new attributes (CREATE, MKNOD, MKDIR,
//!   SYMLINK, LINK with the new link count, SETATTR: chmod, chown, utimens, truncate);
//! - the kernel updates or drops what it caches itself after the request: UNLINK, RMDIR and
//!   RENAME (entries, the parents' times, the link count of what was unlinked or replaced),
//!   WRITE and FALLOCATE (size and times), SETXATTR and REMOVEXATTR (change time), READ
//!   (access time: the kernel drops it after every READ, so a `relatime` update is seen);
//! - what the daemon changes on its own, the kernel is told with `VeilFs::invalidate_attr`:
//!   set-id bits cleared after a write, truncation or allocation by a user without
//!   `CAP_FSETID` (`ops/data.rs`); a file found UNSETTLED and settled at open (its size); the
//!   header written when a file is settled at its last close or at FSYNC (its times); and,
//!   for a daemon that is not root, the change times moved by granting the owner's rights
//!   for a moment (`sys::with_owner_rwx`: at open, in READDIR, when a directory denying its
//!   owner is opened) or by putting back set-id bits the backing store cleared.
//!
//! Names change behind the kernel's back on such a mount only when something else writes
//! CIPHERDIR (a sync tool delivering another machine's work; the crash sweep runs before it is
//! mounted): `watch.rs` watches the loaded ciphertext directories and invalidates what others
//! changed. With `--shared-storage` nothing is cached.
//!
//! # Modules
//!
//! `ops` holds what each request does, one file per op family (`ops/lookup.rs`,
//! `ops/data.rs`, `ops/readdir.rs`, `ops/entries.rs`, `ops/rename.rs`, `ops/attrs.rs`,
//! `ops/xattrs.rs`, `ops/perms.rs`); `perm` the permission rules a mount without
//! `default_permissions` applies itself; `fs` is the fuser `Filesystem` shell; `inodes` the node table and each
//! file's shared state; `dirs` each directory's fd, IV and name index; `handles`; `rangelock`;
//! `attr` (stat conversion); `watch` the watch of CIPHERDIR for others' changes; `reverse` the read-only view of `veilfs mount --reverse`, a
//! front end of its own over `veilfs_core::reverse`; `tests` drives `ops` on a temporary vault without /dev/fuse.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attr;
mod dirs;
mod fs;
mod handles;
mod inodes;
mod ops;
mod perm;
mod rangelock;
pub mod reverse;
#[cfg(test)]
mod tests;
mod watch;

pub use fs::MAX_WRITE;
pub use ops::{Activity, FsOptions, VeilFs};
pub use reverse::{mount_reverse, ReverseFs};

use std::path::Path;
use std::sync::Arc;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Behaviour options.
    pub fs: FsOptions,
    /// Let other users in. The kernel then checks permissions (`default_permissions`);
    /// without it only the mount owner's processes get in and the daemon checks them
    /// (`perm.rs`), which spares a GETATTR of the parent after every UNLINK.
    pub allow_other: bool,
    /// Worker threads.
    pub threads: usize,
    /// Shown as the mount's source in /proc/mounts.
    pub fsname: String,
    /// mount(8)'s generic flags (`noexec`, `nosuid`, `sync`, …), set by the kernel.
    pub flags: veilfs_core::sys::process::MountFlags,
}

/// The kernel flags of `flags` as fuser's mount options.
///
/// fuser mounts through mount(2) as root and through fusermount3 otherwise. Both set the
/// classic flags: `ro`, `noexec`, `nosuid`, `nodev`, `sync`, `dirsync`, `noatime`; both
/// default to `nosuid,nodev` (fusermount3 always sets them for a user), so `suid` and `dev`
/// are asked for explicitly, which only root's mount(2) honours. `lazytime` goes to root's
/// mount(2) as a superblock option. The rest (`nodiratime`, `strictatime`, `nosymfollow`)
/// neither path can set at mount time: root sets them just after (the CLI calls
/// `sys::process::remount`), and for a user the CLI refuses them (fusermount3 does not know
/// them).
pub(crate) fn generic_options(flags: &veilfs_core::sys::process::MountFlags) -> Vec<fuser::MountOption> {
    use fuser::MountOption as O;
    let mut out = Vec::new();
    let root = veilfs_core::sys::euid() == 0;
    for (on, opt) in [
        (flags.read_only, O::RO),
        (flags.noexec, O::NoExec),
        (flags.nosuid, O::NoSuid),
        (flags.nodev, O::NoDev),
        (!flags.nosuid && root, O::Suid),
        (!flags.nodev && root, O::Dev),
        (flags.sync, O::Sync),
        (flags.dirsync, O::DirSync),
        (flags.noatime, O::NoAtime),
        (flags.lazytime && root, O::CUSTOM("lazytime".into())),
    ] {
        if on {
            out.push(opt);
        }
    }
    out
}

/// Mounts `vault` at `mountpoint`; returns once the mount is live (the kernel's INIT is
/// answered). Run the returned session with `run()`.
pub fn mount(
    vault: Arc<veilfs_core::Vault>,
    mountpoint: &Path,
    cfg: &MountConfig,
    activity: Arc<Activity>,
) -> std::io::Result<fuser::Session<VeilFs>> {
    let mut opts = cfg.fs.clone();
    opts.check_permissions = !cfg.allow_other;
    let fs = VeilFs::new(vault, opts, activity)?;
    fs.start_watch();
    let notifier = fs.notifier.clone();
    let mut options = vec![
        fuser::MountOption::FSName(cfg.fsname.clone()),
        // Not MountOption::Subtype: fuser's own mount(2) (root) drops it and the mount shows
        // type `fuse`; as a kernel option the kernel sets the subtype (`fuse.veilfs`), and
        // fusermount3 (non-root) gets the same `subtype=veilfs` text either way.
        fuser::MountOption::CUSTOM("subtype=veilfs".into()),
    ];
    if cfg.allow_other {
        options.push(fuser::MountOption::DefaultPermissions);
    }
    // `noatime` is shown in the mount table; the daemon keeps access times itself (FUSE
    // inodes are S_NOATIME), by `FsOptions::noatime` and `strictatime`.
    let flags = veilfs_core::sys::process::MountFlags {
        read_only: cfg.flags.read_only || cfg.fs.read_only,
        noatime: cfg.flags.noatime || cfg.fs.noatime,
        ..cfg.flags
    };
    options.extend(generic_options(&flags));
    let mut config = fuser::Config::default();
    config.mount_options = options;
    config.acl = if cfg.allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    config.n_threads = Some(cfg.threads.max(1));
    config.clone_fd = true;
    let session = fuser::Session::new(fs, mountpoint, &config)?;
    let _ = notifier.set(session.notifier());
    Ok(session)
}
