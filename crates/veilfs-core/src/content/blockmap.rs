//! The block map of a file (feature `"block-map"`): its layout, its root and header v2.
//!
//! Why it exists: a v1 block authenticates its own position, file and "last or not", but not
//! its *version*: an older copy of a block put back at the same place, an older header with
//! a newer body, or an older final block after a truncate all open (docs/SECURITY.md §4.2).
//! The block map commits, in the header, to the exact ciphertext of every block: the *leaf*
//! of block `n` is its AEAD tag (16 bytes; a hole's leaf is 16 zero bytes), the leaves are
//! stored in the file itself at offsets that depend on the block index alone, and the
//! header carries a SHA-256 root over them under its HMAC (docs/FORMAT.md §5.10,
//! docs/design/rollback.md "Layer 1").
//!
//! This module is the pure part: offset math, the root, header v2 and its HMAC. No file I/O;
//! the reader and the writer build on it.
//!
//! ```text
//! header v2 (92) ‖ map 0 ‖ block 0 ‖ map 1 ‖ block 1 ‖ map 2 ‖ blocks 2–3 ‖ map 3 ‖ blocks 4–7 ‖ …
//!   ‖ map 8 ‖ blocks 128–255 ‖ map 9 ‖ blocks 256–511 ‖ map 10 ‖ … ‖ node 0 ‖ map 136 ‖ …
//! ```
//!
//! Map block `g` (a *group*) holds the leaves of its blocks and has a fixed reserved size, so
//! that growing a file never moves a block. The first 256 blocks are split into groups of
//! 1, 1, 2, 4, …, 128 blocks, every later group holds 256 (one MiB at B = 4096): a small file
//! pays about 16–32 bytes per block instead of a whole 4 KiB map block, and a group's map
//! block is at most 4096 bytes. Every 2^15 blocks (a *span*) the SHA-256 hashes of the span's
//! map blocks are stored as a *node* after its last block, once a block follows it, so that
//! opening a file reads one node per span plus at most the last span's map blocks, not every
//! map block of the file.

use crate::content::header::{FileId, FLAG_SPARSE, FLAG_UNSETTLED};
use crate::error::Error;
use crate::keys::{hmac16, SubKeys};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Length of header v2 on disk.
pub const HEADER_V2_LEN: usize = 92;
/// The header version of files with a block map.
pub const HEADER_V2_VERSION: u16 = 2;
/// Bytes of one leaf: a block's AEAD tag.
pub const LEAF_LEN: u64 = 16;
/// The leaf of a hole (a block never written): 16 zero bytes.
pub const HOLE_LEAF: Leaf = [0; 16];
/// Blocks in a full group (one map block of 4096 bytes).
pub const GROUP_BLOCKS: u64 = 256;
/// The groups that split the first [`GROUP_BLOCKS`] blocks (1, 1, 2, 4, …, 128 blocks).
pub const SMALL_GROUPS: u64 = 9;
/// Blocks in a span: each span but the file's last has a node after it.
pub const SPAN_BLOCKS: u64 = 1 << 15;
/// Bytes of one hash in a node and in the root's list.
pub const HASH_LEN: u64 = 32;
/// The most blocks this implementation writes or reads in one file, 2^30 (4 TiB at B = 4096,
/// 1 PiB at 1 MiB blocks): far below [`MapLayout::max_blocks`], because a file's map costs in
/// proportion to its block count even where it is all holes. An open file keeps the hash of
/// every map block in memory (32 bytes per group of 256 blocks: 128 MiB at this size), and
/// every span a file covers has a node on disk that is not zeros (4 KiB per 2^15 blocks),
/// which a growing truncate writes at once (and logs first, in a session). Beyond this, a
/// sparse file of an absurd size exhausted the daemon's memory (the kernel killed it); the
/// writer refuses it with EFBIG instead, as a file system refuses a size beyond its limit.
pub const MAX_WRITTEN_BLOCKS: u64 = 1 << 30;
/// The domain string that starts the root's input.
pub const ROOT_LABEL: &[u8] = b"veilfs v2 map";
const HEADER_V2_LABEL: &[u8] = b"veilfs v2 header";
const KNOWN_FLAGS: u16 = FLAG_SPARSE | FLAG_UNSETTLED;
/// Bytes covered by the header's HMAC.
const MACED: usize = 76;

/// A block's leaf: its AEAD tag, or [`HOLE_LEAF`].
pub type Leaf = [u8; 16];
/// A SHA-256 hash.
pub type Hash = [u8; 32];

/// The leaf of a block from its ciphertext as stored (`nonce ‖ ciphertext ‖ tag`): the tag.
/// `None` if it is too short to hold one.
pub fn leaf_of(block: &[u8]) -> Option<Leaf> {
    let at = block.len().checked_sub(LEAF_LEN as usize)?;
    block[at..].try_into().ok()
}

/// The group (map block index) of block `n`.
pub const fn group_of(n: u64) -> u64 {
    if n == 0 {
        0
    } else if n < GROUP_BLOCKS {
        // 1 → 1, 2–3 → 2, 4–7 → 3, …, 128–255 → 8.
        64 - n.leading_zeros() as u64
    } else {
        n / GROUP_BLOCKS + SMALL_GROUPS - 1
    }
}

/// The first block of group `g`.
pub const fn group_start(g: u64) -> u64 {
    if g == 0 {
        0
    } else if g < SMALL_GROUPS {
        1 << (g - 1)
    } else {
        (g - SMALL_GROUPS + 1) * GROUP_BLOCKS
    }
}

/// The number of blocks group `g` can hold (its reserved map block is 16 bytes per block).
pub const fn group_capacity(g: u64) -> u64 {
    group_start(g + 1) - group_start(g)
}

/// The number of groups (map blocks) of a file of `k` blocks.
pub const fn group_count(k: u64) -> u64 {
    if k == 0 {
        0
    } else {
        group_of(k - 1) + 1
    }
}

/// The number of nodes stored in a file of `k` blocks: one per span that a block follows.
pub const fn node_count(k: u64) -> u64 {
    if k == 0 {
        0
    } else {
        (k - 1) / SPAN_BLOCKS
    }
}

/// The first group of span `j`.
pub const fn span_first_group(j: u64) -> u64 {
    group_of(j * SPAN_BLOCKS)
}

/// The number of map-block hashes node `j` holds (136 for node 0, which also covers the
/// small groups, 128 for the others).
pub const fn node_hashes(j: u64) -> u64 {
    span_first_group(j + 1) - span_first_group(j)
}

/// Why a ciphertext size or block count is not one a file with a block map can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Shorter than header v2 but not empty.
    #[error("ciphertext of {0} bytes is cut inside the header")]
    InHeader(u64),
    /// The file ends inside a map block or node, or in a block with no payload.
    #[error("ciphertext of {0} bytes ends inside map data or a block with no payload (truncated file)")]
    NoBlockEnd(u64),
    /// More blocks than the offsets of this layout can address.
    #[error("block count {0} is beyond the largest file this layout can address")]
    TooManyBlocks(u64),
}

/// The geometry of files with a block map: block size and per-block overhead, as
/// [`Layout`](super::Layout), plus the map's groups and nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapLayout {
    /// Plaintext bytes per block `B`.
    pub block_size: u64,
    /// Ciphertext bytes added per block `O` (nonce + tag).
    pub overhead: u64,
}

impl From<super::Layout> for MapLayout {
    fn from(l: super::Layout) -> Self {
        MapLayout::new(l.block_size, l.overhead)
    }
}

impl MapLayout {
    /// A layout for `block_size` plaintext bytes and `overhead` extra bytes per block.
    pub const fn new(block_size: u64, overhead: u64) -> Self {
        MapLayout { block_size, overhead }
    }

    /// Bytes of one full ciphertext block, `B + O`.
    pub const fn cipher_block(&self) -> u64 {
        self.block_size + self.overhead
    }

    /// The most blocks a file may have: every offset of such a file stays below 2^62, well
    /// inside `off_t`. Each block costs at most `B + O` bytes, two leaves (the small groups'
    /// reservation) and a share of a node below 1 byte, so `B + O + 64` bounds it.
    pub const fn max_blocks(&self) -> u64 {
        (1 << 62) / (self.cipher_block() + 64)
    }

    /// The most blocks this implementation gives or reads a file: [`MAX_WRITTEN_BLOCKS`], or
    /// [`max_blocks`](Self::max_blocks) if that is lower. A writer refuses to grow a file past
    /// it (EFBIG), and a reader refuses a header beyond it the same way.
    pub const fn max_written_blocks(&self) -> u64 {
        if MAX_WRITTEN_BLOCKS < self.max_blocks() {
            MAX_WRITTEN_BLOCKS
        } else {
            self.max_blocks()
        }
    }

    /// Checks a block count read from a header: an error if it is beyond [`max_blocks`](Self::max_blocks).
    pub const fn check_block_count(&self, k: u64) -> Result<(), SizeError> {
        if k > self.max_blocks() {
            Err(SizeError::TooManyBlocks(k))
        } else {
            Ok(())
        }
    }

    /// Bytes of the nodes stored before block `n`: the nodes of the spans before `n`'s.
    const fn node_bytes_before(&self, n: u64) -> u64 {
        // Nodes partition the groups: the spans before n's hold one hash per group before
        // the first group of n's span.
        HASH_LEN * span_first_group(n / SPAN_BLOCKS)
    }

    /// Ciphertext offset of block `n`: the header, the full blocks before it, the reserved map
    /// blocks of every group up to its own, and the nodes before it.
    pub const fn block_offset(&self, n: u64) -> u64 {
        HEADER_V2_LEN as u64
            + n * self.cipher_block()
            + LEAF_LEN * group_start(group_of(n) + 1)
            + self.node_bytes_before(n)
    }

    /// Ciphertext offset of map block `g`: right before its first block.
    pub const fn map_offset(&self, g: u64) -> u64 {
        self.block_offset(group_start(g)) - LEAF_LEN * group_capacity(g)
    }

    /// The bytes of map block `g` that a file of `k` blocks commits to (16 per block of the
    /// group that exists); 0 if the group is past the end. The rest of its reserved
    /// `16·group_capacity(g)` bytes is not part of the map.
    pub const fn map_len(&self, g: u64, k: u64) -> u64 {
        let start = group_start(g);
        let end = group_start(g + 1);
        if k <= start {
            0
        } else if k < end {
            LEAF_LEN * (k - start)
        } else {
            LEAF_LEN * (end - start)
        }
    }

    /// Ciphertext offset of node `j`: right after the last block of span `j`.
    pub const fn node_offset(&self, j: u64) -> u64 {
        self.block_offset((j + 1) * SPAN_BLOCKS - 1) + self.cipher_block()
    }

    /// Length of node `j`.
    pub const fn node_len(&self, j: u64) -> u64 {
        HASH_LEN * node_hashes(j)
    }

    /// Number of blocks holding `plain_size` bytes.
    pub const fn block_count(&self, plain_size: u64) -> u64 {
        plain_size.div_ceil(self.block_size)
    }

    /// Ciphertext size of a file of `plain_size` bytes (0 for an empty file: no header).
    pub const fn cipher_size(&self, plain_size: u64) -> u64 {
        if plain_size == 0 {
            return 0;
        }
        let last = self.block_count(plain_size) - 1;
        self.block_offset(last) + (plain_size - last * self.block_size) + self.overhead
    }

    /// The most plaintext one file can hold in `cipher_bytes` bytes of ciphertext: the largest
    /// `p` with `cipher_size(p) <= cipher_bytes` (for `statfs`, which reports the backing
    /// store's free space in plaintext bytes). `cipher_size` grows with `p`, so a binary
    /// search over the sizes a file may have finds it.
    pub fn plain_capacity(&self, cipher_bytes: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, cipher_bytes.min(self.max_blocks() * self.block_size));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.cipher_size(mid) <= cipher_bytes {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Plaintext size and block count `(p, k)` of a ciphertext file of `cipher_size` bytes.
    ///
    /// 0 bytes and a header alone are an empty file; sizes inside the header, inside map
    /// data (a reserved map block or a node) or in a final block of no more than `O` bytes are
    /// impossible. The header's block count must then equal `k`; the reader checks that.
    pub fn plain_size(&self, cipher_size: u64) -> Result<(u64, u64), SizeError> {
        let h = HEADER_V2_LEN as u64;
        if cipher_size == 0 || cipher_size == h {
            return Ok((0, 0));
        }
        if cipher_size < h {
            return Err(SizeError::InHeader(cipher_size));
        }
        // The final block is the last one that starts before the end: the largest n with
        // block_offset(n) < cipher_size (block_offset is strictly increasing).
        let (mut lo, mut hi) = (0u64, self.max_blocks());
        if self.block_offset(0) >= cipher_size {
            return Err(SizeError::NoBlockEnd(cipher_size));
        }
        if self.block_offset(hi) < cipher_size {
            return Err(SizeError::TooManyBlocks(hi + 1));
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.block_offset(mid) < cipher_size {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let r = cipher_size - self.block_offset(lo);
        if r <= self.overhead || r > self.cipher_block() {
            return Err(SizeError::NoBlockEnd(cipher_size));
        }
        Ok((lo * self.block_size + r - self.overhead, lo + 1))
    }
}

/// SHA-256 of a map block or node as stored (the committed bytes only).
pub fn hash(bytes: &[u8]) -> Hash {
    Sha256::digest(bytes).into()
}

/// Node `j`'s bytes: the hashes of its map blocks, in order.
pub fn node_bytes(map_hashes: &[Hash]) -> Vec<u8> {
    map_hashes.concat()
}

/// Why a list given for the root does not fit the block count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{got} hashes given for a file of {blocks} blocks, which needs {want}")]
pub struct CountMismatch {
    /// The block count.
    pub blocks: u64,
    /// Hashes given.
    pub got: u64,
    /// Hashes needed.
    pub want: u64,
}

/// How many hashes the root of a file of `k` blocks covers: one per stored node, then one per
/// map block of the last span.
pub const fn root_list_len(k: u64) -> u64 {
    let nodes = node_count(k);
    nodes + group_count(k) - span_first_group(nodes)
}

/// The root from its list: the hashes of the stored nodes, then those of the map blocks after
/// them (what a reader has after reading the nodes and the last span's map blocks).
///
/// `root = SHA256("veilfs v2 map" ‖ ID ‖ u64be(k) ‖ H(node 0) ‖ … ‖ H(map block …) ‖ …)`
pub fn root_from_list(id: &FileId, k: u64, list: &[Hash]) -> Result<Hash, CountMismatch> {
    let want = root_list_len(k);
    if list.len() as u64 != want {
        return Err(CountMismatch { blocks: k, got: list.len() as u64, want });
    }
    let mut h = Sha256::new();
    h.update(ROOT_LABEL);
    h.update(id);
    h.update(k.to_be_bytes());
    for item in list {
        h.update(item);
    }
    Ok(h.finalize().into())
}

/// The root from the hashes of every map block of a file of `k` blocks (what a writer has):
/// the map blocks of each span a block follows are folded into its node first.
pub fn map_root(id: &FileId, k: u64, map_hashes: &[Hash]) -> Result<Hash, CountMismatch> {
    let want = group_count(k);
    if map_hashes.len() as u64 != want {
        return Err(CountMismatch { blocks: k, got: map_hashes.len() as u64, want });
    }
    let nodes = node_count(k);
    let mut list = Vec::with_capacity(root_list_len(k) as usize);
    for j in 0..nodes {
        let (a, b) = (span_first_group(j) as usize, span_first_group(j + 1) as usize);
        list.push(hash(&node_bytes(&map_hashes[a..b])));
    }
    list.extend_from_slice(&map_hashes[span_first_group(nodes) as usize..]);
    root_from_list(id, k, &list)
}

/// The root of a file of `k` blocks from its leaves (one per block, [`HOLE_LEAF`] for a hole).
pub fn root_of_leaves(id: &FileId, leaves: &[Leaf]) -> Hash {
    let k = leaves.len() as u64;
    let hashes: Vec<Hash> = (0..group_count(k))
        .map(|g| {
            let (a, b) = (group_start(g) as usize, group_start(g + 1).min(k) as usize);
            hash(leaves[a..b].as_flattened())
        })
        .collect();
    map_root(id, k, &hashes).expect("one hash per group")
}

/// Why header v2 bytes were refused. Each is an integrity error of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderV2Error {
    /// Fewer than [`HEADER_V2_LEN`] bytes.
    #[error("file header truncated ({0} of {HEADER_V2_LEN} bytes)")]
    Truncated(usize),
    /// The HMAC did not verify (checked before anything else is looked at).
    #[error("file header authentication failed")]
    BadTag,
    /// A version other than 2.
    #[error("unsupported file header version {0} (expected 2)")]
    Version(u16),
    /// Flag bits other than SPARSE and UNSETTLED.
    #[error("unknown file header flags {0:#x}")]
    UnknownFlags(u16),
}

impl HeaderV2Error {
    /// This error as the crate's integrity error, naming the ciphertext file `what`.
    pub fn into_error(self, what: &str) -> Error {
        Error::auth(what, self.to_string())
    }
}

/// A decoded, verified header v2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderV2 {
    /// Flags: SPARSE and UNSETTLED as in v1 ([`FLAG_SPARSE`], [`FLAG_UNSETTLED`]).
    pub flags: u16,
    /// The file ID.
    pub id: FileId,
    /// The write-session generation, +1 at the start of every session.
    pub generation: u64,
    /// The first 8 bytes of the ID of the client that started session `generation`.
    pub writer: [u8; 8],
    /// The block count `k` the root commits to.
    pub blocks: u64,
    /// The map root.
    pub root: Hash,
}

impl HeaderV2 {
    /// True when the SPARSE flag is set.
    pub fn is_sparse(&self) -> bool {
        self.flags & FLAG_SPARSE != 0
    }

    /// True when the UNSETTLED flag is set.
    pub fn is_unsettled(&self) -> bool {
        self.flags & FLAG_UNSETTLED != 0
    }

    /// Serializes and authenticates the header: `HMAC16(header subkey, "veilfs v2 header" ‖
    /// bytes[0..76])`, the v1 header's key and construction under a label of its own.
    pub fn encode(&self, keys: &SubKeys) -> [u8; HEADER_V2_LEN] {
        let mut out = [0u8; HEADER_V2_LEN];
        out[0..2].copy_from_slice(&HEADER_V2_VERSION.to_be_bytes());
        out[2..4].copy_from_slice(&self.flags.to_be_bytes());
        out[4..20].copy_from_slice(&self.id);
        out[20..28].copy_from_slice(&self.generation.to_be_bytes());
        out[28..36].copy_from_slice(&self.writer);
        out[36..44].copy_from_slice(&self.blocks.to_be_bytes());
        out[44..76].copy_from_slice(&self.root);
        let tag = hmac16(keys.header.expose(), &[HEADER_V2_LABEL, &out[..MACED]]);
        out[MACED..].copy_from_slice(&tag);
        out
    }

    /// Parses and verifies a header: the tag first (in constant time), then the version, then
    /// the flags. The caller still checks the ID against the directory entry and the block
    /// count against the layout ([`MapLayout::check_block_count`]) and the file's size.
    pub fn decode(bytes: &[u8], keys: &SubKeys) -> Result<Self, HeaderV2Error> {
        let Some(bytes) = bytes.get(..HEADER_V2_LEN) else {
            return Err(HeaderV2Error::Truncated(bytes.len()));
        };
        let tag = hmac16(keys.header.expose(), &[HEADER_V2_LABEL, &bytes[..MACED]]);
        if !bool::from(tag.ct_eq(&bytes[MACED..])) {
            return Err(HeaderV2Error::BadTag);
        }
        let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let version = u16::from_be_bytes([bytes[0], bytes[1]]);
        if version != HEADER_V2_VERSION {
            return Err(HeaderV2Error::Version(version));
        }
        let flags = u16::from_be_bytes([bytes[2], bytes[3]]);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(HeaderV2Error::UnknownFlags(flags));
        }
        Ok(HeaderV2 {
            flags,
            id: bytes[4..20].try_into().expect("16 bytes"),
            generation: u64_at(20),
            writer: bytes[28..36].try_into().expect("8 bytes"),
            blocks: u64_at(36),
            root: bytes[44..76].try_into().expect("32 bytes"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MasterKey;
    use proptest::prelude::*;

    const L: MapLayout = MapLayout::new(4096, 28);
    const H2: u64 = HEADER_V2_LEN as u64;

    fn layouts() -> impl Strategy<Value = MapLayout> {
        (9u32..21, prop::sample::select(vec![12u64, 24])).prop_map(|(b, n)| MapLayout::new(1 << b, n + 16))
    }

    /// The regions of a file follow each other with no gap and no overlap: what ends before
    /// block `n` (the previous block, or the map block of `n`'s group, after the node of the
    /// span before when `n` starts a span) ends exactly where `n` starts.
    fn check_tiling(l: &MapLayout, n: u64) -> Result<(), TestCaseError> {
        let g = group_of(n);
        if group_start(g) != n {
            prop_assert_eq!(l.block_offset(n - 1) + l.cipher_block(), l.block_offset(n), "block {}", n);
            return Ok(());
        }
        prop_assert_eq!(l.map_offset(g) + LEAF_LEN * group_capacity(g), l.block_offset(n), "map {} before {}", g, n);
        let before_map = if n == 0 {
            H2
        } else if n.is_multiple_of(SPAN_BLOCKS) {
            let j = n / SPAN_BLOCKS - 1;
            prop_assert_eq!(l.node_offset(j) + l.node_len(j), l.map_offset(g), "node {} before map {}", j, g);
            l.node_offset(j)
        } else {
            l.map_offset(g)
        };
        if n > 0 {
            prop_assert_eq!(l.block_offset(n - 1) + l.cipher_block(), before_map, "block {} ends the region", n - 1);
        }
        Ok(())
    }

    /// Block counts worth testing: the edges of the small groups, of full groups (M−1, M,
    /// M+1 and later multiples) and of spans.
    fn edge_counts() -> Vec<u64> {
        let mut v = vec![0, 1, 2, 3, 4, 5, 7, 8, 9];
        for base in [GROUP_BLOCKS, 2 * GROUP_BLOCKS, 10 * GROUP_BLOCKS, SPAN_BLOCKS, 2 * SPAN_BLOCKS, 7 * SPAN_BLOCKS] {
            v.extend([base - 1, base, base + 1]);
        }
        v.extend((1..8).map(|g| 1u64 << g));
        v
    }

    #[test]
    fn groups_split_the_first_mib_then_hold_256_blocks() {
        let caps: Vec<u64> = (0..12).map(group_capacity).collect();
        assert_eq!(caps, [1, 1, 2, 4, 8, 16, 32, 64, 128, 256, 256, 256]);
        assert_eq!((group_of(0), group_of(1), group_of(2), group_of(3), group_of(4)), (0, 1, 2, 2, 3));
        assert_eq!((group_of(255), group_of(256), group_of(511), group_of(512)), (8, 9, 9, 10));
        assert_eq!((node_hashes(0), node_hashes(1), node_hashes(5)), (136, 128, 128));
        assert_eq!(group_of(SPAN_BLOCKS), 136);
    }

    #[test]
    fn offsets_at_the_edges() {
        // header, map block 0 (16 bytes), block 0.
        assert_eq!(L.map_offset(0), 92);
        assert_eq!(L.block_offset(0), 92 + 16);
        // map block 1 (16), block 1.
        assert_eq!(L.map_offset(1), 108 + 4124);
        assert_eq!(L.block_offset(1), 108 + 4124 + 16);
        // The first 256 blocks reserve 256 leaves; the 257th starts after map block 9.
        assert_eq!(L.block_offset(256), 92 + 256 * 4124 + 512 * 16);
        assert_eq!(L.map_len(9, 257), 16);
        assert_eq!(L.map_len(9, 258), 32);
        assert_eq!(L.map_len(9, 256), 0);
        assert_eq!(L.map_len(8, 200), 16 * 72);
        // One node, of 136 hashes, after the first span.
        assert_eq!(L.node_offset(0), 92 + SPAN_BLOCKS * 4124 + SPAN_BLOCKS * 16);
        assert_eq!(L.node_len(0), 136 * 32);
        assert_eq!(L.block_offset(SPAN_BLOCKS), L.node_offset(0) + 136 * 32 + 4096);
        // Sizes: the FORMAT.md §5.10 worked examples.
        assert_eq!(L.cipher_size(0), 0);
        assert_eq!(L.cipher_size(1), 92 + 16 + 1 + 28);
        assert_eq!(L.cipher_size(4096), 92 + 16 + 4124);
        assert_eq!(L.cipher_size(4097), 92 + 16 + 4124 + 16 + 29);
        assert_eq!(L.cipher_size(20000), 92 + 16 * 8 + 4 * 4124 + 3616 + 28);
        assert_eq!(L.cipher_size(1 << 20), 92 + 256 * 16 + 256 * 4124);
    }

    #[test]
    fn impossible_sizes_are_refused() {
        assert_eq!(L.plain_size(0), Ok((0, 0)));
        assert_eq!(L.plain_size(92), Ok((0, 0)), "a header alone is an empty file");
        assert_eq!(L.plain_size(91), Err(SizeError::InHeader(91)));
        for c in [93, 108, 108 + 28, 108 + 4124 + 1, 108 + 4124 + 16, 108 + 4124 + 16 + 28] {
            assert_eq!(L.plain_size(c), Err(SizeError::NoBlockEnd(c)), "{c}");
        }
        assert_eq!(L.plain_size(108 + 29), Ok((1, 1)));
        let node = L.node_offset(0);
        for c in [node + 1, node + 136 * 32, node + 136 * 32 + 4096, node + 136 * 32 + 4096 + 28] {
            assert_eq!(L.plain_size(c), Err(SizeError::NoBlockEnd(c)), "inside node 0 or map block 136: {c}");
        }
        assert_eq!(L.plain_size(node), Ok((SPAN_BLOCKS * 4096, SPAN_BLOCKS)), "a full span, no node yet");
        assert_eq!(L.plain_size(node - 1), Ok((SPAN_BLOCKS * 4096 - 1, SPAN_BLOCKS)));
        assert!(L.check_block_count(L.max_blocks()).is_ok());
        assert_eq!(L.check_block_count(L.max_blocks() + 1), Err(SizeError::TooManyBlocks(L.max_blocks() + 1)));
        assert_eq!(L.plain_size(u64::MAX), Err(SizeError::TooManyBlocks(L.max_blocks() + 1)));
    }

    #[test]
    fn sizes_round_trip_at_group_and_span_edges() {
        for l in [L, MapLayout::new(4096, 40), MapLayout::new(512, 28), MapLayout::new(1 << 20, 40)] {
            for k in edge_counts() {
                for p in [k * l.block_size, (k * l.block_size).saturating_sub(1), k * l.block_size + 1] {
                    let c = l.cipher_size(p);
                    assert_eq!(l.plain_size(c), Ok((p, l.block_count(p))), "{l:?} p={p}");
                    if p > 0 {
                        assert_eq!(
                            c,
                            l.block_offset(l.block_count(p) - 1) + p - (l.block_count(p) - 1) * l.block_size
                                + l.overhead
                        );
                        assert!(l.plain_size(c - 1).map_or(true, |(q, _)| q == p - 1), "{l:?} p={p}");
                    }
                }
                check_tiling(&l, k).unwrap();
            }
        }
    }

    #[test]
    fn plain_capacity_is_the_largest_size_that_fits() {
        let l = MapLayout::new(4096, 28);
        for c in [0u64, 1, 92, 92 + 16 + 28, 92 + 16 + 29, 1 << 20, 5 << 30, u64::MAX] {
            let p = l.plain_capacity(c);
            assert!(p == 0 || l.cipher_size(p) <= c, "{c}: {p}");
            assert!(p >= l.max_blocks() * 4096 || l.cipher_size(p + 1) > c, "{c}: {p} is not the largest");
        }
        // About B / (B + O + 16) of the bytes, the map's 16 bytes per block included.
        let g = l.plain_capacity(1 << 30) as f64 / (1u64 << 30) as f64;
        assert!((g - 4096.0 / (4096.0 + 28.0 + 16.0)).abs() < 1e-3, "{g}");
    }

    #[test]
    fn largest_file_stays_inside_off_t() {
        for l in [MapLayout::new(512, 28), MapLayout::new(1 << 20, 40)] {
            let k = l.max_blocks();
            assert!(l.block_offset(k) + l.cipher_block() < i64::MAX as u64, "{l:?}");
            let p = k * l.block_size;
            assert_eq!(l.plain_size(l.cipher_size(p)), Ok((p, k)));
        }
    }

    #[test]
    fn storage_overhead_stays_small() {
        // Map data (leaves, reservation and nodes) per block, past a file's first block.
        for p in [8192u64, 14_000, 100_000, 1 << 20, 1 << 30] {
            let extra = L.cipher_size(p) - 92 - L.block_count(p) * 4124 + (L.block_count(p) * 4096 - p);
            let per_block = extra as f64 / L.block_count(p) as f64;
            assert!(per_block <= 32.0, "{p}: {per_block} bytes of map per block");
        }
    }

    proptest! {
        #[test]
        fn group_math_is_consistent(n in 0u64..(1 << 40)) {
            let g = group_of(n);
            prop_assert!(group_start(g) <= n && n < group_start(g + 1));
            prop_assert_eq!(group_of(group_start(g)), g);
            prop_assert!(group_capacity(g) <= GROUP_BLOCKS);
            prop_assert_eq!(group_count(n + 1), g + 1);
        }

        #[test]
        fn regions_tile_the_file(l in layouts(), n in 0u64..(1 << 30)) {
            check_tiling(&l, n)?;
            // Around a random group and span start too.
            let g = group_of(n);
            check_tiling(&l, group_start(g))?;
            check_tiling(&l, group_start(g + 1))?;
            check_tiling(&l, (n / SPAN_BLOCKS + 1) * SPAN_BLOCKS)?;
        }

        #[test]
        fn offsets_increase_and_blocks_never_overlap_map_data(l in layouts(), n in 0u64..(1 << 30), k in 1u64..(1 << 30)) {
            prop_assert!(l.block_offset(n + 1) >= l.block_offset(n) + l.cipher_block());
            // The block does not overlap its own map block, nor any map block or node of the
            // file of k blocks: those lie wholly before or after it.
            let (a, b) = (l.block_offset(n), l.block_offset(n) + l.cipher_block());
            let g = group_of(k - 1);
            for g in [group_of(n), group_of(n) + 1, g] {
                let (ma, mb) = (l.map_offset(g), l.map_offset(g) + LEAF_LEN * group_capacity(g));
                prop_assert!(mb <= a || b <= ma, "block {} vs map {}", n, g);
            }
            let j = n / SPAN_BLOCKS;
            for j in [j.saturating_sub(1), j] {
                let (na, nb) = (l.node_offset(j), l.node_offset(j) + l.node_len(j));
                prop_assert!(nb <= a || b <= na, "block {} vs node {}", n, j);
            }
        }

        #[test]
        fn sizes_round_trip(l in layouts(), p in 0u64..(1 << 42)) {
            prop_assert_eq!(l.plain_size(l.cipher_size(p)), Ok((p, l.block_count(p))));
            prop_assert!(l.cipher_size(p + 1) > l.cipher_size(p));
        }

        #[test]
        fn every_size_is_a_file_or_refused(c in 0u64..(1 << 26)) {
            match L.plain_size(c) {
                Ok((p, k)) => {
                    prop_assert_eq!(L.cipher_size(p), c);
                    prop_assert_eq!(k, L.block_count(p));
                }
                // Refused sizes lie in the header, in map data, or within O bytes of a block's start.
                Err(SizeError::InHeader(_)) => prop_assert!(c < H2),
                Err(SizeError::NoBlockEnd(_)) => {
                    let n = (0..).find(|&n| L.block_offset(n + 1) >= c).unwrap();
                    let r = c as i128 - L.block_offset(n) as i128;
                    prop_assert!(r <= 28 || r > 4124, "c={} n={} r={}", c, n, r);
                }
                Err(e) => prop_assert!(false, "{}", e),
            }
        }

        #[test]
        fn root_commits_to_every_leaf(k in 1usize..700, flip in any::<prop::sample::Index>(), byte in 0usize..16) {
            let id = [7u8; 16];
            let leaves: Vec<Leaf> = (0..k).map(|i| hash(&(i as u64).to_be_bytes())[..16].try_into().unwrap()).collect();
            let root = root_of_leaves(&id, &leaves);
            let mut changed = leaves.clone();
            changed[flip.index(k)][byte] ^= 1;
            prop_assert_ne!(root_of_leaves(&id, &changed), root);
            prop_assert_ne!(root_of_leaves(&id, &leaves[..k - 1]), root, "a shorter file");
            prop_assert_ne!(root_of_leaves(&[8u8; 16], &leaves), root, "another file");
        }
    }

    #[test]
    fn root_folds_complete_spans_into_nodes() {
        let id = [1u8; 16];
        assert_eq!(root_list_len(0), 0);
        assert_eq!(root_list_len(1), 1);
        assert_eq!(root_list_len(257), 10);
        assert_eq!(root_list_len(SPAN_BLOCKS), 136, "a full span, nothing after it: no node yet");
        assert_eq!(root_list_len(SPAN_BLOCKS + 1), 2, "node 0, then map block 136");
        assert_eq!(root_list_len(2 * SPAN_BLOCKS + 257), 2 + 2);
        let k = SPAN_BLOCKS + 300;
        let hashes: Vec<Hash> = (0..group_count(k)).map(|g| hash(&g.to_be_bytes())).collect();
        let node0 = hash(&node_bytes(&hashes[..136]));
        let list = [node0, hashes[136], hashes[137]];
        assert_eq!(map_root(&id, k, &hashes), root_from_list(&id, k, &list));
        assert_eq!(
            map_root(&id, k, &hashes[1..]),
            Err(CountMismatch { blocks: k, got: group_count(k) - 1, want: group_count(k) })
        );
        assert!(root_from_list(&id, k, &list[..2]).is_err());
        // The empty list of an empty file.
        let mut h = Sha256::new();
        h.update(b"veilfs v2 map");
        h.update(id);
        h.update(0u64.to_be_bytes());
        assert_eq!(root_from_list(&id, 0, &[]).unwrap(), <Hash>::from(h.finalize()));
    }

    #[test]
    fn leaf_is_the_tag_and_a_hole_is_zero() {
        let block: Vec<u8> = (0..60u8).collect();
        assert_eq!(leaf_of(&block).unwrap(), <Leaf>::try_from(&block[44..]).unwrap());
        assert_eq!(leaf_of(&[0; 15]), None);
        assert_eq!(HOLE_LEAF, [0; 16]);
    }

    fn keys() -> SubKeys {
        MasterKey::from_bytes([9; 32]).subkeys()
    }

    fn header() -> HeaderV2 {
        HeaderV2 {
            flags: FLAG_UNSETTLED,
            id: [0xa5; 16],
            generation: 0x0102_0304_0506_0708,
            writer: *b"clientid",
            blocks: 300,
            root: [0x3c; 32],
        }
    }

    #[test]
    fn header_round_trips_and_every_byte_is_authenticated() {
        let k = keys();
        let bytes = header().encode(&k);
        assert_eq!(&bytes[..4], &[0, 2, 0, 2]);
        assert_eq!(HeaderV2::decode(&bytes, &k), Ok(header()));
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(b"block data");
        assert_eq!(HeaderV2::decode(&longer, &k), Ok(header()), "decode reads the first 92 bytes");
        for i in 0..HEADER_V2_LEN {
            let mut b = bytes;
            b[i] ^= 0x80;
            assert_eq!(HeaderV2::decode(&b, &k), Err(HeaderV2Error::BadTag), "byte {i}");
        }
        assert_eq!(HeaderV2::decode(&bytes[..91], &k), Err(HeaderV2Error::Truncated(91)));
        assert_eq!(HeaderV2::decode(&bytes, &MasterKey::from_bytes([8; 32]).subkeys()), Err(HeaderV2Error::BadTag));
    }

    #[test]
    fn header_version_and_flags_are_checked_after_the_tag() {
        let k = keys();
        // Authentic bytes with version 1 or 3, or an unknown flag: MAC'd with the right key.
        let remac = |edit: &dyn Fn(&mut [u8; HEADER_V2_LEN])| {
            let mut b = header().encode(&k);
            edit(&mut b);
            let tag = hmac16(k.header.expose(), &[HEADER_V2_LABEL, &b[..MACED]]);
            b[MACED..].copy_from_slice(&tag);
            HeaderV2::decode(&b, &k)
        };
        assert_eq!(remac(&|b| b[1] = 1), Err(HeaderV2Error::Version(1)));
        assert_eq!(remac(&|b| b[1] = 3), Err(HeaderV2Error::Version(3)));
        assert_eq!(remac(&|b| b[3] = 4), Err(HeaderV2Error::UnknownFlags(4)));
        assert_eq!(remac(&|b| b[2] = 0x80), Err(HeaderV2Error::UnknownFlags(0x8002)));
        assert_eq!(remac(&|b| b[3] = 3).map(|h| (h.is_sparse(), h.is_unsettled())), Ok((true, true)));
        let e = HeaderV2Error::BadTag.into_error("f.c");
        assert!(matches!(e, Error::Auth { .. }) && e.to_string().contains("f.c"), "{e}");
    }

    #[test]
    fn a_v1_header_is_not_a_v2_header() {
        let k = keys();
        let mut v1 = crate::content::FileHeader::new([0xa5; 16]).encode(&k).to_vec();
        v1.resize(HEADER_V2_LEN, 0);
        assert_eq!(HeaderV2::decode(&v1, &k), Err(HeaderV2Error::BadTag));
    }

    /// Cost of the root per MiB of file (256 leaves at B = 4096): one SHA-256 of 4 KiB, and
    /// of the root's list. `cargo test --profile quick --workspace --lib root_cost -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement, not a check"]
    fn root_cost() {
        let k = 1u64 << 18; // 1 GiB at B = 4096
        let leaves: Vec<Leaf> = (0..k).map(|i| hash(&i.to_be_bytes())[..16].try_into().unwrap()).collect();
        let t = std::time::Instant::now();
        let rounds = 20;
        for _ in 0..rounds {
            std::hint::black_box(root_of_leaves(&[1; 16], std::hint::black_box(&leaves)));
        }
        let per_mib = t.elapsed() / (rounds * 1024);
        println!("root of a 1 GiB file's leaves: {per_mib:?} per MiB");
    }
}
