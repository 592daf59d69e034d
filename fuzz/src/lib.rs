//! What the fuzz targets share: the fixed keys every target and the seed generator
//! (`examples/seed_corpus.rs`) use, and the input layouts. A decoder can only succeed on
//! input made under the same key, so the seeds are made under these keys; the fuzzer then
//! mutates real objects, and the round-trip assertions of each target run on every input
//! that still authenticates.

use std::sync::OnceLock;
use veilfs_core::content::ContentCipher;
use veilfs_core::keys::{MasterKey, SubKeys};
use veilfs_core::names::DirIv;
use veilfs_core::xattr::XattrCipher;
use veilfs_core::{NameCipher, RecoveryKey, Vault, VaultConfig};

/// The master key of every fuzzed object.
pub const MASTER: [u8; 32] = [7; 32];
/// The recovery key of the seed configs' recovery slots.
pub const RECOVERY: [u8; 32] = [9; 32];
/// The IV of the directory the `entry_name` seeds were made in.
pub const ENTRY_IV: DirIv = [0x11; 16];
/// Block size of the seed vaults.
pub const BLOCK_SIZE: u32 = 4096;

/// The master key.
pub fn master() -> MasterKey {
    MasterKey::from_bytes(MASTER)
}

/// The subkeys of [`MASTER`] (derived once per process).
pub fn subkeys() -> &'static SubKeys {
    static K: OnceLock<SubKeys> = OnceLock::new();
    K.get_or_init(|| master().subkeys())
}

/// The name cipher of [`MASTER`].
pub fn names() -> &'static NameCipher {
    static N: OnceLock<NameCipher> = OnceLock::new();
    N.get_or_init(|| NameCipher::new(subkeys(), veilfs_core::names::SpecialBinding::ByType))
}

/// The fixed recovery key.
pub fn recovery_key() -> RecoveryKey {
    RecoveryKey::from_bytes(RECOVERY)
}

/// The cipher an input's selector byte picks (bit 0: XChaCha20-Poly1305).
pub fn cipher_of(sel: u8) -> ContentCipher {
    if sel & 1 == 0 {
        ContentCipher::Aes256Gcm
    } else {
        ContentCipher::XChaCha20Poly1305
    }
}

/// The selector byte of `cipher`.
pub fn cipher_byte(cipher: ContentCipher) -> u8 {
    match cipher {
        // GCM-SIV (deterministic vaults) goes through the same aws-lc-rs calls as GCM and is
        // not a selector of its own.
        ContentCipher::Aes256Gcm | ContentCipher::Aes256GcmSiv => 0,
        ContentCipher::XChaCha20Poly1305 => 1,
    }
}

/// The xattr cipher of [`MASTER`] for `cipher`.
pub fn xattr(cipher: ContentCipher) -> &'static XattrCipher {
    static X: OnceLock<[XattrCipher; 2]> = OnceLock::new();
    let x = X.get_or_init(|| {
        [
            XattrCipher::new(subkeys(), ContentCipher::Aes256Gcm),
            XattrCipher::new(subkeys(), ContentCipher::XChaCha20Poly1305),
        ]
    });
    &x[cipher_byte(cipher) as usize]
}

/// An unlocked in-memory vault of [`MASTER`] for `cipher` (no directory behind it: only
/// for the functions that need no I/O, such as symlink targets).
pub fn vault(cipher: ContentCipher) -> &'static Vault {
    static V: OnceLock<[Vault; 2]> = OnceLock::new();
    let v = V.get_or_init(|| [make_vault(ContentCipher::Aes256Gcm), make_vault(ContentCipher::XChaCha20Poly1305)]);
    &v[cipher_byte(cipher) as usize]
}

fn make_vault(cipher: ContentCipher) -> Vault {
    let cfg = VaultConfig::new(cipher, BLOCK_SIZE, &ENTRY_IV).expect("valid block size");
    Vault::from_parts(std::path::Path::new("/nonexistent-fuzz-vault"), cfg, master())
}

/// Splits at the first NUL: `(before, Some(after))`, or `(all, None)` without one.
pub fn split_nul(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    }
}

/// The `block` target's input: `flags (bit 0 XChaCha, bit 1 last) ‖ block number (u64 BE) ‖
/// file ID (16) ‖ on-disk block`.
pub struct BlockInput<'a> {
    /// Content cipher.
    pub cipher: ContentCipher,
    /// Last-block flag.
    pub last: bool,
    /// Block number.
    pub n: u64,
    /// File ID.
    pub file_id: [u8; 16],
    /// nonce ‖ ciphertext ‖ tag.
    pub ct: &'a [u8],
}

/// Length of the `block` input's prefix.
pub const BLOCK_PREFIX: usize = 1 + 8 + 16;

impl<'a> BlockInput<'a> {
    /// Parses an input; `None` if shorter than the prefix.
    pub fn parse(data: &'a [u8]) -> Option<Self> {
        if data.len() < BLOCK_PREFIX {
            return None;
        }
        Some(BlockInput {
            cipher: cipher_of(data[0]),
            last: data[0] & 2 != 0,
            n: u64::from_be_bytes(data[1..9].try_into().expect("8 bytes")),
            file_id: data[9..25].try_into().expect("16 bytes"),
            ct: &data[25..],
        })
    }

    /// Serializes (for the seed corpus).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![cipher_byte(self.cipher) | if self.last { 2 } else { 0 }];
        v.extend_from_slice(&self.n.to_be_bytes());
        v.extend_from_slice(&self.file_id);
        v.extend_from_slice(self.ct);
        v
    }
}

/// The `xattr` and `symlink_target` inputs start with `cipher selector ‖ identity (16)`.
pub const ID_PREFIX: usize = 1 + 16;

/// Splits `cipher selector ‖ identity ‖ rest`; `None` if too short.
pub fn split_id(data: &[u8]) -> Option<(ContentCipher, [u8; 16], &[u8])> {
    if data.len() < ID_PREFIX {
        return None;
    }
    Some((cipher_of(data[0]), data[1..17].try_into().expect("16 bytes"), &data[17..]))
}

/// Builds `cipher selector ‖ identity ‖ rest` (for the seed corpus).
pub fn join_id(cipher: ContentCipher, id: &[u8; 16], rest: &[u8]) -> Vec<u8> {
    let mut v = vec![cipher_byte(cipher)];
    v.extend_from_slice(id);
    v.extend_from_slice(rest);
    v
}

/// The name of the `exchange_record` seeds' record (`veilfs.xchg.<r>`).
pub const RECORD_NAME: &str = "veilfs.xchg.AAAAAAAAAAAAAAAA";
/// The IV of the directory the `exchange_record` seeds lie in.
pub const RECORD_DIR_IV: DirIv = [0x22; 16];
/// The IV of the directory the `exchange_record` seeds name (`a_dir`).
pub const RECORD_A_DIR_IV: DirIv = [0x33; 16];

/// The password of the seed configs' password slots (Argon2 at 64 KiB, one pass).
pub const PASSWORD: &str = "fuzz";

/// The Argon2 ceiling of the `slots` target: the seed slots' cost and no more, so a slot
/// asking for more is skipped before anything is derived (as the reader does above its own
/// ceiling) and no input makes an execution slow.
pub const SLOTS_CEILING: veilfs_core::kdf::KdfCeiling =
    veilfs_core::kdf::KdfCeiling { memory_kib: 64, memory_passes_kib: 128 };
