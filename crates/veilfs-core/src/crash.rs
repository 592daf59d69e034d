//! Named crash points for the crash-consistency matrix (`tests/crash.rs`).
//!
//! Each point sits between two on-disk steps of one operation, where a crash leaves the
//! ciphertext in a state no clean run produces. Built with `--features failpoints` (test
//! builds only), `FAILPOINTS=<name>=panic` makes the process die at that point: the `veilfs`
//! binary of such a build turns every panic into `abort()`, so nothing after the point runs
//! (no destructor, no unmount), as after `SIGKILL`. `FAILPOINTS=<name>=return` at a `torn`
//! point first writes half of the pending buffer, as a `pwrite` cut short by a fatal signal
//! does (the kernel stops copying between pages), and then dies.
//!
//! Without the feature the macros expand to nothing: no code, no cost.

/// Every crash point, in the order an operation passes them; the matrix iterates this list,
/// so a point added to the code without an entry here is never exercised.
pub const POINTS: &[&str] = &[
    "file.header_alone",
    "file.before_header",
    "file.tail_stashed",
    "file.reseal_alone",
    "file.inner_stashed",
    "file.torn_inner",
    "file.growth_logged",
    "file.torn_write",
    "file.grown",
    "file.torn_reseal",
    "file.after_write",
    "file.shrink_resealed",
    "file.settle_sparse",
    "map.session_logged",
    "map.session_started",
    "map.blocks_logged",
    "map.torn_block",
    "map.grown",
    "map.blocks_written",
    "map.committed",
    "map.torn_map",
    "map.map_written",
    "map.settled",
    "vault.create",
    "vault.mkdir_temp",
    "vault.mkdir_diriv",
    "vault.side_file",
    "vault.symlink_side",
    "vault.carry_side",
    "vault.rename",
    "vault.exchange",
    "vault.link",
    "vault.remove_temp",
    "vault.remove_side",
    "vault.drop_side",
    "vault.xattr_more",
    "vault.xattr",
    "vault.xattr_drop_more",
    "config.rewrite",
];

/// A crash point: the process dies here when `FAILPOINTS` names it (failpoints builds).
macro_rules! point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name);
    };
}

/// A crash point inside a `pwrite` of `buf` at `off` on `fd`: with the `return` action,
/// half of `buf` reaches the file before the process dies.
macro_rules! torn {
    ($name:literal, $fd:expr, $buf:expr, $off:expr) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |_| {
            let half = &$buf[..$buf.len() / 2];
            let _ = $crate::sys::pwrite_all($fd, half, $off);
            std::process::abort()
        });
    };
}

/// A crash point for the front ends (the mount's own steps): as [`point!`], by name.
#[inline(always)]
pub fn at(name: &'static str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name);
    let _ = name;
}

pub(crate) use point;
pub(crate) use torn;
