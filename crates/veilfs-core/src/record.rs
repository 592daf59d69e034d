//! The vault's own records that a crash sweep or a repair acts on, and their authentication.
//!
//! Why: a record that tells the sweep to rename objects is an instruction to whoever runs the
//! sweep — root, for a `--allow-other` mount. Anyone who can write a backing directory (the
//! owner of a directory of a root mount, a sync peer) can plant a file under a reserved name;
//! an unauthenticated record would let her have root move a root-owned directory into hers.
//! So every record carries an HMAC-SHA256 under the vault's `record-mac` subkey
//! (docs/FORMAT.md §4) over its kind, its own name, the IV of the directory it lies in, the
//! IV of the other directory it names, and every field; a record whose MAC does not verify
//! (planted, edited, moved to another directory, renamed, or written by a version before
//! records carried a MAC) is damage, reported and never executed.
//!
//! Today one kind exists: an exchange's intent record (docs/FORMAT.md §10). The other files
//! the sweep and `fsck --repair` touch authenticate themselves or are harmless to act on
//! (docs/SECURITY.md, "The vault's own records").

use crate::keys::{hmac_parts, SubKeys};
use crate::names::{b64_decode, b64_encode, DirIv, NAME_MAX};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The domain of an exchange record's MAC (its kind).
const EXCHANGE_KIND: &[u8] = b"veilfs v1 exchange record";

/// The longest exchange record a reader accepts (four names of at most 255 bytes each is
/// far below; a longer file is not a record).
pub const MAX_RECORD_LEN: usize = 4096;

/// Length of a record MAC (HMAC-SHA256, untruncated).
pub const RECORD_MAC_LEN: usize = 32;

/// The intent record of an exchange (F§10): the first object's directory (relative to the
/// vault root, empty for the root), its on-disk name, its new name (in the record's
/// directory) and the new name (in the first directory) of the object moved aside; and the
/// MAC over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExchangeIntent {
    /// The first entry's directory, relative to the vault root (`a/b`, empty for the root).
    pub a_dir: String,
    /// The first entry's on-disk name in `a_dir`.
    pub a: String,
    /// Its new on-disk name, in the record's directory.
    pub a_new: String,
    /// The new on-disk name, in `a_dir`, of the object waiting under the temporary name.
    pub b_new: String,
    /// HMAC-SHA256 over the record (see [`ExchangeIntent::mac`]).
    pub mac: [u8; RECORD_MAC_LEN],
}

/// Why a record was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Not a record of this form (missing, extra or out-of-order lines, a name that is not
    /// a name, too long).
    Malformed(String),
    /// A record without a MAC: planted, or written by a version before records carried one.
    NoMac,
    /// The MAC does not verify for this directory, name and fields.
    BadMac,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Malformed(w) => write!(f, "not an exchange record ({w})"),
            RecordError::NoMac => {
                f.write_str("an exchange record without a MAC (planted, or left by an older version)")
            }
            RecordError::BadMac => f.write_str(
                "an exchange record whose MAC does not verify for this directory and name (planted, edited or moved)",
            ),
        }
    }
}

/// Whether `n` is one on-disk name: not empty, not `.` or `..`, no `/` or NUL, at most 255 bytes.
fn is_name(n: &str) -> bool {
    !n.is_empty() && n != "." && n != ".." && n.len() <= NAME_MAX && !n.contains(['/', '\0', '\n'])
}

/// Whether `p` is a directory path relative to the root: names separated by single `/`, or empty.
fn is_rel_dir(p: &str) -> bool {
    p.is_empty() || p.split('/').all(is_name)
}

impl ExchangeIntent {
    /// A record for these fields with its MAC for the record named `name` in the directory
    /// of IV `dir_iv`, naming the directory of IV `a_dir_iv`.
    pub fn sealed(mut self, keys: &SubKeys, name: &str, dir_iv: &DirIv, a_dir_iv: &DirIv) -> Self {
        self.mac = self.mac(keys, name, dir_iv, a_dir_iv);
        self
    }

    /// The MAC of this record: HMAC-SHA256(record-mac subkey, the length-prefixed parts
    /// kind ‖ record name ‖ IV of its directory ‖ IV of `a_dir` ‖ a_dir ‖ a ‖ a_new ‖ b_new)
    /// (docs/FORMAT.md §10).
    pub fn mac(&self, keys: &SubKeys, name: &str, dir_iv: &DirIv, a_dir_iv: &DirIv) -> [u8; RECORD_MAC_LEN] {
        hmac_parts(keys.record_mac.expose(), &self.mac_parts(name, dir_iv, a_dir_iv))
    }

    fn mac_parts<'a>(&'a self, name: &'a str, dir_iv: &'a DirIv, a_dir_iv: &'a DirIv) -> [&'a [u8]; 8] {
        [
            EXCHANGE_KIND,
            name.as_bytes(),
            dir_iv,
            a_dir_iv,
            self.a_dir.as_bytes(),
            self.a.as_bytes(),
            self.a_new.as_bytes(),
            self.b_new.as_bytes(),
        ]
    }

    /// Whether the MAC verifies for the record named `name` in the directory of IV `dir_iv`
    /// naming the directory of IV `a_dir_iv` (constant time).
    pub fn verify(&self, keys: &SubKeys, name: &str, dir_iv: &DirIv, a_dir_iv: &DirIv) -> Result<(), RecordError> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(keys.record_mac.expose()).expect("any key length");
        for p in self.mac_parts(name, dir_iv, a_dir_iv) {
            mac.update(&(p.len() as u32).to_be_bytes());
            mac.update(p);
        }
        mac.verify_slice(&self.mac).map_err(|_| RecordError::BadMac)
    }

    /// The record's bytes: the lines `a_dir=`, `a=`, `a_new=`, `b_new=`, `mac=<base64url>`.
    pub fn encode(&self) -> String {
        format!(
            "a_dir={}\na={}\na_new={}\nb_new={}\nmac={}\n",
            self.a_dir,
            self.a,
            self.a_new,
            self.b_new,
            b64_encode(&self.mac)
        )
    }

    /// Parses a record's bytes, strictly: exactly the five lines of [`encode`](Self::encode)
    /// in that order, names that are single names (never paths: a record cannot reach out of
    /// its two directories), `a_dir` a relative path without `.` or `..`. The MAC is not
    /// checked here ([`verify`](Self::verify)).
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        let bad = |w: &str| Err(RecordError::Malformed(w.to_string()));
        if bytes.len() > MAX_RECORD_LEN {
            return bad("too long");
        }
        let Ok(text) = std::str::from_utf8(bytes) else { return bad("not UTF-8") };
        let Some(body) = text.strip_suffix('\n') else { return bad("no final newline") };
        let lines: Vec<&str> = body.split('\n').collect();
        let keys = ["a_dir", "a", "a_new", "b_new", "mac"];
        if lines.len() == 4 && lines.iter().zip(keys).all(|(l, k)| l.starts_with(&format!("{k}="))) {
            return Err(RecordError::NoMac);
        }
        if lines.len() != keys.len() {
            return bad("wrong number of lines");
        }
        let mut v = Vec::with_capacity(keys.len());
        for (l, k) in lines.iter().zip(keys) {
            match l.split_once('=') {
                Some((lk, val)) if lk == k => v.push(val),
                _ => return bad(&format!("no {k}")),
            }
        }
        if !is_rel_dir(v[0]) {
            return bad("a_dir is not a relative directory path");
        }
        if !v[1..4].iter().all(|n| is_name(n)) {
            return bad("not a name");
        }
        let mac: [u8; RECORD_MAC_LEN] = match b64_decode(v[4]).map(<[u8; RECORD_MAC_LEN]>::try_from) {
            Some(Ok(m)) if b64_encode(&m) == v[4] => m,
            _ => return bad("mac is not 32 bytes of base64url"),
        };
        Ok(ExchangeIntent {
            a_dir: v[0].to_string(),
            a: v[1].to_string(),
            a_new: v[2].to_string(),
            b_new: v[3].to_string(),
            mac,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MasterKey;

    fn keys() -> SubKeys {
        MasterKey::from_bytes([3; 32]).subkeys()
    }

    const NAME: &str = "veilfs.xchg.AAAAAAAAAAAAAAAA";
    const DIR: DirIv = [1; 16];
    const A_DIR: DirIv = [2; 16];

    fn record(k: &SubKeys) -> ExchangeIntent {
        let r = ExchangeIntent {
            a_dir: "x/y".into(),
            a: "aaa".into(),
            a_new: "bbb".into(),
            b_new: "ccc".into(),
            mac: [0; RECORD_MAC_LEN],
        };
        r.sealed(k, NAME, &DIR, &A_DIR)
    }

    #[test]
    fn a_record_round_trips_and_verifies_where_it_was_written() {
        let k = keys();
        let r = record(&k);
        let back = ExchangeIntent::parse(r.encode().as_bytes()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.verify(&k, NAME, &DIR, &A_DIR), Ok(()));
    }

    #[test]
    fn a_record_in_another_directory_or_naming_another_fails() {
        let k = keys();
        let r = record(&k);
        assert_eq!(r.verify(&k, NAME, &[9; 16], &A_DIR), Err(RecordError::BadMac), "moved to another directory");
        assert_eq!(r.verify(&k, NAME, &DIR, &[9; 16]), Err(RecordError::BadMac), "a_dir swapped for another");
        assert_eq!(r.verify(&k, NAME, &A_DIR, &DIR), Err(RecordError::BadMac), "the two directories swapped");
    }

    /// The MAC as docs/FORMAT.md §10 spells it, computed independently (Python's hmac and
    /// hashlib from the document's formula; the fuzz seeds `exchange_record/seed-root`).
    #[test]
    fn the_mac_is_the_documented_hmac() {
        let k = MasterKey::from_bytes([7; 32]).subkeys();
        let r = ExchangeIntent {
            a_dir: String::new(),
            a: "aGVsbG8.c2Vhbg".into(),
            a_new: "d29ybGQ.YmluZGluZw".into(),
            b_new: "veilfs.L.bG9uZw".into(),
            mac: [0; RECORD_MAC_LEN],
        };
        let mac = r.mac(&k, "veilfs.xchg.AAAAAAAAAAAAAAAA", &[0x22; 16], &[0x33; 16]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "2bedb280f252e9f2f64a85c08279dee561b7f62bd88d1a531bc9086c06a68a6b");
    }

    #[test]
    fn a_renamed_record_fails() {
        let k = keys();
        let r = record(&k);
        assert_eq!(r.verify(&k, "veilfs.xchg.BBBBBBBBBBBBBBBB", &DIR, &A_DIR), Err(RecordError::BadMac));
    }

    #[test]
    fn an_edited_field_fails() {
        let k = keys();
        let r = record(&k);
        for edit in [
            ("a_dir=x/y", "a_dir="),
            ("a_dir=x/y", "a_dir=x/z"),
            ("\na=aaa", "\na=aab"),
            ("a_new=bbb", "a_new=bbc"),
            ("b_new=ccc", "b_new=ccd"),
        ] {
            let text = r.encode().replacen(edit.0, edit.1, 1);
            let e = ExchangeIntent::parse(text.as_bytes()).unwrap();
            assert_eq!(e.verify(&k, NAME, &DIR, &A_DIR), Err(RecordError::BadMac), "{edit:?}");
        }
    }

    #[test]
    fn a_record_under_another_vault_key_fails() {
        let r = record(&keys());
        let other = MasterKey::from_bytes([4; 32]).subkeys();
        assert_eq!(r.verify(&other, NAME, &DIR, &A_DIR), Err(RecordError::BadMac));
    }

    #[test]
    fn a_record_without_mac_is_reported_as_such() {
        // The form versions before the MAC wrote.
        let old = b"a_dir=\na=aaa\na_new=bbb\nb_new=ccc\n";
        assert_eq!(ExchangeIntent::parse(old), Err(RecordError::NoMac));
    }

    #[test]
    fn paths_and_odd_forms_are_not_records() {
        let k = keys();
        let good = record(&k).encode();
        let mac_line = good.lines().last().unwrap().to_string();
        for bad in [
            format!("a_dir=\na=../x\na_new=b\nb_new=c\n{mac_line}\n"),
            format!("a_dir=\na=a/x\na_new=b\nb_new=c\n{mac_line}\n"),
            format!("a_dir=../up\na=a\na_new=b\nb_new=c\n{mac_line}\n"),
            format!("a_dir=/abs\na=a\na_new=b\nb_new=c\n{mac_line}\n"),
            format!("a_dir=x//y\na=a\na_new=b\nb_new=c\n{mac_line}\n"),
            format!("a_dir=\na=\na_new=b\nb_new=c\n{mac_line}\n"),
            format!("a=a\na_dir=\na_new=b\nb_new=c\n{mac_line}\n"),
            format!("a_dir=\na=a\na_new=b\nb_new=c\n{mac_line}\nextra=1\n"),
            format!("a_dir=\na=a\na_new=b\nb_new=c\n{mac_line}"),
            "a_dir=\na=a\na_new=b\nb_new=c\nmac=short\n".to_string(),
        ] {
            assert!(matches!(ExchangeIntent::parse(bad.as_bytes()), Err(RecordError::Malformed(_))), "{bad:?}");
        }
        assert!(ExchangeIntent::parse(&vec![b'a'; MAX_RECORD_LEN + 1]).is_err());
    }
}
