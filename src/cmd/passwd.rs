//! `veilfs passwd`: change a password, add or remove key slots, reset a password with the
//! recovery key. Slot numbers are stable: a changed password keeps its slot's number, and
//! a new slot takes the lowest free one.

use super::{check_slot, slot_kind_name, UnlockArgs};
use crate::exit::{Exit, OTHER, USAGE};
use crate::password::PasswordArgs;
use anyhow::Result;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use veilfs_core::config::SlotKind;
use veilfs_core::keys::MasterKey;
use veilfs_core::reverse::ReverseVault;
use veilfs_core::{RecoveryKey, Vault, VaultConfig};

/// Arguments of `veilfs passwd`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
veilfs passwd VAULT                      change the password (asks old, then new twice)\n  \
veilfs passwd VAULT --add                add a second password slot\n  \
veilfs passwd VAULT --remove-slot 2      remove slot 2 (see `veilfs info`)\n  \
veilfs passwd VAULT --recovery-key       forgot the password: unlock with the recovery key, set a new one\n  \
veilfs passwd VAULT --new-recovery-key   replace the recovery key (the old one stops working)\n\n\
Slot numbers never change: a changed password keeps its slot number, a new slot gets the lowest free one. \
Removing the last recovery key asks for confirmation (or needs --yes without a terminal).\n\n\
With --password-stdin, the first line is the current secret and the second the new password.\n\n\
passwd works while the vault is mounted: it changes only the key slots in veilfs.conf (replaced at once, by a \
rename), and a mount needs them only when it unlocks. Two passwd commands on one vault wait for each other.\n\n\
A reverse vault (PLAINDIR made by `veilfs init --reverse`) is found by its .veilfs.reverse.conf, or named with \
--reverse; only that file changes, and so does veilfs.conf in its view (a live reverse mount shows the new one at \
once): the keys stay, so the rest of the view and of its backups stays byte for byte the same, and the next backup \
of the view carries the new password. Backups made before keep the old slots. A reverse vault takes no lock.")]
pub struct Args {
    /// The vault (or, with --reverse, the PLAINDIR of a reverse vault).
    pub cipherdir: PathBuf,
    /// The directory is a reverse vault's PLAINDIR (found without the flag when it holds
    /// .veilfs.reverse.conf and no veilfs.conf).
    #[arg(long)]
    pub reverse: bool,
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Add a new password slot instead of replacing one.
    #[arg(long, conflicts_with_all = ["remove_slot", "new_recovery_key"])]
    pub add: bool,
    /// Remove key slot N.
    #[arg(long, value_name = "N", conflicts_with = "new_recovery_key")]
    pub remove_slot: Option<u32>,
    /// Replace the recovery key with a new one (printed once).
    #[arg(long)]
    pub new_recovery_key: bool,
    /// Do not ask before removing the last recovery key.
    #[arg(short, long)]
    pub yes: bool,
    /// Read the new password from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    pub new_passfile: Option<PathBuf>,
    /// Run CMD and use its first output line as the new password.
    #[arg(long, value_name = "CMD")]
    pub new_extpass: Option<String>,
    #[command(flatten)]
    pub kdf: super::KdfArgs,
}

/// Asks on the terminal whether to remove the last recovery key; without a terminal the
/// answer must be given as `--yes`.
fn confirm_last_recovery(id: u32) -> Result<()> {
    let question = format!(
        "Slot {id} is the vault's only recovery key: without it, a forgotten password cannot be reset. \
         Remove it? [y/N] "
    );
    let tty = std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty");
    let (Ok(tty), true) = (tty, std::io::stdin().is_terminal() || std::io::stderr().is_terminal()) else {
        return Err(Exit::new(
            USAGE,
            anyhow::anyhow!("slot {id} is the only recovery key; to remove it without a terminal, add --yes"),
        )
        .into());
    };
    let mut w = &tty;
    w.write_all(question.as_bytes())?;
    let mut answer = String::new();
    std::io::BufReader::new(&tty).read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(Exit::new(OTHER, anyhow::anyhow!("nothing was removed")).into())
    }
}

/// Checks of `--remove-slot N` that need no password: the slot exists, is not the last
/// password slot, and removing the last recovery key is confirmed.
fn check_removal(cfg: &VaultConfig, id: u32, yes: bool) -> Result<()> {
    check_slot(cfg, id, None)?;
    let kind = cfg.slots.iter().find(|s| s.id == id).map(|s| s.kind);
    let count = |k: SlotKind| cfg.slots.iter().filter(|s| s.kind == k).count();
    match kind {
        Some(SlotKind::Password) if count(SlotKind::Password) == 1 => Err(Exit::new(
            OTHER,
            anyhow::anyhow!("slot {id} is the last password slot; add another password first (--add)"),
        )
        .into()),
        Some(SlotKind::Recovery) if count(SlotKind::Recovery) == 1 && !yes => confirm_last_recovery(id),
        _ => Ok(()),
    }
}

/// A vault unlocked for `passwd`: forward, or the reverse config of a PLAINDIR.
enum Unlocked {
    Forward(Box<Vault>),
    Reverse(Box<ReverseVault>),
}

impl Unlocked {
    fn config(&self) -> &VaultConfig {
        match self {
            Unlocked::Forward(v) => v.config(),
            Unlocked::Reverse(r) => r.vault().config(),
        }
    }

    fn master_key(&self) -> &MasterKey {
        match self {
            Unlocked::Forward(v) => v.master_key(),
            Unlocked::Reverse(r) => r.vault().master_key(),
        }
    }

    fn save_config(&mut self, cfg: VaultConfig) -> veilfs_core::Result<()> {
        match self {
            Unlocked::Forward(v) => v.save_config(cfg),
            Unlocked::Reverse(r) => r.save_config(cfg),
        }
    }
}

/// Runs `veilfs passwd`.
pub fn run(a: Args) -> Result<i32> {
    // Everything that needs no password is checked first.
    let reverse = super::is_reverse(&a.cipherdir, a.reverse);
    let on_disk = VaultConfig::load_named(&a.cipherdir, super::config_name(reverse))?;
    let changes_password = a.remove_slot.is_none() && !a.new_recovery_key;
    let params = if changes_password { Some(a.kdf.params(a.unlock.allow_slow_kdf)?) } else { None };
    if let Some(id) = a.remove_slot {
        check_removal(&on_disk, id, a.yes)?;
    }
    // Not the vault lock: a mount keeps working (it needs the slots only to unlock); only
    // another config change waits. A reverse vault has no lock file: a file in PLAINDIR
    // would be an entry of the view.
    let _lock = if reverse { None } else { Some(veilfs_core::lock::ConfigLock::acquire(&a.cipherdir)?) };
    let mut vault = if reverse {
        Unlocked::Reverse(Box::new(a.unlock.open_reverse(&a.cipherdir)?))
    } else {
        Unlocked::Forward(Box::new(a.unlock.open(&a.cipherdir)?))
    };
    let mut cfg = vault.config().clone();
    let quiet = crate::logging::quiet();
    if let Some(id) = a.remove_slot {
        let removed = cfg.remove_slot(id)?;
        vault.save_config(cfg)?;
        if !quiet {
            eprintln!("veilfs: removed key slot {id} ({})", slot_kind_name(removed.kind));
        }
        return Ok(crate::exit::OK);
    }
    if a.new_recovery_key {
        let rk = RecoveryKey::generate();
        cfg.slots.retain(|s| s.kind != SlotKind::Recovery);
        let id = cfg.add_recovery_slot(vault.master_key(), &rk)?;
        cfg.slots.sort_by_key(|s| s.id);
        vault.save_config(cfg)?;
        eprintln!("veilfs: new recovery key in slot {id} (shown only now; the old one no longer works):");
        println!("{}", rk.display());
        return Ok(crate::exit::OK);
    }
    // Which slots a replacement drops: decided before asking for the new password.
    let password_slots: Vec<u32> = cfg.slots.iter().filter(|s| s.kind == SlotKind::Password).map(|s| s.id).collect();
    let drop: Vec<u32> = match (a.add, a.unlock.recovery_key, a.unlock.slot) {
        (true, _, _) => Vec::new(),
        // The password was lost: every password slot is replaced by the new one.
        (false, true, _) => password_slots,
        (false, false, Some(s)) => vec![s],
        (false, false, None) if password_slots.len() == 1 => password_slots,
        (false, false, None) => {
            let ids: Vec<String> = password_slots.iter().map(|s| s.to_string()).collect();
            return Err(Exit::new(
                USAGE,
                anyhow::anyhow!(
                    "the vault has several password slots ({}); say which one to replace with --slot N, \
                     or use --add / --remove-slot",
                    ids.join(", ")
                ),
            )
            .into());
        }
    };
    let new_src = if a.new_passfile.is_some() || a.new_extpass.is_some() {
        PasswordArgs { passfile: a.new_passfile.clone(), password_stdin: false, extpass: a.new_extpass.clone() }
    } else {
        PasswordArgs { passfile: None, password_stdin: a.unlock.password.password_stdin, extpass: None }
    };
    let new_pw = new_src.read_new("New password")?;
    let params = params.expect("checked above for a password change");
    super::kdf_notice(params.memory_kib);
    // Drop first, then add: the new slot takes the lowest free number, which is the
    // replaced slot's own (the config is only written once both steps succeeded).
    cfg.slots.retain(|s| !drop.contains(&s.id));
    let id = cfg.add_password_slot(vault.master_key(), &new_pw, params)?;
    cfg.slots.sort_by_key(|s| s.id);
    vault.save_config(cfg)?;
    if !quiet {
        if a.add {
            eprintln!("veilfs: added password slot {id}");
        } else {
            eprintln!("veilfs: password changed (slot {id})");
        }
    }
    Ok(crate::exit::OK)
}
