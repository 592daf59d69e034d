//! Content encryption: the file header, fixed-size AEAD blocks and the offset math.
//!
//! A non-empty ciphertext file is a [`header`] followed by blocks. Every block holds up to
//! `block_size` plaintext bytes and is stored as `nonce ‖ ciphertext ‖ tag`; its AAD binds
//! the file ID, the block number and whether it is the file's last block, so blocks cannot be
//! reordered, moved between files, or cut off at a block boundary unnoticed.

pub mod aead;
pub mod block;
pub mod blockmap;
pub mod header;
pub mod layout;
pub mod tail;

pub use aead::{BlockKey, ContentCipher};
pub use block::BlockCodec;
pub use header::{FileHeader, FileId, HEADER_LEN};
pub use layout::Layout;
