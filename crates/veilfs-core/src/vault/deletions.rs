//! Deletions a client can vouch for, and the verdicts on a directory's entries
//! (docs/design/rollback.md "Layer 2", feature `"versions"`): every step that takes an
//! on-disk entry name out of a directory (unlink, rmdir, the old name of a rename or
//! exchange, the entry a rename replaces) first leaves a tombstone for it
//! (`crate::tombstone`), and every step that puts a name into a directory (a rename, an
//! exchange, a link) first removes the tombstone of that name, so that a name a client brings
//! back is never taken for one the storage brought back.
//!
//! A listing then compares the directory with what this client remembers of it
//! (`crate::known`): an entry it saw that is gone with a valid tombstone was deleted by a
//! client and is forgotten; one gone without a tombstone was deleted by someone who is not a
//! client; an entry present whose valid tombstone is present too was resurrected.

use super::*;
use crate::tombstone::{self, Token, Tombstone};
use std::collections::HashSet;

/// What a listing found against this client's memory of the directory.
#[derive(Debug, Default)]
pub struct EntryVerdicts {
    /// Entries this client saw in the directory that are gone without a valid tombstone:
    /// deleted by someone who is not a client (or by a client whose tombstone has not arrived
    /// yet, or expired).
    pub missing: usize,
    /// Entries gone with a valid tombstone (deleted by a client): forgotten.
    pub deleted: usize,
    /// On-disk names of entries present whose valid tombstone is present too: put back after
    /// a client deleted them.
    pub resurrected: Vec<String>,
    /// Tombstones that do not verify (planted, edited, moved, damaged): their names and why.
    pub bad_tombstones: Vec<(String, String)>,
}

impl Vault {
    /// Whether this vault keeps tombstones (feature `"versions"`).
    pub fn keeps_tombstones(&self) -> bool {
        self.config.has_feature(crate::config::FEATURE_VERSIONS)
    }

    /// Before the user entry `on_disk` (of `kind`) leaves `dir`: writes its tombstone and
    /// forgets it in this client's memory. Returns the tombstone's name (to take back if the
    /// removal fails), `None` when none is kept (no feature, or not a user entry).
    pub(crate) fn tombstone_before_remove(
        &self,
        dir: &CipherDir,
        on_disk: &str,
        kind: EntryKind,
    ) -> Result<Option<String>> {
        if !self.keeps_tombstones() || ParsedEntry::parse(on_disk.as_bytes()).key().is_none() {
            return Ok(None);
        }
        let tok = tombstone::token(&self.ctx.keys, &dir.iv, on_disk.as_bytes());
        let name = tombstone::name(&tok);
        let client = self.ctx.known.as_ref().map_or([0; 16], |k| k.client_id());
        let t = Tombstone { kind: kind as u8, client, time: tombstone::now() };
        tombstone::write(dir.fd(), &self.ctx.keys, &name, &dir.iv, &t).ctx(|| dir.child_path(&name))?;
        if let Some(k) = &self.ctx.known {
            k.update_entries(&dir.iv, &[], &[tok]);
        }
        Ok(Some(name))
    }

    /// Takes back the tombstone `name` of `dir` of a removal that failed (best effort).
    pub(crate) fn take_back_tombstone(dir: &CipherDir, name: Option<String>) {
        if let Some(name) = name {
            let _ = sys::unlinkat(dir.fd(), name.as_bytes(), false);
        }
    }

    /// Before the user entry `on_disk` appears in `dir` (a rename, exchange or link brings a
    /// name back): removes its tombstone, if any, so the entry does not read as resurrected.
    pub(crate) fn clear_tombstone(&self, dir: &CipherDir, on_disk: &str) -> Result<()> {
        if !self.keeps_tombstones() {
            return Ok(());
        }
        let name = tombstone::name(&tombstone::token(&self.ctx.keys, &dir.iv, on_disk.as_bytes()));
        match sys::unlinkat(dir.fd(), name.as_bytes(), false) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(Error::io(dir.child_path(&name), e)),
            _ => Ok(()),
        }
    }

    /// The error for the resurrected entry `on_disk` of `dir`.
    pub fn resurrected_error(dir: &CipherDir, on_disk: &str) -> Error {
        Error::Rollback {
            what: dir.child_path(on_disk),
            detail: "resurrected: a client deleted this entry (its tombstone is present and valid) and it was put \
                     back; `veilfs fsck --accept` keeps it"
                .to_string(),
        }
    }

    /// Whether the user entry `on_disk` of `dir` has a valid tombstone, given the names in the
    /// directory's listing that are tombstones (`tombs`).
    pub fn has_tombstone(&self, dir: &CipherDir, on_disk: &str, tombs: &HashSet<&[u8]>) -> bool {
        if !self.keeps_tombstones() || tombs.is_empty() {
            return false;
        }
        let name = tombstone::name(&tombstone::token(&self.ctx.keys, &dir.iv, on_disk.as_bytes()));
        tombs.contains(name.as_bytes()) && tombstone::read(dir.fd(), &self.ctx.keys, &name, &dir.iv).is_ok()
    }

    /// Compares the listing `raw` of `dir` with what this client remembers of it and updates
    /// that memory (docs/design/rollback.md, "What a client checks"). Without a client state,
    /// without the feature, or under `--allow-rollback`: no verdicts, nothing remembered.
    /// Under `fsck --accept` the directory as it is becomes what the client remembers, and the
    /// tombstones of resurrected entries are removed (the user decided they stay).
    ///
    /// Cost: one HMAC per entry, plus reading the tombstones whose entries are present or
    /// remembered (none in a directory without deletions).
    pub fn check_entries<'r>(&self, dir: &CipherDir, raw: impl Iterator<Item = &'r [u8]>) -> EntryVerdicts {
        let mut v = EntryVerdicts::default();
        let Some(known) = self.ctx.known.as_ref().filter(|_| self.keeps_tombstones()) else { return v };
        if known.trust() == crate::known::Trust::AllowRollback {
            return v;
        }
        let accept = known.trust() == crate::known::Trust::Accept;
        let mut present: HashMap<Token, &[u8]> = HashMap::new();
        let mut tombs: HashSet<Token> = HashSet::new();
        // Entries a sync tool renamed to a conflict copy's name: not deleted (the copy shows
        // them), not forgotten either; `fsck --repair` leaves a tombstone for the original
        // name when it makes the copy an ordinary entry.
        let mut copied: HashSet<Token> = HashSet::new();
        for name in raw {
            if let Some(t) = tombstone::token_of_name(name) {
                tombs.insert(t);
                continue;
            }
            match ParsedEntry::parse(name) {
                ParsedEntry::Conflict(c) if c.is_of_entry() => {
                    copied.insert(tombstone::token(&self.ctx.keys, &dir.iv, c.original.as_bytes()));
                }
                ParsedEntry::Short { key, s } => {
                    if crate::conflict::may_be_short_copy(key) {
                        for c in crate::conflict::short_copy_candidates(key, s) {
                            copied.insert(tombstone::token(&self.ctx.keys, &dir.iv, c.original.as_bytes()));
                        }
                    }
                    present.insert(tombstone::token(&self.ctx.keys, &dir.iv, name), name);
                }
                p if p.key().is_some() => {
                    present.insert(tombstone::token(&self.ctx.keys, &dir.iv, name), name);
                }
                _ => {}
            }
        }
        let mut bad: HashSet<Token> = HashSet::new();
        let mut valid = |t: &Token, v: &mut EntryVerdicts| -> bool {
            if !tombs.contains(t) || bad.contains(t) {
                return false;
            }
            let name = tombstone::name(t);
            match tombstone::read(dir.fd(), &self.ctx.keys, &name, &dir.iv) {
                Ok(_) => true,
                Err(why) => {
                    bad.insert(*t);
                    v.bad_tombstones.push((name, why));
                    false
                }
            }
        };
        let remembered = known.entries(&dir.iv);
        let mut gone: Vec<Token> = Vec::new();
        for t in remembered.iter().filter(|t| !present.contains_key(*t)) {
            if valid(t, &mut v) {
                v.deleted += 1;
                gone.push(*t);
            } else if accept {
                gone.push(*t);
            } else if !copied.contains(t) {
                v.missing += 1;
            }
        }
        let mut seen: Vec<Token> = Vec::new();
        for (t, on_disk) in &present {
            if valid(t, &mut v) {
                let on_disk = String::from_utf8_lossy(on_disk).into_owned();
                if accept {
                    let _ = sys::unlinkat(dir.fd(), tombstone::name(t).as_bytes(), false);
                } else {
                    v.resurrected.push(on_disk);
                    continue;
                }
            }
            if !remembered.contains(t) {
                seen.push(*t);
            }
        }
        v.resurrected.sort();
        known.update_entries(&dir.iv, &seen, &gone);
        v
    }

    /// Logs what [`check_entries`](Self::check_entries) found (one line per finding, the
    /// directory named): for the offline listings and the mount.
    pub fn log_verdicts(dir: &CipherDir, v: &EntryVerdicts) {
        if v.missing > 0 {
            tracing::error!(
                "integrity error in {}: {} entr{} this client saw {} missing without a tombstone: deleted by someone \
                 who is not a client (or a deletion whose tombstone a sync has not delivered yet); `veilfs fsck \
                 --accept` forgets {}",
                dir.path.display(),
                v.missing,
                if v.missing == 1 { "y" } else { "ies" },
                if v.missing == 1 { "is" } else { "are" },
                if v.missing == 1 { "it" } else { "them" },
            );
        }
        for on_disk in &v.resurrected {
            tracing::error!("{}", Self::resurrected_error(dir, on_disk));
        }
        for (name, why) in &v.bad_tombstones {
            tracing::error!("integrity error in {}: {why}", dir.child_path(name));
        }
    }
}
