//! What this client remembers of a vault (docs/design/rollback.md, "Layer 2"): the highest
//! generation it has seen of every file with a block map and of the config, so that a whole
//! file or the config put back to an older version is an error here even though the older
//! copy is, in itself, perfectly valid ciphertext.
//!
//! The ciphertext alone cannot tell: a complete older copy of a file (header, map and blocks)
//! authenticates. Only a client that saw the newer version can object, so the memory lives
//! outside the ciphertext, per machine and user: `$XDG_STATE_HOME/veilfs/<vault ID>/`, else
//! `$HOME/.local/state/veilfs/<vault ID>/` (`$VEILFS_STATE_DIR/<vault ID>/` if that is set;
//! docs/GUIDE.md). The vault ID is derived from the
//! config's authenticated `root_dir_iv` ([`vault_id`]; docs/FORMAT.md §4.3), since the config
//! has no ID field of its own.
//!
//! Two files (docs/FORMAT.md §4.3): a snapshot `known` (written to a temporary name, synced,
//! renamed) and an append-only log `known.log` of records since it. Every record is a
//! max-merge (a generation only ever goes up), so replaying a log a compaction already
//! folded in changes nothing, and a torn tail only loses its last records: the client then
//! trusts those objects again, which is the safe direction for a cache of "what I saw".
//! Both are authenticated under a subkey of the vault key (HKDF label `client-state`), so a
//! state from another vault, or one edited by hand, is refused rather than silently used;
//! the snapshot also names its vault ID. This guards against mistakes and against whoever
//! holds only the storage; a local user who can write the state directory can make this
//! client forget (delete it) — that is outside what a client-side memory can defend.
//!
//! Two processes of one user on one vault (a mount and a `veilfs cat`) each keep a table of
//! their own and append to the same log (whole records, `O_APPEND`); a compaction by one can
//! drop records the other appended meanwhile, which again only makes this client trust those
//! objects as it next finds them.
//!
//! Cost: the mount is multi-threaded, so the table is a `Mutex`'d map; a check is one lookup.
//! New records are batched in memory and appended [`BATCH`] at a time (no `fsync` per open);
//! [`Known::flush`] (the end of a command, unmount, drop) appends the rest and syncs.

use crate::content::header::FileId;
use crate::error::{Error, Result};
use crate::keys::{hmac16, MasterKey, SecretBytes};
use crate::tombstone::Token;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The snapshot's file name in the state directory.
pub const SNAPSHOT_NAME: &str = "known";
/// The log's file name in the state directory.
pub const LOG_NAME: &str = "known.log";
/// The snapshot's first 8 bytes: `veilfsK2` (files, then directory entries); a `veilfsK1`
/// snapshot (files only, before the entries were remembered) is read as one without entries.
const MAGIC: &[u8; 8] = b"veilfsK2";
const MAGIC_V1: &[u8; 8] = b"veilfsK1";
/// Snapshot header: magic, vault ID, client ID, trusted since, config generation, count.
const SNAP_HEAD: usize = 8 + 16 + 16 + 8 + 8 + 8;
/// One snapshot entry: file ID, generation, writer.
const SNAP_ENTRY: usize = 16 + 8 + 8;
/// One remembered directory entry in the snapshot: directory IV, entry token
/// (`crate::tombstone::token`).
const SNAP_DIR_ENTRY: usize = 16 + 16;
/// One log record: kind, file ID (zero for the config), generation, writer, MAC. An entry
/// record has the directory IV where the file ID is and the entry's token in the 16 bytes of
/// generation and writer.
const REC_LEN: usize = 1 + 16 + 8 + 8 + 16;
const KIND_FILE: u8 = 1;
const KIND_CONFIG: u8 = 2;
/// A directory entry seen.
const KIND_ENTRY: u8 = 3;
/// A directory entry forgotten (removed by a client, or adopted as gone by `fsck --accept`).
const KIND_GONE: u8 = 4;
/// Records kept in memory before they are appended (without `fsync`).
pub const BATCH: usize = 64;
/// A log longer than this many records (and than the table) is folded into a new snapshot
/// when the state is opened.
const COMPACT_AFTER: u64 = 4096;

/// What a check does with what it sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Trust {
    /// Refuse an older generation than the one remembered; remember newer ones.
    #[default]
    Check,
    /// Read anyway (`--allow-rollback`, for recovery): neither refuse nor change the state.
    AllowRollback,
    /// Adopt what is there now, older or newer (`fsck --accept`, after the user decided).
    Accept,
}

/// How a front end asks for the client state.
#[derive(Clone, Debug, Default)]
pub struct KnownOptions {
    /// The state root instead of `$XDG_STATE_HOME/veilfs` (tests, and callers that know
    /// better); the vault's directory is `<root>/<vault ID>`.
    pub root: Option<PathBuf>,
    /// What checks do.
    pub trust: Trust,
}

/// The vault ID: the first 16 bytes of `SHA-256("veilfs vault id" ‖ root directory IV)`, in
/// lowercase hex. The root IV is random per vault and authenticated by the config's MAC.
pub fn vault_id(root_iv: &[u8; 16]) -> String {
    let d = Sha256::new().chain_update(b"veilfs vault id").chain_update(root_iv).finalize();
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The state root: `$VEILFS_STATE_DIR` if set (the override the tests use, as for the
/// crash marks of `crate::unclean`), else `$XDG_STATE_HOME/veilfs` if that is an absolute
/// path, else `$HOME/.local/state/veilfs` — root included: what a client saw belongs to the
/// user who unlocks, not to the machine (`/var/lib` is not used).
pub fn default_root() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VEILFS_STATE_DIR").filter(|v| !v.is_empty()) {
        return Some(p.into());
    }
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Some(x.join("veilfs"));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).filter(|p| p.is_absolute())?;
    Some(home.join(".local/state/veilfs"))
}

/// What `veilfs info` shows without the key (read, not authenticated).
#[derive(Clone, Debug)]
pub struct Summary {
    /// The vault's state directory.
    pub dir: PathBuf,
    /// The client ID, hex; `None` when there is no state yet.
    pub client_id: Option<String>,
    /// Unix seconds since when this client trusts the vault.
    pub trusted_since: Option<u64>,
    /// Files in the snapshot plus records in the log (an upper bound of objects known).
    pub objects: u64,
}

/// Reads the state of the vault whose root IV is `root_iv` under `root` (or the default
/// root) for display; nothing is verified (that needs the key).
pub fn summary(root: Option<&Path>, root_iv: &[u8; 16]) -> Option<Summary> {
    let dir = root.map(Path::to_path_buf).or_else(default_root)?.join(vault_id(root_iv));
    let snap = std::fs::read(dir.join(SNAPSHOT_NAME)).ok();
    let log_len = std::fs::metadata(dir.join(LOG_NAME)).map_or(0, |m| m.len());
    let Some(s) = snap.filter(|s| s.len() >= SNAP_HEAD && (&s[..8] == MAGIC || &s[..8] == MAGIC_V1)) else {
        return Some(Summary { dir, client_id: None, trusted_since: None, objects: 0 });
    };
    Some(Summary {
        client_id: Some(hex(&s[24..40])),
        trusted_since: Some(u64::from_be_bytes(s[40..48].try_into().expect("8"))),
        objects: u64::from_be_bytes(s[56..64].try_into().expect("8")) + log_len / REC_LEN as u64,
        dir,
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// One remembered version: generation and writer (the first 8 bytes of a client ID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The generation.
    pub generation: u64,
    /// Who wrote it.
    pub writer: [u8; 8],
}

struct Table {
    files: HashMap<FileId, Seen>,
    /// Per directory IV, the tokens of the entries this client saw in it when it last listed
    /// it (`crate::tombstone`).
    entries: HashMap<[u8; 16], HashSet<Token>>,
    config: u64,
    /// Records not yet appended.
    pending: Vec<u8>,
    /// Records in the log file.
    logged: u64,
    log: Option<File>,
    /// A generation was lowered (`Trust::Accept`): the log's records only ever raise one, so
    /// the table must go to a new snapshot instead.
    lowered: bool,
}

/// A client's memory of one vault. Shared by every open file (`Arc` in the content context).
pub struct Known {
    dir: PathBuf,
    vault_id: String,
    client_id: [u8; 16],
    since: u64,
    trust: Trust,
    key: SecretBytes<32>,
    first_use: bool,
    table: Mutex<Table>,
}

impl std::fmt::Debug for Known {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Known").field("dir", &self.dir).field("trust", &self.trust).finish_non_exhaustive()
    }
}

fn state_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Invalid(format!(
        "client state {}: {detail}; to trust the vault as it is now, move that directory away",
        path.display()
    ))
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::io(path.display().to_string(), e)
}

impl Known {
    /// Opens (or, at first use, creates) the state of the vault with root IV `root_iv` and
    /// config generation `config_generation`, keyed by `master`. A first use trusts what is
    /// there and says so once (a warning); see [`first_use`](Self::first_use).
    pub fn open(opts: &KnownOptions, root_iv: &[u8; 16], master: &MasterKey) -> Result<Known> {
        let root = opts.root.clone().or_else(default_root).ok_or_else(|| {
            Error::io(
                "no place for the client state (neither XDG_STATE_HOME nor HOME is an absolute path)",
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
        let vault_id = vault_id(root_iv);
        let dir = root.join(&vault_id);
        let key: SecretBytes<32> = master.derive("client-state");
        let snap_path = dir.join(SNAPSHOT_NAME);
        let bytes = match std::fs::read(&snap_path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&snap_path, e)),
        };
        let mut known = Known {
            dir,
            vault_id,
            client_id: [0; 16],
            since: 0,
            trust: opts.trust,
            key,
            first_use: bytes.is_none(),
            table: Mutex::new(Table {
                files: HashMap::new(),
                entries: HashMap::new(),
                config: 0,
                pending: Vec::new(),
                logged: 0,
                log: None,
                lowered: false,
            }),
        };
        match bytes {
            None => {
                known.client_id = crate::random::bytes();
                known.since = now();
                // The state root as any directory (it may be shared, as `VEILFS_STATE_DIR` is by
                // the crash marks); the vault's own directory for this user alone.
                std::fs::create_dir_all(&root).map_err(|e| io_err(&root, e))?;
                match std::fs::DirBuilder::new().mode(0o700).create(&known.dir) {
                    // Made by a first use that stopped before its snapshot, or at the same time.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    r => r.map_err(|e| io_err(&known.dir, e))?,
                }
                let snap = known.snapshot_bytes(&HashMap::new(), &HashMap::new(), 0);
                known.write_snapshot(&snap)?;
                let _ = std::fs::remove_file(known.dir.join(LOG_NAME));
            }
            Some(b) => known.parse_snapshot(&b, &snap_path)?,
        }
        known.open_log()?;
        Ok(known)
    }

    /// Whether this state was made just now (no state for this vault ID existed).
    pub fn first_use(&self) -> bool {
        self.first_use
    }

    /// The vault's state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The vault ID (hex) that names the directory.
    pub fn vault_id(&self) -> &str {
        &self.vault_id
    }

    /// The client ID (random, not secret).
    pub fn client_id(&self) -> [u8; 16] {
        self.client_id
    }

    /// What a header this client writes carries as its writer.
    pub fn writer(&self) -> [u8; 8] {
        self.client_id[..8].try_into().expect("16 bytes")
    }

    /// Unix seconds since when this client trusts the vault.
    pub fn trusted_since(&self) -> u64 {
        self.since
    }

    /// What checks do.
    pub fn trust(&self) -> Trust {
        self.trust
    }

    /// Files remembered.
    pub fn objects(&self) -> usize {
        self.lock().files.len()
    }

    /// The remembered version of file `id`.
    pub fn file(&self, id: &FileId) -> Option<Seen> {
        self.lock().files.get(id).copied()
    }

    /// The remembered config generation.
    pub fn config_generation(&self) -> u64 {
        self.lock().config
    }

    /// The entries this client remembers in the directory of IV `dir` (their tokens).
    pub fn entries(&self, dir: &[u8; 16]) -> HashSet<Token> {
        self.lock().entries.get(dir).cloned().unwrap_or_default()
    }

    /// Entries remembered, over every directory.
    pub fn entry_count(&self) -> usize {
        self.lock().entries.values().map(HashSet::len).sum()
    }

    /// Updates what this client remembers of the directory of IV `dir`: `seen` are entries it
    /// found there (remembered if new), `gone` entries it forgets (removed by a client, or
    /// adopted as gone). Nothing changes under `--allow-rollback`.
    pub fn update_entries(&self, dir: &[u8; 16], seen: &[Token], gone: &[Token]) {
        if self.trust == Trust::AllowRollback || (seen.is_empty() && gone.is_empty()) {
            return;
        }
        let mut t = self.lock();
        let mut recs: Vec<(u8, Token)> = Vec::new();
        {
            let set = t.entries.entry(*dir).or_default();
            for tok in seen {
                if set.insert(*tok) {
                    recs.push((KIND_ENTRY, *tok));
                }
            }
            for tok in gone {
                if set.remove(tok) {
                    recs.push((KIND_GONE, *tok));
                }
            }
        }
        let changed = !recs.is_empty();
        for (kind, tok) in recs {
            let s = Seen {
                generation: u64::from_be_bytes(tok[..8].try_into().expect("8")),
                writer: tok[8..].try_into().expect("8"),
            };
            self.append(&mut t, kind, dir, s);
        }
        // Written through (one `write`, no `fsync`): what a directory held and what this client
        // removed must survive the process being killed, or a removal interrupted by that
        // crash would look like an entry put back (`Vault::check_entries`).
        if changed {
            if let Err(e) = self.write_pending(&mut t) {
                tracing::warn!("{e}");
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A file with a block map whose authenticated header says `seen` was opened (`what`
    /// names its ciphertext). Older than remembered: [`Error::Rollback`] (unless the trust
    /// says otherwise); newer: remembered. The same generation by another writer is two
    /// clients' concurrent sessions, a conflict for sync handling, not a rollback.
    pub fn check_file(&self, id: &FileId, seen: Seen, what: &str) -> Result<()> {
        if self.trust == Trust::AllowRollback {
            return Ok(());
        }
        let mut t = self.lock();
        match t.files.get(id).copied() {
            Some(k) if k.generation > seen.generation && self.trust == Trust::Check => Err(Error::Rollback {
                what: what.to_string(),
                detail: format!(
                    "rolled back: generation {}, this client saw {}; `--allow-rollback` reads it anyway, `veilfs \
                     fsck --accept` adopts it",
                    seen.generation, k.generation
                ),
            }),
            // The same generation by another writer: concurrent sessions on two clients.
            Some(k) if k.generation == seen.generation => Ok(()),
            // Newer (another client's edit), new to this client, or older under `Accept`.
            k => {
                t.lowered |= k.is_some();
                t.files.insert(*id, seen);
                self.append(&mut t, KIND_FILE, id, seen);
                Ok(())
            }
        }
    }

    /// This client wrote a header of file `id` with `seen` (its own session): remembered if
    /// newer. Nothing is remembered under `--allow-rollback`.
    pub fn wrote_file(&self, id: &FileId, seen: Seen) {
        if self.trust == Trust::AllowRollback {
            return;
        }
        let mut t = self.lock();
        if t.files.get(id).is_some_and(|k| k.generation >= seen.generation) {
            return;
        }
        t.files.insert(*id, seen);
        self.append(&mut t, KIND_FILE, id, seen);
    }

    /// The generation a new header of file `id` must exceed: what this client saw of it (a
    /// file emptied on another handle starts over from nothing on disk).
    pub fn floor(&self, id: &FileId) -> u64 {
        self.lock().files.get(id).map_or(0, |k| k.generation)
    }

    /// The config at `path` has generation `g`, just unlocked: older than remembered is a
    /// config rollback ([`Error::Rollback`], unless the trust says otherwise).
    pub fn check_config(&self, g: u64, path: &Path) -> Result<()> {
        if self.trust == Trust::AllowRollback {
            return Ok(());
        }
        let mut t = self.lock();
        if g < t.config && self.trust == Trust::Check {
            return Err(Error::Rollback {
                what: path.display().to_string(),
                detail: format!(
                    "config rolled back: generation {g}, this client saw {} (since {}): an older copy of the config \
                     was put back (a removed password may work again); restore the newer config, or run `veilfs \
                     fsck --accept` to adopt this one",
                    t.config, self.since
                ),
            });
        }
        if g != t.config {
            t.lowered |= g < t.config;
            t.config = g;
            self.append(&mut t, KIND_CONFIG, &[0; 16], Seen { generation: g, writer: [0; 8] });
        }
        Ok(())
    }

    /// This client wrote config generation `g`.
    pub fn wrote_config(&self, g: u64) {
        if self.trust == Trust::AllowRollback {
            return;
        }
        let mut t = self.lock();
        if g > t.config {
            t.config = g;
            self.append(&mut t, KIND_CONFIG, &[0; 16], Seen { generation: g, writer: [0; 8] });
        }
        drop(t);
        // A config change is rare and worth remembering at once.
        if let Err(e) = self.flush() {
            tracing::warn!("{e}");
        }
    }

    fn record(&self, kind: u8, id: &FileId, s: Seen) -> [u8; REC_LEN] {
        let mut r = [0u8; REC_LEN];
        r[0] = kind;
        r[1..17].copy_from_slice(id);
        r[17..25].copy_from_slice(&s.generation.to_be_bytes());
        r[25..33].copy_from_slice(&s.writer);
        let mac = hmac16(self.key.expose(), &[b"veilfs client state record", &self.client_id, &r[..33]]);
        r[33..].copy_from_slice(&mac);
        r
    }

    fn append(&self, t: &mut Table, kind: u8, id: &FileId, s: Seen) {
        let r = self.record(kind, id, s);
        t.pending.extend_from_slice(&r);
        if t.pending.len() >= BATCH * REC_LEN {
            if let Err(e) = self.write_pending(t) {
                tracing::warn!("{e}");
            }
        }
    }

    fn write_pending(&self, t: &mut Table) -> Result<()> {
        if t.pending.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(LOG_NAME);
        let Some(log) = t.log.as_mut() else { return Ok(()) };
        // One append of whole records: a crash tears at most the last one, which a load drops.
        log.write_all(&t.pending).map_err(|e| io_err(&path, e))?;
        t.logged += (t.pending.len() / REC_LEN) as u64;
        t.pending.clear();
        Ok(())
    }

    /// Appends what is pending and syncs the log (the end of a command, unmount); after an
    /// accepted older generation, writes a new snapshot instead.
    pub fn flush(&self) -> Result<()> {
        let mut t = self.lock();
        if t.lowered {
            return self.compact_locked(&mut t);
        }
        let had = !t.pending.is_empty();
        self.write_pending(&mut t)?;
        if had {
            if let Some(log) = &t.log {
                log.sync_data().map_err(|e| io_err(&self.dir.join(LOG_NAME), e))?;
            }
        }
        Ok(())
    }

    fn snapshot_bytes(
        &self,
        files: &HashMap<FileId, Seen>,
        entries: &HashMap<[u8; 16], HashSet<Token>>,
        config: u64,
    ) -> Vec<u8> {
        let mut b = Vec::with_capacity(SNAP_HEAD + files.len() * SNAP_ENTRY + 16);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&vault_id_bytes(&self.vault_id));
        b.extend_from_slice(&self.client_id);
        b.extend_from_slice(&self.since.to_be_bytes());
        b.extend_from_slice(&config.to_be_bytes());
        b.extend_from_slice(&(files.len() as u64).to_be_bytes());
        let mut ids: Vec<_> = files.iter().collect();
        ids.sort_by_key(|(id, _)| **id);
        for (id, s) in ids {
            b.extend_from_slice(id);
            b.extend_from_slice(&s.generation.to_be_bytes());
            b.extend_from_slice(&s.writer);
        }
        let mut pairs: Vec<([u8; 16], Token)> =
            entries.iter().flat_map(|(dir, set)| set.iter().map(|t| (*dir, *t))).collect();
        pairs.sort_unstable();
        b.extend_from_slice(&(pairs.len() as u64).to_be_bytes());
        for (dir, t) in pairs {
            b.extend_from_slice(&dir);
            b.extend_from_slice(&t);
        }
        let mac = hmac16(self.key.expose(), &[b"veilfs client state", &b]);
        b.extend_from_slice(&mac);
        b
    }

    fn parse_snapshot(&mut self, b: &[u8], path: &Path) -> Result<()> {
        if b.len() < SNAP_HEAD + 16 || (&b[..8] != MAGIC && &b[..8] != MAGIC_V1) {
            return Err(state_err(path, "is not a veilfs client state"));
        }
        let (body, mac) = b.split_at(b.len() - 16);
        let want = hmac16(self.key.expose(), &[b"veilfs client state", body]);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(&want[..], mac)) || body[8..24] != vault_id_bytes(&self.vault_id) {
            return Err(state_err(path, "does not authenticate for this vault (another vault's, edited, or damaged)"));
        }
        let n = u64::from_be_bytes(body[56..64].try_into().expect("8"));
        let files_end = (n as usize).checked_mul(SNAP_ENTRY).and_then(|l| l.checked_add(SNAP_HEAD));
        let files_end =
            files_end.filter(|&e| e <= body.len()).ok_or_else(|| state_err(path, "has the wrong length"))?;
        // `veilfsK2`: a count of remembered directory entries and the entries follow.
        let dir_entries = if &body[..8] == MAGIC {
            let rest = &body[files_end..];
            let m = rest.get(..8).map(|c| u64::from_be_bytes(c.try_into().expect("8")));
            match m {
                Some(m) if (rest.len() - 8) as u64 == m.saturating_mul(SNAP_DIR_ENTRY as u64) => &rest[8..],
                _ => return Err(state_err(path, "has the wrong length")),
            }
        } else if files_end == body.len() {
            &[][..]
        } else {
            return Err(state_err(path, "has the wrong length"));
        };
        self.client_id = body[24..40].try_into().expect("16");
        self.since = u64::from_be_bytes(body[40..48].try_into().expect("8"));
        let t = self.table.get_mut().unwrap_or_else(|e| e.into_inner());
        t.config = u64::from_be_bytes(body[48..56].try_into().expect("8"));
        for e in dir_entries.chunks_exact(SNAP_DIR_ENTRY) {
            let dir: [u8; 16] = e[..16].try_into().expect("16");
            t.entries.entry(dir).or_default().insert(e[16..].try_into().expect("16"));
        }
        for e in body[SNAP_HEAD..files_end].chunks_exact(SNAP_ENTRY) {
            let id: FileId = e[..16].try_into().expect("16");
            let s = Seen {
                generation: u64::from_be_bytes(e[16..24].try_into().expect("8")),
                writer: e[24..].try_into().expect("8"),
            };
            t.files.insert(id, s);
        }
        Ok(())
    }

    fn write_snapshot(&self, bytes: &[u8]) -> Result<()> {
        let path = self.dir.join(SNAPSHOT_NAME);
        let tmp = self.dir.join(format!("{SNAPSHOT_NAME}.tmp"));
        let write = || -> std::io::Result<()> {
            let _ = std::fs::remove_file(&tmp);
            let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| io_err(&path, e))
    }

    /// Reads the log into the table (up to its first record that does not authenticate: a
    /// torn tail, cut off so later appends follow whole records), compacts it if long, and
    /// keeps it open for appending.
    fn open_log(&mut self) -> Result<()> {
        let path = self.dir.join(LOG_NAME);
        let mut f = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).map_err(|e| io_err(&path, e))?;
        let mut good = 0usize;
        let mut recs = Vec::new();
        for r in bytes.chunks(REC_LEN) {
            if r.len() < REC_LEN {
                break;
            }
            let mac = hmac16(self.key.expose(), &[b"veilfs client state record", &self.client_id, &r[..33]]);
            if !bool::from(subtle::ConstantTimeEq::ct_eq(&mac[..], &r[33..]))
                || !matches!(r[0], KIND_FILE | KIND_CONFIG | KIND_ENTRY | KIND_GONE)
            {
                break;
            }
            recs.push(<[u8; REC_LEN]>::try_from(r).expect("REC_LEN"));
            good += REC_LEN;
        }
        if good < bytes.len() {
            tracing::warn!(
                "{}: the last {} bytes are not whole records of this state (a write cut by a crash): dropped; the \
                 objects they named are trusted as they are next time they are seen",
                path.display(),
                bytes.len() - good
            );
            f.set_len(good as u64).map_err(|e| io_err(&path, e))?;
        }
        let t = self.table.get_mut().unwrap_or_else(|e| e.into_inner());
        for r in &recs {
            let g = u64::from_be_bytes(r[17..25].try_into().expect("8"));
            if r[0] == KIND_CONFIG {
                t.config = t.config.max(g);
                continue;
            }
            // Entries are a set, replayed in order: the last record of an entry decides, so a
            // log replayed over the snapshot it was folded into gives that snapshot again.
            if matches!(r[0], KIND_ENTRY | KIND_GONE) {
                let dir: [u8; 16] = r[1..17].try_into().expect("16");
                let tok: Token = r[17..33].try_into().expect("16");
                if r[0] == KIND_ENTRY {
                    t.entries.entry(dir).or_default().insert(tok);
                } else if let Some(set) = t.entries.get_mut(&dir) {
                    set.remove(&tok);
                }
                continue;
            }
            let id: FileId = r[1..17].try_into().expect("16");
            let s = Seen { generation: g, writer: r[25..33].try_into().expect("8") };
            match t.files.get(&id) {
                Some(k) if k.generation >= g => {}
                _ => {
                    t.files.insert(id, s);
                }
            }
        }
        t.logged = recs.len() as u64;
        t.log = Some(f);
        let objects = t.files.len() + t.entries.values().map(HashSet::len).sum::<usize>();
        if t.logged > COMPACT_AFTER && t.logged > objects as u64 {
            self.compact()?;
        }
        Ok(())
    }

    /// Folds the log into a new snapshot, then empties the log. A crash between the two
    /// replays records the snapshot already holds: harmless, as every record is a max-merge.
    pub fn compact(&self) -> Result<()> {
        self.compact_locked(&mut self.lock())
    }

    fn compact_locked(&self, t: &mut Table) -> Result<()> {
        t.pending.clear();
        t.entries.retain(|_, set| !set.is_empty());
        let snap = self.snapshot_bytes(&t.files, &t.entries, t.config);
        self.write_snapshot(&snap)?;
        if let Some(log) = &t.log {
            log.set_len(0).map_err(|e| io_err(&self.dir.join(LOG_NAME), e))?;
        }
        t.logged = 0;
        t.lowered = false;
        Ok(())
    }
}

impl Drop for Known {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!("{e}");
        }
    }
}

fn vault_id_bytes(hex: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("made by vault_id");
    }
    out
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vault ID of FORMAT §18, against an independent computation
    /// (`hashlib.sha256(b"veilfs vault id" + bytes(range(16))).hexdigest()[:32]`).
    #[test]
    fn vault_id_is_the_hash_of_the_root_iv_as_format_says() {
        let iv: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(vault_id(&iv), "26e2dd08ce343908cbdfd87fe13c6c98");
        assert_eq!(vault_id_bytes(&vault_id(&iv)).to_vec(), hex_decode("26e2dd08ce343908cbdfd87fe13c6c98"));
    }

    fn hex_decode(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// Entry records are replayed in order (the last record of an entry decides), so a log
    /// replayed over the snapshot it was folded into gives that snapshot again; a snapshot of
    /// the first form (`veilfsK1`, files only) is read as one that remembers no entries.
    #[test]
    fn remembered_entries_survive_a_replayed_log_and_a_compaction_and_a_k1_snapshot_reads() {
        let t = tempfile::tempdir().unwrap();
        let opts = KnownOptions { root: Some(t.path().to_path_buf()), trust: Trust::Check };
        let master = MasterKey::from_bytes([7; 32]);
        let iv = [3u8; 16];
        let dir = [9u8; 16];
        let k = Known::open(&opts, &iv, &master).unwrap();
        k.wrote_file(&[1; 16], Seen { generation: 2, writer: [2; 8] });
        k.update_entries(&dir, &[[1; 16], [2; 16], [3; 16]], &[]);
        k.update_entries(&dir, &[], &[[2; 16]]);
        k.update_entries(&dir, &[[2; 16]], &[[3; 16]]);
        k.flush().unwrap();
        let log = k.dir().join(LOG_NAME);
        let bytes = std::fs::read(&log).unwrap();
        let want: HashSet<Token> = [[1; 16], [2; 16]].into();
        k.compact().unwrap();
        drop(k);
        std::fs::write(&log, &bytes).unwrap();
        let k = Known::open(&opts, &iv, &master).unwrap();
        assert_eq!(k.entries(&dir), want);
        assert_eq!(k.entry_count(), 2);
        k.compact().unwrap();
        drop(k);
        let k = Known::open(&opts, &iv, &master).unwrap();
        assert_eq!(k.entries(&dir), want);
        // The same state in the first form: header and files, no entries.
        let files = HashMap::from([([1u8; 16], Seen { generation: 2, writer: [2; 8] })]);
        let mut v1 = k.snapshot_bytes(&files, &HashMap::new(), 0);
        v1.truncate(v1.len() - 16 - 8);
        v1[..8].copy_from_slice(MAGIC_V1);
        let mac = hmac16(k.key.expose(), &[b"veilfs client state", &v1]);
        v1.extend_from_slice(&mac);
        drop(k);
        std::fs::write(t.path().join(vault_id(&iv)).join(SNAPSHOT_NAME), &v1).unwrap();
        std::fs::write(&log, b"").unwrap();
        let k = Known::open(&opts, &iv, &master).unwrap();
        assert_eq!(k.file(&[1; 16]).map(|s| s.generation), Some(2));
        assert_eq!(k.entry_count(), 0);
    }

    /// Records are max-merges: a log replayed over a snapshot that holds them, or records in
    /// any order, give the highest generation of each file.
    #[test]
    fn a_log_replayed_twice_or_out_of_order_keeps_the_highest_generation() {
        let t = tempfile::tempdir().unwrap();
        let opts = KnownOptions { root: Some(t.path().to_path_buf()), trust: Trust::Check };
        let master = MasterKey::from_bytes([7; 32]);
        let iv = [3u8; 16];
        let k = Known::open(&opts, &iv, &master).unwrap();
        let id = [1u8; 16];
        for g in [3, 5, 4] {
            k.wrote_file(&id, Seen { generation: g, writer: [g as u8; 8] });
        }
        k.flush().unwrap();
        let log = k.dir().join(LOG_NAME);
        let bytes = std::fs::read(&log).unwrap();
        drop(k);
        // The log appended to itself (a compaction's crash before the log was emptied).
        let mut twice = bytes.clone();
        twice.extend_from_slice(&bytes);
        std::fs::write(&log, &twice).unwrap();
        let k = Known::open(&opts, &iv, &master).unwrap();
        assert_eq!(k.file(&id), Some(Seen { generation: 5, writer: [5; 8] }));
        k.compact().unwrap();
        drop(k);
        let k = Known::open(&opts, &iv, &master).unwrap();
        assert_eq!(k.file(&id).map(|s| s.generation), Some(5));
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        assert_eq!(
            k.check_file(&id, Seen { generation: 4, writer: [0; 8] }, "x").map_err(|e| e.to_string()),
            Err("integrity error in x: rolled back: generation 4, this client saw 5; `--allow-rollback` reads it \
                 anyway, `veilfs fsck --accept` adopts it"
                .to_string())
        );
    }
}
