//! The recovery key: 256 random bits a person can write down.
//!
//! Shown once at `veilfs init` as 14 groups of 4 characters of Crockford base32
//! (`0-9 A-Z` without `I L O U`): 52 characters carry the 256 bits, the last 4 are a
//! checksum (the first 20 bits of SHA-256("veilfs recovery key" ‖ key)) so a typo is reported
//! as a typo instead of "wrong key". Input is case-insensitive, ignores spaces and dashes and
//! reads `O` as 0 and `I`/`L` as 1.

use crate::error::{Error, Result};
use crate::keys::SecretBytes;
use sha2::{Digest, Sha256};

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const DATA_CHARS: usize = 52;
const CHECK_CHARS: usize = 4;

/// A recovery key (zeroized on drop).
#[derive(Clone, Debug)]
pub struct RecoveryKey(pub(crate) SecretBytes<32>);

impl RecoveryKey {
    /// A fresh random recovery key.
    pub fn generate() -> Self {
        RecoveryKey(SecretBytes(crate::random::bytes()))
    }

    /// A recovery key from its 32 bytes (known-answer tests).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        RecoveryKey(SecretBytes(bytes))
    }

    /// The key bytes.
    pub fn bytes(&self) -> &[u8; 32] {
        self.0.expose()
    }

    fn checksum(key: &[u8; 32]) -> u32 {
        let h = Sha256::new().chain_update(b"veilfs recovery key").chain_update(key).finalize();
        (u32::from(h[0]) << 12) | (u32::from(h[1]) << 4) | (u32::from(h[2]) >> 4)
    }

    /// The human form, e.g. `7K3M-...` (14 groups of 4).
    pub fn display(&self) -> String {
        let key = self.0.expose();
        let mut chars = Vec::with_capacity(DATA_CHARS + CHECK_CHARS);
        let (mut acc, mut bits) = (0u32, 0u32);
        for &b in key {
            acc = (acc << 8) | u32::from(b);
            bits += 8;
            while bits >= 5 {
                bits -= 5;
                chars.push(ALPHABET[((acc >> bits) & 31) as usize]);
            }
        }
        if bits > 0 {
            chars.push(ALPHABET[((acc << (5 - bits)) & 31) as usize]);
        }
        let c = Self::checksum(key);
        for i in (0..CHECK_CHARS).rev() {
            chars.push(ALPHABET[((c >> (5 * i)) & 31) as usize]);
        }
        chars.chunks(4).map(|g| std::str::from_utf8(g).expect("ASCII")).collect::<Vec<_>>().join("-")
    }

    /// Parses the human form.
    pub fn parse(text: &str) -> Result<Self> {
        let mut vals = Vec::with_capacity(DATA_CHARS + CHECK_CHARS);
        for ch in text.chars() {
            if ch == '-' || ch.is_whitespace() {
                continue;
            }
            let up = match ch.to_ascii_uppercase() {
                'O' => '0',
                'I' | 'L' => '1',
                c => c,
            };
            let v = ALPHABET
                .iter()
                .position(|&a| a as char == up)
                .ok_or_else(|| Error::Invalid(format!("recovery key contains '{ch}', which is not one of 0-9 A-Z")))?;
            vals.push(v as u32);
        }
        if vals.len() != DATA_CHARS + CHECK_CHARS {
            return Err(Error::Invalid(format!(
                "a recovery key has {} characters (without dashes); this one has {}",
                DATA_CHARS + CHECK_CHARS,
                vals.len()
            )));
        }
        let mut key = SecretBytes([0u8; 32]);
        let (mut acc, mut bits, mut i) = (0u32, 0u32, 0usize);
        for &v in &vals[..DATA_CHARS] {
            acc = (acc << 5) | v;
            bits += 5;
            if bits >= 8 {
                bits -= 8;
                if i < 32 {
                    key.0[i] = (acc >> bits) as u8;
                }
                i += 1;
            }
        }
        // 52 characters carry 260 bits: the last 4 are padding and must be zero, so every key
        // has exactly one spelling.
        if acc & ((1 << bits) - 1) != 0 {
            return Err(Error::Invalid("the recovery key has a typo (its last data character is impossible)".into()));
        }
        let check = vals[DATA_CHARS..].iter().fold(0u32, |a, &v| (a << 5) | v);
        if check != Self::checksum(&key.0) {
            return Err(Error::Invalid("the recovery key has a typo (its checksum does not match)".into()));
        }
        Ok(RecoveryKey(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_typos() {
        for _ in 0..50 {
            let k = RecoveryKey::generate();
            let s = k.display();
            assert_eq!(s.len(), 14 * 4 + 13);
            let back = RecoveryKey::parse(&s.to_lowercase().replace('-', " ")).unwrap();
            assert_eq!(back.bytes(), k.bytes());
            let mut typo: Vec<char> = s.chars().collect();
            typo[5] = if typo[5] == 'A' { 'B' } else { 'A' };
            assert!(RecoveryKey::parse(&typo.into_iter().collect::<String>()).is_err());
        }
    }
}
