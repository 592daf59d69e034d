//! `CIPHERDIR[/PATH]` arguments: a vault directory optionally followed by a path inside it.
//!
//! The split point is the longest prefix that holds a `veilfs.conf`; what follows is a
//! plaintext path inside the vault (or, for `ls` and `decrypt-path`, a ciphertext one).

use crate::exit::{Exit, BAD_PATH};
use anyhow::Result;
use std::path::{Path, PathBuf};
use veilfs_core::VaultConfig;

/// A vault and a path inside it.
#[derive(Debug, Clone)]
pub struct Target {
    /// The CIPHERDIR.
    pub cipherdir: PathBuf,
    /// The path inside the vault (may be empty).
    pub inner: PathBuf,
}

/// Splits `arg` into vault and inner path.
pub fn split(arg: &Path) -> Result<Target> {
    let mut prefix = arg.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if VaultConfig::path_in(&prefix).is_file() {
            let inner: PathBuf = rest.iter().rev().collect();
            return Ok(Target { cipherdir: prefix, inner });
        }
        match (prefix.file_name().map(|s| s.to_os_string()), prefix.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                prefix = if parent.as_os_str().is_empty() { PathBuf::from(".") } else { parent.to_path_buf() };
            }
            _ => break,
        }
    }
    Err(Exit::new(
        BAD_PATH,
        anyhow::anyhow!(
            "{} is not inside a veilfs vault (no veilfs.conf found in it or above it); create one with `veilfs init DIR`",
            arg.display()
        ),
    )
    .into())
}
