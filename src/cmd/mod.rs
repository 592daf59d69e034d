//! One module per subcommand; shared helpers here.

pub mod cat;
pub mod conflicts;
pub mod export;
pub mod fsck;
pub mod generate;
pub mod import;
pub mod info;
pub mod init;
pub mod ls;
pub mod mount;
pub mod mountargs;
pub mod mountopts;
pub mod passwd;
pub mod paths;
pub mod speed;
pub mod upgrade;

use crate::exit::{Exit, USAGE, WRONG_PASSWORD};
use crate::password::PasswordArgs;
use anyhow::{Context, Result};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use veilfs_core::config::{SlotKdf, SlotKind};
use veilfs_core::holder::Holder;
use veilfs_core::kdf::{Argon2Params, KdfCeiling};
use veilfs_core::known::{KnownOptions, Trust};
use veilfs_core::names;
use veilfs_core::reverse::{ReverseVault, REVERSE_CONFIG_NAME};
use veilfs_core::{Error, RecoveryKey, Secret, Vault, VaultConfig, VaultLock};

/// How to unlock an existing vault.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct UnlockArgs {
    #[command(flatten)]
    pub password: PasswordArgs,
    /// Unlock with the recovery key (shown at `veilfs init`) instead of a password.
    #[arg(long)]
    pub recovery_key: bool,
    /// Try only key slot N (see `veilfs info`); slot numbers never change.
    #[arg(long, value_name = "N")]
    pub slot: Option<u32>,
    /// Try key slots whose key derivation costs more than the ceiling (1 GiB of memory,
    /// 4 GiB·passes): only for a vault made with such settings. Without it such slots are
    /// skipped, so a forged slot cannot make unlocking take minutes.
    #[arg(long)]
    pub allow_slow_kdf: bool,
}

/// The recovery option of the commands that read files (mount, cat, export).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RollbackArgs {
    /// Read files (and a config) older than this client saw anyway, for recovery: no
    /// integrity error, and this client's memory of the vault is left as it is (see `veilfs
    /// info` for where it is kept; `veilfs fsck --accept` adopts the current state instead).
    #[arg(long)]
    pub allow_rollback: bool,
}

impl RollbackArgs {
    /// What rollback checks do.
    pub fn trust(&self) -> Trust {
        if self.allow_rollback {
            Trust::AllowRollback
        } else {
            Trust::Check
        }
    }
}

/// The vault lock option of every command that writes a vault (mount, import, passwd,
/// fsck --repair).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LockArgs {
    /// Accepted for older command lines and fstab entries; does nothing. The vault lock is an
    /// OS lock that dies with its holder, and a lock file that came from another machine
    /// (synced or copied) never blocks, so there is nothing to break.
    #[arg(long, hide = true)]
    pub break_lock: bool,
}

impl LockArgs {
    /// Takes the lock of the vault in `cipherdir` for `command` (see `veilfs_core::lock`):
    /// before any password is asked for, so a vault in use is refused at once. A holder that
    /// is a mount of this machine no longer in the mount table is unmounting: it is waited
    /// for a moment (`fusermount3 -u` returns before the daemon lets go of the lock).
    pub fn take(&self, cipherdir: &Path, command: &str) -> Result<VaultLock> {
        VaultConfig::load(cipherdir)?;
        if self.break_lock {
            tracing::info!("--break-lock is no longer needed and does nothing: a lock file never blocks by itself");
        }
        let source = cipherdir.canonicalize().unwrap_or_else(|_| cipherdir.to_path_buf());
        let ending = |h: &Holder| {
            h.command == "mount"
                && h.is_this_host()
                && matches!(crate::mountinfo::find_veilfs_source(&source), Ok(None))
        };
        Ok(VaultLock::acquire(cipherdir, command, &ending)?)
    }
}

/// Refuses (exit code 9) a vault that a `--shared-storage` mount, which takes no lock, has
/// mounted: for the offline commands that write the vault (`doing` says what).
pub fn refuse_if_mounted(cipherdir: &Path, doing: &str) -> Result<()> {
    let dir = cipherdir.canonicalize().unwrap_or_else(|_| cipherdir.to_path_buf());
    if let Some(m) = crate::mountinfo::all().into_iter().find(|m| m.is_veilfs() && m.source == dir) {
        return Err(Exit::new(
            crate::exit::IN_USE,
            anyhow::anyhow!(
                "{} is mounted at {}: unmount it before {doing} it",
                cipherdir.display(),
                m.mount_point.display()
            ),
        )
        .into());
    }
    Ok(())
}

/// Whether `dir` is to be taken as a reverse vault (its config `.veilfs.reverse.conf`):
/// `--reverse` was given, or `dir` holds that config and no `veilfs.conf` (so `passwd` and
/// `info` find a PLAINDIR without the flag; a directory with both needs `--reverse`).
pub fn is_reverse(dir: &Path, flag: bool) -> bool {
    flag || (!VaultConfig::path_in(dir).exists() && dir.join(REVERSE_CONFIG_NAME).symlink_metadata().is_ok())
}

/// The config file of a forward (`veilfs.conf`) or reverse vault.
pub fn config_name(reverse: bool) -> &'static str {
    if reverse {
        REVERSE_CONFIG_NAME
    } else {
        names::CONFIG_NAME
    }
}

/// "Slot N" in user terms.
pub fn slot_kind_name(kind: SlotKind) -> &'static str {
    match kind {
        SlotKind::Password => "password",
        SlotKind::Recovery => "recovery key",
    }
}

/// Checks that slot `id` exists (and, with `kind`, is of that kind): a usage error (2)
/// otherwise, found before any password is asked for.
pub fn check_slot(cfg: &VaultConfig, id: u32, kind: Option<SlotKind>) -> Result<()> {
    let ids: Vec<String> = cfg.slots.iter().map(|s| s.id.to_string()).collect();
    match cfg.slots.iter().find(|s| s.id == id) {
        None => Err(Exit::new(
            USAGE,
            anyhow::anyhow!("there is no key slot {id} (the vault has slots {}; see `veilfs info`)", ids.join(", ")),
        )
        .into()),
        Some(s) if kind.is_some_and(|k| k != s.kind) => Err(Exit::new(
            USAGE,
            anyhow::anyhow!(
                "key slot {id} is a {} slot, not a {} slot{}",
                slot_kind_name(s.kind),
                slot_kind_name(kind.unwrap_or(s.kind)),
                if s.kind == SlotKind::Recovery { " (use --recovery-key)" } else { "" }
            ),
        )
        .into()),
        Some(_) => Ok(()),
    }
}

/// Says "deriving the key (Argon2id, N MiB)…" on a terminal before a slow derivation.
pub fn kdf_notice(memory_kib: u32) {
    if crate::logging::interactive() {
        eprintln!("veilfs: deriving the key (Argon2id, {} MiB)…", memory_kib / 1024);
    }
}

impl UnlockArgs {
    /// Checks `--slot` against `cfg` and reads the secret (before any key is derived).
    fn secret(&self, cfg: &VaultConfig) -> Result<Secret> {
        let want = if self.recovery_key { SlotKind::Recovery } else { SlotKind::Password };
        if let Some(id) = self.slot {
            check_slot(cfg, id, Some(want))?;
        }
        Ok(if self.recovery_key {
            let text = self.password.read("Recovery key")?;
            use secrecy::ExposeSecret;
            // A malformed key (a typo) is a wrong secret, not an error of the vault.
            Secret::Recovery(RecoveryKey::parse(text.expose_secret()).map_err(|e| Exit::new(WRONG_PASSWORD, e))?)
        } else {
            let password = self.password.read("Password")?;
            let slot = cfg.slots.iter().find(|s| s.kind == want && self.slot.is_none_or(|id| id == s.id));
            if let Some(SlotKdf::Argon2id { memory_kib, .. }) = slot.map(|s| &s.kdf) {
                kdf_notice(*memory_kib);
            }
            Secret::Password(password)
        })
    }

    fn ceiling(&self) -> KdfCeiling {
        if self.allow_slow_kdf {
            KdfCeiling::UNLIMITED
        } else {
            KdfCeiling::DEFAULT
        }
    }

    /// Reads the secret and opens the reverse vault of PLAINDIR (`--reverse`).
    pub fn open_reverse(&self, plaindir: &Path) -> Result<ReverseVault> {
        let cfg = VaultConfig::load_named(plaindir, REVERSE_CONFIG_NAME)?;
        let secret = self.secret(&cfg)?;
        ReverseVault::open_with(plaindir, &secret, self.slot, &self.ceiling())
            .with_context(|| format!("cannot open the reverse vault of {}", plaindir.display()))
    }

    /// Reads the secret and opens the vault, checking it against this client's memory of it
    /// (`veilfs_core::known`): an older config or file than this client saw is an integrity
    /// error. Everything that can be checked without the secret (the config, `--slot`) is
    /// checked before asking for it.
    pub fn open(&self, cipherdir: &Path) -> Result<Vault> {
        self.open_trusting(cipherdir, Trust::Check)
    }

    /// [`open`](Self::open) for `veilfs upgrade`: also a vault whose upgrade is unfinished,
    /// and without the client's memory (`veilfs_core::known`), which the upgrade's mixed
    /// vault is not read by: the first command after the upgrade remembers its files, as at
    /// a first use of block-map files.
    pub fn open_for_upgrade(&self, cipherdir: &Path) -> Result<Vault> {
        self.open_by(cipherdir, Vault::open_for_upgrade)
    }

    /// [`open`](Self::open) with what rollback checks do: `--allow-rollback` reads anyway,
    /// `fsck --accept` adopts what is there. A client state that cannot be made (no home, a
    /// read-only one) only costs the detection, and says so; one that does not authenticate,
    /// or an older config, refuses the vault.
    pub fn open_trusting(&self, cipherdir: &Path, trust: Trust) -> Result<Vault> {
        let mut vault = self.open_by(cipherdir, Vault::open_with)?;
        match vault.remember(&KnownOptions { root: None, trust }) {
            Ok(_) => {}
            Err(e @ Error::Io { .. }) => {
                tracing::warn!("no rollback detection for this run: {e}");
            }
            Err(e) => return Err(e.into()),
        }
        Ok(vault)
    }

    fn open_by(
        &self,
        cipherdir: &Path,
        open: fn(&Path, &Secret, Option<u32>, &KdfCeiling) -> veilfs_core::Result<Vault>,
    ) -> Result<Vault> {
        let cfg = VaultConfig::load(cipherdir)?;
        let secret = self.secret(&cfg)?;
        let t = std::time::Instant::now();
        let vault = open(cipherdir, &secret, self.slot, &self.ceiling())
            .with_context(|| format!("cannot open the vault in {}", cipherdir.display()))?;
        tracing::info!("unlocked {} in {:.2} s", cipherdir.display(), t.elapsed().as_secs_f64());
        tracing::debug!(
            "{}: {}, {} B blocks, {} key slot(s)",
            cipherdir.display(),
            vault.config().cipher.name(),
            vault.config().block_size,
            vault.config().slots.len()
        );
        Ok(vault)
    }
}

/// Argon2id cost options of a new password slot (`init`, `passwd`), range-checked when
/// the command line is parsed.
#[derive(clap::Args, Debug, Clone)]
pub struct KdfArgs {
    /// Argon2id memory in MiB (1..=4096).
    #[arg(long, default_value_t = Argon2Params::DEFAULT.memory_kib / 1024, value_name = "MiB",
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub kdf_memory: u32,
    /// Argon2id passes (1..=100).
    #[arg(long, default_value_t = Argon2Params::DEFAULT.iterations, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub kdf_iterations: u32,
    /// Argon2id lanes (1..=64).
    #[arg(long, default_value_t = Argon2Params::DEFAULT.parallelism, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub kdf_parallelism: u32,
}

impl KdfArgs {
    /// The parameters, validated (a usage error otherwise). Call before any prompt. A slot
    /// above the ceiling every unlock applies is made only with `allow_slow` (the command's
    /// `--allow-slow-kdf`): otherwise no unlock without that flag could open it.
    pub fn params(&self, allow_slow: bool) -> Result<Argon2Params> {
        let p = Argon2Params {
            memory_kib: self.kdf_memory.saturating_mul(1024),
            iterations: self.kdf_iterations,
            parallelism: self.kdf_parallelism,
        };
        p.validate().map_err(|e| Exit::new(USAGE, e))?;
        let ceiling = KdfCeiling::DEFAULT;
        if !allow_slow && !p.within(&ceiling) {
            return Err(Exit::new(
                USAGE,
                anyhow::anyhow!(
                    "--kdf-memory {} MiB × --kdf-iterations {} is above what an unlock tries without \
                     --allow-slow-kdf ({} MiB, {} MiB·passes): every unlock of that slot would need that flag; give \
                     --allow-slow-kdf here too to make it anyway",
                    self.kdf_memory,
                    self.kdf_iterations,
                    ceiling.memory_kib / 1024,
                    ceiling.memory_passes_kib / 1024
                ),
            )
            .into());
        }
        if p.memory_kib < 64 * 1024 || p.iterations < 2 {
            eprintln!("veilfs: warning: weak key derivation settings; only use them for tests");
        }
        Ok(p)
    }
}

/// The same error, naming the plaintext path the user gave (`VAULT/some/path`); an
/// integrity error names the damaged ciphertext file too, which is what to restore from a
/// backup. The variant, and so the exit code, is kept.
pub fn plain_path_error(e: Error, user_path: &Path) -> Error {
    match e {
        Error::Io { source, .. } => Error::io(user_path.display().to_string(), source),
        Error::Auth { what, detail } => Error::auth(format!("{} (ciphertext {what})", user_path.display()), detail),
        other => other,
    }
}

/// "No such file or directory" for a plaintext path the user gave.
pub fn not_found(user_path: &Path) -> Error {
    Error::io(user_path.display().to_string(), std::io::Error::from_raw_os_error(libc::ENOENT))
}

/// `n` bytes in binary units, as `ls -h` and `du -h` print them: 999, 1.0K, 15M, 2.3G.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["K", "M", "G", "T", "P", "E"];
    if n < 1024 {
        return n.to_string();
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    // Like coreutils: one decimal below 10, rounded up so a size is never understated.
    if v < 10.0 {
        format!("{:.1}{}", (v * 10.0).ceil() / 10.0, UNITS[unit])
    } else {
        format!("{}{}", v.ceil() as u64, UNITS[unit])
    }
}

/// A progress bar of `len` bytes on stderr when it is a terminal and `-q` was not given;
/// hidden otherwise.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    if !crate::logging::interactive() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// The line that ends an import or export, e.g. "veilfs: exported 12 files (3538 bytes,
/// 3.5K), skipped 0 identical, 0 conflicts, 0 errors". Not shown under `-q`.
pub fn summary(verb: &str, files: u64, bytes: u64, skipped: usize, conflicts: usize, errors: &str) {
    if !crate::logging::quiet() {
        let s = if files == 1 { "" } else { "s" };
        eprintln!(
            "veilfs: {verb} {files} file{s} ({bytes} bytes, {}), skipped {skipped} identical, {}, {errors}",
            human_size(bytes),
            count(conflicts, "conflict")
        );
    }
}

/// An existing entry that differs from its source and is kept (`import`, `export` without
/// `--overwrite`): counted apart from errors.
#[derive(Debug)]
pub struct Conflict(pub &'static str);

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Conflict {}

/// After an import or export that a signal interrupted: says how to resume (`main` then
/// dies of that signal, once everything is dropped: the vault lock is released).
pub fn say_if_interrupted(what: &str) {
    if crate::interrupt::requested() {
        eprintln!("veilfs: {what} interrupted; run the same command again to resume");
    }
}

/// "1 error", "3 errors".
pub fn count(n: usize, what: &str) -> String {
    match (n, what.strip_suffix('y')) {
        (1, _) => format!("{n} {what}"),
        (_, Some(stem)) => format!("{n} {stem}ies"),
        _ => format!("{n} {what}s"),
    }
}

/// Plaintext bytes of the regular files under the ciphertext directory `dir` (a cheap
/// total for the export progress bar: no names are decrypted, no file is opened).
/// A hard-linked file counts once; the vault's metadata files are left out.
pub fn plain_bytes_under(dir: &Path, layout: &veilfs_core::ContentCtx) -> u64 {
    fn walk(dir: &Path, layout: &veilfs_core::ContentCtx, seen: &mut HashSet<(u64, u64)>) -> u64 {
        let Ok(it) = std::fs::read_dir(dir) else { return 0 };
        let mut sum = 0;
        for e in it.flatten() {
            // The vault's own files (directory IVs, long-name side files) hold no user data.
            let name = e.file_name();
            let name = name.as_encoded_bytes();
            if name.starts_with(names::RESERVED_PREFIX.as_bytes()) && !name.starts_with(names::LONG_PREFIX.as_bytes()) {
                continue;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => sum += walk(&e.path(), layout, seen),
                Ok(t) if t.is_file() => {
                    if let Ok(m) = e.metadata() {
                        if m.nlink() < 2 || seen.insert((m.dev(), m.ino())) {
                            sum += layout.plain_size_lenient(m.len());
                        }
                    }
                }
                _ => {}
            }
        }
        sum
    }
    walk(dir, layout, &mut HashSet::new())
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_sizes_like_coreutils() {
        for (n, want) in [
            (0, "0"),
            (1023, "1023"),
            (1024, "1.0K"),
            (1536, "1.5K"),
            (10 * 1024, "10K"),
            (1 << 20, "1.0M"),
            (5 << 30, "5.0G"),
        ] {
            assert_eq!(super::human_size(n), want, "{n}");
        }
    }
}
