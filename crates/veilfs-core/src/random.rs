//! Randomness for keys, IDs and nonces.
//!
//! Uses AWS-LC's DRBG (seeded from the OS), which is fast enough to draw a fresh nonce
//! for every 4 KiB block without a system call per block.

/// Fills `buf` with cryptographically secure random bytes.
///
/// Panics only if the system RNG is unavailable, in which case no safe operation is possible.
pub fn fill(buf: &mut [u8]) {
    aws_lc_rs::rand::fill(buf).expect("system random number generator failed");
}

/// Returns `N` random bytes.
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    fill(&mut b);
    b
}
