//! `veilfs conflicts`: the sync tools' conflict copies in a vault, and what each is shown as.
//!
//! A vault in a synced folder gets conflict copies when one file changes on two machines
//! before they sync; the mount and the other tools show each copy whose binding verifies as
//! `name (<suffix>).ext` (`veilfs_core::conflict`). This lists them all in one place, so a
//! user can decide which version to keep; `fsck --repair` makes them ordinary entries.

use super::UnlockArgs;
use anyhow::Result;
use std::path::PathBuf;

/// Arguments of `veilfs conflicts`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Lists every conflict copy a sync tool (Syncthing, Dropbox, Nextcloud/ownCloud, Google \
Drive, OneDrive, ...) made of a file or directory in the vault, with the name the mount, ls, cat and export show it \
under and the name of the entry it copies; also the copies of veilfs's own files (lock, config, directory IVs, long \
names' side files), which are never used. The older of two valid entries for one name (made on two machines) is \
listed as a copy made by veilfs. Nothing is written; it works while the vault is mounted. Exit code 0: listed; \
6: a copy (or another entry) failed authentication (named on stderr, shown nowhere).")]
pub struct Args {
    /// The vault.
    pub cipherdir: PathBuf,
    /// Print the list as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
}

/// Runs `veilfs conflicts`.
pub fn run(a: Args) -> Result<i32> {
    let vault = a.unlock.open(&a.cipherdir)?;
    let (found, bad) = vault.conflicts_under()?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "vault": a.cipherdir, "copies": found }))?);
    } else {
        for c in &found {
            match &c.shown_as {
                Some(shown) => println!(
                    "/{}\t{} copy of /{}\t{}",
                    shown.display(),
                    c.tool,
                    c.copy_of.display(),
                    c.cipher_path.display()
                ),
                None => println!(
                    "(not shown)\t{} copy of veilfs's {}\t{}",
                    c.tool,
                    c.copy_of.display(),
                    c.cipher_path.display()
                ),
            }
        }
    }
    for e in &bad {
        eprintln!("veilfs: conflicts: integrity error: {e}");
    }
    if !crate::logging::quiet() && !a.json {
        eprintln!("veilfs: conflicts: {}", super::count(found.len(), "conflict copy"));
    }
    Ok(if bad.is_empty() { crate::exit::OK } else { crate::exit::INTEGRITY })
}
