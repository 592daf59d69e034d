//! Deletions a client can vouch for, and the verdicts on a directory's entries
//! (docs/design/rollback.md "Layer 2", feature `"versions"`): every step that takes an
//! on-disk entry name out of a directory (unlink, rmdir, the old name of a rename or
//! exchange, the entry a rename replaces) first appends a tombstone record for it to this
//! client's log of the directory (`crate::tombstone`), and every step that puts a name into a
//! directory (a rename, an exchange, a link) appends a "back" record when a record says that
//! name was deleted, so that a name a client brings back is never taken for one the storage
//! brought back.
//!
//! A listing then compares the directory with what this client remembers of it
//! (`crate::known`): an entry it saw that is gone with a valid tombstone was deleted by a
//! client and is forgotten; one gone without one was deleted by someone who is not a
//! client; an entry present whose latest valid record says deleted was resurrected.

use super::*;
use crate::tombstone::{self, Event, Op, Token};
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
    /// Tombstone logs that vouch for nothing, in whole or from some record on (planted,
    /// edited, moved, damaged): their names and why.
    pub bad_tombstones: Vec<(String, String)>,
}

impl Vault {
    /// Whether this vault keeps tombstones (feature `"versions"`).
    pub fn keeps_tombstones(&self) -> bool {
        self.config.has_feature(crate::config::FEATURE_VERSIONS)
    }

    /// Appends this client's record `op` for the on-disk entry `on_disk` (of `kind`) of `dir`.
    /// A "back" record is dated no earlier than the deletion it answers (another client's
    /// clock may be ahead).
    fn tomb_record(&self, dir: &CipherDir, tok: Token, kind: EntryKind, op: Op, after: u64) -> Result<()> {
        self.append_record(dir.fd(), &dir.iv, tok, kind as u8, op, after)
            .ctx(|| dir.child_path(&tombstone::log_name(&self.tombs.client())))
    }

    /// [`tomb_record`](Self::tomb_record) for a directory known by its fd and IV, with the
    /// daemon's own rights (the log is the client's, whoever asked for the step).
    fn append_record(
        &self,
        dir: BorrowedFd<'_>,
        iv: &DirIv,
        tok: Token,
        kind: u8,
        op: Op,
        after: u64,
    ) -> std::io::Result<()> {
        let e = Event { op, kind, time: tombstone::now().max(after) };
        sys::privileged(|| self.tombs.append(dir, &self.ctx.keys, iv, &[(tok, e)]))
    }

    /// Before the user entry `on_disk` (of `kind`) leaves `dir`: appends its tombstone record.
    /// Returns what to take back if the removal fails, or to forget once it is done
    /// ([`forget_removed`](Self::forget_removed)); `None` when nothing was recorded (no
    /// feature, or not a user entry). The client keeps remembering the entry until the removal
    /// is done: a crash in between leaves the entry present under this client's own deletion
    /// record while this client still remembers it, which its next listing recognises as its
    /// own unfinished step and answers with a "back" record (not "resurrected").
    pub(crate) fn tombstone_before_remove(
        &self,
        dir: &CipherDir,
        on_disk: &str,
        kind: EntryKind,
    ) -> Result<Option<(Token, EntryKind)>> {
        if !self.keeps_tombstones() || ParsedEntry::parse(on_disk.as_bytes()).key().is_none() {
            return Ok(None);
        }
        let tok = tombstone::token(&self.ctx.keys, &dir.iv, on_disk.as_bytes());
        self.tomb_record(dir, tok, kind, Op::Deleted, 0)?;
        Ok(Some((tok, kind)))
    }

    /// Records that the user entry `on_disk` of the directory `dir` (IV `iv`) leaves it, for a
    /// step that has only the directory's fd (the crash sweep finishing an exchange). Best
    /// effort: a record that cannot be written makes a false alarm at worst.
    pub(crate) fn record_removal_at(&self, dir: BorrowedFd<'_>, iv: &DirIv, on_disk: &str) {
        if !self.keeps_tombstones() || ParsedEntry::parse(on_disk.as_bytes()).key().is_none() {
            return;
        }
        let kind = match sys::fstatat(dir, on_disk.as_bytes()).map(|st| st.st_mode & libc::S_IFMT) {
            Ok(libc::S_IFDIR) => EntryKind::Dir,
            Ok(libc::S_IFLNK) => EntryKind::Symlink,
            _ => EntryKind::File,
        };
        let tok = tombstone::token(&self.ctx.keys, iv, on_disk.as_bytes());
        let _ = self.append_record(dir, iv, tok, kind as u8, Op::Deleted, 0);
        if let Some(k) = &self.ctx.known {
            k.update_entries(iv, &[], &[tok]);
        }
    }

    /// After a removal recorded by [`tombstone_before_remove`](Self::tombstone_before_remove)
    /// is done: this client forgets the entry.
    pub(crate) fn forget_removed(&self, dir: &CipherDir, tomb: Option<(Token, EntryKind)>) {
        if let (Some((tok, _)), Some(k)) = (tomb, &self.ctx.known) {
            k.update_entries(&dir.iv, &[], &[tok]);
        }
    }

    /// Takes back the tombstone of a removal that failed (best effort): a "back" record.
    pub(crate) fn take_back_tombstone(&self, dir: &CipherDir, tomb: Option<(Token, EntryKind)>) {
        if let Some((tok, kind)) = tomb {
            let _ = self.tomb_record(dir, tok, kind, Op::Back, 0);
        }
    }

    /// Before the user entry `on_disk` (of `kind`) appears in `dir` (a rename, exchange or
    /// link brings a name back): if a client's record says it was deleted, a "back" record, so
    /// the entry does not read as resurrected. Reads the directory's logs as this process last
    /// knew them (a listing if it knew none).
    pub(crate) fn clear_tombstone(&self, dir: &CipherDir, on_disk: &str, kind: EntryKind) -> Result<()> {
        if !self.keeps_tombstones() {
            return Ok(());
        }
        let tok = tombstone::token(&self.ctx.keys, &dir.iv, on_disk.as_bytes());
        let latest = self.tombs.with_dir(dir.fd(), &self.ctx.keys, &dir.iv, None, |t| t.latest(&tok));
        match latest {
            Some(e) if e.op == Op::Deleted => self.tomb_record(dir, tok, kind, Op::Back, e.time),
            _ => Ok(()),
        }
    }

    /// Forgets what this process parsed of the tombstones of the directory of IV `iv` (it was
    /// removed, its logs with it).
    pub(crate) fn forget_tombstones(&self, iv: &DirIv) {
        self.tombs.forget_dir(iv);
    }

    /// This client's state when it checks directories' entries: a vault with tombstones, a
    /// client state, and not `--allow-rollback`.
    fn entry_checker(&self) -> Option<&Arc<crate::known::Known>> {
        let known = self.ctx.known.as_ref()?;
        (self.keeps_tombstones() && known.trust() != crate::known::Trust::AllowRollback).then_some(known)
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

    /// Whether a client's tombstone record says the user entry `on_disk` of `dir` was deleted
    /// (a resurrected entry, refused by a lookup), given the directory's listing just made
    /// (`raw`). Only for a client with a state that checks (not under `--allow-rollback`), as
    /// [`check_entries`](Self::check_entries).
    pub fn has_tombstone(&self, dir: &CipherDir, on_disk: &str, raw: &[sys::RawDirEntry]) -> bool {
        if self.entry_checker().is_none() || !raw.iter().any(|r| tombstone::is_log_name(&r.name)) {
            return false;
        }
        let names: Vec<&[u8]> = raw.iter().map(|r| r.name.as_slice()).collect();
        let tok = tombstone::token(&self.ctx.keys, &dir.iv, on_disk.as_bytes());
        self.tombs.with_dir(dir.fd(), &self.ctx.keys, &dir.iv, Some(&names), |t| t.deleted(&tok))
    }

    /// Compares the listing `raw` of `dir` with what this client remembers of it and updates
    /// that memory (docs/design/rollback.md, "What a client checks"). Without a client state,
    /// without the feature, or under `--allow-rollback`: no verdicts, nothing remembered.
    /// Under `fsck --accept` the directory as it is becomes what the client remembers, and a
    /// resurrected entry gets a "back" record (the user decided it stays).
    ///
    /// Cost: one HMAC per entry, plus reading what was appended to the directory's tombstone
    /// logs since this process last read them (nothing in a directory without deletions).
    pub fn check_entries<'r>(&self, dir: &CipherDir, raw: impl Iterator<Item = &'r [u8]>) -> EntryVerdicts {
        let mut v = EntryVerdicts::default();
        let Some(known) = self.entry_checker() else { return v };
        let accept = known.trust() == crate::known::Trust::Accept;
        let names: Vec<&[u8]> = raw.collect();
        let mut present: HashMap<Token, &[u8]> = HashMap::new();
        // Entries a sync tool renamed to a conflict copy's name: not deleted (the copy shows
        // them), not forgotten either; `fsck --repair` leaves a tombstone for the original
        // name when it makes the copy an ordinary entry.
        let mut copied: HashSet<Token> = HashSet::new();
        let mut logs = false;
        for &name in &names {
            if tombstone::is_log_name(name) {
                logs = true;
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
        let remembered = known.entries(&dir.iv);
        let mut gone: Vec<Token> = Vec::new();
        let mut seen: Vec<Token> = Vec::new();
        let mut back: Vec<(Token, u8, u64)> = Vec::new();
        let mut judge = |tombs: Option<&tombstone::DirTombs>, v: &mut EntryVerdicts| {
            let latest = |t: &Token| tombs.and_then(|d| d.latest_by(t)).filter(|(e, _)| e.op == Op::Deleted);
            let me = self.tombs.client();
            for t in remembered.iter().filter(|t| !present.contains_key(*t)) {
                if latest(t).is_some() {
                    v.deleted += 1;
                    gone.push(*t);
                } else if accept {
                    gone.push(*t);
                } else if !copied.contains(t) {
                    v.missing += 1;
                }
            }
            for (t, on_disk) in &present {
                if let Some((e, by)) = latest(t) {
                    // This client's own deletion of an entry it still remembers: a removal it
                    // recorded and never finished (a crash between the two), not one put back.
                    let unfinished = by == me && remembered.contains(t);
                    if accept || unfinished {
                        back.push((*t, e.kind, e.time));
                    } else {
                        v.resurrected.push(String::from_utf8_lossy(on_disk).into_owned());
                        continue;
                    }
                }
                if !remembered.contains(t) {
                    seen.push(*t);
                }
            }
            if let Some(d) = tombs {
                v.bad_tombstones = d.bad();
            }
        };
        if logs {
            self.tombs.with_dir(dir.fd(), &self.ctx.keys, &dir.iv, Some(&names), |d| judge(Some(d), &mut v));
        } else {
            judge(None, &mut v);
        }
        for (t, kind, after) in back {
            let _ = self.append_record(dir.fd(), &dir.iv, t, kind, Op::Back, after);
        }
        v.resurrected.sort();
        known.update_entries(&dir.iv, &seen, &gone);
        v
    }

    /// The error for `n` entries this client saw in `dir` that are gone without a tombstone.
    pub fn deleted_error(dir: &CipherDir, n: usize) -> Error {
        Error::Rollback {
            what: dir.path.display().to_string(),
            detail: format!(
                "{n} entr{} this client saw {} missing without a tombstone: deleted by someone who is not a client \
                 (or a deletion whose tombstone a sync has not delivered yet); `veilfs fsck --accept` forgets {}",
                if n == 1 { "y" } else { "ies" },
                if n == 1 { "is" } else { "are" },
                if n == 1 { "it" } else { "them" },
            ),
        }
    }

    /// What [`check_entries`](Self::check_entries) found, as the entries a listing could not
    /// give: deletions by a non-client (one, on the directory itself: no on-disk name), each
    /// resurrected entry, and each tombstone log that vouches for nothing.
    pub fn verdict_errors(dir: &CipherDir, v: &EntryVerdicts) -> Vec<BadEntry> {
        let mut out = Vec::new();
        if v.missing > 0 {
            out.push(BadEntry { on_disk: Vec::new(), error: Self::deleted_error(dir, v.missing) });
        }
        for on_disk in &v.resurrected {
            out.push(BadEntry { on_disk: on_disk.clone().into_bytes(), error: Self::resurrected_error(dir, on_disk) });
        }
        for (name, why) in &v.bad_tombstones {
            out.push(BadEntry {
                on_disk: name.clone().into_bytes(),
                error: Error::auth(dir.child_path(name), why.clone()),
            });
        }
        out
    }

    /// Logs what [`check_entries`](Self::check_entries) found (one line per finding, the
    /// directory or file named): for the mount, whose listings have no one else to tell.
    pub fn log_verdicts(dir: &CipherDir, v: &EntryVerdicts) {
        for b in Self::verdict_errors(dir, v) {
            tracing::error!("{}", b.error);
        }
    }
}
