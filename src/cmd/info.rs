//! `veilfs info`.

use anyhow::Result;
use std::path::PathBuf;
use veilfs_core::config::{SlotKdf, SlotKind};
use veilfs_core::VaultConfig;

/// Arguments of `veilfs info`.
#[derive(clap::Args, Debug)]
#[command(after_help = "No password is needed, so the fields shown are not yet authenticated: every command that \
unlocks the vault verifies the whole config and refuses an edited one.")]
pub struct Args {
    /// The vault (or, with --reverse, the PLAINDIR of a reverse vault).
    pub cipherdir: PathBuf,
    /// The directory is a reverse vault's PLAINDIR (found without the flag when it holds
    /// .veilfs.reverse.conf and no veilfs.conf).
    #[arg(long)]
    pub reverse: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `veilfs info`.
pub fn run(a: Args) -> Result<i32> {
    let reverse = super::is_reverse(&a.cipherdir, a.reverse);
    let cfg = VaultConfig::load_named(&a.cipherdir, super::config_name(reverse))?;
    let slots: Vec<serde_json::Value> = cfg
        .slots
        .iter()
        .map(|s| match &s.kdf {
            SlotKdf::Argon2id { memory_kib, iterations, parallelism, .. } => serde_json::json!({
                "id": s.id, "kind": s.kind, "kdf": "argon2id",
                "memory_kib": memory_kib, "iterations": iterations, "parallelism": parallelism,
            }),
            SlotKdf::HkdfSha256 { .. } => {
                serde_json::json!({"id": s.id, "kind": s.kind, "kdf": "hkdf-sha256"})
            }
        })
        .collect();
    // This client's memory of the vault (read without the key, so not yet authenticated).
    let state = if reverse { None } else { cfg.root_iv().and_then(|iv| veilfs_core::known::summary(None, &iv)) };
    let since = |t: u64| {
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t)).to_string()
    };
    if a.json {
        let client_state = state.as_ref().map(|s| {
            serde_json::json!({
                "path": s.dir,
                "client_id": s.client_id,
                "trusted_since": s.trusted_since.map(since),
                "objects_known": s.objects,
            })
        });
        let v = serde_json::json!({
            "client_state": client_state,
            "config_generation": cfg.generation,
            "path": a.cipherdir,
            "reverse": reverse,
            "format": cfg.format,
            "version": cfg.version,
            "creator": cfg.creator,
            "cipher": cfg.cipher.name(),
            "block_size": cfg.block_size,
            "features": cfg.features,
            "slots": slots,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(crate::exit::OK);
    }
    if reverse {
        println!(
            "vault:      {} (reverse: plaintext directory, config {})",
            a.cipherdir.display(),
            super::config_name(true)
        );
    } else {
        println!("vault:      {}", a.cipherdir.display());
    }
    println!("format:     {} version {} (created by {})", cfg.format, cfg.version, cfg.creator);
    println!("cipher:     {} with {} B blocks", cfg.cipher.name(), cfg.block_size);
    println!("names:      AES-256-SIV, per-directory IV, identity-bound entries");
    println!("features:   {}", cfg.features.join(", "));
    println!("key slots:");
    for s in &cfg.slots {
        match (&s.kind, &s.kdf) {
            (SlotKind::Password, SlotKdf::Argon2id { memory_kib, iterations, parallelism, .. }) => println!(
                "  {}: password (Argon2id, {} MiB, {} passes, {} lanes)",
                s.id,
                memory_kib / 1024,
                iterations,
                parallelism
            ),
            (SlotKind::Recovery, _) => println!("  {}: recovery key", s.id),
            (k, _) => println!("  {}: {}", s.id, super::slot_kind_name(*k)),
        }
    }
    if let Some(s) = &state {
        match (&s.client_id, s.trusted_since) {
            (Some(id), Some(t)) => {
                println!("client state: {} (not yet authenticated)", s.dir.display());
                println!("  client ID {id}, trusted since {}, {} object(s) known", since(t), s.objects);
            }
            _ => println!(
                "client state: {} (none yet: the first unlock on this machine trusts the vault)",
                s.dir.display()
            ),
        }
    }
    Ok(crate::exit::OK)
}
