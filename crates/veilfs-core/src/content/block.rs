//! Sealing and opening single blocks of one file.
//!
//! On disk a block is `nonce ‖ ciphertext ‖ tag`. The AAD is
//! `file ID (16) ‖ block number (u64 big-endian) ‖ last-block flag (1 byte: 0 or 1)`:
//! a block only opens at its own position in its own file, and only the true last block
//! carries flag 1, so cutting a file at a block boundary fails authentication.

use super::aead::{BlockKey, ContentCipher, TAG_LEN};
use super::header::FileId;
use crate::error::{Error, Result};
use crate::keys::SubKeys;

/// Length of the block AAD.
pub const AAD_LEN: usize = 25;

/// Builds the AAD of block `n`.
pub fn block_aad(file_id: &FileId, n: u64, last: bool) -> [u8; AAD_LEN] {
    let mut aad = [0u8; AAD_LEN];
    aad[..16].copy_from_slice(file_id);
    aad[16..24].copy_from_slice(&n.to_be_bytes());
    aad[24] = last as u8;
    aad
}

/// Encrypts and decrypts the blocks of one file (its key schedule is computed once).
#[derive(Debug)]
pub struct BlockCodec {
    cipher: ContentCipher,
    key: BlockKey,
    file_id: FileId,
}

impl BlockCodec {
    /// A codec for the file with ID `file_id`.
    pub fn new(cipher: ContentCipher, keys: &SubKeys, file_id: FileId) -> Self {
        let fk = keys.file_key(&file_id);
        BlockCodec { cipher, key: cipher.key(fk.expose()), file_id }
    }

    /// The file ID.
    pub fn file_id(&self) -> &FileId {
        &self.file_id
    }

    /// Bytes added per block.
    pub fn overhead(&self) -> usize {
        self.cipher.overhead()
    }

    /// Nonce length of the cipher.
    pub fn nonce_len(&self) -> usize {
        self.cipher.nonce_len()
    }

    /// Encrypts `plain` as block `n` into `out`, which must be `plain.len() + overhead` long,
    /// with a fresh random nonce.
    pub fn seal_into(&self, n: u64, last: bool, plain: &[u8], out: &mut [u8]) {
        crate::random::fill(&mut out[..self.cipher.nonce_len()]);
        self.seal_into_prefilled(n, last, plain, out);
    }

    /// Like [`seal_into`](Self::seal_into), but the caller has already put a fresh random
    /// nonce in the first `nonce_len` bytes of `out` (so a request of many blocks draws its
    /// nonces with one call to the random generator).
    pub fn seal_into_prefilled(&self, n: u64, last: bool, plain: &[u8], out: &mut [u8]) {
        let nl = self.cipher.nonce_len();
        assert_eq!(out.len(), plain.len() + nl + TAG_LEN, "output buffer size");
        let (nonce, rest) = out.split_at_mut(nl);
        let (body, tag) = rest.split_at_mut(plain.len());
        body.copy_from_slice(plain);
        let t = self.key.seal(nonce, &block_aad(&self.file_id, n, last), body);
        tag.copy_from_slice(&t);
    }

    /// Encrypts with a caller-chosen nonce. Only for known-answer test vectors.
    #[doc(hidden)]
    pub fn seal_with_nonce(&self, n: u64, last: bool, nonce: &[u8], plain: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plain.len() + self.overhead());
        out.extend_from_slice(nonce);
        let mut body = plain.to_vec();
        let t = self.key.seal(nonce, &block_aad(&self.file_id, n, last), &mut body);
        out.extend_from_slice(&body);
        out.extend_from_slice(&t);
        out
    }

    /// Decrypts on-disk block `n` from `ct` into `out` (at least `ct.len() - overhead` long);
    /// returns the plaintext length. `what` names the file in errors.
    pub fn open_into(&self, n: u64, last: bool, ct: &[u8], out: &mut [u8], what: &str) -> Result<usize> {
        let nl = self.cipher.nonce_len();
        if ct.len() <= nl + TAG_LEN {
            return Err(Error::auth(what, format!("block {n} is truncated ({} bytes)", ct.len())));
        }
        let plen = ct.len() - nl - TAG_LEN;
        let (nonce, rest) = ct.split_at(nl);
        let (body, tag) = rest.split_at(plen);
        let dst = &mut out[..plen];
        dst.copy_from_slice(body);
        self.key
            .open(nonce, &block_aad(&self.file_id, n, last), dst, tag)
            .map_err(|_| Error::auth(what, format!("block {n} failed authentication")))?;
        Ok(plen)
    }
}
