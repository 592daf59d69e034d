//! The write-session log of a file with a block map (docs/FORMAT.md §5.10, "Write sessions
//! and their log").
//!
//! Why it exists: a write session of such a file changes blocks in place while its header
//! still commits (UNSETTLED) to the map of before the session, and at its end rewrites map
//! blocks in place before the settled header. A crash between any two of those steps would
//! leave blocks or map blocks the header does not commit to. The log, kept where the
//! inner-block stash is (`veilfs.S.<b64(ID)>`), holds what a reader of the UNSETTLED file may
//! accept instead: every record carries `HMAC16(record-mac, …)` over the file ID and the
//! session's generation, so a record of another file or of another session never counts,
//! and no one without the key can write one.
//!
//! Record = `u8 kind ‖ 3 zero bytes ‖ u32be(len) ‖ u64be(seq) ‖ u64be(a) ‖ MAC16 ‖ payload`
//! (`len` bytes); the MAC covers a digest of the payload rather than the payload itself
//! where the payload authenticates otherwise (a block's ciphertext by its AEAD tag, a map
//! block through the commit record's root).
//!
//! What vouches for a block is its tag (a 16-byte block record, kept for the session); the
//! block's whole ciphertext (a copy record) is needed only until its in-place `pwrite`
//! returns, in case a crash tears it. So the writer appends a write's block records and its
//! copies in one `pwrite` but advances its log's end past the block records only: the next
//! write's records go over the copies (after them, while that write is still in flight: the
//! mount's threads write one file's blocks at once, and those copies then stay). A session
//! of random 4 KiB overwrites then keeps its log at ~60 bytes per write instead of a copy of
//! every block (which, measured, cost ~40 % of such a write's time in page allocation alone).

use crate::content::blockmap::{hash, Hash};
use crate::content::header::FileId;
use crate::keys::SubKeys;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Bytes before a record's payload.
pub const HEAD: usize = 40;
/// The MAC's label.
pub const LABEL: &[u8] = b"veilfs v2 session record";
/// `a` of a map record for node `j` is `NODE_BIT + j` (else it is a group index).
pub const NODE_BIT: u64 = 1 << 63;
/// At most this many bytes of a log are read (a planted giant log costs no more).
pub const READ_LIMIT: u64 = crate::stash::READ_LIMIT;
/// A writer ends its session (commits) before its log grows past this. Every record must lie
/// in the first [`READ_LIMIT`] bytes, so a writer also splits a write into pieces of at most
/// [`WRITE_PIECE`] bytes: a piece's records fit in what is left. (At 8 MiB, a commit every
/// ~2000 random 4 KiB overwrites cost ~20 % of their time, each rewriting every map block
/// they touched.)
pub const CHECKPOINT: u64 = 32 << 20;
/// The largest piece of a write that is logged at once.
pub const WRITE_PIECE: usize = 8 << 20;

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `a` = block index; payload = the tag (16 bytes) of the block's ciphertext the
    /// session writes in place: a version of that block the session vouches for. MAC
    /// digest: the payload.
    Block = 1,
    /// `a` = group index, or `NODE_BIT + j` for node `j`; payload = the map block's (or
    /// node's) new bytes. MAC digest: SHA-256 of the payload.
    Map = 2,
    /// `a` = 0; payload = `u64be(p') ‖ root'`: the session's end, the plaintext size and
    /// root the map records that come before it give. MAC digest: the payload.
    Commit = 3,
    /// `a` = 0; payload = `u64be(p)`: the plaintext size after the write that follows.
    /// MAC digest: the payload.
    Size = 4,
    /// `a` = block index; payload = the whole ciphertext of a block being written in place
    /// (for a crash that tears that write). MAC digest: its tag (the last 16 bytes).
    Copy = 5,
}

impl Kind {
    fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Block,
            2 => Kind::Map,
            3 => Kind::Commit,
            4 => Kind::Size,
            5 => Kind::Copy,
            _ => return None,
        })
    }
}

/// The record MAC of one file's session `g`: the `record-mac` key schedule and the fixed
/// prefix (label, file ID, generation) hashed once, cloned for every record (a random 4 KiB
/// overwrite logs one record).
#[derive(Clone)]
pub struct Keyed(Hmac<Sha256>);

impl Keyed {
    /// The MAC of records of session `g` of file `id`.
    pub fn new(keys: &SubKeys, id: &FileId, g: u64) -> Keyed {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(keys.record_mac.expose()).expect("any key length");
        m.update(LABEL);
        m.update(id);
        m.update(&g.to_be_bytes());
        Keyed(m)
    }

    fn mac(&self, kind: Kind, seq: u64, a: u64, payload: &[u8]) -> Option<[u8; 16]> {
        let len = u32::try_from(payload.len()).ok()?;
        let mut m = self.0.clone();
        m.update(&[kind as u8]);
        m.update(&seq.to_be_bytes());
        m.update(&a.to_be_bytes());
        m.update(&len.to_be_bytes());
        match kind {
            Kind::Copy => m.update(payload.get(payload.len().checked_sub(16)?..)?),
            Kind::Map => m.update(&hash(payload)),
            Kind::Block | Kind::Commit | Kind::Size => m.update(payload),
        }
        let full = m.finalize().into_bytes();
        Some(full[..16].try_into().expect("16 bytes"))
    }

    /// Appends a record to `out`.
    pub fn push(&self, out: &mut Vec<u8>, kind: Kind, seq: u64, a: u64, payload: &[u8]) {
        let tag = self.mac(kind, seq, a, payload).expect("a record's payload fits its format");
        out.push(kind as u8);
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&a.to_be_bytes());
        out.extend_from_slice(&tag);
        out.extend_from_slice(payload);
    }
}

impl std::fmt::Debug for Keyed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyed(..)")
    }
}

/// Appends a record of session `g` of file `id` to `out` (see [`Keyed::push`]).
#[allow(clippy::too_many_arguments)]
pub fn push(out: &mut Vec<u8>, keys: &SubKeys, id: &FileId, g: u64, kind: Kind, seq: u64, a: u64, payload: &[u8]) {
    Keyed::new(keys, id, g).push(out, kind, seq, a, payload)
}

/// The payload of a commit record.
pub fn commit_payload(size: u64, root: &Hash) -> Vec<u8> {
    let mut v = size.to_be_bytes().to_vec();
    v.extend_from_slice(root);
    v
}

/// One authenticated record of a parsed log.
#[derive(Clone, Debug)]
pub struct Record {
    /// Its kind.
    pub kind: Kind,
    /// Its sequence number.
    pub seq: u64,
    /// Its `a` field.
    pub a: u64,
    /// Where its payload lies in [`Log::bytes`].
    pub at: std::ops::Range<usize>,
}

/// The records of one session of one file that authenticate, in the order they were written.
#[derive(Debug, Default)]
pub struct Log {
    /// The log's bytes (at most [`READ_LIMIT`]).
    pub bytes: Vec<u8>,
    /// The records of session `g` of this file whose MAC verifies.
    pub records: Vec<Record>,
    /// Where the next record goes (after the last whole record, authentic or not).
    pub end: u64,
    /// The next free sequence number.
    pub next_seq: u64,
}

impl Log {
    /// Parses `bytes` (a log's first bytes), keeping the records of session `g` of file `id`
    /// whose MAC verifies. A record cut short ends the log (a crash while it was appended);
    /// one that does not verify (another session's, another file's, or forged) is skipped.
    pub fn parse(bytes: Vec<u8>, keys: &SubKeys, id: &FileId, g: u64) -> Log {
        let keyed = Keyed::new(keys, id, g);
        let mut log = Log { bytes, ..Log::default() };
        let mut pos = 0usize;
        while pos + HEAD <= log.bytes.len() {
            let h = &log.bytes[pos..pos + HEAD];
            let Some(kind) = Kind::of(h[0]) else { break };
            if h[1..4] != [0, 0, 0] {
                break;
            }
            let u64_at = |i: usize| u64::from_be_bytes(h[i..i + 8].try_into().expect("8 bytes"));
            let len = u32::from_be_bytes(h[4..8].try_into().expect("4 bytes")) as usize;
            let (seq, a) = (u64_at(8), u64_at(16));
            let at = pos + HEAD..pos + HEAD + len;
            if at.end > log.bytes.len() {
                break;
            }
            let ok = (keyed.mac(kind, seq, a, &log.bytes[at.clone()]))
                .is_some_and(|m| bool::from(m.ct_eq(&log.bytes[pos + 24..pos + 40])));
            if ok {
                log.next_seq = log.next_seq.max(seq + 1);
                log.records.push(Record { kind, seq, a, at: at.clone() });
            }
            pos = at.end;
        }
        log.end = pos as u64;
        log
    }

    /// The payload of record `r`.
    pub fn payload(&self, r: &Record) -> &[u8] {
        &self.bytes[r.at.clone()]
    }

    /// The tags the block records vouch for as block `n`.
    pub fn tags_of(&self, n: u64) -> Vec<[u8; 16]> {
        (self.records.iter().filter(|r| r.kind == Kind::Block && r.a == n))
            .filter_map(|r| self.payload(r).try_into().ok())
            .collect()
    }

    /// The copy records of block `n`, newest first.
    pub fn copies_of(&self, n: u64) -> Vec<&Record> {
        let mut v: Vec<&Record> = self.records.iter().filter(|r| r.kind == Kind::Copy && r.a == n).collect();
        v.sort_by_key(|r| std::cmp::Reverse(r.seq));
        v
    }

    /// The commit records (plaintext size, root, sequence number), newest first.
    pub fn commits(&self) -> Vec<(u64, Hash, u64)> {
        let mut v: Vec<_> = (self.records.iter().filter(|r| r.kind == Kind::Commit))
            .filter_map(|r| {
                let p = self.payload(r);
                (p.len() == 40)
                    .then(|| (u64::from_be_bytes(p[..8].try_into().expect("8")), p[8..].try_into().expect("32"), r.seq))
            })
            .collect();
        v.sort_by_key(|c| std::cmp::Reverse(c.2));
        v
    }

    /// The sizes of the size records, newest first.
    pub fn sizes(&self) -> Vec<u64> {
        let mut v: Vec<_> = (self.records.iter().filter(|r| r.kind == Kind::Size && r.at.len() == 8))
            .map(|r| (r.seq, u64::from_be_bytes(self.payload(r).try_into().expect("8"))))
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.0));
        v.into_iter().map(|(_, p)| p).collect()
    }

    /// The newest map record for `a` (a group, or `NODE_BIT + j`) of `len` bytes written
    /// before sequence number `before`.
    pub fn map_bytes(&self, a: u64, len: u64, before: u64) -> Option<&[u8]> {
        (self.records.iter().filter(|r| r.kind == Kind::Map && r.a == a && r.seq < before))
            .filter(|r| r.at.len() as u64 == len)
            .max_by_key(|r| r.seq)
            .map(|r| self.payload(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> SubKeys {
        crate::keys::MasterKey::from_bytes([7; 32]).subkeys()
    }

    #[test]
    fn records_count_only_for_their_file_and_session_and_every_byte_is_authenticated() {
        let k = keys();
        let (id, other) = ([1u8; 16], [2u8; 16]);
        let mut log = Vec::new();
        push(&mut log, &k, &id, 5, Kind::Size, 0, 0, &9u64.to_be_bytes());
        push(&mut log, &k, &id, 5, Kind::Copy, 1, 3, &[4u8; 60]);
        push(&mut log, &k, &id, 5, Kind::Commit, 2, 0, &commit_payload(9, &[8; 32]));
        let parsed = Log::parse(log.clone(), &k, &id, 5);
        assert_eq!(parsed.records.len(), 3);
        assert_eq!((parsed.sizes(), parsed.copies_of(3).len(), parsed.commits()), (vec![9], 1, vec![(9, [8; 32], 2)]));
        assert_eq!(parsed.next_seq, 3);
        assert!(Log::parse(log.clone(), &k, &id, 6).records.is_empty(), "another session");
        assert!(Log::parse(log.clone(), &k, &other, 5).records.is_empty(), "another file");
        // The copy record's payload before its tag is the block's ciphertext, which the
        // AEAD authenticates under that tag: the MAC covers the tag only.
        let body = 48 + HEAD..48 + HEAD + 60 - 16;
        for i in (0..log.len()).filter(|i| !body.contains(i)) {
            let mut c = log.clone();
            c[i] ^= 1;
            let p = Log::parse(c, &k, &id, 5);
            // A changed byte costs at least its record (and a changed length, those after).
            assert!(p.records.len() < 3, "byte {i}");
        }
        // A record cut short ends the log.
        assert_eq!(Log::parse(log[..log.len() - 1].to_vec(), &k, &id, 5).records.len(), 2);
    }
}
