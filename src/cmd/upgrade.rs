//! `veilfs upgrade`: convert a vault of v1 files to block maps (feature `"block-map"`), in
//! place. Every on-disk step is `veilfs_core::upgrade`; this is the front end: the lock,
//! progress, one message per file not converted, the exit code.

use super::UnlockArgs;
use anyhow::Result;
use std::path::PathBuf;
use veilfs_core::upgrade::{self, Phase, Status};
use veilfs_core::VaultConfig;

/// Arguments of `veilfs upgrade`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Gives every file of a vault made before block maps (or with `veilfs init --no-block-map`) \
header v2 and a block map, so that an older copy of a block, header or final block put back into a file is an \
integrity error (docs/FORMAT.md, section 5.10). Versions of veilfs without block maps cannot open the vault \
afterwards.\n\n\
First every file is read through once (an UNSETTLED file a crash left is settled first). If a file is damaged, \
each one is named, nothing is changed and the exit code is 6: run `veilfs fsck --repair` (which salvages or moves \
damaged files into /lost+found), then the upgrade again. A damaged file already in /lost+found (what fsck \
--repair set aside after salvaging what authenticates of it under its name) does not hold the upgrade up: it is \
left as it is, named, and the exit code is 6 (export --salvage it first if you still want something from it: \
after the upgrade it is no longer salvaged block by block). Then the config is marked \"block-map-upgrade\" and each \
file is rewritten under a temporary name in its directory (same content, holes, owner, mode, extended attributes \
and times), flushed and renamed over the original, so a crash leaves every file either old or new. Hard links stay \
one file. Symlinks, directories and special files are not touched. When every file is converted the config names \
\"block-map\".\n\n\
While the mark is there (from the check's end until the run finishes) every other veilfs command that unlocks the \
vault refuses it (exit code 5) with \"run veilfs upgrade to finish\" (`veilfs info` shows the mark); after a crash or Ctrl-C run the same command again: it removes the \
temporaries the interrupted run left and goes on where it stopped. The upgrade takes the vault lock: a mounted or \
locked vault is refused (exit code 9). It needs free space for the largest file, and as root it keeps every \
file's owner.\n\n\
Exit codes: 0 converted (or already: the vault names \"block-map\"); 6 damaged files (named; nothing changed, or, \
in /lost+found, left as they are); 1 other errors (named; run it again); 2 a deterministic (--reverse) vault, which has \
no block maps. Export into a new vault (veilfs init, veilfs import) is the other way to get block maps.")]
pub struct Args {
    /// The vault.
    pub cipherdir: PathBuf,
    #[command(flatten)]
    pub unlock: UnlockArgs,
    #[command(flatten)]
    pub lock: super::LockArgs,
}

/// Runs `veilfs upgrade`.
pub fn run(a: Args) -> Result<i32> {
    let cfg = VaultConfig::load(&a.cipherdir)?;
    match upgrade::status(&cfg) {
        Status::Done => {
            eprintln!(
                "veilfs: upgrade: {} already has block maps (feature \"block-map\"): nothing to do",
                a.cipherdir.display()
            );
            return Ok(crate::exit::OK);
        }
        Status::Deterministic => {
            return Err(crate::exit::Exit::new(
                crate::exit::USAGE,
                anyhow::anyhow!(
                    "{} is a deterministic (--reverse) vault: its files do not get block maps",
                    a.cipherdir.display()
                ),
            )
            .into())
        }
        Status::Fresh | Status::Unfinished => {}
    }
    let resuming = upgrade::status(&cfg) == Status::Unfinished;
    let _lock = a.lock.take(&a.cipherdir, "upgrade")?;
    super::refuse_if_mounted(&a.cipherdir, "upgrading")?;
    let mut vault = a.unlock.open_for_upgrade(&a.cipherdir)?;
    let total = super::plain_bytes_under(vault.root_path(), vault.content());
    let pb = super::progress(if resuming { total } else { 2 * total }, "checking");
    let files = std::cell::Cell::new(0u64);
    let progress = |phase: Phase, n: u64| {
        files.set(files.get() + 1);
        pb.inc(n);
        let what = match phase {
            Phase::Check => "checking",
            Phase::Convert => "converting",
        };
        pb.set_message(format!("{what} ({} files)", files.get()));
    };
    // Ctrl-C (or SIGTERM, SIGHUP) ends the run between two files, as a crash would but with
    // no temporary left; `main` then dies of the signal.
    crate::interrupt::catch();
    let opts = upgrade::Options { interrupted: Some(crate::interrupt::requested), ..Default::default() };
    let report = match upgrade::run(&mut vault, &opts, &progress) {
        Err(e) if upgrade::is_interrupted(&e) => {
            pb.finish_and_clear();
            eprintln!("veilfs: upgrade: {e} (every file is either old or new)");
            return Ok(crate::exit::OTHER);
        }
        r => r?,
    };
    pb.finish_and_clear();
    for l in &report.leftovers {
        eprintln!("veilfs: upgrade: {l}: left by an interrupted upgrade: finished or removed");
    }
    for p in &report.problems {
        let what = match (p.damaged, p.left) {
            (_, true) => "damaged, left as it is",
            (true, false) => "damaged",
            (false, false) => "not converted",
        };
        eprintln!("veilfs: upgrade: {what}: {} (/{}): {}", p.cipher_path, p.plain_path.display(), p.detail);
    }
    let damaged = report.problems.iter().any(|p| p.damaged);
    if report.refused {
        eprintln!(
            "veilfs: upgrade: nothing was changed: repair the damaged files first (veilfs fsck --repair {}), then run \
             the upgrade again",
            a.cipherdir.display()
        );
    } else if !report.finished {
        eprintln!(
            "veilfs: upgrade: not finished: the vault opens for nothing but the upgrade until it is; fix what is named \
             above and run veilfs upgrade {} again",
            a.cipherdir.display()
        );
    }
    if !crate::logging::quiet() {
        eprintln!(
            "veilfs: upgrade: {} converted ({}, {} with several names), {} unchanged, {} settled first, {} not \
             converted{}",
            super::count(report.converted as usize, "file"),
            super::human_size(report.bytes),
            report.linked,
            report.unchanged,
            report.settled,
            report.problems.len(),
            if report.finished { "; the vault has block maps (feature \"block-map\")" } else { "" }
        );
    }
    Ok(match (report.finished, damaged) {
        (_, true) => crate::exit::INTEGRITY,
        (true, false) => crate::exit::OK,
        (false, false) => crate::exit::OTHER,
    })
}
