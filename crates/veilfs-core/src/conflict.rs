//! Sync tools' conflict copies of vault files: recognising them, and the names users see.
//!
//! Why: when one file changes on two machines before they sync, a sync tool keeps both
//! versions, the losing one as a copy under a changed name — Syncthing inserts
//! `.sync-conflict-<date>-<time>-<device>` before the name's extension, Dropbox and Nextcloud
//! insert ` (… conflicted copy …)`, Google Drive and others ` (1)`. For a vault the "name" is
//! the ciphertext name `base64url(D).base64url(S)`, whose "extension" is the binding `S`, so
//! the copy of `D.S` is, for example, `D.sync-conflict-20261127-101010-ABCDEFG.S`. Such a
//! name is no veilfs entry name, and before this module the losing version vanished from the
//! mount and made every offline tool report damage.
//!
//! The rule (Cryptomator's, docs/FORMAT.md §6.6): take the tool's part out of the name; what
//! is left must be an entry name veilfs writes, and its binding must verify for the object
//! that is there, exactly as for the original entry (the same directory IV, `D`, kind and
//! identity — a file's header ID, a directory's IV). Only then is the copy shown, as
//! `name (<suffix>).ext`: the plaintext name with the tool's suffix kept readable before its
//! extension, and a counter (`name (<suffix> 2).ext`) when that name is taken. Nothing here
//! trusts the suffix beyond showing it: it is unauthenticated text of a fixed shape, and a
//! copy can only ever show an object under a name that an entry of this directory was bound
//! to (docs/SECURITY.md, "Conflict copies").
//!
//! OneDrive's `-<host>` and old ownCloud clients' `_conflict-<date>-<time>` are base64url
//! themselves: on a short entry the copy's name is another well-formed entry name, whose own
//! name does not decrypt. Only then is it read as a copy ([`short_copy_candidates`]): the
//! original's `D` must decrypt in this directory (SIV authenticates it) and the binding
//! verify, as above. A listing that decrypts every name anyway pays for this only on names
//! that failed.
//!
//! A copy of a copy (the copy conflicted again) holds one tool's part per conflict, each
//! inserted before the extension again (`D (1) (2).S`); [`parse`] takes them out one by one,
//! a bounded number, and shows their suffixes joined (`name (1, 2).ext`). Syncthing since
//! 0.12.12 makes no copy of a copy (a conflict on one drops the local version), but older
//! ones did, and a vault carried by two tools may hold any mix.
//!
//! Two valid entries for one name (made on two machines, or left by a crash in the middle of
//! a rename over an existing name) are both shown the same way: the newer under the name, the
//! older as `name (conflict).ext`.

use crate::error::{Error, IoContext, Result};
use crate::names::{NameKey, ParsedEntry, NAME_MAX};
use crate::sys::Stat;
use crate::vault::{BadEntry, CipherDir, Entry, Vault};
use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;

/// The suffix under which the older of two valid entries for one name is shown.
pub const OLDER_SUFFIX: &str = "conflict";

/// Longest suffix shown: enough for every tool's own text, and a bound on what an
/// unauthenticated part of a name can put in front of a user.
const SUFFIX_MAX: usize = 96;

/// A name recognised as a sync tool's conflict copy of another name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConflictName {
    /// The name it copies (the tool's part taken out).
    pub original: String,
    /// The tool's part, readable: `sync-conflict-20261127-101010-ABCDEFG`, `host's
    /// conflicted copy 2026-11-27`, `1`, ...
    pub suffix: String,
    /// The tool that makes such names.
    pub tool: &'static str,
}

impl ConflictName {
    /// The original name, classified (a user entry, or one of veilfs's own files).
    pub fn entry(&self) -> ParsedEntry<'_> {
        ParsedEntry::parse(self.original.as_bytes())
    }

    /// Whether it copies a user entry (not one of veilfs's own files).
    pub fn is_of_entry(&self) -> bool {
        matches!(self.entry(), ParsedEntry::Short { .. } | ParsedEntry::Long { .. })
    }

    /// base64url(S) of the original entry, for a copy of a user entry.
    pub fn binding(&self) -> Option<&str> {
        self.entry().binding()
    }
}

/// How a tool's part of a name looks. Each returns the length of the part at the start of
/// `rest` and the suffix to show, or `None`.
type Matcher = fn(&str) -> Option<(usize, String)>;

/// The tools, in the order they are tried.
const TOOLS: &[(&str, Matcher)] = &[
    ("Syncthing", syncthing),
    ("Dropbox", dropbox),
    ("Nextcloud/ownCloud", nextcloud),
    ("ownCloud", owncloud_legacy),
    ("Google Drive or copy counter", counter),
];

/// Recognises `name` as a conflict copy: a tool's part ending where the name ends or where
/// its last component (the "extension") begins, whose removal leaves a name veilfs writes
/// (a user entry or one of its own files). OneDrive's `-<host>` and ownCloud's older
/// `_conflict-<date>-<time>` are base64url themselves: on a short entry they make another
/// well-formed key, which [`ParsedEntry::parse`] takes first; such a copy is found only once
/// its name fails to decrypt ([`short_copy_candidates`]). Where the part they follow has a
/// fixed length (a long name's hash, a side file's hash, a directory IV name, the binding)
/// the name says it, and it is recognised here (see [`onedrive`]).
///
/// A copy of a copy (a conflict copy that conflicted again) holds several tools' parts, each
/// later one inserted before the extension again: `D.sync-conflict-A.sync-conflict-B.S`,
/// `D (1) (2).S`. They are taken out one by one, the last first, at most [`NESTED_MAX`] of
/// them; the suffix shown is theirs in the name's order, joined by [`NESTED_SEPARATOR`]
/// (`sync-conflict-A, sync-conflict-B`), at most [`SUFFIX_MAX`] long, and the tool is the one
/// whose part came last (the one that made this copy).
pub fn parse(name: &[u8]) -> Option<ConflictName> {
    let name = std::str::from_utf8(name).ok()?;
    let mut budget = NESTED_TRIES;
    let (original, parts) = peel(name, 1, &mut budget)?;
    let tool = parts.last()?.1;
    let suffix = parts.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>().join(NESTED_SEPARATOR);
    (parts.len() == 1 || suffix.len() <= SUFFIX_MAX).then_some(ConflictName { original, suffix, tool })
}

/// Most tools' parts taken out of one name: a copy of a copy of a copy of a copy.
pub const NESTED_MAX: usize = 4;

/// Between the suffixes of a copy of a copy, as shown.
pub const NESTED_SEPARATOR: &str = ", ";

/// Most readings of inner parts [`parse`] tries for one name: a name made of many parts that
/// each could be a tool's costs no more than this.
const NESTED_TRIES: usize = 32;

/// The original of `name` and the tools' parts taken out of it (suffix, tool), first part
/// first; `level` counts the parts taken so far, `budget` the readings left to try.
fn peel(name: &str, level: usize, budget: &mut usize) -> Option<(String, Vec<(String, &'static str)>)> {
    // Each tool's part that ends where the name ends or a component begins, by where it
    // starts, then in the order of the tools.
    let mut readings: Vec<(usize, String, String, &'static str)> = Vec::new();
    for (start, _) in name.char_indices() {
        let rest = &name[start..];
        for &(tool, matcher) in TOOLS {
            let Some((len, suffix)) = matcher(rest) else { continue };
            let end = start + len;
            if !(end == name.len() || name.as_bytes()[end] == b'.') {
                continue;
            }
            let original = format!("{}{}", &name[..start], &name[end..]);
            if is_veilfs_name(&original) {
                return Some((original, vec![(suffix, tool)]));
            }
            // Two tools' readings of one part (Dropbox's text is also Nextcloud's): the first.
            if !readings.iter().any(|r| r.0 == start && r.1 == original) {
                readings.push((start, original, suffix, tool));
            }
        }
    }
    if let Some(c) = onedrive(name) {
        return Some((c.original, vec![(c.suffix, c.tool)]));
    }
    if level >= NESTED_MAX {
        return None;
    }
    // A copy of a copy: the part left by the latest copy is the last one before the
    // extension, so the readings are tried from the right.
    readings.sort_by_key(|r| std::cmp::Reverse(r.0));
    for (_, inner, suffix, tool) in readings {
        if *budget == 0 {
            return None;
        }
        *budget -= 1;
        if let Some((original, mut parts)) = peel(&inner, level + 1, budget) {
            parts.push((suffix, tool));
            return Some((original, parts));
        }
    }
    None
}

/// OneDrive keeps a conflict copy as `<stem>-<host>.<ext>` (HOST: the computer's name,
/// letters, digits and `-`). Recognised where taking `-HOST` out (up to the next `.` or the
/// end) leaves a name veilfs writes: `veilfs-HOST.lock`, `veilfs.L.<hash>-HOST.<S>`,
/// `veilfs.N-HOST.<hash>`, `veilfs.N.<hash>-HOST`, `veilfs.diriv-HOST.<iv>`, ... The part
/// before `-HOST` is a fixed word or has a fixed length (43 characters of a hash, 22 of an
/// IV), so the name has one reading. On a short entry (`D` of any length) `D-HOST.S` is
/// another well-formed key, which [`ParsedEntry::parse`] takes first: see
/// [`short_copy_candidates`].
pub fn onedrive(name: &str) -> Option<ConflictName> {
    for (dash, _) in name.match_indices('-') {
        let end = name[dash..].find('.').map_or(name.len(), |i| dash + i);
        let host = &name[dash + 1..end];
        if !is_host(host) {
            continue;
        }
        let original = format!("{}{}", &name[..dash], &name[end..]);
        if is_veilfs_name(&original) {
            return Some(ConflictName { original, suffix: host.to_string(), tool: "OneDrive" });
        }
    }
    None
}

/// A computer's name as OneDrive appends it: letters, digits and `-`, 1 to 63 characters.
fn is_host(host: &str) -> bool {
    !host.is_empty() && host.len() <= 63 && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// At most this many readings of a short entry's key are tried as a copy (each costs a name
/// decryption, and only a key that failed to decrypt is tried at all).
const MAX_SHORT_SPLITS: usize = 8;

/// Fewest characters of a short entry's key.
const SHORT_KEY_MIN: usize = 23;

/// The readings of a short entry's key as a copy's, without allocating (a listing asks this of
/// every short name): (length of the original key, start of the suffix, tool). ownCloud's
/// older `KEY_conflict-YYYYMMDD-HHMMSS`, then OneDrive's `KEY-HOST` at each `-` from the right,
/// where `KEY` keeps a short key's 23 characters; at most [`MAX_SHORT_SPLITS`].
fn short_readings(key: &str) -> impl Iterator<Item = (usize, usize, &'static str)> + '_ {
    let owncloud = key
        .len()
        .checked_sub(25)
        .filter(|&i| i >= SHORT_KEY_MIN && owncloud_legacy(&key[i..]).is_some())
        .map(|i| (i, i + 1, "ownCloud"));
    let onedrive = key
        .rmatch_indices('-')
        .map(|(dash, _)| dash)
        // Once the tail holds a `_` or is too long, every split further left keeps it.
        .take_while(move |&dash| dash >= SHORT_KEY_MIN && !key[dash + 1..].contains('_') && key.len() - dash <= 64)
        .filter(move |&dash| is_host(&key[dash + 1..]))
        .map(|dash| (dash, dash + 1, "OneDrive"));
    owncloud.into_iter().chain(onedrive).take(MAX_SHORT_SPLITS)
}

/// Whether the short entry key `key` has a reading as a copy's ([`short_copy_candidates`]).
pub fn may_be_short_copy(key: &str) -> bool {
    short_readings(key).next().is_some()
}

/// The originals a short entry `key.s` may be a conflict copy of, to try when its own name
/// does not decrypt (see [`short_readings`]). Nothing here is trusted: a reading is a copy
/// only if its `KEY` decrypts in the directory (SIV authenticates the name, so a chance string
/// decrypts with probability 2^-128) and `s` verifies for the object that is there, as for
/// any copy.
pub fn short_copy_candidates(key: &str, s: &str) -> Vec<ConflictName> {
    short_readings(key)
        .map(|(len, suffix, tool)| ConflictName {
            original: format!("{}.{s}", &key[..len]),
            suffix: key[suffix..].to_string(),
            tool,
        })
        .collect()
}

/// A name veilfs writes: a user entry, or one of its own files a sync tool may copy (the
/// config, the lock, a directory's IV copy, a long name's side file).
fn is_veilfs_name(name: &str) -> bool {
    use crate::names::{CONFIG_NAME, DIRIV_NAME, LOCK_NAME, LONG_NAME_FILE_PREFIX};
    let side = name.strip_prefix(LONG_NAME_FILE_PREFIX).is_some_and(|h| h.len() == 43 && !h.contains('.'));
    matches!(ParsedEntry::parse_format(name.as_bytes()), ParsedEntry::Short { .. } | ParsedEntry::Long { .. })
        || [CONFIG_NAME, LOCK_NAME, DIRIV_NAME].contains(&name)
        || crate::names::parse_diriv_name(name.as_bytes()).is_some()
        || side
}

fn digits(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_digit())
}

/// Syncthing: `.sync-conflict-YYYYMMDD-HHMMSS-DEVICE` (DEVICE: the first 7 characters of the
/// device ID, upper-case letters and digits).
fn syncthing(rest: &str) -> Option<(usize, String)> {
    const PREFIX: &str = ".sync-conflict-";
    let b = rest.strip_prefix(PREFIX)?.as_bytes();
    let digits_at = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if b.len() < 17 || !digits_at(0..8) || b[8] != b'-' || !digits_at(9..15) || b[15] != b'-' {
        return None;
    }
    let dev_len = b[16..].iter().take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit()).count();
    if dev_len == 0 || dev_len > 63 {
        return None;
    }
    let len = PREFIX.len() + 16 + dev_len;
    Some((len, rest[1..len].to_string()))
}

/// ` (<text>)` with `text` readable (no control characters, no parentheses) and accepted by
/// `ok`: the part and `text`.
fn parenthesised(rest: &str, ok: impl Fn(&str) -> bool) -> Option<(usize, String)> {
    let body = rest.strip_prefix(" (").or_else(|| rest.strip_prefix('('))?;
    let close = body.find(')')?;
    let text = &body[..close];
    if text.is_empty() || text.len() > SUFFIX_MAX || text.chars().any(|c| c.is_control() || c == '(') || !ok(text) {
        return None;
    }
    Some((rest.len() - body.len() + close + 1, text.to_string()))
}

/// Dropbox: ` (<who>'s conflicted copy <date>)`, possibly with a counter ` (1)` inside.
fn dropbox(rest: &str) -> Option<(usize, String)> {
    let r = parenthesised(rest, |t| t.contains("'s conflicted copy") || t.contains("\u{2019}s conflicted copy"));
    r.or_else(|| {
        // With a counter: ` (host's conflicted copy 2026-11-27 (1))`.
        let body = rest.strip_prefix(" (")?;
        let inner_open = body.find(" (")?;
        let (head, tail) = body.split_at(inner_open);
        let n = tail.strip_prefix(" (")?;
        let close = n.find("))")?;
        if !head.contains("'s conflicted copy") || !digits(&n[..close], close) || head.len() + close > SUFFIX_MAX {
            return None;
        }
        let len = 2 + head.len() + 2 + close + 2;
        Some((len, format!("{head} ({})", &n[..close])))
    })
}

/// Nextcloud and ownCloud (current clients): ` (conflicted copy <date> <time>)`, also with
/// the user's name before it.
fn nextcloud(rest: &str) -> Option<(usize, String)> {
    parenthesised(rest, |t| t.starts_with("conflicted copy") || t.contains(" conflicted copy "))
}

/// ownCloud's older clients: `_conflict-YYYYMMDD-HHMMSS`.
fn owncloud_legacy(rest: &str) -> Option<(usize, String)> {
    let body = rest.strip_prefix("_conflict-")?;
    let (date, time) = (body.get(..8)?, body.get(9..15)?);
    (digits(date, 8) && body.as_bytes()[8] == b'-' && digits(time, 6)).then(|| (25, rest[1..25].to_string()))
}

/// Google Drive and many other tools (and file managers' copies): ` (N)`.
fn counter(rest: &str) -> Option<(usize, String)> {
    parenthesised(rest, |t| t.len() <= 6 && t.bytes().all(|b| b.is_ascii_digit()))
}

/// The name a conflict copy of `plain` is shown under: ` (<suffix>)` before the extension
/// (the part from the last `.` that does not start the name), ` (<suffix> <n>)` for `n` ≥ 2.
/// Shortened at the end of the stem if it would exceed 255 bytes.
pub fn display_name(plain: &[u8], suffix: &str, n: u32) -> Vec<u8> {
    let dot = plain.iter().rposition(|&b| b == b'.').filter(|&i| i > 0).unwrap_or(plain.len());
    let (stem, ext) = plain.split_at(dot);
    let mid = if n >= 2 { format!(" ({suffix} {n})") } else { format!(" ({suffix})") };
    let room = NAME_MAX.saturating_sub(mid.len());
    let (stem, ext) = if stem.len() + ext.len() <= room {
        (stem, ext)
    } else if ext.len() < room {
        (&stem[..room - ext.len()], ext)
    } else {
        (&stem[..room.min(stem.len())], &b""[..])
    };
    [stem, mid.as_bytes(), ext].concat()
}

/// Display names for conflict copies in the order given: `(plaintext name, suffix)` each;
/// `taken` says whether a name is an entry of the directory already. The same inputs give the
/// same names, so a listing and a lookup agree.
pub fn assign(copies: &[(Vec<u8>, String)], mut taken: impl FnMut(&[u8]) -> bool) -> Vec<Vec<u8>> {
    let mut given: HashSet<Vec<u8>> = HashSet::new();
    copies
        .iter()
        .map(|(plain, suffix)| {
            let mut n = 1;
            let name = loop {
                let name = display_name(plain, suffix, n);
                if n > 10_000 || (!given.contains(&name) && !taken(&name)) {
                    break name;
                }
                n += 1;
            };
            given.insert(name.clone());
            name
        })
        .collect()
}

/// One entry of [`Vault::keyed_entries`]: lookup key, on-disk name, `d_type`.
pub type KeyedEntry = (String, String, u8);

/// What [`Vault::keyed_entries_and_copies`] finds in a directory.
#[derive(Debug)]
pub struct KeyedListing {
    /// The user entries by lookup key (not decrypted, except as `names` says).
    pub entries: Vec<KeyedEntry>,
    /// The conflict copies that verified, each under the key of its shown name.
    pub copies: Vec<ConflictCopy>,
    /// Plaintext name and `D` of the entries whose names were decrypted on the way (short
    /// entries whose keys could have been a copy's), by on-disk name.
    pub names: HashMap<String, (Vec<u8>, Vec<u8>)>,
    /// What the listing found against this client's memory of the directory
    /// ([`Vault::check_entries`]).
    pub verdicts: crate::vault::EntryVerdicts,
}

/// A conflict copy of a user entry whose binding verified, as the directory shows it.
#[derive(Clone, Debug)]
pub struct ConflictCopy {
    /// The entry as shown: `name` is the display name and `key` its lookup key (a rename or
    /// exchange onto it binds that name); `on_disk` is the copy's own name.
    pub entry: Entry,
    /// The plaintext name of the entry it copies.
    pub original: Vec<u8>,
    /// `D` of that name: the one its binding verifies for.
    pub d: Vec<u8>,
    /// The suffix shown.
    pub suffix: String,
    /// The tool that made it ("veilfs" for the older of two entries for one name).
    pub tool: &'static str,
}

impl Vault {
    /// The conflict copies among `candidates` (on-disk names of `dir`): names with a sync
    /// tool's part, and every entry of a name that has several. Each is verified as its
    /// original entry would be; of several valid entries for one name the newest (ctime)
    /// stays the entry and the others are copies. `undecryptable`: short entries of `dir`
    /// whose names did not decrypt, each tried as a copy whose tool's part is base64url
    /// itself ([`short_copy_candidates`]); one whose readings do not verify is left out here
    /// (it stays the caller's integrity finding, as the entry it claims to be), one that
    /// verifies is a copy, and the caller no longer reports it. `key_present` says whether an
    /// entry with a given lookup key is in `dir` (display names avoid them). Copies that do
    /// not verify are returned as bad entries (integrity errors naming the copy).
    pub fn conflict_copies(
        &self,
        dir: &CipherDir,
        candidates: &[String],
        undecryptable: &[String],
        key_present: impl Fn(&str) -> bool,
    ) -> (Vec<ConflictCopy>, Vec<BadEntry>) {
        let mut found: Vec<(Entry, String, &'static str)> = Vec::new();
        let mut bad = Vec::new();
        let mut groups: HashMap<&str, Vec<Entry>> = HashMap::new();
        for on_disk in undecryptable {
            let ParsedEntry::Short { key, s } = ParsedEntry::parse(on_disk.as_bytes()) else { continue };
            let Ok(st) = Self::stat_entry(dir, on_disk.as_bytes()) else { continue };
            let copy = short_copy_candidates(key, s)
                .into_iter()
                .find_map(|c| self.decode_copy(dir, on_disk, &c, st).ok().map(|e| (e, c.suffix, c.tool)));
            found.extend(copy);
        }
        for on_disk in candidates {
            let parsed = ParsedEntry::parse(on_disk.as_bytes());
            let st = match Self::stat_entry(dir, on_disk.as_bytes()) {
                Ok(st) => st,
                Err(error) => {
                    bad.push(BadEntry { on_disk: on_disk.clone().into_bytes(), error });
                    continue;
                }
            };
            let r = match &parsed {
                ParsedEntry::Conflict(c) => match c.entry() {
                    ParsedEntry::Short { .. } | ParsedEntry::Long { .. } => {
                        self.decode_copy(dir, on_disk, c, st).map(|e| Some((e, c.suffix.clone(), c.tool)))
                    }
                    _ => Ok(None),
                },
                // One of several entries for one name; one that does not verify is the entry
                // path's finding (a listing or lookup reports it), not a copy's.
                ParsedEntry::Short { key, .. } | ParsedEntry::Long { key, .. } => {
                    if let Ok(Some(e)) = self.decode_entry(dir, on_disk.as_bytes(), st) {
                        groups.entry(key).or_default().push(e);
                    }
                    Ok(None)
                }
                _ => Ok(None),
            };
            match r {
                Ok(Some(f)) => found.push(f),
                Ok(None) => {}
                Err(error) => {
                    tracing::error!("{error}");
                    bad.push(BadEntry { on_disk: on_disk.clone().into_bytes(), error });
                }
            }
        }
        for (_, mut entries) in groups {
            entries.sort_by_key(|e| std::cmp::Reverse(((e.stat.st_ctime, e.stat.st_ctime_nsec), e.on_disk.clone())));
            found.extend(entries.into_iter().skip(1).map(|e| (e, OLDER_SUFFIX.to_string(), "veilfs")));
        }
        // One order for every caller: by original name, then on-disk name.
        found.sort_by(|a, b| (&a.0.name, &a.0.on_disk).cmp(&(&b.0.name, &b.0.on_disk)));
        let wanted: Vec<(Vec<u8>, String)> = found.iter().map(|(e, s, _)| (e.name.clone(), s.clone())).collect();
        let names = assign(&wanted, |n| self.names().name_key(&dir.iv, n).is_ok_and(|k| key_present(&k.key)));
        let copies = found
            .into_iter()
            .zip(names)
            .filter_map(|((mut entry, suffix, tool), display)| {
                let key = self.names().name_key(&dir.iv, &display).ok()?;
                let original = std::mem::replace(&mut entry.name, display);
                let d = std::mem::replace(&mut entry.key, key).d;
                Some(ConflictCopy { entry, original, d, suffix, tool })
            })
            .collect();
        (copies, bad)
    }

    /// Decodes the conflict copy `on_disk` of `dir` (backing `st`) as the entry it copies:
    /// `D` from the original name (through its side file for a long name), the name decrypted
    /// in this directory, the binding verified for the object that is there.
    fn decode_copy(&self, dir: &CipherDir, on_disk: &str, c: &ConflictName, st: Stat) -> Result<Entry> {
        let what = || dir.child_path(on_disk);
        let relabel = |e: Error| match e {
            Error::Auth { detail, .. } => Error::auth(what(), format!("(a conflict copy) {detail}")),
            e => e,
        };
        let parsed = c.entry();
        let d = self.names().entry_d(&parsed, |side| Self::read_side_file(dir, side)).map_err(relabel)?;
        let name = self.names().decrypt_name(&dir.iv, &d).map_err(relabel)?;
        let (kind, identity) =
            self.verified_identity(&dir.iv, &d, parsed.binding().expect("user entry"), &st).map_err(relabel)?;
        Ok(Entry {
            name,
            on_disk: on_disk.to_string(),
            key: NameKey { d, key: String::new(), side_file: None },
            kind,
            identity,
            stat: st,
        })
    }

    /// The conflict copies of `dir` (lists it; see [`conflict_copies`](Self::conflict_copies)).
    pub fn list_conflicts(&self, dir: &CipherDir) -> Result<(Vec<ConflictCopy>, Vec<BadEntry>)> {
        let raw = crate::sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        Ok(self.conflicts_in(dir, raw.iter().map(|r| r.name.as_slice())))
    }

    /// The conflict copies among the on-disk names `raw` of `dir`: collects the candidates and
    /// the keys present, then [`conflict_copies`](Self::conflict_copies). A short entry whose
    /// key could be a copy's ([`short_copy_candidates`]) has its name decrypted to tell.
    pub fn conflicts_in<'r>(
        &self,
        dir: &CipherDir,
        raw: impl Iterator<Item = &'r [u8]>,
    ) -> (Vec<ConflictCopy>, Vec<BadEntry>) {
        self.conflicts_among(dir, raw, |on_disk| self.short_name(dir, on_disk).is_none())
    }

    /// [`conflicts_in`](Self::conflicts_in), where `undecryptable(on_disk)` says whether a short
    /// entry's name fails to decrypt. Asked only for a short entry whose key could be a copy's;
    /// a caller that decrypted every name already answers from what it found, so a listing
    /// without such failures costs no decryption more. Cheap when there are no copies (one
    /// parse per name).
    pub(crate) fn conflicts_among<'r>(
        &self,
        dir: &CipherDir,
        raw: impl Iterator<Item = &'r [u8]>,
        mut undecryptable: impl FnMut(&str) -> bool,
    ) -> (Vec<ConflictCopy>, Vec<BadEntry>) {
        // Every listing passes here: one parse per name and a count per key, no allocation
        // per entry; the work below is only for directories that hold copies.
        let names: Vec<&[u8]> = raw.collect();
        let mut keys: HashMap<&str, u32> = HashMap::with_capacity(names.len());
        let mut copies = false;
        let mut failed: Vec<String> = Vec::new();
        for name in &names {
            match ParsedEntry::parse(name) {
                ParsedEntry::Conflict(_) => copies = true,
                // Entry names are ASCII, so the key is a prefix of `name`.
                p => {
                    if let Some(k) = p.key() {
                        *keys.entry(std::str::from_utf8(&name[..k.len()]).expect("ASCII")).or_default() += 1;
                    }
                    if let ParsedEntry::Short { key, .. } = p {
                        let on_disk = std::str::from_utf8(name).expect("ASCII");
                        if may_be_short_copy(key) && undecryptable(on_disk) {
                            failed.push(on_disk.to_string());
                        }
                    }
                }
            }
        }
        if !copies && failed.is_empty() && keys.values().all(|&n| n == 1) {
            return (Vec::new(), Vec::new());
        }
        let candidates: Vec<String> = names
            .iter()
            .filter(|name| match ParsedEntry::parse(name) {
                ParsedEntry::Conflict(_) => true,
                p => p.key().is_some_and(|k| keys.get(k).is_some_and(|&n| n > 1)),
            })
            .map(|name| String::from_utf8_lossy(name).into_owned())
            .collect();
        self.conflict_copies(dir, &candidates, &failed, |k| keys.contains_key(k))
    }

    /// The `D` the binding of entry `on_disk` of `dir` is for, when it may be a conflict copy
    /// shown under another name: the original's for a copy whose tool's part the name shows
    /// ([`Vault::entry_d`]), and for a short entry whose own name does not decrypt, that of the
    /// first reading as a copy ([`short_copy_candidates`]) whose `D` decrypts here. The caller
    /// verifies the binding for that `D`; for the mount, whose index keeps a copy under the key
    /// of its shown name. Decrypts names: for a binding that failed with the `D` at hand.
    pub fn copy_d(&self, dir: &CipherDir, on_disk: &str) -> Result<Vec<u8>> {
        let own = self.entry_d(dir, on_disk);
        if let ParsedEntry::Short { key, s } = ParsedEntry::parse(on_disk.as_bytes()) {
            if own.as_ref().map_or(true, |d| self.names().decrypt_name(&dir.iv, d).is_err()) {
                let found = short_copy_candidates(key, s)
                    .iter()
                    .find_map(|c| self.short_name(dir, &c.original).map(|(_, d)| d));
                if let Some(d) = found {
                    return Ok(d);
                }
            }
        }
        own
    }

    /// The plaintext name and `D` of the short entry `on_disk` of `dir`, or `None` if its
    /// name does not decrypt (the binding is not checked).
    fn short_name(&self, dir: &CipherDir, on_disk: &str) -> Option<(Vec<u8>, Vec<u8>)> {
        let parsed = ParsedEntry::parse(on_disk.as_bytes());
        let d = self.names().entry_d(&parsed, |_| Err(Error::Invalid("a short name has no side file".into()))).ok()?;
        let name = self.names().decrypt_name(&dir.iv, &d).ok()?;
        Some((name, d))
    }

    /// [`Vault::keyed_entries`] and the conflict copies of `dir`, from one listing: for a
    /// front end that keeps its own index of keys (the mount), where each copy goes under the
    /// key of its shown name. A short entry that turned out to be a copy is not among the
    /// entries; the names decrypted to tell are handed back, so they are not decrypted again.
    pub fn keyed_entries_and_copies(&self, dir: &CipherDir) -> Result<KeyedListing> {
        let raw = crate::sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        let mut names: HashMap<String, (Vec<u8>, Vec<u8>)> = HashMap::new();
        let (copies, _) = self.conflicts_among(dir, raw.iter().map(|r| r.name.as_slice()), |on_disk| {
            match self.short_name(dir, on_disk) {
                Some(decoded) => {
                    names.insert(on_disk.to_string(), decoded);
                    false
                }
                None => true,
            }
        });
        let copied: HashSet<&str> = copies.iter().map(|c| c.entry.on_disk.as_str()).collect();
        let verdicts = self.check_entries(dir, raw.iter().map(|r| r.name.as_slice()));
        let mut entries = Self::keyed_from(dir, raw);
        entries.retain(|(_, on_disk, _)| !copied.contains(on_disk.as_str()));
        Ok(KeyedListing { entries, copies, names, verdicts })
    }

    /// The conflict copy shown as `name` in `dir`, if any (`raw`: the directory's on-disk
    /// names). For a lookup that found no entry of that name.
    pub fn lookup_conflict<'r>(
        &self,
        dir: &CipherDir,
        name: &[u8],
        raw: impl Iterator<Item = &'r [u8]>,
    ) -> Result<Option<Entry>> {
        // Every name a copy is shown under has ` (<suffix>)` in it: a lookup of any other name
        // (each create asks one) does not look for copies.
        if !name.windows(2).any(|w| w == b" (") {
            return Ok(None);
        }
        let (copies, _) = self.conflicts_in(dir, raw);
        Ok(copies.into_iter().find(|c| c.entry.name == name).map(|c| c.entry))
    }
}

/// What a conflict copy of one of veilfs's own files is, by that file's rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InternalCopy {
    /// A copy of the lock: never a lock (only `veilfs.lock` is), no data; `--repair` removes it.
    Lock,
    /// A copy of the config: never the config (the vault opens with `veilfs.conf`), but its
    /// key slots are tried after the config's (`Vault::open_with`); left alone, as it may hold
    /// a password the user still unlocks with.
    Config,
    /// A copy of a directory's IV copy or of a long name's side file that says exactly what
    /// the original says (checked): redundant; `--repair` removes it.
    Same,
    /// A copy of a directory's IV copy or a side file that says something else: not used
    /// (the original is what the vault reads), an integrity finding.
    Differs(String),
}

/// The rule for `name`, a conflict copy `c` of one of veilfs's own files in `dir`.
pub fn internal_copy(vault: &Vault, dir: &CipherDir, name: &str, c: &ConflictName) -> InternalCopy {
    use crate::names::{CONFIG_NAME, DIRIV_LEN, DIRIV_NAME, LOCK_NAME, LONG_NAME_FILE_PREFIX};
    let read = |max| crate::sys::read_meta_at(dir.fd(), name.as_bytes(), max);
    match c.original.as_str() {
        LOCK_NAME => InternalCopy::Lock,
        CONFIG_NAME => InternalCopy::Config,
        DIRIV_NAME => match read(DIRIV_LEN) {
            Ok(iv) if iv == dir.iv => InternalCopy::Same,
            Ok(_) => InternalCopy::Differs("names another directory IV than this directory's entry promises".into()),
            Err(e) => InternalCopy::Differs(format!("cannot be read: {e}")),
        },
        o => {
            if let Some(iv) = crate::names::parse_diriv_name(o.as_bytes()) {
                return if iv == dir.iv {
                    InternalCopy::Same
                } else {
                    InternalCopy::Differs("names another directory IV than this directory's entry promises".into())
                };
            }
            let hash = o.strip_prefix(LONG_NAME_FILE_PREFIX).unwrap_or_default();
            let key = format!("{}{hash}", crate::names::LONG_PREFIX);
            match Vault::read_side_file(dir, name) {
                Ok(text) => {
                    let parsed = ParsedEntry::Long { key: &key, hash, s: "" };
                    match vault.names().entry_d(&parsed, |_| Ok(text)) {
                        Ok(_) => InternalCopy::Same,
                        Err(e) => InternalCopy::Differs(e.to_string()),
                    }
                }
                Err(e) => InternalCopy::Differs(e.to_string()),
            }
        }
    }
}

/// One conflict copy found in a vault (see [`Vault::conflicts_under`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct FoundCopy {
    /// Its ciphertext path.
    pub cipher_path: std::path::PathBuf,
    /// The plaintext path it is shown under (`None`: a copy of one of veilfs's own files).
    pub shown_as: Option<std::path::PathBuf>,
    /// The plaintext path of the entry it copies, or the name of the veilfs file.
    pub copy_of: std::path::PathBuf,
    /// The tool that made it.
    pub tool: &'static str,
}

impl Vault {
    /// Every conflict copy in the vault, directory by directory (conflict copies of
    /// directories are walked too), and the copies that do not verify (integrity errors:
    /// not shown anywhere). Names and bindings only; no content is read.
    pub fn conflicts_under(&self) -> Result<(Vec<FoundCopy>, Vec<Error>)> {
        let (mut found, mut bad) = (Vec::new(), Vec::new());
        let mut todo = vec![(self.root()?, std::path::PathBuf::new())];
        while let Some((dir, plain)) = todo.pop() {
            let raw = crate::sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
            for r in &raw {
                if let ParsedEntry::Internal | ParsedEntry::Conflict(_) = ParsedEntry::parse(&r.name) {
                    let Some(c) = parse(&r.name).filter(|c| !c.is_of_entry()) else {
                        continue;
                    };
                    found.push(FoundCopy {
                        cipher_path: dir.path.join(String::from_utf8_lossy(&r.name).as_ref()),
                        shown_as: None,
                        copy_of: c.original.clone().into(),
                        tool: c.tool,
                    });
                }
            }
            let (copies, failed) = self.conflicts_in(&dir, raw.iter().map(|r| r.name.as_slice()));
            bad.extend(failed.into_iter().map(|b| b.error));
            for c in &copies {
                found.push(FoundCopy {
                    cipher_path: dir.path.join(&c.entry.on_disk),
                    shown_as: Some(plain.join(std::ffi::OsStr::from_bytes(&c.entry.name))),
                    copy_of: plain.join(std::ffi::OsStr::from_bytes(&c.original)),
                    tool: c.tool,
                });
            }
            let (entries, _) = self.list(&dir)?;
            for e in entries.iter().filter(|e| e.kind == crate::names::EntryKind::Dir) {
                match self.open_dir(&dir, e) {
                    Ok(sub) => todo.push((sub, plain.join(std::ffi::OsStr::from_bytes(&e.name)))),
                    Err(e) => bad.push(e),
                }
            }
        }
        found.sort_by(|a, b| a.cipher_path.cmp(&b.cipher_path));
        Ok((found, bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const D: &str = "Zm9vYmFyYmF6cXV4cXV1eAbc";
    const S: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

    fn entry() -> String {
        format!("{D}.{S}")
    }

    fn long_entry() -> String {
        format!("veilfs.L.{S}.{S}")
    }

    #[track_caller]
    fn copy_of(name: &str, original: &str, suffix: &str, tool: &str) {
        let c = parse(name.as_bytes()).unwrap_or_else(|| panic!("{name} is not recognised"));
        assert_eq!((c.original.as_str(), c.suffix.as_str(), c.tool), (original, suffix, tool), "{name}");
        assert!(
            matches!(ParsedEntry::parse(name.as_bytes()), ParsedEntry::Conflict(_)) || original.starts_with("veilfs.")
        );
    }

    #[test]
    fn syncthing_inserts_before_the_binding_or_appends() {
        let e = entry();
        let sfx = "sync-conflict-20261127-101010-ABCDEFG";
        copy_of(&format!("{D}.{sfx}.{S}"), &e, sfx, "Syncthing");
        copy_of(&format!("{e}.{sfx}"), &e, sfx, "Syncthing");
        let long = long_entry();
        copy_of(&format!("veilfs.L.{S}.{sfx}.{S}"), &long, sfx, "Syncthing");
        // veilfs's own files.
        copy_of(&format!("veilfs.{sfx}.lock"), "veilfs.lock", sfx, "Syncthing");
        copy_of(&format!("veilfs.{sfx}.conf"), "veilfs.conf", sfx, "Syncthing");
        copy_of(&format!("veilfs.{sfx}.diriv"), "veilfs.diriv", sfx, "Syncthing");
        copy_of(&format!("veilfs.N.{sfx}.{S}"), &format!("veilfs.N.{S}"), sfx, "Syncthing");
        // Not Syncthing's shape.
        for bad in [
            "sync-conflict-2026112-101010-ABCDEFG",
            "sync-conflict-20261127-10101-ABCDEFG",
            "sync-conflict-20261127-101010-",
        ] {
            assert!(parse(format!("{D}.{bad}.{S}").as_bytes()).is_none(), "{bad}");
        }
    }

    #[test]
    fn dropbox_nextcloud_owncloud() {
        let e = entry();
        let dbx = "host's conflicted copy 2026-11-27";
        copy_of(&format!("{D} ({dbx}).{S}"), &e, dbx, "Dropbox");
        copy_of(&format!("{D} ({dbx} (1)).{S}"), &e, &format!("{dbx} (1)"), "Dropbox");
        copy_of(&format!("veilfs ({dbx}).lock"), "veilfs.lock", dbx, "Dropbox");
        let nc = "conflicted copy 2026-11-27 101010";
        copy_of(&format!("{D} ({nc}).{S}"), &e, nc, "Nextcloud/ownCloud");
        copy_of(&format!("{e} ({nc})"), &e, nc, "Nextcloud/ownCloud");
        // ownCloud's older clients: on a user entry the part is base64url too, so the name is
        // another well-formed key first (like OneDrive's, see `counters_and_onedrive`); on
        // veilfs's own files it is recognised.
        let oc = format!("{D}_conflict-20261127-101010.{S}");
        assert!(matches!(ParsedEntry::parse(oc.as_bytes()), ParsedEntry::Short { .. }));
        copy_of("veilfs_conflict-20261127-101010.conf", "veilfs.conf", "conflict-20261127-101010", "ownCloud");
    }

    #[test]
    fn counters_and_onedrive() {
        let e = entry();
        copy_of(&format!("{D} (1).{S}"), &e, "1", "Google Drive or copy counter");
        copy_of(&format!("{D}(12).{S}"), &e, "12", "Google Drive or copy counter");
        copy_of(&format!("{e} (2)"), &e, "2", "Google Drive or copy counter");
        copy_of("veilfs-DESKTOP-AB12.lock", "veilfs.lock", "DESKTOP-AB12", "OneDrive");
        // A user entry with `-HOST` is another well-formed key: not taken for a copy here.
        assert!(matches!(ParsedEntry::parse(format!("{D}-HOST.{S}").as_bytes()), ParsedEntry::Short { .. }));
        assert!(parse(format!("{D} (x).{S}").as_bytes()).is_none());
        assert!(parse(b"report (1).txt").is_none(), "what is left must be a veilfs name");
    }

    /// A copy of a copy, as each tool names it: its part inserted before the extension again
    /// (Syncthing before 0.12.12 did; later ones keep no copy of a copy, but a vault synced by
    /// two tools, or restored from an old one, may still hold such names).
    #[test]
    fn copies_of_copies_are_peeled_to_the_original() {
        let e = entry();
        let (a, b) = ("sync-conflict-20261127-101010-AAAAAAA", "sync-conflict-20261128-090909-BBBBBBB");
        copy_of(&format!("{D}.{a}.{b}.{S}"), &e, &format!("{a}, {b}"), "Syncthing");
        copy_of(&format!("{e}.{a}.{b}"), &e, &format!("{a}, {b}"), "Syncthing");
        copy_of(&format!("veilfs.L.{S}.{a}.{b}.{S}"), &long_entry(), &format!("{a}, {b}"), "Syncthing");
        copy_of(&format!("veilfs.{a}.{b}.conf"), "veilfs.conf", &format!("{a}, {b}"), "Syncthing");
        let (x, y) = ("host's conflicted copy 2026-11-27", "host's conflicted copy 2026-11-28");
        copy_of(&format!("{D} ({x}) ({y}).{S}"), &e, &format!("{x}, {y}"), "Dropbox");
        copy_of(&format!("{D} ({x} (1)) ({y}).{S}"), &e, &format!("{x} (1), {y}"), "Dropbox");
        let (x, y) = ("conflicted copy 2026-11-27 101010", "conflicted copy 2026-11-28 090909");
        copy_of(&format!("{D} ({x}) ({y}).{S}"), &e, &format!("{x}, {y}"), "Nextcloud/ownCloud");
        let counter = "Google Drive or copy counter";
        copy_of(&format!("{D} (1) (1).{S}"), &e, "1, 1", counter);
        copy_of(&format!("{D} (1) (2).{S}"), &e, "1, 2", counter);
        copy_of(&format!("{D} (1) (2) (3) (4).{S}"), &e, "1, 2, 3, 4", counter);
        // Two tools: the tool named is the one whose part came last.
        copy_of(&format!("{D}.{a} (1).{S}"), &e, &format!("{a}, 1"), counter);
        copy_of(&format!("{D} (1).{a}.{S}"), &e, &format!("1, {a}"), "Syncthing");
        // Bounded: at most four parts, and the suffix shown at most SUFFIX_MAX long.
        assert!(parse(format!("{D} (1) (2) (3) (4) (5).{S}").as_bytes()).is_none());
        assert!(parse(format!("{D}.{a}.{b}.{a}.{S}").as_bytes()).is_none());
        // What is left must still be a veilfs name.
        assert!(parse(format!("{D} (x) (1).{S}").as_bytes()).is_none());
        assert!(parse(b"report (1) (2).txt").is_none());
        // Many parts that each could be a tool's, none leaving a veilfs name: refused, after
        // a bounded number of readings.
        let many = format!("{D}{}.x", format!(".{a}").repeat(6));
        assert!(parse(many.as_bytes()).is_none());
        let many = format!("{D}{}", ".(1)".repeat(60));
        assert!(parse(many.as_bytes()).is_none());
        // Shown with the collision counter after the last suffix.
        assert_eq!(display_name(b"r.txt", "1, 2", 2), b"r (1, 2 2).txt");
    }

    /// OneDrive's `-HOST` where the part before it has a fixed length: a long name's hash, a
    /// side file's hash, a directory IV name's IV, the binding. The hash may hold `-` itself;
    /// the fixed length gives the one reading.
    #[test]
    fn onedrive_on_fixed_length_names() {
        let h = "abcdefghij-klmnopqrstuvwxyz0123456789ABCDEF";
        assert_eq!(h.len(), 43);
        let long = format!("veilfs.L.{h}.{S}");
        for host in ["LAPTOP", "DESKTOP-AB12", "a", &"x".repeat(63)] {
            copy_of(&format!("veilfs.L.{h}-{host}.{S}"), &long, host, "OneDrive");
            copy_of(&format!("veilfs.N.{h}-{host}"), &format!("veilfs.N.{h}"), host, "OneDrive");
            copy_of(&format!("veilfs.N-{host}.{h}"), &format!("veilfs.N.{h}"), host, "OneDrive");
            copy_of(&format!("veilfs-{host}.diriv"), "veilfs.diriv", host, "OneDrive");
            let iv = "AAAAAAAAAAAAAAAAAAAAAA";
            copy_of(&format!("veilfs.diriv.{iv}-{host}"), &format!("veilfs.diriv.{iv}"), host, "OneDrive");
            copy_of(&format!("veilfs.diriv-{host}.{iv}"), &format!("veilfs.diriv.{iv}"), host, "OneDrive");
        }
        // Not a HOST (too long, `_`, empty), or what is left is no veilfs name.
        for bad in [
            format!("veilfs.L.{h}-{}.{S}", "x".repeat(64)),
            format!("veilfs.L.{h}-LAP_TOP.{S}"),
            format!("veilfs.L.{h}-.{S}"),
            format!("veilfs.L.{}-LAPTOP.{S}", &h[..42]),
            format!("veilfs.N.{h}x-LAPTOP"),
            "veilfs.tmp.abc-LAPTOP".to_string(),
        ] {
            assert!(parse(bad.as_bytes()).is_none(), "{bad}");
        }
        // What a sync tool makes of a long entry is never the long entry itself.
        assert!(matches!(ParsedEntry::parse(format!("veilfs.L.{h}-PC.{S}").as_bytes()), ParsedEntry::Conflict(_)));
    }

    /// On a short entry, OneDrive's `-HOST` and ownCloud's `_conflict-…` give readings to try
    /// once the name fails to decrypt: ownCloud's first, then each `-` from the right, while
    /// the key left keeps 23 characters, at most eight.
    #[test]
    fn short_copies_are_readings_to_try() {
        let readings = |key: &str| -> Vec<(String, String, &str)> {
            short_copy_candidates(key, S).into_iter().map(|c| (c.original, c.suffix, c.tool)).collect()
        };
        let orig = |k: &str| format!("{k}.{S}");
        assert_eq!(readings(&format!("{D}-LAPTOP")), [(orig(D), "LAPTOP".into(), "OneDrive")]);
        assert_eq!(
            readings(&format!("{D}-DESKTOP-AB12")),
            [(orig(&format!("{D}-DESKTOP")), "AB12".into(), "OneDrive"), (orig(D), "DESKTOP-AB12".into(), "OneDrive")]
        );
        assert_eq!(
            readings(&format!("{D}_conflict-20261127-101010")),
            [
                (orig(D), "conflict-20261127-101010".into(), "ownCloud"),
                (orig(&format!("{D}_conflict-20261127")), "101010".into(), "OneDrive"),
                (orig(&format!("{D}_conflict")), "20261127-101010".into(), "OneDrive")
            ]
        );
        // The key left must keep a short key's 23 characters; a HOST has no `_`.
        assert!(readings(&format!("{}-LAPTOP", &D[..22])).is_empty());
        assert!(readings(&format!("{D}-LAP_TOP")).is_empty());
        assert!(readings(&format!("{D}-{}", "x".repeat(64))).is_empty());
        assert!(readings(D).is_empty());
        assert!(readings(&format!("{}_conflict-20261127-101010", &D[..22])).iter().all(|r| r.2 == "OneDrive"));
        // Bounded.
        assert_eq!(readings(&format!("{D}{}", "-a".repeat(20))).len(), MAX_SHORT_SPLITS);
    }

    #[test]
    fn display_names_keep_the_extension_and_count_collisions() {
        assert_eq!(display_name(b"report.pdf", "1", 1), b"report (1).pdf");
        assert_eq!(display_name(b"a.tar.gz", "x", 2), b"a.tar (x 2).gz");
        assert_eq!(display_name(b".bashrc", "x", 1), b".bashrc (x)");
        assert_eq!(display_name(b"Makefile", "x", 1), b"Makefile (x)");
        let long = display_name(&[b'a'; 250], "sync-conflict-20261127-101010-ABCDEFG", 1);
        assert_eq!(long.len(), 255);
        assert!(long.ends_with(b" (sync-conflict-20261127-101010-ABCDEFG)"));
        let ext = [&[b'a'; 10][..], b".", &[b'e'; 240]].concat();
        assert!(display_name(&ext, "s", 1).len() <= 255);
        let names = assign(&[(b"r.txt".to_vec(), "1".into()), (b"r.txt".to_vec(), "1".into())], |n| n == b"r (1).txt");
        assert_eq!(names, vec![b"r (1 2).txt".to_vec(), b"r (1 3).txt".to_vec()]);
    }

    proptest! {
        /// No name veilfs writes is ever taken for a conflict copy: entries and its own files
        /// parse as before, whatever their bytes.
        #[test]
        fn veilfs_names_are_never_conflict_copies(d in "[A-Za-z0-9_-]{23,200}", s in "[A-Za-z0-9_-]{43}", iv in "[A-Za-z0-9_-]{22}") {
            for name in [format!("{d}.{s}"), format!("veilfs.L.{s}.{s}"), format!("veilfs.N.{s}"), format!("veilfs.diriv.{iv}"),
                         "veilfs.lock".into(), "veilfs.conf".into(), "veilfs.diriv".into()] {
                let copy = matches!(ParsedEntry::parse(name.as_bytes()), ParsedEntry::Conflict(_));
                prop_assert!(!copy, "{}", name);
            }
            let entry = format!("{d}.{s}");
            if entry.len() <= 255 {
                let short = matches!(ParsedEntry::parse(entry.as_bytes()), ParsedEntry::Short { .. });
                prop_assert!(short);
            }
        }

        /// What is recognised gives back exactly the original name.
        #[test]
        fn a_copy_gives_back_its_original(d in "[A-Za-z0-9_-]{23,100}", s in "[A-Za-z0-9_-]{43}", n in 1u32..999) {
            let copy = format!("{d} ({n}).{s}");
            let c = parse(copy.as_bytes()).unwrap();
            prop_assert_eq!(c.original, format!("{d}.{s}"));
            prop_assert_eq!(c.suffix, n.to_string());
        }

        /// And so is what is recognised as a copy of a copy.
        #[test]
        fn a_copy_of_a_copy_gives_back_its_original(d in "[A-Za-z0-9_-]{23,100}", s in "[A-Za-z0-9_-]{43}", n in 1u32..999, m in 1u32..999) {
            let copy = format!("{d} ({n}) ({m}).{s}");
            let c = parse(copy.as_bytes()).unwrap();
            prop_assert_eq!(c.original, format!("{d}.{s}"));
            prop_assert_eq!(c.suffix, format!("{n}, {m}"));
        }
    }
}
