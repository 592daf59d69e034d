//! veilfs core: the on-disk format, its cryptography, the vault config, and file and path
//! APIs over a ciphertext directory. No FUSE here: this crate is what the mount, the offline
//! CLI tools, fuzzers and tests all share. The format is specified in `docs/FORMAT.md`.

#![forbid(unsafe_op_in_unsafe_fn)]
// `unsafe` only in `sys`, the one system-call layer of the workspace.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod conflict;
pub mod content;
pub mod crash;
pub mod diriv;
pub mod error;
pub mod foreign;
pub mod holder;
pub mod keys;
pub mod names;
pub mod plaintree;
pub mod random;

pub use error::{Error, Result};
pub mod config;
pub mod file;
pub mod fsck;
pub mod kdf;
pub mod known;
pub mod lock;
pub mod maplog;
pub mod record;
pub mod recovery;
pub mod reverse;
mod setid;
pub mod settle;
pub mod stash;
pub mod symlink;
#[allow(unsafe_code)]
pub mod sys;
pub mod tombstone;
pub mod unclean;
pub mod upgrade;
pub mod vault;
pub mod xattr;

pub use config::{Secret, VaultConfig};
pub use file::{ContentCtx, CryptFile};
pub use lock::VaultLock;
pub use names::{DirIv, EntryKind, Identity, NameCipher};
pub use recovery::RecoveryKey;
pub use vault::{CipherDir, Entry, FileVersions, InitOptions, Vault};
