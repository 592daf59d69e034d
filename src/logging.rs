//! Logging: stderr in the foreground, syslog (the journal) once a mount daemonizes.
//! Never a key, and no plaintext name at the default verbosity.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static SYSLOG: AtomicBool = AtomicBool::new(false);

/// Sends everything logged from now on to syslog.
pub fn to_syslog() {
    // SAFETY: the ident is a static NUL-terminated string, valid for the process lifetime.
    unsafe { libc::openlog(c"veilfs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    SYSLOG.store(true, Ordering::SeqCst);
}

/// A writer for one log event: stderr, or one syslog message.
pub struct Sink(Vec<u8>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if SYSLOG.load(Ordering::Relaxed) {
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        } else {
            std::io::stderr().write(buf)
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !SYSLOG.load(Ordering::Relaxed) {
            return std::io::stderr().flush();
        }
        if self.0.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.0).trim_end().replace('\0', " ");
        let prio = if text.contains("ERROR") {
            libc::LOG_ERR
        } else if text.contains("WARN") {
            libc::LOG_WARNING
        } else {
            libc::LOG_INFO
        };
        if let Ok(c) = std::ffi::CString::new(text) {
            // SAFETY: "%s" with one valid C string argument.
            unsafe { libc::syslog(prio, c"%s".as_ptr(), c.as_ptr()) };
        }
        self.0.clear();
        Ok(())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

static QUIET: AtomicBool = AtomicBool::new(false);

/// True under `-q`: no progress bars, hints or summaries; errors only.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// True when messages meant for a person at a terminal (progress, "deriving the key…")
/// should be shown: stderr is a terminal and `-q` was not given.
pub fn interactive() -> bool {
    use std::io::IsTerminal;
    !quiet() && std::io::stderr().is_terminal()
}

/// The log level for `-q` and a `-v` count, as `veilfs --help` documents it: warnings by
/// default, `-q` errors only, `-v` info, `-vv` debug, `-vvv` trace.
pub fn level(verbose: u8, quiet: bool) -> &'static str {
    match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    }
}

/// Sets up tracing at the level chosen by `-v`/`-q`; `VEILFS_LOG`, when set to a valid
/// filter, replaces it. For the offline commands (`offline`), the core library's ERROR
/// events are left out at the default verbosity: each comes with an error the command
/// reports itself, naming the path the user gave, and would otherwise be printed twice.
pub fn init(verbose: u8, quiet: bool, offline: bool) {
    use tracing_subscriber::prelude::*;
    QUIET.store(quiet, Ordering::Relaxed);
    let level = level(verbose, quiet);
    let from_env = tracing_subscriber::EnvFilter::try_from_env("VEILFS_LOG").ok();
    let hide_core_errors = offline && verbose == 0 && from_env.is_none();
    let filter = from_env.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(format!("{level},fuser=warn")));
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(|| Sink(Vec::new()))
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .with_filter(filter)
        .with_filter(tracing_subscriber::filter::filter_fn(move |m| {
            !(hide_core_errors && *m.level() == tracing::Level::ERROR && m.target().starts_with("veilfs_core"))
        }))
        // The FUSE crate's request log (info and below) prints plaintext names: never shown,
        // whatever -v or VEILFS_LOG asks for. Its warnings and errors name no files.
        .with_filter(tracing_subscriber::filter::filter_fn(|m| {
            !(m.target().starts_with("fuser") && *m.level() > tracing::Level::WARN)
        }));
    tracing_subscriber::registry().with(layer).init();
}
