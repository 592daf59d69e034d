//! Writes the committed seed corpus, `fuzz/corpus/<target>/seed-*`, from real objects: vaults
//! made by the same code as `veilfs init` (one with random keys, as a user gets; two under the
//! fixed keys of `veilfs_fuzz`, so the fuzzer starts from inputs that authenticate), real
//! entry names and long-name side files, file headers and blocks read back from disk,
//! symlink targets, xattr records and recovery keys.
//!
//! Usage (from `fuzz/`): `cargo run --example seed_corpus [CORPUS_DIR]`. Files and nonces are
//! random, so each run writes different (equally good) seeds.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use veilfs_core::config::Secret;
use veilfs_core::content::header::HEADER_LEN;
use veilfs_core::content::ContentCipher;
use veilfs_core::content::{BlockCodec, FileHeader};
use veilfs_core::kdf::Argon2Params;
use veilfs_core::names::{ParsedEntry, DIRIV_NAME};
use veilfs_core::record::ExchangeIntent;
use veilfs_core::stash::{block_record, hole_record, number, RECORD_HEAD};
use veilfs_core::vault::InitOptions;
use veilfs_core::{Entry, EntryKind, RecoveryKey, Vault, VaultConfig};
use veilfs_fuzz::{
    join_id, master, names, recovery_key, subkeys, vault, xattr, BlockInput, BLOCK_SIZE, ENTRY_IV, RECORD_A_DIR_IV,
    RECORD_DIR_IV, RECORD_NAME,
};

/// The cheapest Argon2 settings `veilfs init` accepts (the seeds are not about the KDF).
const TINY_KDF: Argon2Params = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };

struct Out {
    root: PathBuf,
}

impl Out {
    fn put(&self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.root.join(target);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }

    fn clear(&self) {
        let Ok(dirs) = fs::read_dir(&self.root) else { return };
        for d in dirs.flatten() {
            for f in fs::read_dir(d.path()).into_iter().flatten().flatten() {
                if f.file_name().as_bytes().starts_with(b"seed-") {
                    fs::remove_file(f.path()).unwrap();
                }
            }
        }
    }
}

/// A vault under the fixed master key (what `Vault::create` does, minus the random keys).
fn fixed_vault(dir: &Path, cipher: ContentCipher) -> Vault {
    fs::create_dir_all(dir).unwrap();
    let m = master();
    let mut cfg = VaultConfig::new(cipher, BLOCK_SIZE, &ENTRY_IV).unwrap();
    cfg.add_password_slot(&m, &"fuzz".to_string().into(), TINY_KDF).unwrap();
    cfg.add_recovery_slot(&m, &recovery_key()).unwrap();
    cfg.seal(&m);
    cfg.save(dir).unwrap();
    fs::write(dir.join(DIRIV_NAME), ENTRY_IV).unwrap();
    // Proves the config on disk is what the recovery key opens.
    Vault::open(dir, &Secret::Recovery(recovery_key()), None).unwrap()
}

fn write_file(v: &Vault, name: &[u8], data: &[u8], off: u64) -> Entry {
    let root = v.root().unwrap();
    let (entry, f) = v.create_file(&root, name, 0o644).unwrap();
    f.write_at(data, off, 0).unwrap();
    f.sync(false).unwrap();
    entry
}

fn backing(v: &Vault, e: &Entry) -> Vec<u8> {
    fs::read(v.root_path().join(&e.on_disk)).unwrap()
}

fn main() {
    let out = Out { root: std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| "corpus".into()) };
    out.clear();
    let tmp = std::env::temp_dir().join(format!("veilfs-seed-corpus-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);

    // config + recovery_key: a vault as `veilfs init` makes it (random keys).
    let opts = InitOptions { cipher: ContentCipher::Aes256Gcm, block_size: 4096, kdf: TINY_KDF, recovery_key: true };
    let (_, rk) = Vault::create(&tmp.join("init"), &"fuzz".to_string().into(), &opts).unwrap();
    out.put("config", "init-aes", &fs::read(tmp.join("init/veilfs.conf")).unwrap());
    let shown = rk.unwrap().display();
    out.put("recovery_key", "generated", shown.as_bytes());
    out.put("recovery_key", "generated-lower-spaced", shown.to_lowercase().replace('-', " ").as_bytes());
    let fixed = recovery_key().display();
    out.put("recovery_key", "fixed", format!("{fixed}\n").as_bytes());
    // The reader takes O for 0 and I/L for 1; the same key, spelled as a person might.
    let respelled = fixed.replace('0', "o").replace('1', "l");
    assert_eq!(RecoveryKey::parse(&respelled).unwrap().bytes(), recovery_key().bytes());
    out.put("recovery_key", "fixed-respelled", respelled.as_bytes());
    let mut typo = fixed.clone().into_bytes();
    typo[7] = if typo[7] == b'A' { b'B' } else { b'A' };
    out.put("recovery_key", "fixed-typo", &typo);

    for (cipher, tag) in [(ContentCipher::Aes256Gcm, "aes"), (ContentCipher::XChaCha20Poly1305, "xchacha")] {
        let v = fixed_vault(&tmp.join(tag), cipher);
        out.put("config", &format!("fixed-{tag}"), &fs::read(tmp.join(tag).join("veilfs.conf")).unwrap());

        // header + block: a 3-block file, a 5-byte file and a sparse one.
        let data: Vec<u8> = (0..2 * BLOCK_SIZE as usize + 1808).map(|i| (i * 31 % 251) as u8).collect();
        let big = write_file(&v, b"a.txt", &data, 0);
        let small = write_file(&v, b"b.txt", b"hello", 0);
        let sparse = write_file(&v, b"sparse", b"end", 3 * u64::from(BLOCK_SIZE) + 10);
        let cb = BLOCK_SIZE as usize + cipher.overhead();
        let ct = backing(&v, &big);
        let id: [u8; 16] = ct[4..20].try_into().unwrap();
        out.put("header", &format!("{tag}-plain"), &ct[..HEADER_LEN]);
        let sh = backing(&v, &sparse);
        assert!(FileHeader::decode(&sh, subkeys(), "seed").unwrap().is_sparse(), "the hole made the file SPARSE");
        out.put("header", &format!("{tag}-sparse"), &sh[..HEADER_LEN]);
        let blocks = [(0u64, false, &ct[HEADER_LEN..HEADER_LEN + cb]), (2, true, &ct[HEADER_LEN + 2 * cb..])];
        for (n, last, b) in blocks {
            let inp = BlockInput { cipher, last, n, file_id: id, ct: b };
            let mut buf = vec![0u8; b.len()];
            BlockCodec::new(cipher, subkeys(), id).open_into(n, last, b, &mut buf, "seed").unwrap();
            out.put("block", &format!("{tag}-{n}"), &inp.encode());
        }
        let sct = backing(&v, &small);
        let inp =
            BlockInput { cipher, last: true, n: 0, file_id: sct[4..20].try_into().unwrap(), ct: &sct[HEADER_LEN..] };
        out.put("block", &format!("{tag}-small"), &inp.encode());

        // xattr: records as the mount stores them on a.txt.
        let x = xattr(cipher);
        for (i, (name, value)) in [
            (&b"user.comment"[..], &b"hello"[..]),
            (b"user.xdg.origin.url", b"https://example.org/a.txt"),
            (b"user.e", b""),
        ]
        .into_iter()
        .enumerate()
        {
            let stored = x.encrypt_name(&id, name).unwrap();
            let blob = x.encrypt_value(&id, &stored, value);
            assert_eq!(x.decrypt_value(&id, &stored, &blob).unwrap(), value);
            let rec = [stored.as_bytes(), b"\0", &blob].concat();
            out.put("xattr", &format!("{tag}-{i}"), &join_id(cipher, &id, &rec));
        }
        out.put("xattr", &format!("{tag}-foreign"), &join_id(cipher, &id, b"security.selinux\0system_u:object_r"));

        // symlink_target: a short and a long target.
        let root = v.root().unwrap();
        for (i, target) in [b"../docs/a.txt".to_vec(), [b"/".as_slice(), &[b'd'; 300]].concat()].iter().enumerate() {
            let e = v.symlink(&root, format!("link{i}").as_bytes(), target).unwrap();
            let stored = fs::read_link(v.root_path().join(&e.on_disk)).unwrap();
            assert_eq!(e.kind, EntryKind::Symlink);
            let (stored_b, id) = (stored.as_os_str().as_bytes(), e.identity);
            assert_eq!(&vault(cipher).decrypt_target(&id, stored_b, "seed").unwrap(), target);
            out.put(
                "symlink_target",
                &format!("{tag}-{i}"),
                &join_id(cipher, &e.identity, stored.as_os_str().as_bytes()),
            );
        }

        if cipher != ContentCipher::Aes256Gcm {
            continue;
        }
        // entry_name: every on-disk name of the AES vault's top directory, with more names of
        // every length class and kind; a long name carries its side file after a NUL.
        let long143 = [b'L'; 143];
        let long255: Vec<u8> = (0..255).map(|i| [b'z', 0xc3, 0xa9, b' ', b'.'][i % 5]).collect();
        for name in [&b"Report 2024 \xe2\x80\x93 final.pdf"[..], &[b'x'; 142], &long143, &long255] {
            write_file(&v, name, b"x", 0);
        }
        v.mkdir(&root, b"docs", 0o755).unwrap();
        v.mknod(&root, b"pipe", libc_fifo(), 0).unwrap();
        let mut n = 0;
        for d in fs::read_dir(v.root_path()).unwrap().flatten() {
            let name = d.file_name();
            let name = name.as_bytes();
            let (kind, seed) = match ParsedEntry::parse(name) {
                ParsedEntry::Short { .. } => ("short", name.to_vec()),
                ParsedEntry::Long { hash, .. } => {
                    let side = fs::read(v.root_path().join(format!("veilfs.N.{hash}"))).unwrap();
                    ("long", [name, b"\0", &side].concat())
                }
                _ => ("internal", name.to_vec()),
            };
            if kind == "internal" && !name.starts_with(b"veilfs.N.") && name != b"veilfs.diriv" {
                continue;
            }
            n += 1;
            if let Some(s) = ParsedEntry::parse(name).binding() {
                // A user entry: it must open under the fixed key and IV, as the target does.
                let p = ParsedEntry::parse(name);
                let d = names().entry_d(&p, |_| Ok(seed[name.len() + 1..].to_vec())).unwrap();
                names().decrypt_name(&ENTRY_IV, &d).unwrap();
                let kind = EntryKind::from_mode(d_mode(&v.root_path().join(d_name(name))));
                names().unbind(&ENTRY_IV, &d, kind, s).unwrap();
            }
            out.put("entry_name", &format!("{kind}-{n}"), &seed);
        }
        out.put("entry_name", "foreign", b"notes.sync-conflict-20240101.txt");
    }
    records(&out);
    fs::remove_dir_all(&tmp).unwrap();
}

/// Seeds of the records the crash sweep, `fsck --repair` and unlocking read: exchange
/// records (sealed under the fixed key, and the unsealed form of older versions), inner-block
/// stashes, lock files, and config slot lists behind each selector.
fn records(out: &Out) {
    for (tag, a_dir) in [("root", ""), ("nested", "d1/d2")] {
        let r = ExchangeIntent {
            a_dir: a_dir.into(),
            a: "aGVsbG8.c2Vhbg".into(),
            a_new: "d29ybGQ.YmluZGluZw".into(),
            b_new: "veilfs.L.bG9uZw".into(),
            mac: [0; veilfs_core::record::RECORD_MAC_LEN],
        }
        .sealed(subkeys(), RECORD_NAME, &RECORD_DIR_IV, &RECORD_A_DIR_IV);
        assert!(r.verify(subkeys(), RECORD_NAME, &RECORD_DIR_IV, &RECORD_A_DIR_IV).is_ok());
        out.put("exchange_record", tag, r.encode().as_bytes());
    }
    out.put("exchange_record", "unsealed", b"a_dir=\na=x\na_new=y\nb_new=z\n");

    let cb = BLOCK_SIZE as usize + ContentCipher::Aes256Gcm.overhead();
    let record = RECORD_HEAD + cb;
    let sel = ((record - RECORD_HEAD - 8) as u16).to_be_bytes();
    let mut v = Vec::new();
    block_record(&mut v, 1, &vec![0xab; cb]);
    hole_record(&mut v, 2, 5, cb);
    block_record(&mut v, 1, &vec![0xcd; cb]);
    block_record(&mut v, 3, &vec![0xef; cb]);
    number(&mut v, record, 7);
    v.extend_from_slice(&[0x12; 100]); // a record cut short by a crash
    out.put("stash_records", "mixed", &[&sel[..], &6u16.to_be_bytes(), &v].concat());

    out.put(
        "lock_holder",
        "proc-locks",
        b"1: FLOCK  ADVISORY  WRITE 25544 fe:00:5415163 0 EOF\n2: -> FLOCK  ADVISORY  WRITE 7 08:01:42 0 EOF\n",
    );
    out.put("lock_holder", "cmdline-mount", b"/usr/bin/veilfs\0mount\0/v\0/m\0--passfile\0p\0");
    out.put("lock_holder", "cmdline-helper", b"/sbin/mount.fuse.veilfs\0/v\0/m\0-o\0rw\0");
    out.put("lock_holder", "empty", b"");

    for conf in ["fixed-aes", "fixed-xchacha", "init-aes"] {
        let bytes = fs::read(out.root.join("config").join(format!("seed-{conf}"))).unwrap();
        // password; recovery key; only slot 0 by password; only slot 1 by recovery key.
        for sel in [0u8, 1, 0b10, 0b111] {
            out.put("slots", &format!("{conf}-{sel}"), &[&[sel][..], &bytes].concat());
        }
    }
}

fn d_name(name: &[u8]) -> &std::ffi::OsStr {
    std::ffi::OsStr::from_bytes(name)
}

fn d_mode(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(p).unwrap().mode()
}

/// `S_IFIFO | 0644` (a FIFO needs no privilege to create).
fn libc_fifo() -> u32 {
    0o010644
}
