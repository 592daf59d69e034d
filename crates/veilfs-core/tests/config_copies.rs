//! A sync tool's conflict copy of `veilfs.conf` lends its key slots, never its config: a
//! password added on one machine while the other changed the config too still opens the
//! vault, and a copy from another vault or a forged one opens nothing.

use crate::common::{new_vault, password, FAST_KDF};
use secrecy::SecretString;
use veilfs_core::config::VaultConfig;
use veilfs_core::{Error, Secret, Vault};

const COPY: &str = "veilfs.sync-conflict-20261127-101010-ABCDEFG.conf";

fn pw(s: &str) -> Secret {
    Secret::Password(SecretString::from(s.to_string()))
}

/// Machine B added `second` with `veilfs passwd --add`; the sync kept A's config under the
/// name and B's as a conflict copy.
#[test]
fn a_password_added_in_a_config_the_sync_kept_as_a_copy_still_opens_the_vault() {
    let t = tempfile::tempdir().unwrap();
    let v = new_vault(t.path());
    let mut b = v.config().clone();
    b.add_password_slot(v.master_key(), &SecretString::from("second".to_string()), FAST_KDF).unwrap();
    b.seal(v.master_key());
    b.save_named(t.path(), COPY).unwrap();
    drop(v);

    let opened = Vault::open(t.path(), &pw("second"), None).expect("the copy's slot opens the vault");
    // The vault is opened with veilfs.conf itself, not with the copy.
    assert_eq!(opened.config().slots.len(), VaultConfig::load(t.path()).unwrap().slots.len());
    assert!(Vault::open(t.path(), &Secret::Password(password()), None).is_ok());
    assert!(matches!(Vault::open(t.path(), &pw("neither"), None), Err(Error::WrongPassword)));
}

/// Someone who can write the folder plants another vault's config (whose password they
/// chose) as a conflict copy: its slot opens, but its master key does not authenticate this
/// vault's config, so nothing is opened with it.
#[test]
fn attack_a_config_copy_planted_from_another_vault_opens_nothing() {
    let t = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let _v = new_vault(t.path());
    let o = new_vault(other.path());
    let mut planted = o.config().clone();
    planted.add_password_slot(o.master_key(), &SecretString::from("attacker".to_string()), FAST_KDF).unwrap();
    planted.seal(o.master_key());
    planted.save_named(t.path(), COPY).unwrap();
    assert!(matches!(Vault::open(t.path(), &pw("attacker"), None), Err(Error::WrongPassword)));
    // The vault's own password is unaffected.
    assert!(Vault::open(t.path(), &Secret::Password(password()), None).is_ok());
}
