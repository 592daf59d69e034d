//! Ctrl-C (SIGINT), SIGTERM and SIGHUP during `import` and `export`: the signal only sets a
//! flag; the copy loop sees it within one chunk, removes the file it was writing (it is under
//! a temporary name, never the final one) and prints the summary; `main`, once everything
//! is dropped (the vault lock is released), dies of the same signal, as a shell expects of an
//! interrupted command (exit status 128 + N). A second signal ends the process at once.

use veilfs_core::sys::process;

/// Catches SIGINT, SIGTERM and SIGHUP from now on (after any password prompt, which Ctrl-C
/// must still end at once): each only sets a flag; a second one ends the process at once.
pub fn catch() {
    if let Err(e) = process::catch_signals(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]) {
        tracing::warn!("cannot catch interrupting signals: {e}");
    }
}

/// Whether a signal asked us to stop.
pub fn requested() -> bool {
    process::caught_signal() != 0
}

/// The error a copy loop returns when interrupted.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// `Err(Interrupted)` once a signal asked us to stop.
pub fn check() -> Result<(), Interrupted> {
    if requested() {
        Err(Interrupted)
    } else {
        Ok(())
    }
}

/// Whether an error chain is an interruption.
pub fn is(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Interrupted>())
}

/// Ends the process by the signal that interrupted it (nothing happens without one).
pub fn die_if_interrupted() {
    let sig = process::caught_signal();
    if sig != 0 {
        process::die_of(sig);
    }
}
