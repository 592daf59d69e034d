//! Tombstones: what a client leaves in a directory when it takes an entry name out of it
//! (feature `"versions"`, docs/design/rollback.md "Layer 2", docs/FORMAT.md §19), so that
//! another client that remembers the entry (`crate::known`) can tell a deletion by a client
//! (a valid tombstone: forget it) from a deletion by whoever holds only the storage (no
//! tombstone: an alarm), and an entry put back after a client deleted it (entry present, its
//! latest tombstone record says deleted: "resurrected").
//!
//! A tombstone is about one on-disk entry name in one directory: the name carries the entry's
//! plaintext name, kind and identity under the directory's IV (its binding is deterministic
//! SIV, docs/FORMAT.md §6), so the same object under another name (a rename, a hard link) or
//! in another directory is another entry, and a rename never makes the renamed entry look
//! resurrected. What identifies it is its token `T = HMAC-SHA256(record-mac, "veilfs v1
//! tombstone name" ‖ dir IV ‖ on-disk name)[..16]`: only a client can compute one, and a
//! listing needs one HMAC per entry and no decryption.
//!
//! **One log per client per directory.** A client appends its records to its own file of the
//! directory, `veilfs.D.<base64url(client ID)>`: a header naming the client, then records of
//! [`RECORD_LEN`] bytes (token, deleted or back, the entry's kind, the time, and a MAC bound to
//! the directory's IV and the client). One writer per file, so two clients deleting in one
//! directory never edit one file and a sync tool makes no conflict copies of it in normal
//! life; a copy it makes all the same (a state copied to a second machine) is read as one
//! more log, since what a record says does not depend on the file's name. A record that does
//! not verify (planted, edited, moved from another directory) vouches for nothing and is
//! reported. A torn last record (a crash in an append) is ignored and cut by the next append.
//!
//! A name that comes back (renamed back, linked again) gets a "back" record, so it does not
//! read as resurrected; for one token the record with the latest time wins, the later one in
//! its log on a tie within a log, "back" on a tie across logs.
//!
//! **Expiry.** Records older than [`HORIZON_SECS`] (180 days) are dropped when their client
//! next appends to that log (the log is rewritten, then renamed over), and by `fsck --repair`
//! for every log. A client away longer than that finds the entries deleted meanwhile missing
//! without a tombstone and reports them as deleted by a non-client: a false alarm it cannot
//! avoid (docs/SECURITY.md §4.2a).

use crate::keys::{hmac_parts, SubKeys};
use crate::names::{b64_encode, DirIv};
use crate::sys;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What every tombstone log's name begins with (a sync tool's conflict copy of one too).
pub const LOG_PREFIX: &str = "veilfs.D";
/// How long a tombstone record is kept: 180 days.
pub const HORIZON_SECS: u64 = 180 * 86_400;
/// A log's header: magic `VFTL`, version 1, 3 zero bytes, the client's ID.
pub const HEADER_LEN: usize = 4 + 1 + 3 + 16;
/// A record: token (16), op (1), kind (1), time `u64be` (8), MAC (16).
pub const RECORD_LEN: usize = 16 + 1 + 1 + 8 + 16;
/// A log longer than this is not read (a planted endless file never costs more).
pub const MAX_LOG_LEN: u64 = 64 << 20;
const MAGIC: &[u8; 4] = b"VFTL";
const VERSION: u8 = 1;
const NAME_LABEL: &[u8] = b"veilfs v1 tombstone name";
const RECORD_LABEL: &[u8] = b"veilfs v1 tombstone";
/// Directories whose logs a process keeps parsed at most (then it starts over).
const CACHE_DIRS: usize = 4096;

/// What identifies an entry in a client's memory and in tombstone records: the first 16 bytes
/// of `HMAC-SHA256(record-mac, "veilfs v1 tombstone name" ‖ dir IV ‖ on-disk name)`.
pub type Token = [u8; 16];

/// The token of the on-disk entry `on_disk` of the directory of IV `dir_iv`.
pub fn token(keys: &SubKeys, dir_iv: &DirIv, on_disk: &[u8]) -> Token {
    let m = hmac_parts(keys.record_mac.expose(), &[NAME_LABEL, dir_iv, on_disk]);
    m[..16].try_into().expect("32 bytes")
}

/// The name of the log of client `client`.
pub fn log_name(client: &[u8; 16]) -> String {
    format!("{LOG_PREFIX}.{}", b64_encode(client))
}

/// Whether `name` is a tombstone log's (or a sync tool's copy of one).
pub fn is_log_name(name: &[u8]) -> bool {
    name.starts_with(LOG_PREFIX.as_bytes())
}

/// What a record says of its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A client took the name out of the directory.
    Deleted = 1,
    /// A client put the name back (a rename or link brought it back).
    Back = 2,
}

/// One verified record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Deleted or back.
    pub op: Op,
    /// The entry's kind byte (`EntryKind as u8`).
    pub kind: u8,
    /// When, in Unix seconds, by the writing client's clock.
    pub time: u64,
}

impl Event {
    /// Whether it is older than [`HORIZON_SECS`] at `now`.
    pub fn expired(&self, now: u64) -> bool {
        now.saturating_sub(self.time) > HORIZON_SECS
    }
}

fn record_mac(keys: &SubKeys, dir_iv: &DirIv, client: &[u8; 16], body: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(keys.record_mac.expose()).expect("any key length");
    for p in [RECORD_LABEL, dir_iv.as_slice(), client.as_slice(), body] {
        mac.update(&(p.len() as u32).to_be_bytes());
        mac.update(p);
    }
    mac
}

/// The bytes of the record saying `e` of token `t`, by `client`, in the directory of IV `dir_iv`.
pub fn encode(keys: &SubKeys, dir_iv: &DirIv, client: &[u8; 16], t: &Token, e: &Event) -> [u8; RECORD_LEN] {
    let mut r = [0u8; RECORD_LEN];
    r[..16].copy_from_slice(t);
    r[16] = e.op as u8;
    r[17] = e.kind;
    r[18..26].copy_from_slice(&e.time.to_be_bytes());
    let mac = record_mac(keys, dir_iv, client, &r[..26]).finalize().into_bytes();
    r[26..].copy_from_slice(&mac[..16]);
    r
}

/// Verifies (constant time) and parses one record of `client`'s log in the directory of IV
/// `dir_iv`.
pub fn decode(keys: &SubKeys, dir_iv: &DirIv, client: &[u8; 16], r: &[u8]) -> Option<(Token, Event)> {
    if r.len() != RECORD_LEN || record_mac(keys, dir_iv, client, &r[..26]).verify_truncated_left(&r[26..]).is_err() {
        return None;
    }
    let op = match r[16] {
        1 => Op::Deleted,
        2 => Op::Back,
        _ => return None,
    };
    let time = u64::from_be_bytes(r[18..26].try_into().expect("8"));
    Some((r[..16].try_into().expect("16"), Event { op, kind: r[17], time }))
}

/// A log's header for `client`.
pub fn header(client: &[u8; 16]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(MAGIC);
    h[4] = VERSION;
    h[8..].copy_from_slice(client);
    h
}

fn parse_header(h: &[u8]) -> Result<[u8; 16], String> {
    if h.len() < HEADER_LEN || &h[..4] != MAGIC {
        return Err("is not a tombstone log (no header)".into());
    }
    if h[4] != VERSION {
        return Err(format!("is a tombstone log of unknown version {}", h[4]));
    }
    Ok(h[8..HEADER_LEN].try_into().expect("16"))
}

/// One log as read: whose, its verified records in order, and what was wrong with it.
#[derive(Debug, Default)]
pub struct LogRead {
    /// The writing client's ID (from the header).
    pub client: [u8; 16],
    /// Verified records, in the log's order.
    pub records: Vec<(Token, Event)>,
    /// Why part or all of it vouches for nothing (`None`: every full record verified).
    pub bad: Option<String>,
    /// Bytes of a torn last record (a crash in an append; not damage).
    pub torn: usize,
    /// Bytes parsed (header and full records).
    pub len: u64,
}

/// Parses `bytes`, the part of a log from offset `from` (0, or the end of what was parsed
/// before, which must be header-plus-whole-records), for the directory of IV `dir_iv`;
/// `client` is the header's (known when `from > 0`).
fn parse(keys: &SubKeys, dir_iv: &DirIv, bytes: &[u8], from: u64, client: Option<[u8; 16]>) -> LogRead {
    let mut out = LogRead { len: from, ..LogRead::default() };
    let (client, body) = match client {
        Some(c) => (c, bytes),
        None => match parse_header(bytes) {
            Ok(c) => {
                out.len = HEADER_LEN as u64;
                (c, &bytes[HEADER_LEN..])
            }
            Err(why) => {
                out.bad = Some(why);
                return out;
            }
        },
    };
    out.client = client;
    let mut chunks = body.chunks_exact(RECORD_LEN);
    for r in chunks.by_ref() {
        match decode(keys, dir_iv, &client, r) {
            Some(rec) => out.records.push(rec),
            None => {
                let n = (out.len - HEADER_LEN as u64) / RECORD_LEN as u64;
                out.bad = Some(format!(
                    "record {} of the tombstone log does not verify for this directory and its client (planted, \
                     edited or moved); it and every later record vouch for nothing",
                    n + 1
                ));
                return out;
            }
        }
        out.len += RECORD_LEN as u64;
    }
    out.torn = chunks.remainder().len();
    out
}

/// Opens the log `name` of `dir` for reading: a regular file (never a link, FIFO or device)
/// no longer than [`MAX_LOG_LEN`].
fn open_log(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(OwnedFd, sys::Stat), String> {
    open_log_or_gone(dir, name).map_err(|e| e.unwrap_or_else(|| "cannot be read: it is gone".to_string()))
}

/// [`open_log`], telling a log that is gone (`Err(None)`: removed or renamed over since the
/// listing) from one that cannot be used (`Err(Some(why))`).
fn open_log_or_gone(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(OwnedFd, sys::Stat), Option<String>> {
    let (fd, st) = sys::open_regular_at(dir, name, libc::O_RDONLY).map_err(|e| match e {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
        Err(e) => Some(format!("cannot be read: {e}")),
        Ok(_) => Some("is not a regular file".to_string()),
    })?;
    if st.st_size as u64 > MAX_LOG_LEN {
        return Err(Some(format!("is {} bytes long, more than a tombstone log may be", st.st_size)));
    }
    Ok((fd, st))
}

fn read_from(fd: BorrowedFd<'_>, from: u64, to: u64) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; to.saturating_sub(from) as usize];
    let n = sys::pread_full(fd, &mut buf, from).map_err(|e| format!("cannot be read: {e}"))?;
    buf.truncate(n);
    Ok(buf)
}

/// Reads and verifies the whole log `name` of `dir` (IV `dir_iv`): for `fsck`.
pub fn read_log(dir: BorrowedFd<'_>, keys: &SubKeys, dir_iv: &DirIv, name: &[u8]) -> LogRead {
    match open_log(dir, name).and_then(|(fd, st)| read_from(fd.as_fd(), 0, st.st_size as u64)) {
        Ok(bytes) => parse(keys, dir_iv, &bytes, 0, None),
        Err(why) => LogRead { bad: Some(why), ..LogRead::default() },
    }
}

/// One log as a process keeps it parsed.
#[derive(Debug, Default)]
struct Parsed {
    ino: u64,
    client: Option<[u8; 16]>,
    len: u64,
    /// The latest record of each token in this log.
    latest: HashMap<Token, Event>,
    bad: Option<String>,
}

/// The tombstones of one directory: every log's records, merged.
#[derive(Debug, Default)]
pub struct DirTombs {
    logs: HashMap<Vec<u8>, Parsed>,
}

impl DirTombs {
    /// What the tombstones say last of token `t` (`None`: nothing).
    pub fn latest(&self, t: &Token) -> Option<Event> {
        self.latest_by(t).map(|(e, _)| e)
    }

    /// [`latest`](Self::latest) with the ID of the client whose record it is.
    pub fn latest_by(&self, t: &Token) -> Option<(Event, [u8; 16])> {
        let mut best: Option<(Event, [u8; 16])> = None;
        for l in self.logs.values() {
            let (Some(e), Some(c)) = (l.latest.get(t), l.client) else { continue };
            best = match best {
                Some(b) if b.0.time > e.time || (b.0.time == e.time && b.0.op == Op::Back) => Some(b),
                _ => Some((*e, c)),
            };
        }
        best
    }

    /// Whether a client's record says token `t` was deleted (and no later one brought it back).
    pub fn deleted(&self, t: &Token) -> bool {
        self.latest(t).is_some_and(|e| e.op == Op::Deleted)
    }

    /// Whether the directory has any tombstone record at all.
    pub fn is_empty(&self) -> bool {
        self.logs.values().all(|l| l.latest.is_empty())
    }

    /// Logs (by name) that vouch for nothing, in whole or from some record on, and why.
    pub fn bad(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = self
            .logs
            .iter()
            .filter_map(|(n, l)| l.bad.clone().map(|b| (String::from_utf8_lossy(n).into_owned(), b)))
            .collect();
        v.sort();
        v
    }

    /// Brings the log `name` up to date from `dir`: reads only what was appended since, unless
    /// the file was replaced (a compaction) or cut. A log that is gone is forgotten.
    fn refresh_log(&mut self, dir: BorrowedFd<'_>, keys: &SubKeys, dir_iv: &DirIv, name: &[u8]) {
        let (fd, st) = match open_log_or_gone(dir, name) {
            Ok(x) => x,
            Err(None) => {
                self.logs.remove(name);
                return;
            }
            Err(Some(why)) => {
                self.logs.insert(name.to_vec(), Parsed { bad: Some(why), ..Parsed::default() });
                return;
            }
        };
        let p = self.logs.entry(name.to_vec()).or_default();
        let size = st.st_size as u64;
        if p.ino == st.st_ino && p.len <= size && p.bad.is_none() && p.client.is_some() {
            if size - p.len < RECORD_LEN as u64 {
                return;
            }
        } else {
            *p = Parsed { ino: st.st_ino, ..Parsed::default() };
        }
        let bytes = match read_from(fd.as_fd(), p.len, size) {
            Ok(b) => b,
            Err(why) => {
                p.bad = Some(why);
                return;
            }
        };
        let r = parse(keys, dir_iv, &bytes, p.len, p.client);
        if p.client.is_none() && r.bad.is_none() || !r.records.is_empty() {
            p.client = Some(r.client);
        }
        for (t, e) in r.records {
            p.latest.insert(t, e);
        }
        p.len = r.len;
        p.bad = r.bad;
    }
}

/// A vault's tombstone logs as this process reads and writes them: a cache of every
/// directory's parsed logs (bounded), and the one lock under which this client appends.
#[derive(Debug)]
pub struct Tombstones {
    client: [u8; 16],
    dirs: Mutex<HashMap<DirIv, DirTombs>>,
    /// This client's logs kept open for appending (a few directories at a time): one
    /// `fstatat` and one `write` per deletion while the log stays the same file.
    own: Mutex<HashMap<DirIv, OwnLog>>,
}

/// One of this client's logs, open `O_APPEND`.
#[derive(Debug)]
struct OwnLog {
    fd: OwnedFd,
    ino: u64,
    opened: std::time::Instant,
}

/// How many of its logs a client keeps open at most.
const OWN_OPEN: usize = 64;
/// How long a log is kept open before it is opened again (and its expired records dropped).
const OWN_REOPEN: std::time::Duration = std::time::Duration::from_secs(3600);

impl Tombstones {
    /// For the client `client` (its ID in the client state, or a random one per run for a
    /// command that keeps no state).
    pub fn new(client: [u8; 16]) -> Tombstones {
        Tombstones { client, dirs: Mutex::new(HashMap::new()), own: Mutex::new(HashMap::new()) }
    }

    /// This client's ID, as its records carry it.
    pub fn client(&self) -> [u8; 16] {
        self.client
    }

    /// Runs `f` on the tombstones of the directory `dir` (IV `dir_iv`), brought up to date.
    /// `names`: the directory's on-disk names from a listing just made (the logs among them
    /// are the directory's); `None`: the logs this process knew of, or a listing if it knew
    /// none.
    pub fn with_dir<R>(
        &self,
        dir: BorrowedFd<'_>,
        keys: &SubKeys,
        dir_iv: &DirIv,
        names: Option<&[&[u8]]>,
        f: impl FnOnce(&DirTombs) -> R,
    ) -> R {
        let mut dirs = lock(&self.dirs);
        if dirs.len() >= CACHE_DIRS && !dirs.contains_key(dir_iv) {
            dirs.clear();
        }
        let known = dirs.contains_key(dir_iv);
        let d = dirs.entry(*dir_iv).or_default();
        let listed: Vec<Vec<u8>> = match names {
            Some(n) => n.iter().filter(|n| is_log_name(n)).map(|n| n.to_vec()).collect(),
            None if known => d.logs.keys().cloned().collect(),
            None => sys::read_dir_fd(dir)
                .map(|r| r.into_iter().map(|e| e.name).filter(|n| is_log_name(n)).collect())
                .unwrap_or_default(),
        };
        d.logs.retain(|n, _| listed.contains(n));
        for n in &listed {
            d.refresh_log(dir, keys, dir_iv, n);
        }
        f(d)
    }

    /// Forgets what this process parsed of the directory `dir_iv` (it was removed).
    pub fn forget_dir(&self, dir_iv: &DirIv) {
        lock(&self.dirs).remove(dir_iv);
        lock(&self.own).remove(dir_iv);
    }

    /// Appends this client's records `recs` (token and event) to its log in `dir` (IV
    /// `dir_iv`), creating it. When it opens the log (the first append in that directory, or
    /// an hour after it last did) it cuts a torn last record, starts the log over if its
    /// header is not this client's, and rewrites it without its expired records when its
    /// first one has expired. Never follows a link; refuses a log that is not a regular file
    /// or has other hard links (nothing is written through it). Each append is one `write`
    /// to the file opened `O_APPEND`, so a mount and a command of this machine appending at
    /// once never overwrite each other's records. Not synced: a record a crash loses makes
    /// another client report the deletion as a non-client's (a false alarm `fsck --accept`
    /// settles), never hides one.
    pub fn append(
        &self,
        dir: BorrowedFd<'_>,
        keys: &SubKeys,
        dir_iv: &DirIv,
        recs: &[(Token, Event)],
    ) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(recs.len() * RECORD_LEN);
        for (t, e) in recs {
            buf.extend_from_slice(&encode(keys, dir_iv, &self.client, t, e));
        }
        let name = log_name(&self.client);
        let mut own = lock(&self.own);
        // Still the file this client has open under that name (not replaced by a repair,
        // removed with its directory, or swapped)?
        let current = own.get(dir_iv).is_some_and(|l| {
            l.opened.elapsed() < OWN_REOPEN
                && sys::fstatat(dir, name.as_bytes()).is_ok_and(|st| {
                    st.st_ino == l.ino
                        && st.st_mode & libc::S_IFMT == libc::S_IFREG
                        && st.st_nlink == 1
                        // A torn record (another process of this machine died in an append)
                        // is cut by opening the log again.
                        && (st.st_size as u64)
                            .checked_sub(HEADER_LEN as u64)
                            .is_some_and(|body| body % RECORD_LEN as u64 == 0)
                })
        });
        if !current {
            if own.len() >= OWN_OPEN {
                own.clear();
            }
            let log = self.open_own(dir, keys, dir_iv, &name)?;
            own.insert(*dir_iv, log);
        }
        let fd = &own.get(dir_iv).expect("inserted above").fd;
        // What this process knows of the directory's logs includes its own from now on (a
        // log made after the directory was last listed would be missed otherwise, and a name
        // this client deleted and brings back would read as put back by the storage).
        if let Some(d) = lock(&self.dirs).get_mut(dir_iv).filter(|d| !d.logs.contains_key(name.as_bytes())) {
            d.logs.insert(name.into_bytes(), Parsed::default());
        }
        let n = rustix::io::write(fd, &buf)?;
        if n != buf.len() {
            // A full disk mid-record: cut the torn part (the next opening would too).
            let st = sys::fstat(fd.as_fd())?;
            let keep = (st.st_size as u64).saturating_sub(n as u64);
            let _ = sys::ftruncate(fd.as_fd(), keep);
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }

    /// Opens (creating) this client's log `name` of `dir` for appending: a torn last record
    /// cut, a header that is not this client's started over, expired records dropped.
    fn open_own(&self, dir: BorrowedFd<'_>, keys: &SubKeys, dir_iv: &DirIv, name: &str) -> std::io::Result<OwnLog> {
        let flags = libc::O_RDWR
            | libc::O_APPEND
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_NONBLOCK
            | libc::O_NOCTTY
            | libc::O_CLOEXEC;
        let fd = sys::openat(dir, name.as_bytes(), flags, 0o600)?;
        let st = sys::fstat(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink != 1 {
            return Err(std::io::Error::other(format!(
                "{name} is not a tombstone log of its own (not a regular file, or {} hard links): nothing was \
                 written to it",
                st.st_nlink
            )));
        }
        let size = st.st_size as u64;
        let mut h = [0u8; HEADER_LEN];
        let ours = size >= HEADER_LEN as u64
            && sys::pread_full(fd.as_fd(), &mut h, 0)? == HEADER_LEN
            && h == header(&self.client);
        if !ours {
            // New, torn in its header, or edited: nothing in it reads, so it starts over.
            sys::ftruncate(fd.as_fd(), 0)?;
            sys::pwrite_all(fd.as_fd(), &header(&self.client), 0)?;
            return Ok(OwnLog { fd, ino: st.st_ino, opened: std::time::Instant::now() });
        }
        let end = HEADER_LEN as u64 + (size - HEADER_LEN as u64) / RECORD_LEN as u64 * RECORD_LEN as u64;
        if end != size {
            sys::ftruncate(fd.as_fd(), end)?;
        }
        let mut first = [0u8; RECORD_LEN];
        if end > HEADER_LEN as u64
            && sys::pread_full(fd.as_fd(), &mut first, HEADER_LEN as u64)? == RECORD_LEN
            && now().saturating_sub(u64::from_be_bytes(first[18..26].try_into().expect("8"))) > HORIZON_SECS
        {
            drop(fd);
            rewrite(dir, keys, dir_iv, name.as_bytes(), |e| !e.expired(now()))?;
            return self.open_own(dir, keys, dir_iv, name);
        }
        Ok(OwnLog { fd, ino: st.st_ino, opened: std::time::Instant::now() })
    }
}

/// Rewrites the log `name` of `dir` keeping the verified records `keep` accepts, under a
/// temporary name renamed over it (removed if nothing is kept or its header does not
/// parse). For compaction and `fsck --repair`. Returns the records dropped.
pub fn rewrite(
    dir: BorrowedFd<'_>,
    keys: &SubKeys,
    dir_iv: &DirIv,
    name: &[u8],
    keep: impl Fn(&Event) -> bool,
) -> std::io::Result<usize> {
    let r = read_log(dir, keys, dir_iv, name);
    let kept: Vec<&(Token, Event)> = r.records.iter().filter(|(_, e)| keep(e)).collect();
    let dropped = r.records.len() - kept.len();
    if kept.is_empty() {
        sys::unlinkat(dir, name, false)?;
        return Ok(dropped);
    }
    let mut buf = header(&r.client).to_vec();
    for (t, e) in kept {
        buf.extend_from_slice(&encode(keys, dir_iv, &r.client, t, e));
    }
    let tmp = crate::names::temp_name();
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let fd = sys::openat(dir, tmp.as_bytes(), flags, 0o600)?;
    let w = sys::pwrite_all(fd.as_fd(), &buf, 0).and_then(|()| sys::renameat2(dir, tmp.as_bytes(), dir, name, 0));
    if w.is_err() {
        let _ = sys::unlinkat(dir, tmp.as_bytes(), false);
    }
    w.map(|()| dropped)
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MasterKey;

    fn keys() -> SubKeys {
        MasterKey::from_bytes([9; 32]).subkeys()
    }

    /// A record verifies only for its own directory and client, and not once edited.
    #[test]
    fn a_tombstone_record_verifies_only_for_its_directory_and_client() {
        let keys = keys();
        let (iv, client) = ([1u8; 16], [7u8; 16]);
        let t = token(&keys, &iv, b"abc.def");
        assert_ne!(t, token(&keys, &iv, b"abc.xyz"));
        assert_ne!(t, token(&keys, &[2; 16], b"abc.def"));
        let e = Event { op: Op::Deleted, kind: 1, time: 1_700_000_000 };
        let r = encode(&keys, &iv, &client, &t, &e);
        assert_eq!(decode(&keys, &iv, &client, &r), Some((t, e)));
        assert_eq!(decode(&keys, &[2; 16], &client, &r), None);
        assert_eq!(decode(&keys, &iv, &[8; 16], &r), None);
        for i in 0..RECORD_LEN {
            let mut edited = r;
            edited[i] ^= 1;
            assert_eq!(decode(&keys, &iv, &client, &edited), None, "byte {i}");
        }
        assert!(e.expired(e.time + HORIZON_SECS + 1) && !e.expired(e.time + HORIZON_SECS));
    }

    /// A client's own records count in what it reads of a directory it listed before its log
    /// existed (else a name it deleted and brings back would read as put back).
    #[test]
    fn a_clients_own_new_log_counts_in_a_directory_it_listed_before() {
        let keys = keys();
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        let iv = [4u8; 16];
        let me = Tombstones::new([1; 16]);
        let t = token(&keys, &iv, b"one");
        assert!(!me.with_dir(d.as_fd(), &keys, &iv, Some(&[]), |x| x.deleted(&t)));
        me.append(d.as_fd(), &keys, &iv, &[(t, Event { op: Op::Deleted, kind: 1, time: now() })]).unwrap();
        assert!(me.with_dir(d.as_fd(), &keys, &iv, None, |x| x.deleted(&t)));
    }

    /// Appends, a torn last record, a later "back", a second client's log, an edited record,
    /// a conflict copy of a log, and a compaction of expired records.
    #[test]
    fn logs_append_merge_and_compact() {
        let keys = keys();
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        let iv = [3u8; 16];
        let (a, b) = (Tombstones::new([1; 16]), Tombstones::new([2; 16]));
        let (t1, t2) = (token(&keys, &iv, b"one"), token(&keys, &iv, b"two"));
        let ev = |op, time| Event { op, kind: 1, time };
        let n = now();
        a.append(d.as_fd(), &keys, &iv, &[(t1, ev(Op::Deleted, n))]).unwrap();
        let reader = Tombstones::new([9; 16]);
        assert!(reader.with_dir(d.as_fd(), &keys, &iv, None, |t| t.deleted(&t1) && !t.deleted(&t2)));
        // A torn append: the reader ignores the partial record, the next append cuts it.
        let log = dir.path().join(log_name(&[1; 16]));
        let mut bytes = std::fs::read(&log).unwrap();
        bytes.extend_from_slice(&[0xAA; 10]);
        std::fs::write(&log, &bytes).unwrap();
        assert!(reader.with_dir(d.as_fd(), &keys, &iv, None, |t| t.deleted(&t1) && t.bad().is_empty()));
        a.append(d.as_fd(), &keys, &iv, &[(t2, ev(Op::Deleted, n))]).unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().len(), (HEADER_LEN + 2 * RECORD_LEN) as u64);
        assert!(reader.with_dir(d.as_fd(), &keys, &iv, None, |t| t.deleted(&t1) && t.deleted(&t2)));
        // Another client brings `one` back, later: not deleted any more.
        b.append(d.as_fd(), &keys, &iv, &[(t1, ev(Op::Back, n + 1))]).unwrap();
        let names: Vec<Vec<u8>> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_encoded_bytes()).collect();
        let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
        assert!(reader.with_dir(d.as_fd(), &keys, &iv, Some(&refs), |t| !t.deleted(&t1) && t.deleted(&t2)));
        // A sync tool's copy of a log reads as one more log.
        std::fs::copy(&log, dir.path().join("veilfs.D.sync-conflict-20261128-101010-ABCDEFG.AQEBAQEBAQEBAQEBAQEBAQ"))
            .unwrap();
        let fresh = Tombstones::new([9; 16]);
        assert!(fresh.with_dir(d.as_fd(), &keys, &iv, None, |t| t.deleted(&t2) && t.bad().is_empty()));
        // An edited record vouches for nothing from there on, and is reported.
        let mut bytes = std::fs::read(&log).unwrap();
        bytes[HEADER_LEN + RECORD_LEN + 3] ^= 1;
        std::fs::write(&log, &bytes).unwrap();
        std::fs::remove_file(dir.path().join("veilfs.D.sync-conflict-20261128-101010-ABCDEFG.AQEBAQEBAQEBAQEBAQEBAQ"))
            .unwrap();
        let fresh = Tombstones::new([9; 16]);
        let (deleted2, bad) = fresh.with_dir(d.as_fd(), &keys, &iv, None, |t| (t.deleted(&t2), t.bad()));
        assert!(!deleted2);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].1.contains("record 2"), "{bad:?}");
        // Expired records go at the owner's next append.
        let c = Tombstones::new([5; 16]);
        let old = n - HORIZON_SECS - 10;
        c.append(d.as_fd(), &keys, &iv, &[(t1, ev(Op::Deleted, old)), (t2, ev(Op::Deleted, old))]).unwrap();
        let clog = dir.path().join(log_name(&[5; 16]));
        assert_eq!(std::fs::metadata(&clog).unwrap().len(), (HEADER_LEN + 2 * RECORD_LEN) as u64);
        // The same client's next run (a log it has not opened yet).
        let c = Tombstones::new([5; 16]);
        c.append(d.as_fd(), &keys, &iv, &[(t1, ev(Op::Deleted, n))]).unwrap();
        assert_eq!(std::fs::metadata(&clog).unwrap().len(), (HEADER_LEN + RECORD_LEN) as u64);
        // A log replaced behind an open one (a repair elsewhere renamed over it) is opened
        // again: the record lands in the file the name has now.
        let copy = dir.path().join("copy");
        std::fs::copy(&clog, &copy).unwrap();
        std::fs::rename(&copy, &clog).unwrap();
        c.append(d.as_fd(), &keys, &iv, &[(t2, ev(Op::Deleted, n))]).unwrap();
        assert_eq!(std::fs::metadata(&clog).unwrap().len(), (HEADER_LEN + 2 * RECORD_LEN) as u64);
    }
}
