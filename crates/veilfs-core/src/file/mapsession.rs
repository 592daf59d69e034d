//! Write sessions of files with a block map (docs/FORMAT.md §5.10, "Write sessions and their
//! log"): how a writer changes such a file so that a crash at any step leaves a file that
//! reads as before the session or with what it wrote, and how a reader and settling read a
//! file a session left UNSETTLED.
//!
//! Why sessions: committing every write (blocks, changed map blocks, header) costs a map
//! block and a header per write and still leaves, after a crash between those steps, blocks
//! the header does not commit to. A session instead marks the header UNSETTLED once, writes
//! blocks in place, keeps the map in memory, and at its end writes the changed map blocks and
//! nodes and then the settled header. Its log (`maplog`, kept where the stash is) says what a
//! reader of the UNSETTLED file may accept meanwhile: each block the session overwrites in
//! place (a block record, before the block), each size the file takes (a size record), and at
//! the end a commit record with the new size and root, preceded by the new bytes of every map
//! block and node it will overwrite (so a crash while they are written, torn or not, reads
//! the same). Every record is MAC'd under `record-mac` with the file ID and the session's
//! generation.

use super::mapped::MapState;
use super::CryptFile;
use crate::content::blockmap::{self as bm, group_count, group_start, node_count, span_first_group, Leaf, HOLE_LEAF};
use crate::content::tail::TailRule;
use crate::error::{Error, IoContext, Result};
use crate::maplog::{self, Kind, Log, NODE_BIT};
use crate::sys;
use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// A write session this handle has open.
#[derive(Debug)]
pub(super) struct Session {
    /// The session's log (shared with the writes in flight, which write their records
    /// without the map lock).
    log: Arc<OwnedFd>,
    /// Where its next record goes: the end of every record it keeps (the copy records past
    /// it are needed only until their write's blocks are out).
    pos: u64,
    /// The end of the records last written, copies included: while another write is in
    /// flight, the next records go here instead of over its copies.
    tail: u64,
    /// Its next sequence number.
    seq: u64,
    /// The MAC of its records.
    mac: maplog::Keyed,
    /// The log's bytes allocated ahead (`fallocate`, keeping its size), from its start: room
    /// for its commit, so that a full disk refuses a write instead of the session's end.
    /// `u64::MAX` where the backing store cannot allocate ahead.
    reserved: u64,
    /// The order of the records of writes in flight (see [`LogOrder`]).
    order: LogOrder,
}

/// Writes in place hand out their places in the log in order, under the map lock, and write
/// their records without it; a write puts its blocks in place only once every record before
/// its own is in the log, since a reader stops at the first gap (its block record would not
/// be seen, and its block would be unvouched). Each write has a ticket: `logged` is the first
/// whose records, or an earlier one's, are not yet out.
#[derive(Debug, Default)]
struct LogOrder {
    /// The next ticket.
    next: u64,
    /// Every ticket below it has its records out.
    logged: u64,
    /// Tickets at or past `logged` whose records are out.
    done: BTreeSet<u64>,
    /// The first ticket whose records could not be written, and where they went: every
    /// later write fails too (its records lie past the gap), and once none is in flight the
    /// log's end goes back there.
    failed: Option<(u64, u64)>,
}

/// A write's place in the log, handed out by [`CryptFile::place_records`].
pub(super) struct Placed {
    log: Arc<OwnedFd>,
    mac: maplog::Keyed,
    at: u64,
    seq: u64,
    ticket: u64,
}

/// Bytes of a record's frame (kind, length, seq, `a`, MAC) in the log.
const RECORD_FRAME: u64 = 40;

/// What the next commit of a file writes, as far as the writes since the last one reserved
/// room for it: a superset of the groups it writes (`MapState::write`; a write that fails
/// after its reservation leaves its groups here) and of the spans whose nodes it writes.
#[derive(Clone, Debug, Default)]
pub(super) struct CommitPlan {
    /// Groups whose map block the commit may write (the space of those past the old end,
    /// and of the old last group, allocated in the file).
    groups: BTreeSet<u64>,
    /// Spans whose node the commit may write (those of the groups, and the new nodes); the
    /// last span, which has no node, may be among them.
    spans: BTreeSet<u64>,
    /// The log bytes of the map records of `groups` (each at its group's whole capacity).
    map_bytes: u64,
}

impl CommitPlan {
    fn add_group(&mut self, g: u64) {
        if self.groups.insert(g) {
            self.map_bytes += RECORD_FRAME + bm::LEAF_LEN * bm::group_capacity(g);
            self.spans.insert(group_start(g) / bm::SPAN_BLOCKS);
        }
    }

    /// Forgets the groups from `g` on (cut off by a shrinking truncate, which may free their
    /// space in the file).
    pub(super) fn cut(&mut self, g: u64) {
        for g in self.groups.split_off(&g) {
            self.map_bytes -= RECORD_FRAME + bm::LEAF_LEN * bm::group_capacity(g);
        }
    }

    /// The most bytes the commit takes in its log for a file of `nodes` nodes: a map record
    /// per planned group, one per planned node (at the largest node's length), and the
    /// commit record.
    fn room(&self, nodes: u64) -> u64 {
        let planned_nodes = (self.spans.len() - self.spans.range(nodes..).count()) as u64;
        self.map_bytes + planned_nodes * (RECORD_FRAME + bm::HASH_LEN * bm::node_hashes(0)) + RECORD_FRAME + 40
    }
}

/// Allocates `len` bytes of `fd` from its start without changing its size (space a later
/// `pwrite` there cannot be refused). `Ok(false)` where the backing store cannot.
fn allocate_ahead(fd: std::os::fd::BorrowedFd<'_>, off: u64, len: u64) -> std::io::Result<bool> {
    match sys::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, off, len) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A session found UNSETTLED (a crash, or a writer elsewhere), read by its log.
#[derive(Debug)]
pub(super) struct Found {
    /// The records of the header's session that authenticate.
    pub(super) log: Log,
    /// The header's block count (the map before the session).
    pub(super) k0: u64,
    /// The sequence number of the commit record whose map the file is read by, if any.
    pub(super) commit: Option<u64>,
}

impl Session {
    /// Where its next record goes.
    pub(super) fn log_end(&self) -> u64 {
        self.pos
    }

    /// Where the next write's records go: over the last write's copy records, unless a write
    /// is in flight (`in_flight`), whose copies are still needed.
    pub(super) fn next_record(&self, in_flight: bool) -> u64 {
        if in_flight {
            self.tail
        } else {
            self.pos
        }
    }
}

impl Found {
    fn rule(&self) -> TailRule {
        match self.commit {
            Some(_) => TailRule::MapCommitted,
            None => TailRule::MapSession,
        }
    }
}

/// Where the version of a block a found session's file is read with comes from.
pub(super) enum Source {
    /// The block as stored, with this tag.
    Disk(Leaf),
    /// A block record of the session (its ciphertext).
    Record(Vec<u8>),
    /// A hole.
    Hole,
}

impl CryptFile {
    /// Starts a write session if none is open: a size record with the size as it is, in a
    /// new log, then the header with UNSETTLED, the next generation and the map as it is.
    /// (A session whose log has grown past [`maplog::CHECKPOINT`] was ended before, by
    /// [`reserve_write`](Self::reserve_write).) Then makes sure the log has `need` bytes
    /// past where the next records go allocated, before anything of the write that asks is
    /// logged: a full disk refuses that write (`ENOSPC`, the file as it was), never the
    /// session's end, whose commit always finds its room.
    fn begin_session(&self, st: &mut MapState, need: u64) -> Result<()> {
        let in_flight = st.in_flight > 0;
        if let Some(s) = st.session.as_mut() {
            let want = s.next_record(in_flight) + need;
            if want > s.reserved {
                // Ahead by an eighth of the log (at least 256 KiB), so that a stream of writes
                // allocates now and then; only what is not allocated yet (allocating the log
                // from its start every time cost ~0.3 ms a call on tmpfs once it held MiBs).
                let to = want + (want / 8).max(256 << 10);
                match allocate_ahead(s.log.as_fd(), s.reserved, to - s.reserved) {
                    Ok(true) => s.reserved = to,
                    Ok(false) => s.reserved = u64::MAX,
                    Err(e) => return Err(Error::io(format!("allocating the write-session log of {}", self.what), e)),
                }
            }
            return Ok(());
        }
        let Some(dir) = &self.ctx.stashes else {
            return Err(Error::io(&self.what, std::io::Error::other("no place for the write session's log")));
        };
        let log = dir
            .create(self.id())
            .map_err(|e| Error::io(format!("creating {}", dir.path_of(self.id()).display()), e))?;
        // Room for the size record, the write that asks and the commit, before the header
        // says UNSETTLED: refused here, the file stays as it was and the log goes.
        let reserved = match allocate_ahead(log.as_fd(), 0, 64 + need + (64 << 10)) {
            Ok(true) => 64 + need + (64 << 10),
            Ok(false) => u64::MAX,
            Err(e) => {
                drop(log);
                self.remove_stash();
                return Err(Error::io(format!("allocating {}", dir.path_of(self.id()).display()), e));
            }
        };
        let g = self.next_generation(st);
        let mac = maplog::Keyed::new(&self.ctx.keys, self.id(), g);
        let mut recs = Vec::new();
        mac.push(&mut recs, Kind::Size, 0, 0, &st.size.to_be_bytes());
        sys::pwrite_all(log.as_fd(), &recs, 0)
            .map_err(|e| Error::io(format!("writing {}", dir.path_of(self.id()).display()), e))?;
        crate::crash::point!("map.session_logged");
        st.generation = g;
        self.write_header_map(st, true)?;
        crate::crash::point!("map.session_started");
        let pos = recs.len() as u64;
        st.session =
            Some(Session { log: Arc::new(log), pos, tail: pos, seq: 1, mac, reserved, order: LogOrder::default() });
        Ok(())
    }

    /// Before a write changes blocks `touched` of a file of `k_old` blocks that it leaves
    /// with `k_new`, logging `log_bytes` of records: allocates what its session's end will
    /// write — in the file, the map blocks of the groups it adds to the commit's plan and the
    /// nodes it adds (holes until the commit); in the log, `log_bytes` and the commit of every
    /// map block planned so far — and starts the session (`logged`: a file that has blocks).
    /// So a full disk refuses the write, before anything of it is written, and never the
    /// session's end, which then reads and settles as written (docs/FORMAT.md §5.10).
    ///
    /// The cost is in the groups and spans this write adds to the plan, not in all those the
    /// session changed so far: summing the room of every changed group at each write cost a
    /// random 4 KiB overwrite of a 256 MiB file ~3 µs, a sixth of its time in the daemon.
    pub(super) fn reserve_write(
        &self,
        st: &mut MapState,
        touched: impl Iterator<Item = u64>,
        k_old: u64,
        k_new: u64,
        log_bytes: u64,
    ) -> Result<()> {
        let in_flight = st.in_flight > 0;
        if st.session.as_ref().is_some_and(|s| s.next_record(in_flight) > maplog::CHECKPOINT) {
            // A checkpoint: a new session, and a new plan, before this write adds to it (a
            // write in place never gets here: it checks first, and goes the general way).
            self.finish_map(st, None)?;
        }
        let ml = self.map_layout();
        // A group enters the plan once per commit. The map space of one at or past the old
        // last group is allocated then, whole, so that growing it later needs nothing more;
        // an inner group's lies inside the file already (allocating each of those too cost a
        // random-write session ~260 `fallocate`s, each taking the file's inode lock against
        // the writes in flight).
        let growing = group_count(k_old).saturating_sub(1);
        let mut new: Vec<u64> = touched.map(bm::group_of).filter(|g| !st.plan.groups.contains(g)).collect();
        if k_new > k_old && k_old > 0 && !st.plan.groups.contains(&bm::group_of(k_old - 1)) {
            new.push(bm::group_of(k_old - 1));
        }
        new.sort_unstable();
        new.dedup();
        let (nodes_old, nodes_new) = (node_count(k_old), node_count(k_new));
        let alloc = |off: u64, len: u64| {
            allocate_ahead(self.fd(), off, len).map(drop).ctx(|| format!("allocating space in {}", self.what))
        };
        for &g in new.iter().filter(|&&g| g >= growing) {
            alloc(ml.map_offset(g), bm::LEAF_LEN * bm::group_capacity(g))?;
        }
        for j in nodes_old..nodes_new {
            alloc(ml.node_offset(j), ml.node_len(j))?;
        }
        // Planned only once allocated: a refused write adds nothing.
        for g in new {
            st.plan.add_group(g);
        }
        st.plan.spans.extend(nodes_old..nodes_new);
        if k_old == 0 {
            // A first write commits without a session (its header goes out last).
            return Ok(());
        }
        let room = st.plan.room(nodes_new);
        self.begin_session(st, log_bytes + room)
    }

    /// Writes `recs` (records of the open session) at its log's end in one `pwrite`, and
    /// moves the end past the first `kept` bytes of them. While other writes are in flight
    /// their copy records stay: `recs` go after them, which are then kept in the log for
    /// good (records a reader may use, as the last copies of a session are).
    fn append_log(&self, st: &mut MapState, recs: &[u8], kept: usize) -> Result<()> {
        let in_flight = st.in_flight > 0;
        let s = st.session.as_mut().expect("a session is open");
        let at = s.next_record(in_flight);
        sys::pwrite_all(s.log.as_fd(), recs, at).ctx(|| format!("writing the write-session log of {}", self.what))?;
        (s.pos, s.tail) = (at + kept as u64, at + recs.len() as u64);
        Ok(())
    }

    /// Logs a write before its blocks go out: a block record (the tag) and a copy record for
    /// each block it overwrites in place (below `k_old`, the block count before it), and the
    /// size after it when that changes. The log's end moves past the block records only: the
    /// next records go over the copies, which this write no longer needs once its blocks are
    /// out — unless it is still in flight then (writes in place of one file overlap outside
    /// the map lock), in which case they go after them (`append_log`).
    pub(super) fn log_write(
        &self,
        st: &mut MapState,
        buf: &[u8],
        spans: &[(u64, std::ops::Range<usize>)],
        k_old: u64,
        new_size: Option<u64>,
    ) -> Result<()> {
        let s = st.session.as_mut().expect("a session is open");
        let inplace = || spans.iter().filter(|(n, _)| *n < k_old);
        // Sized at once: grown by pushes, the copies' bytes were copied again at every doubling.
        let len = 48 + inplace().map(|(_, r)| 2 * maplog::HEAD + 16 + r.len()).sum::<usize>();
        let mut recs = Vec::with_capacity(len);
        if let Some(p) = new_size {
            s.mac.push(&mut recs, Kind::Size, s.seq, 0, &p.to_be_bytes());
            s.seq += 1;
        }
        for (n, r) in inplace() {
            s.mac.push(&mut recs, Kind::Block, s.seq, *n, &buf[r.end - 16..r.end]);
            s.seq += 1;
        }
        let kept = recs.len();
        for (n, r) in inplace() {
            s.mac.push(&mut recs, Kind::Copy, s.seq, *n, &buf[r.clone()]);
            s.seq += 1;
        }
        if recs.is_empty() {
            return Ok(());
        }
        self.append_log(st, &recs, kept)?;
        crate::crash::point!("map.blocks_logged");
        Ok(())
    }

    /// For a write in place of the whole blocks `spans` (of `buf`): hands out the place and
    /// sequence numbers of its records (a block record, then a copy record, for each block;
    /// see [`log_write`](Self::log_write)), which [`write_records`](Self::write_records)
    /// writes without the map lock. The write counts as in flight from here.
    pub(super) fn place_records(&self, st: &mut MapState, spans: &[(u64, std::ops::Range<usize>)]) -> Placed {
        let in_flight = st.in_flight > 0;
        let s = st.session.as_mut().expect("a session is open");
        let at = s.next_record(in_flight);
        let kept = spans.len() as u64 * (maplog::HEAD as u64 + 16);
        let all = kept + spans.iter().map(|(_, r)| maplog::HEAD as u64 + r.len() as u64).sum::<u64>();
        (s.pos, s.tail) = (at + kept, at + all);
        let placed = Placed { log: s.log.clone(), mac: s.mac.clone(), at, seq: s.seq, ticket: s.order.next };
        s.seq += 2 * spans.len() as u64;
        s.order.next += 1;
        st.in_flight += 1;
        placed
    }

    /// Writes the records [`place_records`](Self::place_records) placed (without the map
    /// lock), then waits until every record before them is out too. An error if they, or an
    /// earlier write's, could not be written: nothing of this write is in place then.
    pub(super) fn write_records(&self, p: Placed, buf: &[u8], spans: &[(u64, std::ops::Range<usize>)]) -> Result<()> {
        let len = spans.iter().map(|(_, r)| 2 * maplog::HEAD + 16 + r.len()).sum::<usize>();
        let mut recs = Vec::with_capacity(len);
        for (i, (n, r)) in spans.iter().enumerate() {
            p.mac.push(&mut recs, Kind::Block, p.seq + i as u64, *n, &buf[r.end - 16..r.end]);
        }
        for (i, (n, r)) in spans.iter().enumerate() {
            p.mac.push(&mut recs, Kind::Copy, p.seq + (spans.len() + i) as u64, *n, &buf[r.clone()]);
        }
        let res = sys::pwrite_all(p.log.as_fd(), &recs, p.at);
        let mut st = self.map_state();
        let s = st.session.as_mut().expect("a session stays open while a write is in flight");
        let o = &mut s.order;
        if res.is_err() && o.failed.is_none_or(|(t, _)| p.ticket < t) {
            o.failed = Some((p.ticket, p.at));
        }
        o.done.insert(p.ticket);
        while o.done.remove(&o.logged) {
            o.logged += 1;
        }
        if st.log_waiters > 0 {
            self.map_idle.notify_all();
        }
        let ticket = p.ticket;
        if st.session.as_ref().is_some_and(|s| s.order.logged <= ticket) {
            st.log_waiters += 1;
            st = self
                .map_idle
                .wait_while(st, |st| st.session.as_ref().is_some_and(|s| s.order.logged <= ticket))
                .unwrap_or_else(|e| e.into_inner());
            st.log_waiters -= 1;
        }
        let failed = st.session.as_ref().and_then(|s| s.order.failed).is_some_and(|(t, _)| t <= ticket);
        drop(st);
        match res {
            Err(e) => Err(Error::io(format!("writing the write-session log of {}", self.what), e)),
            Ok(()) if failed => Err(Error::io(
                format!("writing the write-session log of {}", self.what),
                std::io::Error::other("an earlier record of the session could not be written"),
            )),
            Ok(()) => {
                crate::crash::point!("map.blocks_logged");
                Ok(())
            }
        }
    }

    /// A write in place is done (its blocks out or not): the last one lets a commit or other
    /// change of the map go on, and puts the log's end back where records failed, if some did.
    pub(super) fn landed(&self, st: &mut MapState) {
        st.in_flight -= 1;
        if st.in_flight > 0 {
            return;
        }
        if let Some(s) = st.session.as_mut() {
            if let Some((_, at)) = s.order.failed.take() {
                (s.pos, s.tail) = (at, at);
            }
        }
        if st.idle_waiters > 0 {
            self.map_idle.notify_all();
        }
    }

    /// Logs block `n`'s new ciphertext `ct` and the size `size` the file takes with it (a
    /// shrinking truncate's new final block).
    pub(super) fn log_block(&self, st: &mut MapState, n: u64, ct: &[u8], size: u64) -> Result<()> {
        let s = st.session.as_mut().expect("a session is open");
        let mut recs = Vec::new();
        s.mac.push(&mut recs, Kind::Size, s.seq, 0, &size.to_be_bytes());
        s.mac.push(&mut recs, Kind::Block, s.seq + 1, n, &ct[ct.len() - 16..]);
        let kept = recs.len();
        s.mac.push(&mut recs, Kind::Copy, s.seq + 2, n, ct);
        s.seq += 3;
        self.append_log(st, &recs, kept)?;
        crate::crash::point!("map.blocks_logged");
        Ok(())
    }

    /// Commits the map in memory: in a session, the new bytes of every map block and node it
    /// changes and a commit record (size, root) go to the log, then those bytes in place,
    /// then (after cutting the file to `cut`, for a shrinking truncate) the settled header;
    /// the log goes last. Without a session (a first write into an empty file), the map and
    /// the header of a new generation, header last.
    pub(super) fn finish_map(&self, st: &mut MapState, cut: Option<u64>) -> Result<()> {
        let writes = self.map_writes(st);
        match st.session.take() {
            Some(mut s) => {
                let root = bm::map_root(self.id(), st.k, &st.hashes).expect("one hash per group");
                let mut recs = Vec::new();
                let mut seq = s.seq;
                for (a, _, bytes) in &writes {
                    s.mac.push(&mut recs, Kind::Map, seq, *a, bytes);
                    seq += 1;
                }
                s.mac.push(&mut recs, Kind::Commit, seq, 0, &maplog::commit_payload(st.size, &root));
                if let Err(e) = sys::pwrite_all(s.log.as_fd(), &recs, s.pos) {
                    // Nothing of the commit counts yet: the session stays open (a cut record
                    // at its end does not authenticate and is written over next time).
                    st.session = Some(s);
                    return Err(Error::io(format!("writing the write-session log of {}", self.what), e));
                }
                crate::crash::point!("map.committed");
                // From here the commit record is what a reader goes by: if a step fails, the
                // session stays open with it in its log, and the next commit comes after it.
                s.pos += recs.len() as u64;
                (s.tail, s.seq) = (s.pos, seq + 1);
                let rest = (|| -> Result<()> {
                    self.put_map(&writes)?;
                    crate::crash::point!("map.map_written");
                    if let Some(c) = cut {
                        sys::ftruncate(self.fd(), c).ctx(|| format!("truncating {}", self.what))?;
                    }
                    self.write_header_map(st, false)
                })();
                if let Err(e) = rest {
                    st.session = Some(s);
                    return Err(e);
                }
                crate::crash::point!("map.settled");
                drop(s);
                self.remove_stash();
            }
            None => {
                st.generation = self.next_generation(st);
                self.put_map(&writes)?;
                if let Some(c) = cut {
                    sys::ftruncate(self.fd(), c).ctx(|| format!("truncating {}", self.what))?;
                }
                self.write_header_map(st, false)?;
            }
        }
        st.write.clear();
        st.changed.clear();
        st.plan = CommitPlan::default();
        st.k_base = st.k;
        Ok(())
    }

    fn put_map(&self, writes: &[(u64, u64, Vec<u8>)]) -> Result<()> {
        for (_, off, bytes) in writes {
            crate::crash::torn!("map.torn_map", self.fd(), bytes, *off);
            sys::pwrite_all(self.fd(), bytes, *off).ctx(|| format!("writing {}", self.what))?;
        }
        Ok(())
    }

    /// Ends this handle's write session, if one is open (the last close, fsync). Returns
    /// whether it wrote the header; the backing file keeps its modification time.
    pub(super) fn end_map_session(&self) -> Result<bool> {
        let mut st = self.map_state_idle();
        if st.session.is_none() {
            return Ok(false);
        }
        let before = sys::fstat(self.fd()).ok();
        self.finish_map(&mut st, None)?;
        if let Some(b) = before {
            self.put_back_mtime(&b);
        }
        Ok(true)
    }

    /// For a file that is being removed unfinished (a partial file discarded): drops this
    /// handle's write session, if any, and removes its log (or inner-block stash), which
    /// would otherwise outlive the file.
    pub fn discard_session(&self) {
        let open = self.map_state_idle().session.take().is_some();
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner()).fd.take().is_some();
        if open || inner {
            self.remove_stash();
        }
    }

    /// Reads a file whose header carries UNSETTLED by its session's log: by the newest commit
    /// record whose map (its map records over the map on disk) gives its root, else by the
    /// header's map with the newest size record whose final block is vouched for.
    pub(super) fn load_session(&self, st: &mut MapState, h: bm::HeaderV2) -> Result<()> {
        let bytes = match &self.ctx.stashes {
            Some(dir) => dir.read(self.id()).ctx(|| format!("reading {}", dir.path_of(self.id()).display()))?,
            None => None,
        };
        let log = Log::parse(bytes.unwrap_or_default(), &self.ctx.keys, self.id(), h.generation);
        let (l, ml) = (self.ctx.layout, self.map_layout());
        (st.generation, st.hdr) = (h.generation, Some(h));
        for (p, root, seq) in log.commits() {
            let k = l.block_count(p);
            if k == 0 || k > ml.max_written_blocks() {
                continue;
            }
            if let Ok((hashes, leaves, r)) = self.read_root(k, Some((&log, seq))) {
                if r == root {
                    (st.hashes, st.leaves, st.k, st.size, st.k_base) = (hashes, leaves, k, p, k);
                    st.found = Some(Found { log, k0: h.blocks, commit: Some(seq) });
                    tracing::warn!(
                        "{}: recovered crash state ({}): reads as {p} bytes",
                        self.what,
                        TailRule::MapCommitted.describe()
                    );
                    return Ok(());
                }
            }
        }
        let (hashes, leaves, root) = self.read_root(h.blocks, None)?;
        if root != h.root {
            return Err(self.map_auth(
                "block map does not match the header's root nor a commit record of its write session (a map block, \
                 node or header of another version)",
            ));
        }
        (st.hashes, st.leaves, st.k_base) = (hashes, leaves, h.blocks);
        let sizes = log.sizes();
        st.found = Some(Found { log, k0: h.blocks, commit: None });
        let mut plain = vec![0u8; l.block_size as usize];
        for p in sizes {
            let k = l.block_count(p);
            if k == 0 || k > ml.max_written_blocks() {
                continue;
            }
            (st.k, st.size) = (k, p);
            if self.accept(st, k - 1, &mut plain).is_ok() {
                tracing::warn!(
                    "{}: recovered crash state ({}): reads as {p} bytes",
                    self.what,
                    TailRule::MapSession.describe()
                );
                return Ok(());
            }
        }
        st.reset();
        Err(self.map_auth(
            "UNSETTLED, and no size its write session's log records ends the file (a log lost, or of another session or file)",
        ))
    }

    /// Block `n` of a found session's file, into `out`: the block as stored if its tag is
    /// the leaf the map in use gives, or (without a commit) the tag of a block record of the
    /// session, or (without a commit, past the header's block count, which has no leaf) if it
    /// opens; a hole by its leaf, or an all-zero slot past the header's count; else the
    /// newest block record that the same rules allow and that opens. Anything else is an
    /// integrity error.
    pub(super) fn accept(&self, st: &mut MapState, n: u64, out: &mut [u8]) -> Result<(usize, Source)> {
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let (k, p) = (st.k, st.size);
        let f = st.found.as_ref().expect("a found session");
        let (committed, k0) = (f.commit.is_some(), f.k0);
        let leaf = if committed || n < k0 { Some(self.leaf(st, n)?) } else { None };
        let f = st.found.as_ref().expect("a found session");
        let vouched = f.log.tags_of(n);
        let last = n + 1 == k;
        let len = (l.block_len(n, p) + l.overhead) as usize;
        let plain = len - l.overhead as usize;
        let hole_by_leaf = leaf == Some(HOLE_LEAF) && (committed || vouched.is_empty());
        if hole_by_leaf {
            if last {
                return Err(Error::auth(&self.what, format!("block {n}, the final block, is a hole in the map")));
            }
            out[..plain].fill(0);
            return Ok((plain, Source::Hole));
        }
        let mut ct = vec![0u8; len];
        let got = sys::pread_full(self.fd(), &mut ct, ml.block_offset(n)).ctx(|| format!("reading {}", self.what))?;
        if got == len {
            let tag = bm::leaf_of(&ct).expect("a block has a tag");
            let ok = match leaf {
                Some(lf) => lf == tag,
                None => true,
            } || (!committed && vouched.contains(&tag));
            if ok && self.codec.open_into(n, last, &ct, out, &self.what).is_ok() {
                return Ok((plain, Source::Disk(tag)));
            }
            if leaf.is_none() && !last && ct.iter().all(|&b| b == 0) {
                out[..plain].fill(0);
                return Ok((plain, Source::Hole));
            }
        }
        // A copy counts only as a version the map or a block record vouches for.
        for r in f.log.copies_of(n) {
            let rct = f.log.payload(r);
            let tag = bm::leaf_of(rct);
            let ok = match committed {
                true => tag == leaf,
                false => tag.is_some_and(|t| vouched.contains(&t) || leaf == Some(t)),
            };
            if rct.len() != len || !ok {
                continue;
            }
            if self.codec.open_into(n, last, rct, out, &self.what).is_ok() {
                return Ok((plain, Source::Record(rct.to_vec())));
            }
        }
        Err(Error::auth(
            &self.what,
            format!("block {n} is not a version the header or its write session's log vouches for"),
        ))
    }

    /// [`read_at_map`](Self::read_at_map) for a found session's file: block by block.
    pub(super) fn read_found(&self, st: &mut MapState, buf: &mut [u8], off: u64, len: u64) -> Result<usize> {
        let l = self.ctx.layout;
        let size = st.size;
        if off >= size {
            return Ok(0);
        }
        let len = len.min(size - off);
        let (first, last) = l.blocks_touched(off, len).expect("non-empty");
        let mut plain = vec![0u8; l.block_size as usize];
        let mut done = 0usize;
        for n in first..=last {
            let (blen, _) = self.accept(st, n, &mut plain).inspect_err(|e| tracing::error!("{e}"))?;
            let bstart = n * l.block_size;
            let from = (off.max(bstart) - bstart) as usize;
            let to = ((off + len).min(bstart + blen as u64) - bstart) as usize;
            buf[done..done + to - from].copy_from_slice(&plain[from..to]);
            done += to - from;
        }
        Ok(done)
    }

    /// Settles a found session's file: writes in place every block it reads from a record,
    /// then, in the same session's log, the map records and a commit record for the file as
    /// it reads; then the map in place, the cut to its size, the settled header, and the log
    /// goes. Each step reads the same as the one before. `None` when nothing was found.
    pub(super) fn settle_found(&self, st: &mut MapState) -> Result<Option<TailRule>> {
        let Some(f) = st.found.as_ref() else { return Ok(None) };
        let (committed, rule) = (f.commit.is_some(), f.rule());
        let (l, ml) = (self.ctx.layout, self.map_layout());
        let (k, p) = (st.k, st.size);
        let with_records: BTreeSet<u64> =
            (f.log.records.iter().filter(|r| r.kind == Kind::Block)).map(|r| r.a).collect();
        let mut leaves: Vec<Leaf> = Vec::with_capacity(k as usize);
        let mut plain = vec![0u8; l.block_size as usize];
        for n in 0..k {
            let k0 = st.found.as_ref().expect("found").k0;
            if !with_records.contains(&n) && n + 1 < k && (committed || n + 1 < k0) {
                leaves.push(self.leaf(st, n)?);
                continue;
            }
            let (_, src) = self.accept(st, n, &mut plain).inspect_err(|e| tracing::error!("{e}"))?;
            leaves.push(match src {
                Source::Disk(t) => t,
                Source::Hole => HOLE_LEAF,
                Source::Record(ct) => {
                    sys::pwrite_all(self.fd(), &ct, ml.block_offset(n)).ctx(|| format!("writing {}", self.what))?;
                    bm::leaf_of(&ct).expect("a block has a tag")
                }
            });
        }
        let mut hashes = Vec::with_capacity(group_count(k) as usize);
        let mut writes = Vec::new();
        let differs = |bytes: &[u8], off: u64| -> Result<bool> {
            let mut disk = vec![0u8; bytes.len()];
            let got = sys::pread_full(self.fd(), &mut disk, off).ctx(|| format!("reading {}", self.what))?;
            Ok(got != disk.len() || disk != bytes)
        };
        for g in 0..group_count(k) {
            let (a, b) = (group_start(g), group_start(g + 1).min(k));
            let bytes = leaves[a as usize..b as usize].as_flattened().to_vec();
            hashes.push(bm::hash(&bytes));
            if differs(&bytes, ml.map_offset(g))? {
                writes.push((g, ml.map_offset(g), bytes));
            }
        }
        for j in 0..node_count(k) {
            let node = bm::node_bytes(&hashes[span_first_group(j) as usize..span_first_group(j + 1) as usize]);
            if differs(&node, ml.node_offset(j))? {
                writes.push((NODE_BIT + j, ml.node_offset(j), node));
            }
        }
        let id = *self.id();
        let root = bm::map_root(&id, k, &hashes).expect("one hash per group");
        let dir = self.ctx.stashes.as_ref().expect("a found session has a log");
        let f = st.found.as_ref().expect("found");
        let (log, pos, mut seq) = match dir.open_rw(&id) {
            Ok(Some(fd)) => (fd, f.log.end, f.log.next_seq),
            _ => (dir.create(&id).map_err(|e| Error::io(format!("creating {}", dir.path_of(&id).display()), e))?, 0, 0),
        };
        let mac = maplog::Keyed::new(&self.ctx.keys, &id, st.generation);
        let mut recs = Vec::new();
        for (a, _, bytes) in &writes {
            mac.push(&mut recs, Kind::Map, seq, *a, bytes);
            seq += 1;
        }
        mac.push(&mut recs, Kind::Commit, seq, 0, &maplog::commit_payload(p, &root));
        sys::pwrite_all(log.as_fd(), &recs, pos).ctx(|| format!("writing the write-session log of {}", self.what))?;
        self.put_map(&writes)?;
        sys::ftruncate(self.fd(), ml.cipher_size(p)).ctx(|| format!("truncating {}", self.what))?;
        st.found = None;
        (st.hashes, st.k, st.size, st.k_base) = (hashes, k, p, k);
        st.leaves.clear();
        st.write.clear();
        st.changed.clear();
        st.plan = CommitPlan::default();
        self.write_header_map(st, false)?;
        drop(log);
        self.remove_stash();
        tracing::warn!("{}: settled ({}): {p} bytes", self.what, rule.describe());
        Ok(Some(rule))
    }

    /// Whether a found session's file is being read by its log, and its size (for fsck).
    pub(super) fn map_crash_state(&self) -> Option<(TailRule, u64)> {
        let st = self.map_state();
        st.found.as_ref().map(|f| (f.rule(), st.size))
    }

    /// [`recover_tail`](Self::recover_tail) for a file with a block map.
    pub(super) fn recover_map(&self) -> Result<Option<TailRule>> {
        let mut st = self.map_state_idle();
        if st.found.is_none() {
            return Ok(None);
        }
        self.settle_found(&mut st)
    }
}
