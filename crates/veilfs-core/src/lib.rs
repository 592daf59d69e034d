//! veilfs core: the on-disk format, its cryptography, the vault config, and file and path
//! APIs over a ciphertext directory. No FUSE here: this crate is what the mount, the offline
//! CLI tools, fuzzers and tests all share. The format is specified in `docs/FORMAT.md`.

#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod content;
pub mod error;
pub mod keys;
pub mod names;
pub mod random;

pub use error::{Error, Result};
