//! Ctrl-C (SIGINT), SIGTERM and SIGHUP during `import` and `export`: the signal only sets a
//! flag; the copy loop sees it within one chunk, removes the file it was writing (it is under
//! a temporary name, never the final one) and prints the summary; `main`, once everything
//! is dropped (the vault lock is released), dies of the same signal, as a shell expects of an
//! interrupted command (exit status 128 + N). A second signal ends the process at once.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if SIGNAL.swap(sig, Ordering::SeqCst) != 0 {
        // SAFETY: signal() and raise() are async-signal-safe; the default action ends us.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Catches SIGINT, SIGTERM and SIGHUP from now on (after any password prompt, which Ctrl-C
/// must still end at once).
pub fn catch() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs a handler that only touches an atomic (and re-raises, see above);
        // the sigaction struct is zeroed and then filled in.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Whether a signal asked us to stop.
pub fn requested() -> bool {
    SIGNAL.load(Ordering::SeqCst) != 0
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
    let sig = SIGNAL.load(Ordering::SeqCst);
    if sig == 0 {
        return;
    }
    // SAFETY: restores the default action and raises the signal, which ends the process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    std::process::exit(128 + sig);
}
