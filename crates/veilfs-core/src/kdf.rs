//! Password key derivation (Argon2id) and key wrapping for key slots.
//!
//! A key slot stores the master key encrypted ("wrapped") with AES-256-GCM under a key
//! encryption key (KEK). For a password slot the KEK is Argon2id(password, salt, params);
//! for the recovery slot it is HKDF-SHA256 of the 256-bit recovery key (already full
//! entropy, so no slow KDF is needed). The slot's own parameters are the AAD of the wrap,
//! so editing them makes the slot fail rather than silently weakening it.

use crate::error::{Error, Result};
use crate::keys::{hkdf_expand, MasterKey, SecretBytes, MASTER_KEY_LEN};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use serde::{Deserialize, Serialize};

/// Argon2id cost parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Argon2Params {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over memory.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Argon2Params {
    /// The default: 128 MiB, 3 passes, 4 lanes (~0.5–1 s on the reference 2-core machine;
    /// see the closing note of the core issue and docs/SECURITY.md).
    pub const DEFAULT: Argon2Params = Argon2Params { memory_kib: 128 * 1024, iterations: 3, parallelism: 4 };

    /// Checks the parameters are within the ranges this implementation accepts (Argon2's own
    /// minimum of 8 KiB per lane up to 4 GiB; weak settings are allowed for tests and refused
    /// by nothing but good sense, so the CLI warns about them).
    pub fn validate(&self) -> Result<()> {
        if self.parallelism == 0 || self.parallelism > 64 {
            return Err(Error::Invalid(format!("Argon2 parallelism {} is outside 1..=64", self.parallelism)));
        }
        if self.iterations == 0 || self.iterations > 100 {
            return Err(Error::Invalid(format!("Argon2 iterations {} is outside 1..=100", self.iterations)));
        }
        if self.memory_kib < 8 * self.parallelism || self.memory_kib > 4 * 1024 * 1024 {
            return Err(Error::Invalid(format!("Argon2 memory {} KiB is outside 8·p KiB..=4 GiB", self.memory_kib)));
        }
        Ok(())
    }

    /// Whether unlocking may spend this much: a slot above `ceiling` is refused before any
    /// derivation (a forged slot must not make unlocking take minutes or gigabytes).
    pub fn within(&self, ceiling: &KdfCeiling) -> bool {
        self.memory_kib <= ceiling.memory_kib && self.cost_kib() <= ceiling.memory_passes_kib && self.parallelism <= 64
    }

    /// What one derivation costs, in KiB × passes (what [`KdfCeiling`] limits).
    pub fn cost_kib(&self) -> u64 {
        u64::from(self.memory_kib) * u64::from(self.iterations)
    }

    /// Derives a 32-byte KEK from `password` and `salt`.
    pub fn derive(&self, password: &[u8], salt: &[u8]) -> Result<SecretBytes<32>> {
        self.validate()?;
        let params = argon2::Params::new(self.memory_kib, self.iterations, self.parallelism, Some(32))
            .map_err(|e| Error::Invalid(format!("Argon2 parameters: {e}")))?;
        let a2 = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = SecretBytes([0u8; 32]);
        a2.hash_password_into(password, salt, &mut out.0).map_err(|e| Error::Invalid(format!("Argon2: {e}")))?;
        Ok(out)
    }
}

/// The most an Argon2id slot may cost before unlocking refuses it (docs/SECURITY.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfCeiling {
    /// Largest memory in KiB.
    pub memory_kib: u32,
    /// Largest memory × passes, in KiB.
    pub memory_passes_kib: u64,
}

impl KdfCeiling {
    /// The default ceiling: 1 GiB of memory and 4 GiB·passes (8× the default slot's memory,
    /// ~10× its time; a few seconds on the reference 2-core machine).
    pub const DEFAULT: KdfCeiling = KdfCeiling { memory_kib: 1024 * 1024, memory_passes_kib: 4 * 1024 * 1024 };
    /// What `--allow-slow-kdf` allows: anything Argon2 parameters can say (4 GiB, 100 passes).
    pub const UNLIMITED: KdfCeiling = KdfCeiling { memory_kib: 4 * 1024 * 1024, memory_passes_kib: 400 * 1024 * 1024 };

    /// The most one unlock derives over all the slots it tries, in KiB × passes: twice the
    /// costliest slot allowed. A wrong password against a forged config costs at most that;
    /// the right one, at most [`crate::config::MAX_SLOTS`] slots no costlier than its own
    /// (the unlock order), and never more than that either.
    pub fn unlock_budget_kib(&self) -> u64 {
        2 * self.memory_passes_kib
    }
}

/// The KEK of a recovery slot.
pub fn recovery_kek(recovery_key: &[u8; 32], salt: &[u8]) -> SecretBytes<32> {
    hkdf_expand(salt, recovery_key, b"veilfs v1 recovery slot")
}

/// Length of a wrapped master key: nonce (12) + key (32) + tag (16).
pub const WRAPPED_LEN: usize = 12 + MASTER_KEY_LEN + 16;

/// Wraps `master` under `kek` with `aad`.
pub fn wrap(kek: &SecretBytes<32>, master: &MasterKey, aad: &[u8]) -> [u8; WRAPPED_LEN] {
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, kek.expose()).expect("32-byte key"));
    let nonce: [u8; 12] = crate::random::bytes();
    let mut out = [0u8; WRAPPED_LEN];
    out[..12].copy_from_slice(&nonce);
    out[12..44].copy_from_slice(master.as_bytes());
    let tag = key
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut out[12..44])
        .expect("seal 32 bytes");
    out[44..].copy_from_slice(tag.as_ref());
    out
}

/// Unwraps a master key; `None` if `kek` or `aad` is wrong or the blob was modified.
pub fn unwrap(kek: &SecretBytes<32>, wrapped: &[u8], aad: &[u8]) -> Option<MasterKey> {
    if wrapped.len() != WRAPPED_LEN {
        return None;
    }
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, kek.expose()).expect("32-byte key"));
    let nonce = Nonce::try_assume_unique_for_key(&wrapped[..12]).ok()?;
    let mut buf = SecretBytes([0u8; MASTER_KEY_LEN]);
    buf.0.copy_from_slice(&wrapped[12..44]);
    key.open_in_place_separate_tag(nonce, Aad::from(aad), &wrapped[44..], &mut buf.0).ok()?;
    Some(MasterKey::from_bytes(buf.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_round_trip_and_tamper() {
        let kek = SecretBytes([4u8; 32]);
        let mk = MasterKey::from_bytes([9; 32]);
        let w = wrap(&kek, &mk, b"aad");
        assert_eq!(unwrap(&kek, &w, b"aad").unwrap().as_bytes(), &[9; 32]);
        assert!(unwrap(&kek, &w, b"aae").is_none());
        assert!(unwrap(&SecretBytes([5u8; 32]), &w, b"aad").is_none());
        for i in 0..WRAPPED_LEN {
            let mut t = w;
            t[i] ^= 1;
            assert!(unwrap(&kek, &t, b"aad").is_none(), "bit flip at {i} accepted");
        }
    }

    #[test]
    fn argon2_is_deterministic_and_salted() {
        let p = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };
        let a = p.derive(b"pw", b"saltsaltsaltsalt").unwrap();
        let b = p.derive(b"pw", b"saltsaltsaltsalt").unwrap();
        let c = p.derive(b"pw", b"saltsaltsaltsal2").unwrap();
        assert_eq!(a.expose(), b.expose());
        assert_ne!(a.expose(), c.expose());
    }
}
