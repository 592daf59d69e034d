//! `RecoveryKey::parse` of arbitrary text (invalid UTF-8 replaced): no panic; failures are
//! `Invalid` errors; a key that parses is the same key as its canonical display form, which
//! is the input normalized (dashes and spaces dropped, upper case, O→0, I/L→1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::{Error, RecoveryKey};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match RecoveryKey::parse(&text) {
        Ok(k) => {
            let shown = k.display();
            assert_eq!(RecoveryKey::parse(&shown).expect("display parses").bytes(), k.bytes());
            assert_eq!(RecoveryKey::parse(&shown.to_lowercase()).expect("lower case parses").bytes(), k.bytes());
            let normalized: String = text
                .chars()
                .filter(|c| *c != '-' && !c.is_whitespace())
                .map(|c| match c.to_ascii_uppercase() {
                    'O' => '0',
                    'I' | 'L' => '1',
                    c => c,
                })
                .collect();
            assert_eq!(normalized, shown.replace('-', ""), "two spellings of one key");
        }
        Err(e) => assert!(matches!(e, Error::Invalid(_)), "parse error of the wrong kind: {e:?}"),
    }
});
