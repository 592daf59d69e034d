//! Seeing changes made behind the mount: a sync tool delivering another machine's work into
//! CIPHERDIR, or anything else that writes there.
//!
//! A mount that holds the vault lock lets the kernel keep names, attributes, "no such name"
//! answers, pages and listings for an hour, and keeps each directory's index itself; that is
//! what makes a warm tree walk as fast as on the backing filesystem. The lock keeps other
//! veilfs writers out, but not a sync tool, whose changes the mount would then not show for
//! an hour. So one inotify instance watches every ciphertext directory the mount has loaded
//! (every directory node the kernel knows), and one thread reads it. An event about an entry
//! name that the mount did not cause drops that directory's index and tells the kernel to drop
//! the name (`inval_entry` of the plaintext name, also a cached "no such name") and the
//! directory's listing and attributes (`inval_inode`); a file whose content changed in place
//! gets an `inval_inode` of its pages and attributes, a changed mode or owner one of its
//! attributes; a file whose time changed in place (a sync tool that found its content the
//! same) is treated as rewritten (below). Nothing else changes: the kernel keeps every other
//! name, attribute and page.
//!
//! Events are read in batches (a short quiet time after the first, [`SETTLE`]), so a burst
//! costs one pass per directory, and the notifications go out after every lock is released
//! (the kernel takes the directory's inode lock for `inval_entry`, which a request waiting
//! for the directory's `ops` lock may hold).
//!
//! The mount's own changes cause events too, and must cost next to nothing. They are told
//! apart without a table of pending operations:
//! - a create, delete or rename of an entry name is checked under the directory's `ops` lock,
//!   so that a change in flight has finished and updated the index: a name the index holds
//!   and whose inode this mount knows, or a name gone from both the directory and the index,
//!   is the mount's own (or no change); anything else is someone else's;
//! - a file closed after writing is the mount's own when its modification time and size are
//!   the ones the mount noted when it last closed or changed it (`FileState::note_own`). Its
//!   own shared open file is opened for writing even for readers, so every last close of a
//!   file causes such an event. A file rewritten in place by others becomes a new inode to the
//!   kernel (the writeback cache keeps a file's size and times as the kernel's own, so
//!   invalidating its attributes would not show the new size);
//! - a changed mode, owner or time of a file is the mount's own when all of them and the size
//!   are as it noted them; a SETATTR holds the file's `setting` lock from its change until it
//!   noted it, and the watch takes that lock before it judges, so the mount's own chmod or
//!   utimes costs a stat and nothing more. Someone else's changed time or size makes the
//!   file a new inode, as a rewrite does, unless the file is open through the mount.
//!
//! Names that are not entries (IV copies, long-name side files, temporary names, a sync tool's
//! own files) are left alone, except that a long name whose side file had not arrived yet is
//! tried again later ([`PENDING_FOR`]). A sync tool's conflict copy of an entry is shown
//! beside it, so it counts as an entry name: one that came drops the directory's index and
//! listing (the name it is shown as comes from the next listing), one that went also the
//! name it was shown as.
//!
//! Directories are watched through `/proc/self/fd/N` of the fd the mount holds: the magic
//! link resolves to that very open directory, so no name in CIPHERDIR is walked (the rule
//! that CIPHERDIR's links are never followed holds) and the watch is on the directory the
//! mount uses, whatever was renamed meanwhile. A directory that cannot be watched (the
//! per-user limit `fs.inotify.max_user_watches`, no inotify instance left, a directory its
//! owner may not read) is compared every [`POLL_EVERY`] instead: its change time, and when it
//! moved, its listing against the index (one log line names the limit the first time). If the
//! event queue overflows, every loaded directory is compared that way at once.
//!
//! Left as it was: a file the mount holds open that another machine rewrites in place (a
//! conflict in any case) keeps the header state the mount read at open.

use crate::dirs::DirState;
use crate::inodes::{Node, NodeTable};
use parking_lot::Mutex;
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};
use veilfs_core::names::ParsedEntry;
use veilfs_core::{sys, Vault};

/// After the first event of a batch, events are gathered until none came for this long (or
/// [`BATCH_AT_MOST`] passed): a sync tool delivers a file as several events.
const SETTLE: Duration = Duration::from_millis(30);
/// The longest a batch gathers events before it is handled.
const BATCH_AT_MOST: Duration = Duration::from_millis(250);
/// How often directories that could not be watched are compared with their index.
pub const POLL_EVERY: Duration = Duration::from_secs(3);
/// How long an entry whose long name could not be read yet (its side file not arrived) is
/// tried again.
const PENDING_FOR: Duration = Duration::from_secs(120);

const WATCH: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::EXCL_UNLINK)
    .union(WatchFlags::ONLYDIR);

const NAMESPACE: ReadFlags =
    ReadFlags::CREATE.union(ReadFlags::DELETE).union(ReadFlags::MOVED_FROM).union(ReadFlags::MOVED_TO);

/// The directories watched, by watch descriptor and by node, and those compared by time.
#[derive(Default)]
struct Watched {
    by_wd: HashMap<i32, Vec<(u64, Weak<Node>)>>,
    by_node: HashMap<u64, i32>,
    /// Directories without a watch: node → (node, change time last seen).
    polled: HashMap<u64, (Weak<Node>, (i64, i64))>,
    limit_logged: bool,
}

/// The inotify instance and what it watches. Owned by the node table (which adds and drops
/// watches as directory nodes come and go) and shared with the thread that reads it.
pub struct Watcher {
    fd: Option<OwnedFd>,
    watched: Mutex<Watched>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Watcher({} watched)", self.watched.lock().by_node.len())
    }
}

fn ctime(st: &sys::Stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

impl Watcher {
    /// A new instance (without one, every directory is compared by time, logged once).
    pub fn new() -> Arc<Watcher> {
        let fd = match inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(
                    "cannot watch CIPHERDIR for changes made by others ({e}; fs.inotify.max_user_instances?): \
                     its directories are checked every {} s instead",
                    POLL_EVERY.as_secs()
                );
                None
            }
        };
        Arc::new(Watcher { fd, watched: Mutex::new(Watched::default()) })
    }

    /// Starts watching directory node `node` (nothing for other nodes).
    pub fn watch(&self, node: &Arc<Node>) {
        let Some(dir) = &node.dir else { return };
        let r = match &self.fd {
            // The magic link of our own fd: the kernel resolves it to the open directory
            // itself, walking no name of CIPHERDIR (see the module docs).
            Some(fd) => inotify::add_watch(fd, format!("/proc/self/fd/{}", dir.cd.fd().as_raw_fd()), WATCH),
            None => Err(rustix::io::Errno::NOSYS),
        };
        let mut w = self.watched.lock();
        match r {
            Ok(wd) => {
                w.by_wd.entry(wd).or_default().push((node.id, Arc::downgrade(node)));
                w.by_node.insert(node.id, wd);
            }
            Err(e) => {
                if e == rustix::io::Errno::NOSPC && !w.limit_logged {
                    w.limit_logged = true;
                    tracing::warn!(
                        "the inotify watch limit is reached (fs.inotify.max_user_watches): changes made by others \
                         in directories beyond it show within {} s",
                        POLL_EVERY.as_secs()
                    );
                } else if self.fd.is_some() {
                    tracing::debug!(
                        "{}: not watched ({e}); checked every {} s",
                        dir.cd.path.display(),
                        POLL_EVERY.as_secs()
                    );
                }
                let seen = sys::fstat(dir.cd.fd()).map(|st| ctime(&st)).unwrap_or_default();
                w.polled.insert(node.id, (Arc::downgrade(node), seen));
            }
        }
    }

    /// Stops watching node `id` (the kernel forgot it).
    pub fn unwatch(&self, id: u64) {
        let mut w = self.watched.lock();
        w.polled.remove(&id);
        let Some(wd) = w.by_node.remove(&id) else { return };
        let last = match w.by_wd.get_mut(&wd) {
            Some(v) => {
                v.retain(|(n, _)| *n != id);
                v.is_empty()
            }
            None => false,
        };
        if last {
            w.by_wd.remove(&wd);
            if let Some(fd) = &self.fd {
                let _ = inotify::remove_watch(fd, wd);
            }
        }
    }

    /// Every loaded directory node still alive.
    fn all(&self) -> Vec<Arc<Node>> {
        let w = self.watched.lock();
        let watched = w.by_wd.values().flatten().map(|(_, n)| n);
        watched.chain(w.polled.values().map(|(n, _)| n)).filter_map(Weak::upgrade).collect()
    }

    fn nodes_of(&self, wd: i32) -> Vec<Arc<Node>> {
        let w = self.watched.lock();
        w.by_wd.get(&wd).map(|v| v.iter().filter_map(|(_, n)| n.upgrade()).collect()).unwrap_or_default()
    }

    fn forget_wd(&self, wd: i32) {
        let mut w = self.watched.lock();
        if let Some(v) = w.by_wd.remove(&wd) {
            for (id, _) in v {
                w.by_node.remove(&id);
            }
        }
    }

    /// The polled directories whose change time moved since last seen (noting the new one).
    fn moved_polled(&self) -> Vec<Arc<Node>> {
        let mut w = self.watched.lock();
        let mut out = Vec::new();
        w.polled.retain(|_, (n, seen)| {
            let Some(node) = n.upgrade() else { return false };
            if let Some(st) = node.dir.as_ref().and_then(|d| sys::fstat(d.cd.fd()).ok()) {
                if ctime(&st) != *seen {
                    *seen = ctime(&st);
                    out.push(node);
                }
            }
            true
        });
        out
    }
}

/// What the kernel is told after a batch, once every lock is released.
enum Note {
    /// `inval_entry(parent, name)`.
    Entry(u64, Vec<u8>),
    /// `inval_inode(node, offset)`: with offset 0 also its pages (a directory's: its
    /// listing), with -1 only its attributes.
    Inode(u64, i64),
}

/// The thread's view of the mount. Only weak references: the thread must not keep the keys
/// (the vault) or the directory fds alive after the mount has ended.
pub struct Context {
    /// The node table (the watcher is in it).
    pub nodes: Weak<NodeTable>,
    /// The vault, to read entry names.
    pub vault: Weak<Vault>,
    /// The kernel connection, once mounted.
    pub notifier: Arc<OnceLock<fuser::Notifier>>,
}

struct Ev {
    wd: i32,
    mask: ReadFlags,
    name: Option<Vec<u8>>,
}

/// Starts the thread that reads `w`'s events for as long as the mount lives.
pub fn spawn(w: Arc<Watcher>, cx: Context) -> std::io::Result<()> {
    std::thread::Builder::new().name("veilfs-watch".into()).spawn(move || run(&w, &cx)).map(|_| ())
}

fn wait_readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut p = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    let ts = rustix::event::Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as i64 };
    matches!(rustix::event::poll(&mut p, Some(&ts)), Ok(n) if n > 0)
}

/// Reads every event queued now.
fn drain(fd: &OwnedFd, buf: &mut [MaybeUninit<u8>], out: &mut Vec<Ev>) {
    let mut r = inotify::Reader::new(fd.as_fd(), buf);
    while let Ok(e) = r.next() {
        out.push(Ev { wd: e.wd(), mask: e.events(), name: e.file_name().map(|n| n.to_bytes().to_vec()) });
    }
}

fn run(w: &Arc<Watcher>, cx: &Context) {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 << 10];
    let mut pending: Vec<(Weak<Node>, String, Instant)> = Vec::new();
    let mut last_poll = Instant::now();
    loop {
        let mut events = Vec::new();
        match &w.fd {
            Some(fd) => {
                if wait_readable(fd, POLL_EVERY) {
                    let start = Instant::now();
                    drain(fd, &mut buf, &mut events);
                    while start.elapsed() < BATCH_AT_MOST && wait_readable(fd, SETTLE) {
                        drain(fd, &mut buf, &mut events);
                    }
                }
            }
            None => std::thread::sleep(POLL_EVERY),
        }
        let (Some(nodes), Some(vault)) = (cx.nodes.upgrade(), cx.vault.upgrade()) else { return };
        let mut notes = Vec::new();
        if events.iter().any(|e| e.mask.contains(ReadFlags::QUEUE_OVERFLOW)) {
            tracing::info!("CIPHERDIR changed faster than its watch could report: comparing every loaded directory");
            for node in w.all() {
                compare(&vault, &node, &mut notes, &mut pending);
            }
        } else {
            handle(w, &nodes, &vault, events, &mut notes, &mut pending);
        }
        if last_poll.elapsed() >= POLL_EVERY {
            last_poll = Instant::now();
            for node in w.moved_polled() {
                compare(&vault, &node, &mut notes, &mut pending);
            }
        }
        retry_pending(&vault, &mut pending, &mut notes);
        drop((nodes, vault));
        if let Some(n) = cx.notifier.get() {
            for note in notes {
                let r = match &note {
                    Note::Entry(parent, name) => {
                        n.inval_entry(fuser::INodeNo(*parent), std::ffi::OsStr::from_bytes(name))
                    }
                    Note::Inode(ino, off) => n.inval_inode(fuser::INodeNo(*ino), *off, 0),
                };
                if let Err(e) = r {
                    // ENOENT: the kernel no longer knows it, so caches nothing of it.
                    tracing::trace!("invalidation after a change in CIPHERDIR: {e}");
                }
            }
        }
    }
}

/// The plaintext name of entry `on_disk` of `dir` (`None`: its long name's side file is not
/// there, or it does not decrypt, which its use will report).
fn plain_name(vault: &Vault, dir: &DirState, on_disk: &str) -> Option<Vec<u8>> {
    let d = vault.entry_d(&dir.cd, on_disk).ok()?;
    vault.names().decrypt_name(&dir.cd.iv, &d).ok()
}

/// Handles one batch of events.
fn handle(
    w: &Watcher,
    nodes: &NodeTable,
    vault: &Vault,
    events: Vec<Ev>,
    notes: &mut Vec<Note>,
    pending: &mut Vec<(Weak<Node>, String, Instant)>,
) {
    // Per watch: the entry names and what happened to each; the directory's own changes.
    let mut by_wd: HashMap<i32, (HashMap<String, ReadFlags>, ReadFlags)> = HashMap::new();
    for e in events {
        if e.mask.contains(ReadFlags::IGNORED) {
            w.forget_wd(e.wd);
            continue;
        }
        let slot = by_wd.entry(e.wd).or_default();
        match e.name {
            None => slot.1 |= e.mask,
            Some(name) => {
                // Only entry names and conflict copies of entries (shown beside them): IV
                // copies, side files, temporary names and a sync tool's files are no entries
                // the kernel can have cached.
                if ParsedEntry::parse(&name).key().is_none() && !is_copy(&name) {
                    continue;
                }
                let Ok(name) = String::from_utf8(name) else { continue };
                *slot.0.entry(name).or_insert(ReadFlags::empty()) |= e.mask;
            }
        }
    }
    for (wd, (names, own)) in by_wd {
        for node in w.nodes_of(wd) {
            let Some(dir) = &node.dir else { continue };
            if own.contains(ReadFlags::ATTRIB) {
                // The directory's mode or owner changed: the permission checks read them again.
                dir.forget_perm();
                notes.push(Note::Inode(node.id, -1));
            }
            if !names.is_empty() {
                changed(nodes, vault, &node, dir, &names, notes, pending);
            }
        }
    }
}

/// Whether `name` is a sync tool's conflict copy of an entry (`veilfs_core::conflict`).
fn is_copy(name: &[u8]) -> bool {
    matches!(ParsedEntry::parse(name), ParsedEntry::Conflict(c) if c.is_of_entry())
}

/// Whether entry `on_disk` is in `idx`. A conflict copy is kept under the key of the name it
/// is shown as, which its own name does not give: it is looked for among all (rare: only for
/// an event about a copy).
fn indexed(idx: &crate::dirs::Index, on_disk: &str) -> Option<Option<Vec<u8>>> {
    let holds = |e: &&crate::dirs::IndexEntry| e.on_disk == on_disk || e.others.iter().any(|o| o == on_disk);
    let e = match ParsedEntry::parse(on_disk.as_bytes()).key() {
        Some(key) => idx.get(key).filter(holds)?,
        None => idx.values().find(holds)?,
    };
    Some(e.plain.get().and_then(|p| p.as_ref()).map(|p| p.name.clone()))
}

/// The entries `names` of directory `node` changed: tells the mount's changes from others'.
fn changed(
    nodes: &NodeTable,
    vault: &Vault,
    node: &Arc<Node>,
    dir: &DirState,
    names: &HashMap<String, ReadFlags>,
    notes: &mut Vec<Note>,
    pending: &mut Vec<(Weak<Node>, String, Instant)>,
) {
    // Whether a create, delete or rename of `on_disk` (found as `st` now) is the mount's own,
    // by the index `idx`; with the name's plaintext from the index when it has it.
    let judge = |idx: &Option<crate::dirs::Index>, on_disk: &str, st: &Option<sys::Stat>| {
        let known = idx.as_ref().map(|i| indexed(i, on_disk));
        let own = match (st, &known) {
            // Held by the index under an inode this mount made or looked up.
            (Some(st), Some(Some(_))) => nodes.id_of(st.st_ino).is_some(),
            // Gone from both: the mount's own removal (or a name that came and went).
            (None, Some(None)) => true,
            _ => false,
        };
        (own, known.flatten().flatten())
    };
    let mut suspects: Vec<&str> = Vec::new();
    let mut rewritten: Vec<Arc<Node>> = Vec::new();
    let mut attrs: Vec<(&str, Arc<Node>)> = Vec::new();
    {
        // First without the directory's `ops` lock, so the mount's own busy directory is not
        // held up: a change the index already shows is finished.
        let idx = dir.peek();
        for (on_disk, mask) in names {
            let st = Vault::stat_entry(&dir.cd, on_disk.as_bytes()).ok();
            if mask.intersects(NAMESPACE) && !judge(&idx, on_disk, &st).0 {
                suspects.push(on_disk);
                continue;
            }
            if mask.intersects(ReadFlags::CLOSE_WRITE | ReadFlags::ATTRIB) {
                let Some(st) = st else { continue };
                // Only a file the kernel knows has anything cached.
                let Some(n) = nodes.id_of(st.st_ino).and_then(|id| nodes.get(id).ok()) else { continue };
                match &n.file {
                    // As the mount left it (its own close, chmod or utimes: the reply carried
                    // the attributes).
                    Some(f) if f.is_own(&st) => {}
                    // Rewritten in place by someone else. A file the mount holds open is left
                    // alone (both sides wrote it: a conflict, whichever way it is resolved).
                    Some(f) if mask.contains(ReadFlags::CLOSE_WRITE) => {
                        if f.opened().is_none() {
                            nodes.backing_gone(st.st_ino);
                            rewritten.push(n);
                        }
                    }
                    // Another mode, owner or time: judged below, once the index is let go.
                    Some(_) => attrs.push((on_disk, n)),
                    None => notes.push(Note::Inode(n.id, -1)),
                }
            }
        }
    }
    for (on_disk, n) in attrs {
        let renew = {
            let Some(f) = &n.file else { continue };
            // A SETATTR of the mount's own in flight notes its change first.
            let _setting = f.setting.lock();
            let Ok(st) = Vault::stat_entry(&dir.cd, on_disk.as_bytes()) else { continue };
            if f.is_own(&st) {
                continue;
            }
            // The kernel keeps a regular file's size and modification time as its own (see
            // below): another time or size (a sync tool that found the content unchanged
            // sets the time in place) takes a new inode, as a rewrite does, unless the file
            // is open through the mount. A mode or owner is taken from the attributes again.
            if !f.content_moved(&st) {
                f.note_own(&st);
                false
            } else if f.opened().is_none() {
                nodes.backing_gone(st.st_ino);
                true
            } else {
                false
            }
        };
        if renew {
            rewritten.push(n);
        } else {
            notes.push(Note::Inode(n.id, -1));
        }
    }
    let mut theirs: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    if !suspects.is_empty() {
        // A change of the mount's own in flight finishes (and updates the index) first.
        let _ops = dir.ops.lock();
        let idx = dir.peek();
        for on_disk in suspects {
            let st = Vault::stat_entry(&dir.cd, on_disk.as_bytes()).ok();
            if let (false, plain) = judge(&idx, on_disk, &st) {
                theirs.push((on_disk.to_string(), plain));
            }
        }
        drop(idx);
        if !theirs.is_empty() {
            dir.drop_index();
        }
    }
    // With the writeback cache the kernel keeps a regular file's size and modification time
    // as its own and never takes them from the daemon again, so a file rewritten in place
    // must become a new inode to the kernel: the backing inode gets a new node id at its next
    // lookup (`backing_gone` above), and each of its names is dropped so that lookup comes.
    for n in rewritten {
        tracing::debug!("{}: rewritten by others", dir.cd.path.display());
        notes.push(Note::Inode(n.id, 0));
        for l in n.links() {
            if let Some(p) = l.parent.dir.as_ref().and_then(|d| plain_name(vault, d, &l.on_disk)) {
                notes.push(Note::Entry(l.parent.id, p));
            }
        }
    }
    if theirs.is_empty() {
        return;
    }
    tracing::debug!("{}: {} entries changed by others", dir.cd.path.display(), theirs.len());
    notes.push(Note::Inode(node.id, 0));
    for (on_disk, plain) in theirs {
        match plain.or_else(|| plain_name(vault, dir, &on_disk)) {
            Some(p) => notes.push(Note::Entry(node.id, p)),
            // A new conflict copy: the name it is shown as comes from the listing (dropped
            // above), not from its own name.
            None if is_copy(on_disk.as_bytes()) => {}
            None => pending.push((Arc::downgrade(node), on_disk, Instant::now())),
        }
    }
}

/// Compares directory `node`'s listing with its index (a directory without a watch whose
/// change time moved, or every directory after the event queue overflowed): the names that
/// came or went are someone else's.
fn compare(vault: &Vault, node: &Arc<Node>, notes: &mut Vec<Note>, pending: &mut Vec<(Weak<Node>, String, Instant)>) {
    let Some(dir) = &node.dir else { return };
    let mut theirs: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    {
        let _ops = dir.ops.lock();
        let now: HashSet<String> = match Vault::keyed_entries(&dir.cd) {
            Ok(v) => v.into_iter().map(|(_, on_disk, _)| on_disk).collect(),
            Err(_) => HashSet::new(),
        };
        let idx = dir.peek();
        if let Some(idx) = idx.as_ref() {
            let mut before: HashMap<&str, Option<Vec<u8>>> = HashMap::new();
            for e in idx.values() {
                before.insert(&e.on_disk, e.plain.get().and_then(|p| p.as_ref()).map(|p| p.name.clone()));
                for o in &e.others {
                    before.insert(o, None);
                }
            }
            theirs.extend(before.iter().filter(|(n, _)| !now.contains(**n)).map(|(n, p)| (n.to_string(), p.clone())));
            theirs.extend(now.iter().filter(|n| !before.contains_key(n.as_str())).map(|n| (n.clone(), None)));
        }
        drop(idx);
        dir.drop_index();
    }
    notes.push(Note::Inode(node.id, 0));
    for (on_disk, plain) in theirs {
        match plain.or_else(|| plain_name(vault, dir, &on_disk)) {
            Some(p) => notes.push(Note::Entry(node.id, p)),
            None => pending.push((Arc::downgrade(node), on_disk, Instant::now())),
        }
    }
}

/// Entries whose plaintext name could not be read yet: a long name whose side file had not
/// arrived when the entry did. The kernel may cache the name as absent, so it is told once the
/// name can be read.
fn retry_pending(vault: &Vault, pending: &mut Vec<(Weak<Node>, String, Instant)>, notes: &mut Vec<Note>) {
    pending.retain(|(node, on_disk, since)| {
        let Some(node) = node.upgrade() else { return false };
        let Some(dir) = &node.dir else { return false };
        if let Some(p) = plain_name(vault, dir, on_disk) {
            notes.push(Note::Entry(node.id, p));
            return false;
        }
        since.elapsed() < PENDING_FOR
    });
}
