//! Helpers shared by the core's integration tests.
#![allow(dead_code)]

use secrecy::SecretString;
use std::path::{Path, PathBuf};
use veilfs_core::kdf::Argon2Params;
use veilfs_core::{CipherDir, Entry, InitOptions, Secret, Vault};

/// Argon2 settings cheap enough for tests.
pub const FAST_KDF: Argon2Params = Argon2Params { memory_kib: 64, iterations: 1, parallelism: 1 };

pub fn password() -> SecretString {
    SecretString::from("correct horse".to_string())
}

pub fn new_vault(dir: &Path) -> Vault {
    let opts = InitOptions { kdf: FAST_KDF, ..InitOptions::default() };
    Vault::create(dir, &password(), &opts).unwrap().0
}

/// A vault whose files keep header v1 and no block map (`veilfs init --no-block-map`, and
/// every vault made before the feature `block-map`): for the tests of that format's own rules.
pub fn new_v1_vault(dir: &Path) -> Vault {
    let opts = InitOptions { kdf: FAST_KDF, block_map: false, ..InitOptions::default() };
    Vault::create(dir, &password(), &opts).unwrap().0
}

pub fn reopen(dir: &Path) -> Vault {
    Vault::open(dir, &Secret::Password(password()), None).unwrap()
}

pub fn write_file(v: &Vault, dir: &CipherDir, name: &str, data: &[u8]) -> Entry {
    let (e, f) = v.create_file(dir, name.as_bytes(), 0o644).unwrap();
    f.write_at(data, 0, 0).unwrap();
    e
}

pub fn read_file(v: &Vault, dir: &CipherDir, name: &str) -> veilfs_core::Result<Vec<u8>> {
    let e = v.lookup(dir, name.as_bytes())?.expect("entry exists");
    let f = v.open_file(dir, &e, libc::O_RDONLY)?;
    let size = f.plain_size()?;
    let mut buf = vec![0u8; size as usize];
    let n = f.read_at(&mut buf, 0, size)?;
    buf.truncate(n);
    Ok(buf)
}

pub fn cipher_path(v: &Vault, dir: &CipherDir, name: &str) -> PathBuf {
    dir.path.join(v.lookup(dir, name.as_bytes()).unwrap().unwrap().on_disk)
}

/// Deterministic pseudo-random bytes.
pub fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(seed as u32).to_le_bytes()[1]).collect()
}

/// A vault as made before the config feature `special-kinds` existed (docs/FORMAT.md §9):
/// the six original features only, so every special file is bound as kind 0x04.
pub fn legacy_vault(dir: &Path) -> Vault {
    vault_without(dir, veilfs_core::config::FEATURE_SPECIAL_KINDS)
}

/// A new vault in `dir` whose config does not name `feature`, as made before it existed:
/// every such feature is older than `block-map`, so the vault has v1 files too.
pub fn vault_without(dir: &Path, feature: &str) -> Vault {
    let mut v = new_v1_vault(dir);
    let mut cfg = v.config().clone();
    cfg.features.retain(|f| f != feature);
    v.save_config(cfg).unwrap();
    reopen(dir)
}

/// A temporary directory on tmpfs where there is one (`/dev/shm`): 64 KiB attribute values
/// need a backing filesystem that takes them (ext4 without `ea_inode` stops at one block).
pub fn xattr_tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// A vault as made before the config feature `overflow` existed: symlink targets and xattr
/// values keep their inline limits.
pub fn vault_without_overflow(dir: &Path) -> Vault {
    vault_without(dir, veilfs_core::config::FEATURE_OVERFLOW)
}

/// A new vault (`iv_in_name`) or one made before the feature `iv-in-name`, whose directories
/// keep their IV in the 16-byte file `veilfs.diriv` (docs/FORMAT.md §7.1).
pub fn vault_of_iv_form(dir: &Path, iv_in_name: bool) -> Vault {
    if iv_in_name {
        new_vault(dir)
    } else {
        // Made with the feature, its top directory has an IV name: give it the file instead.
        let v = vault_without(dir, veilfs_core::config::FEATURE_IV_IN_NAME);
        let root = v.root_dir().unwrap();
        veilfs_core::diriv::IvCopy::Name.remove(root.fd(), &root.iv).unwrap();
        veilfs_core::diriv::IvCopy::File.write(root.fd(), &root.iv).unwrap();
        v
    }
}

/// An attacker's copy of `from`'s directory IV copy into `to`, replacing `to`'s own (in the
/// vault's form: the file's bytes, or the empty file named after the IV).
pub fn copy_iv_copy(v: &Vault, from: &CipherDir, to: &CipherDir) {
    let c = v.iv_copy();
    c.remove(to.fd(), &to.iv).unwrap();
    c.write(to.fd(), &from.iv).unwrap();
}

/// The backing path of `dir`'s IV copy.
pub fn iv_copy_path(v: &Vault, dir: &CipherDir) -> PathBuf {
    dir.path.join(v.iv_copy().name(&dir.iv))
}

/// A vault with `block_size`-byte blocks and the feature `block-map` (docs/FORMAT.md §5.10),
/// as every new vault has it: every file gets header v2 and a block map.
pub fn vault_with_block_map(dir: &Path, block_size: u32) -> Vault {
    let opts = InitOptions { kdf: FAST_KDF, block_size, ..InitOptions::default() };
    let v = Vault::create(dir, &password(), &opts).unwrap().0;
    assert!(v.content().block_map);
    v
}

/// Asserts `r` is an integrity error whose message mentions `needle`.
pub fn assert_auth<T: std::fmt::Debug>(r: veilfs_core::Result<T>, needle: &str) {
    match r {
        Err(veilfs_core::Error::Auth { what, detail }) => {
            let msg = format!("{what}: {detail}");
            assert!(msg.contains(needle), "integrity error {msg:?} should mention {needle:?}");
        }
        other => panic!("expected an integrity error mentioning {needle:?}, got {other:?}"),
    }
}
