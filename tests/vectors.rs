//! Known-answer tests: the committed vectors in tests/vectors/v1.json pin the on-disk format
//! (subkey derivation, content blocks, headers, names and bindings, config unwrap, recovery
//! key encoding), so it cannot drift silently. Regenerate only for a deliberate format
//! change: `VEILFS_REGEN_VECTORS=1 cargo test --test vectors` (and bump the format version).

use secrecy::SecretString;
use serde_json::{json, Value};
use std::path::PathBuf;
use veilfs_core::content::header::FLAG_SPARSE;
use veilfs_core::content::{BlockCodec, ContentCipher, FileHeader};
use veilfs_core::keys::MasterKey;
use veilfs_core::{EntryKind, NameCipher, RecoveryKey, Secret, VaultConfig};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn arr<const N: usize>(s: &str) -> [u8; N] {
    unhex(s).try_into().unwrap()
}

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/v1.json")
}

const MASTER: [u8; 32] = [
    0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0, 0x01, 0x23, 0x45,
    0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10,
];

/// Computes every deterministic vector from fixed inputs.
fn compute(config_vector: Value) -> Value {
    let mk = MasterKey::from_bytes(MASTER);
    let k = mk.subkeys();
    let file_id = arr::<16>("a0a1a2a3a4a5a6a7a8a9aaabacadaeaf");
    let mut content = Vec::new();
    for (cipher, nonce) in [
        (ContentCipher::Aes256Gcm, "101112131415161718191a1b"),
        (ContentCipher::XChaCha20Poly1305, "202122232425262728292a2b2c2d2e2f3031323334353637"),
    ] {
        let codec = BlockCodec::new(cipher, &k, file_id);
        for (block, last, plain) in [(0u64, false, vec![0x61u8; 4096]), (7, true, b"veilfs block".to_vec())] {
            let ct = codec.seal_with_nonce(block, last, &unhex(nonce), &plain);
            content.push(json!({
                "cipher": cipher.name(), "file_id": hex(&file_id), "file_key": hex(k.file_key(&file_id).expose()),
                "block": block, "last": last, "nonce": nonce, "plaintext": hex(&plain), "on_disk": hex(&ct),
            }));
        }
    }
    let headers: Vec<Value> = [0u16, FLAG_SPARSE]
        .iter()
        .map(|&flags| json!({"flags": flags, "file_id": hex(&file_id), "bytes": hex(&FileHeader { flags, id: file_id }.encode(&k))}))
        .collect();
    let nc = NameCipher::new(&k);
    let iv = arr::<16>("c0c1c2c3c4c5c6c7c8c9cacbcccdcecf");
    let identity = arr::<16>("d0d1d2d3d4d5d6d7d8d9dadbdcdddedf");
    let mut names = Vec::new();
    let long_name = "L".repeat(200);
    for (name, kind) in
        [("hello.txt", EntryKind::File), ("Documents", EntryKind::Dir), (long_name.as_str(), EntryKind::File)]
    {
        let key = nc.name_key(&iv, name.as_bytes()).unwrap();
        let s = nc.bind(&iv, &key.d, kind, &identity);
        names.push(json!({
            "dir_iv": hex(&iv), "name": name, "kind": kind as u8, "identity": hex(&identity),
            "d": hex(&key.d), "s": hex(&s), "entry": key.entry_name(&s),
            "side_file": key.side_file, "side_file_contents": key.side_file_contents(),
        }));
    }
    // Deterministic (reverse) vaults, docs/FORMAT.md §17: identities, a GCM-SIV block with
    // its derived nonce, and a symlink blob.
    let rv = veilfs_core::reverse::vector_parts(&mk);
    let root_iv = arr::<16>("e0e1e2e3e4e5e6e7e8e9eaebecedeeef");
    let siv = BlockCodec::new(ContentCipher::Aes256GcmSiv, &k, file_id);
    let mut det_blocks = Vec::new();
    for (block, last, plain) in [(0u64, false, vec![0x61u8; 4096]), (7, true, b"veilfs block".to_vec())] {
        let nonce = veilfs_core::reverse::derived_nonce(block, last);
        det_blocks.push(json!({
            "cipher": "AES-256-GCM-SIV", "file_id": hex(&file_id), "file_key": hex(k.file_key(&file_id).expose()),
            "block": block, "last": last, "nonce": hex(&nonce), "plaintext": hex(&plain),
            "on_disk": hex(&siv.seal_with_nonce(block, last, &nonce, &plain)),
        }));
    }
    let ids: Vec<Value> = [("Documents", EntryKind::Dir), ("hello.txt", EntryKind::File), ("link", EntryKind::Symlink)]
        .iter()
        .map(|(name, kind)| {
            json!({"parent_iv": hex(&root_iv), "name": name, "kind": *kind as u8,
            "identity": hex(&rv.identity(&root_iv, name.as_bytes(), *kind))})
        })
        .collect();
    let link_id = rv.identity(&root_iv, b"link", EntryKind::Symlink);
    let deterministic = json!({
        "ids_key": hex(rv.ids_key()),
        "identities": ids,
        "content": det_blocks,
        "symlink": {"identity": hex(&link_id), "target": "hello.txt",
                    "stored": String::from_utf8(rv.seal_target(&link_id, b"hello.txt").unwrap()).unwrap()},
    });
    let rk_bytes = arr::<32>("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
    let rk_display = RecoveryKey::from_bytes(rk_bytes).display();
    json!({
        "description": "veilfs format v1 known-answer vectors; see docs/FORMAT.md",
        "master_key": hex(&MASTER),
        "subkeys": {
            "content": hex(k.content.expose()), "header": hex(k.header.expose()), "names": hex(k.names.expose()),
            "binding": hex(k.binding.expose()), "config_mac": hex(k.config_mac.expose()), "xattr_names": hex(k.xattr_names.expose()),
        },
        "content": content,
        "headers": headers,
        "names": names,
        "recovery_key": {"bytes": hex(&rk_bytes), "display": rk_display},
        "config": config_vector,
        "deterministic": deterministic,
    })
}

fn config_vector() -> Value {
    // A real vault config made once with a weak KDF; its unwrap must keep working.
    let t = tempfile::tempdir().unwrap();
    let pw = SecretString::from("vector password".to_string());
    let opts = veilfs_core::InitOptions {
        kdf: veilfs_core::kdf::Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 },
        recovery_key: false,
        ..Default::default()
    };
    let (v, _) = veilfs_core::Vault::create(t.path(), &pw, &opts).unwrap();
    let text = std::fs::read_to_string(t.path().join("veilfs.conf")).unwrap();
    json!({"password": "vector password", "file": text, "master_key": hex(v.master_key().expose_secret())})
}

#[test]
fn format_v1_known_answers() {
    if std::env::var_os("VEILFS_REGEN_VECTORS").is_some() {
        // Keep the committed config (it has random salts) unless there is none yet.
        let committed = std::fs::read_to_string(path()).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
        let v = compute(committed.map(|c| c["config"].clone()).unwrap_or_else(config_vector));
        std::fs::create_dir_all(path().parent().unwrap()).unwrap();
        std::fs::write(path(), serde_json::to_string_pretty(&v).unwrap() + "\n").unwrap();
        return;
    }
    let committed: Value =
        serde_json::from_str(&std::fs::read_to_string(path()).expect("tests/vectors/v1.json")).unwrap();
    let fresh = compute(committed["config"].clone());
    for key in ["master_key", "subkeys", "content", "headers", "names", "recovery_key", "deterministic"] {
        assert_eq!(fresh[key], committed[key], "format drift in {key:?}: the v1 format must not change");
    }
    // Content vectors decrypt with the committed file key, independently of the key schedule.
    let det = committed["deterministic"]["content"].as_array().unwrap();
    for c in committed["content"].as_array().unwrap().iter().chain(det) {
        let cipher = ContentCipher::parse(c["cipher"].as_str().unwrap()).unwrap();
        let key = cipher.key(&arr::<32>(c["file_key"].as_str().unwrap()));
        let on_disk = unhex(c["on_disk"].as_str().unwrap());
        let nl = cipher.nonce_len();
        let mut aad = unhex(c["file_id"].as_str().unwrap());
        aad.extend_from_slice(&c["block"].as_u64().unwrap().to_be_bytes());
        aad.push(c["last"].as_bool().unwrap() as u8);
        let mut body = on_disk[nl..on_disk.len() - 16].to_vec();
        key.open(&on_disk[..nl], &aad, &mut body, &on_disk[on_disk.len() - 16..]).unwrap();
        assert_eq!(hex(&body), c["plaintext"].as_str().unwrap());
    }
    // The committed config unlocks to the committed master key and authenticates.
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("veilfs.conf"), committed["config"]["file"].as_str().unwrap()).unwrap();
    let cfg = VaultConfig::load(t.path()).unwrap();
    let pw = Secret::Password(SecretString::from(committed["config"]["password"].as_str().unwrap().to_string()));
    let mk = cfg.unlock(&pw, None, &t.path().join("veilfs.conf")).unwrap();
    assert_eq!(hex(mk.expose_secret()), committed["config"]["master_key"].as_str().unwrap());
    // The recovery key display decodes to its bytes.
    let rk = RecoveryKey::parse(committed["recovery_key"]["display"].as_str().unwrap()).unwrap();
    assert_eq!(hex(rk.bytes()), committed["recovery_key"]["bytes"].as_str().unwrap());
}
