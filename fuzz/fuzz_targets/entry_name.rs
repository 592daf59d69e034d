//! Directory entry names: `ParsedEntry::parse` of arbitrary bytes, then for user entries
//! `entry_d` (a long name's side-file content is the input after its first NUL; no NUL means
//! the side file is missing), `decrypt_name` and `unbind` for every kind under the fixed key
//! and directory IV. Invariants: no panic; a parsed entry is exactly `key.binding`; `D` is in
//! canonical form; a name that decrypts re-encrypts to the same `D` and on-disk key; a
//! binding that opens re-seals to the same text; failures are integrity errors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::names::{b64_decode, b64_encode, validate_name, ParsedEntry, LONG_PREFIX, RESERVED_PREFIX};
use veilfs_core::{EntryKind, Error, NameCipher};
use veilfs_fuzz::{names, split_nul, ENTRY_IV};

const KINDS: [EntryKind; 7] = [
    EntryKind::File,
    EntryKind::Dir,
    EntryKind::Symlink,
    EntryKind::Fifo,
    EntryKind::Socket,
    EntryKind::CharDevice,
    EntryKind::BlockDevice,
];

fuzz_target!(|data: &[u8]| {
    let (name, side) = split_nul(data);
    let parsed = ParsedEntry::parse(name);
    match &parsed {
        ParsedEntry::Short { key, s } => assert_eq!(format!("{key}.{s}").as_bytes(), name),
        ParsedEntry::Long { key, hash, s } => {
            assert_eq!(format!("{key}.{s}").as_bytes(), name);
            assert_eq!(*key, format!("{LONG_PREFIX}{hash}"));
        }
        ParsedEntry::Internal => {
            assert!(name.starts_with(RESERVED_PREFIX.as_bytes()) || name == b"." || name == b"..")
        }
        ParsedEntry::Foreign => {
            assert!(veilfs_core::foreign::sync_tool(name).is_none() && veilfs_core::conflict::parse(name).is_none());
            return;
        }
        // A conflict copy: the tool's part taken out leaves a name veilfs writes, which is
        // never itself a copy, and the copy is not an entry by itself.
        ParsedEntry::Conflict(c) => {
            assert!(!matches!(c.entry(), ParsedEntry::Conflict(_) | ParsedEntry::Foreign | ParsedEntry::SyncTool(_)));
            assert!(c.original.len() < name.len() && parsed.key().is_none() && parsed.binding().is_none());
            return;
        }
        // Only a name that parses as nothing veilfs writes is looked up as a sync tool's file.
        ParsedEntry::SyncTool(tool) => {
            assert_eq!(veilfs_core::foreign::sync_tool(name), Some(*tool));
            return;
        }
    }
    let Some(s) = parsed.binding() else { return };
    let nc = names();
    let mut asked = None;
    let got = nc.entry_d(&parsed, |side_name| {
        asked = Some(side_name.to_string());
        side.map(<[u8]>::to_vec).ok_or_else(|| Error::io(side_name, std::io::Error::from(std::io::ErrorKind::NotFound)))
    });
    if let ParsedEntry::Long { hash, .. } = &parsed {
        assert_eq!(asked.as_deref(), Some(format!("veilfs.N.{hash}").as_str()), "wrong side file read");
    } else {
        assert!(asked.is_none(), "a short name read a side file");
    }
    let d = match got {
        Ok(d) => d,
        Err(e) => {
            assert!(matches!(e, Error::Auth { .. } | Error::Io { .. }), "entry_d error of the wrong kind: {e:?}");
            return;
        }
    };
    let canonical = NameCipher::key_for_d(d.clone());
    assert_eq!(Some(canonical.key.as_str()), parsed.key(), "non-canonical D accepted");
    if let Some(content) = canonical.side_file_contents() {
        assert_eq!(b64_decode(&content).as_deref(), Some(d.as_slice()));
    }

    let plain = match nc.decrypt_name(&ENTRY_IV, &d) {
        Ok(p) => {
            validate_name(&p).expect("a decrypted name is valid");
            assert_eq!(nc.encrypt_name(&ENTRY_IV, &p).expect("re-encrypts"), d, "name does not re-encrypt to D");
            let key = nc.name_key(&ENTRY_IV, &p).expect("has a key");
            assert_eq!(Some(key.key.as_str()), parsed.key(), "name does not map back to its on-disk key");
            Some((p, key))
        }
        Err(e) => {
            assert!(matches!(e, Error::Auth { .. }), "decrypt_name error of the wrong kind: {e:?}");
            None
        }
    };
    for kind in KINDS {
        match nc.unbind(&ENTRY_IV, &d, kind, s) {
            Ok(id) => {
                let sealed = nc.bind(&ENTRY_IV, &d, kind, &id);
                assert_eq!(b64_encode(&sealed), s, "binding does not re-seal to itself");
                if let Some((_, key)) = &plain {
                    assert_eq!(key.entry_name(&sealed).as_bytes(), name, "entry does not rebuild");
                }
            }
            Err(e) => assert!(matches!(e, Error::Auth { .. }), "unbind error of the wrong kind: {e:?}"),
        }
    }
});
