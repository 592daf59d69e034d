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

/// Sets up tracing at the level chosen by `-v`/`-q` (or `VEILFS_LOG`).
pub fn init(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("VEILFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},fuser=warn")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Sink(Vec::new()))
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .init();
}
