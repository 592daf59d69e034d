//! `veilfs fsck`: check a whole vault, and repair what a crash can leave behind. The walk
//! itself is `veilfs_core::fsck` (the same steps the mount and the other tools use); this
//! is the front end: progress, the report, the exit code.

use super::UnlockArgs;
use anyhow::Result;
use std::path::PathBuf;
use veilfs_core::fsck::{Checker, ProblemKind, Report};

/// Arguments of `veilfs fsck`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Checks the config, every directory IV, entry name and binding, long-name side file, \
symlink, extended attribute and content block. Without --repair nothing is written and no lock is taken, so it \
can run while the vault is mounted. --repair fixes what a crash leaves behind (temporary names, duplicate entries \
for one name, orphaned long-name side files, a missing directory IV copy, the partial copy of an interrupted import), \
renames sync tools' conflict copies (and the older of two valid entries for one name) to the names they are shown \
under, so they become ordinary files, and \
moves damaged or stray objects into /lost+found in the vault, where whatever still authenticates can be read \
again; it deletes no file data. A damaged file whose header still authenticates (a write or truncate a crash cut \
short) is salvaged: a copy of every block that authenticates takes its name, unreadable blocks inside become zeros \
and a torn end is cut off, and the report names the byte ranges lost. --repair takes the vault lock: while the \
vault is mounted it is refused (exit code 9). Exit code 0: clean (or everything repaired); 6: problems remain.")]
pub struct Args {
    /// The vault.
    pub cipherdir: PathBuf,
    /// Repair crash leftovers and move damaged objects into /lost+found (not while mounted).
    #[arg(long)]
    pub repair: bool,
    /// Adopt the vault as it is now into this client's memory of it: files and a config older
    /// than this client saw (reported as rolled back) are trusted from now on. Only after
    /// deciding that the older versions are wanted (a restore from a backup, say).
    #[arg(long)]
    pub accept: bool,
    /// Print the report as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
    #[command(flatten)]
    pub lock: super::LockArgs,
}

fn kind_name(k: ProblemKind) -> &'static str {
    match k {
        ProblemKind::Damaged => "damaged",
        ProblemKind::Foreign => "not a veilfs object",
        ProblemKind::TempName => "crash leftover (temporary name)",
        ProblemKind::Duplicate => "crash leftover (duplicate entry)",
        ProblemKind::OrphanSideFile => "crash leftover (orphaned side file)",
        ProblemKind::OrphanXattrPiece => "crash leftover (orphaned xattr continuation)",
        ProblemKind::MissingDirIv => "crash leftover (missing directory IV)",
        ProblemKind::Unsettled => "recovered crash state (unsettled file)",
        ProblemKind::StrayLog => "damaged (a write-session log of no session of its file)",
        ProblemKind::RolledBack => "rolled back (older than this client saw)",
        ProblemKind::Deleted => "deleted by a non-client (entries missing without a tombstone)",
        ProblemKind::Resurrected => "resurrected (present while a client's tombstone says deleted)",
    }
}

/// Runs `veilfs fsck`.
pub fn run(a: Args) -> Result<i32> {
    let _lock = if a.repair { Some(a.lock.take(&a.cipherdir, "fsck")?) } else { None };
    if a.repair {
        // A --shared-storage mount takes no lock: the mount table names it.
        let dir = a.cipherdir.canonicalize().unwrap_or_else(|_| a.cipherdir.clone());
        if let Some(m) = crate::mountinfo::all().into_iter().find(|m| m.is_veilfs() && m.source == dir) {
            return Err(crate::exit::Exit::new(
                crate::exit::IN_USE,
                anyhow::anyhow!(
                    "{} is mounted at {}: unmount it before --repair (a check without --repair works while mounted)",
                    a.cipherdir.display(),
                    m.mount_point.display()
                ),
            )
            .into());
        }
    }
    let trust = if a.accept { veilfs_core::known::Trust::Accept } else { veilfs_core::known::Trust::Check };
    let vault = a.unlock.open_trusting(&a.cipherdir, trust)?;
    let total = super::plain_bytes_under(vault.root_path(), vault.content());
    let pb = super::progress(total, "checking");
    let files = std::cell::Cell::new(0u64);
    let progress = |n: u64| {
        files.set(files.get() + 1);
        pb.inc(n);
        pb.set_message(format!("checking ({} files)", files.get()));
    };
    let report = Checker::new(&vault, a.repair, &progress).run()?;
    pb.finish_and_clear();
    print_report(&a, &report)?;
    if let Some(k) = vault.known().filter(|_| a.accept) {
        k.flush()?;
        eprintln!(
            "veilfs: fsck: --accept: the vault as it is now is what this client remembers ({} file(s), config \
             generation {}; {})",
            k.objects(),
            k.config_generation(),
            k.dir().display()
        );
    }
    Ok(if report.is_clean() { crate::exit::OK } else { crate::exit::INTEGRITY })
}

fn print_report(a: &Args, r: &Report) -> Result<()> {
    if a.json {
        let mut v = serde_json::to_value(r)?;
        v["clean"] = serde_json::Value::Bool(r.is_clean());
        v["vault"] = serde_json::json!(a.cipherdir);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for f in &r.sync_files {
        eprintln!("veilfs: fsck: foreign (sync tool: {}): {}: left alone", f.tool, f.cipher_path.display());
    }
    for c in &r.conflicts {
        let shown = c.plain_path.as_ref().map(|p| format!(" (shown as /{})", p.display())).unwrap_or_default();
        let of =
            if c.plain_path.is_some() { format!("/{}", c.copy_of.display()) } else { c.copy_of.display().to_string() };
        let detail = if c.detail.is_empty() { String::new() } else { format!(": {}", c.detail) };
        let fixed = c.repaired.as_ref().map(|w| format!("; repaired: {w}")).unwrap_or_default();
        eprintln!(
            "veilfs: fsck: conflict copy ({} copy of {of}): {}{shown}{detail}{fixed}",
            c.tool,
            c.cipher_path.display()
        );
    }
    for p in &r.problems {
        let plain = p.plain_path.as_ref().map(|p| format!(" (/{})", p.display())).unwrap_or_default();
        let fixed = p.repaired.as_ref().map(|w| format!("; repaired: {w}")).unwrap_or_default();
        eprintln!("veilfs: fsck: {}: {}{plain}: {}{fixed}", kind_name(p.kind), p.cipher_path.display(), p.detail);
    }
    if !crate::logging::quiet() {
        let leftovers = r.problems.iter().filter(|p| p.kind.is_crash_leftover()).count();
        let repaired = r.problems.iter().filter(|p| p.repaired.is_some()).count();
        eprintln!(
            "veilfs: fsck: checked {}, {} ({}), {}, {}: {} ({} crash leftover(s), {} damaged), {} repaired",
            super::count(r.dirs as usize, "directory"),
            super::count(r.files as usize, "file"),
            super::human_size(r.bytes),
            super::count(r.symlinks as usize, "symlink"),
            super::count(r.specials as usize, "special file"),
            super::count(r.problems.len(), "problem"),
            leftovers,
            r.problems.len() - leftovers,
            repaired
        );
    }
    Ok(())
}
