//! `BlockCodec::open_into` for both ciphers with arbitrary ciphertext, block number, last
//! flag and file ID (input layout: `veilfs_fuzz::BlockInput`). Invariants: no panic; failures
//! are integrity errors and leave no plaintext in the output buffer; nothing is written past
//! the plaintext length; a block that opens re-seals (same nonce) to the same bytes and does
//! not open at another position or with the other last flag.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::content::BlockCodec;
use veilfs_core::Error;
use veilfs_fuzz::{subkeys, BlockInput};

const GUARD: usize = 8;

fuzz_target!(|data: &[u8]| {
    let Some(inp) = BlockInput::parse(data) else { return };
    let codec = BlockCodec::new(inp.cipher, subkeys(), inp.file_id);
    let plen = inp.ct.len().saturating_sub(codec.overhead());
    let mut out = vec![0xa5u8; plen + GUARD];
    match codec.open_into(inp.n, inp.last, inp.ct, &mut out, "fuzz") {
        Ok(n) => {
            assert_eq!(n, plen);
            assert!(out[n..].iter().all(|&b| b == 0xa5), "wrote past the plaintext");
            let nonce = &inp.ct[..codec.nonce_len()];
            let again = codec.seal_with_nonce(inp.n, inp.last, nonce, &out[..n]);
            assert_eq!(again, inp.ct, "block does not re-seal to itself");
            let mut scratch = vec![0u8; plen];
            assert!(codec.open_into(inp.n, !inp.last, inp.ct, &mut scratch, "fuzz").is_err(), "last flag ignored");
            assert!(codec.open_into(inp.n ^ 1, inp.last, inp.ct, &mut scratch, "fuzz").is_err(), "position ignored");
        }
        Err(e) => {
            assert!(matches!(e, Error::Auth { .. }), "open error of the wrong kind: {e:?}");
            // Too short: untouched; otherwise the plaintext area is wiped.
            let wiped = if inp.ct.len() <= codec.overhead() { 0xa5 } else { 0 };
            assert!(out[..plen].iter().all(|&b| b == wiped), "a failed open left data in the buffer");
            assert!(out[plen..].iter().all(|&b| b == 0xa5), "wrote past the plaintext");
        }
    }
});
