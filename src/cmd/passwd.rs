//! `veilfs passwd`.

use super::UnlockArgs;
use crate::password::PasswordArgs;
use anyhow::Result;
use std::path::PathBuf;
use veilfs_core::config::SlotKind;
use veilfs_core::RecoveryKey;

/// Arguments of `veilfs passwd`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
veilfs passwd VAULT                      change the password (asks old, then new twice)\n  \
veilfs passwd VAULT --add                add a second password slot\n  \
veilfs passwd VAULT --remove-slot 2      remove slot 2 (see `veilfs info`)\n  \
veilfs passwd VAULT --recovery-key       forgot the password: unlock with the recovery key, set a new one\n  \
veilfs passwd VAULT --new-recovery-key   replace the recovery key (the old one stops working)\n\n\
With --password-stdin, the first line is the current secret and the second the new password.")]
pub struct Args {
    /// The vault.
    pub cipherdir: PathBuf,
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
    /// Read the new password from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    pub new_passfile: Option<PathBuf>,
    /// Run CMD and use its first output line as the new password.
    #[arg(long, value_name = "CMD")]
    pub new_extpass: Option<String>,
    #[command(flatten)]
    pub kdf: super::KdfArgs,
}

/// Runs `veilfs passwd`.
pub fn run(a: Args) -> Result<i32> {
    let mut vault = a.unlock.open(&a.cipherdir)?;
    let mut cfg = vault.config().clone();
    if let Some(id) = a.remove_slot {
        let removed = cfg.remove_slot(id)?;
        vault.save_config(cfg)?;
        eprintln!("veilfs: removed key slot {id} ({:?})", removed.kind);
        return Ok(crate::exit::OK);
    }
    if a.new_recovery_key {
        let old: Vec<u32> = cfg.slots.iter().filter(|s| s.kind == SlotKind::Recovery).map(|s| s.id).collect();
        let rk = RecoveryKey::generate();
        let id = cfg.add_recovery_slot(vault.master_key(), &rk);
        cfg.slots.retain(|s| !old.contains(&s.id));
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
        (false, false, None) => anyhow::bail!(
            "the vault has several password slots ({password_slots:?}); say which one to replace with --slot N, \
             or use --add / --remove-slot"
        ),
    };
    let new_src = if a.new_passfile.is_some() || a.new_extpass.is_some() {
        PasswordArgs { passfile: a.new_passfile.clone(), password_stdin: false, extpass: a.new_extpass.clone() }
    } else {
        PasswordArgs { passfile: None, password_stdin: a.unlock.password.password_stdin, extpass: None }
    };
    let new_pw = new_src.read_new("New password")?;
    let params = a.kdf.params()?;
    let id = cfg.add_password_slot(vault.master_key(), &new_pw, params)?;
    cfg.slots.retain(|s| !drop.contains(&s.id));
    vault.save_config(cfg)?;
    if a.add {
        eprintln!("veilfs: added password slot {id}");
    } else {
        eprintln!("veilfs: password changed (now slot {id})");
    }
    Ok(crate::exit::OK)
}
