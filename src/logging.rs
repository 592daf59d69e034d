//! Logging: stderr in the foreground; once a mount daemonizes, the systemd journal when it
//! is there (native protocol: a priority per line, fields for the unit), syslog otherwise.
//! A foreground mount whose stderr already is the journal (a systemd service) logs to the
//! journal natively too. Never a key, and no plaintext name at the default verbosity.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_subscriber::registry::LookupSpan;

static SYSLOG: AtomicBool = AtomicBool::new(false);
/// Events go to the journal layer (and nowhere else).
static JOURNAL: AtomicBool = AtomicBool::new(false);
/// A journal layer was made at start-up: the journal's socket answered.
static HAVE_JOURNAL: AtomicBool = AtomicBool::new(false);

/// The log file of a daemon on a machine with neither journal nor syslog.
static FILE: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

/// Where a daemon's log went.
#[derive(Debug, PartialEq, Eq)]
pub enum Destination {
    /// The systemd journal.
    Journal,
    /// syslog (`/dev/log`).
    Syslog,
    /// This file: there is neither journal nor syslog (a container, a minimal system).
    File(std::path::PathBuf),
    /// Nowhere: no journal, no syslog and no log file could be opened (its path and why).
    Nowhere(std::path::PathBuf, String),
}

/// The log file of a daemon without journal or syslog: `VEILFS_LOG_FILE` when set, else
/// `/var/log/veilfs.log` for root, `$XDG_STATE_HOME/veilfs/veilfs.log` (default
/// `~/.local/state/veilfs/veilfs.log`) for a user.
fn log_file_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("VEILFS_LOG_FILE").filter(|v| !v.is_empty()) {
        return p.into();
    }
    if veilfs_core::sys::euid() == 0 {
        return "/var/log/veilfs.log".into();
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    state.join("veilfs").join("veilfs.log")
}

/// Sends everything logged from now on to the journal when it is there, else to syslog when
/// its socket is there, else (appending, mode 0600) to a log file; returns which.
pub fn to_system_log() -> Destination {
    if HAVE_JOURNAL.load(Ordering::SeqCst) {
        JOURNAL.store(true, Ordering::SeqCst);
        return Destination::Journal;
    }
    if std::path::Path::new("/dev/log").exists() {
        veilfs_core::sys::process::open_syslog();
        SYSLOG.store(true, Ordering::SeqCst);
        return Destination::Syslog;
    }
    let path = log_file_path();
    let opened = path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&path)
    });
    match opened {
        Ok(f) => {
            *FILE.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
            Destination::File(path)
        }
        Err(e) => Destination::Nowhere(path, e.to_string()),
    }
}

/// One log line's time for the log file: UTC to the second, as `date -u` shows it.
fn timestamp() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M:%S").to_string()
}

/// True when stderr is the journal's stream (systemd sets `JOURNAL_STREAM=DEV:INODE` for a
/// service whose output goes to the journal; see systemd.exec(5)).
pub fn stderr_is_journal() -> bool {
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM").ok().and_then(|v| {
        let (d, i) = v.split_once(':')?;
        Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?))
    }) else {
        return false;
    };
    veilfs_core::sys::fstat(std::io::stderr().as_fd()).is_ok_and(|st| st.st_dev == dev && st.st_ino == ino)
}

/// The journal's layer, silent until [`to_system_log`] picks the journal.
struct Journal(tracing_journald::Layer);

impl<S> tracing_subscriber::Layer<S> for Journal
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.0.on_new_span(attrs, id, ctx)
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.0.on_record(id, values, ctx)
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if JOURNAL.load(Ordering::Relaxed) {
            self.0.on_event(event, ctx)
        }
    }
}

/// One line per incident: an ERROR event whose text was logged in the last [`INCIDENT_QUIET`]
/// is dropped, for every destination. A failed read of a damaged file comes back several
/// times (the kernel's readahead, the read itself, a program's retries), and both the core
/// library and the FUSE front end report it; the user needs one line naming the file.
struct Incidents;

/// How long one incident (the same error text) is logged once.
const INCIDENT_QUIET: std::time::Duration = std::time::Duration::from_secs(60);

/// An event's fields as text.
struct Text(String);

impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = write!(self.0, "{}={value:?};", field.name());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Incidents {
    fn event_enabled(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) -> bool {
        if *event.metadata().level() != tracing::Level::ERROR {
            return true;
        }
        static RECENT: std::sync::Mutex<Vec<(String, std::time::Instant)>> = std::sync::Mutex::new(Vec::new());
        let mut text = Text(String::new());
        event.record(&mut text);
        let now = std::time::Instant::now();
        let mut recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        recent.retain(|(_, t)| now.duration_since(*t) < INCIDENT_QUIET);
        if recent.iter().any(|(t, _)| *t == text.0) {
            return false;
        }
        // At most 64 incidents remembered: a flood of distinct errors is logged in full.
        if recent.len() >= 64 {
            recent.remove(0);
        }
        recent.push((text.0, now));
        true
    }
}

/// A writer for one log event: stderr, or one syslog message.
pub struct Sink(Vec<u8>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if JOURNAL.load(Ordering::Relaxed) {
            return Ok(buf.len());
        }
        if SYSLOG.load(Ordering::Relaxed) || FILE.lock().is_ok_and(|f| f.is_some()) {
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        } else {
            std::io::stderr().write(buf)
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.0.is_empty() {
            return if SYSLOG.load(Ordering::Relaxed) { Ok(()) } else { std::io::stderr().flush() };
        }
        let text = String::from_utf8_lossy(&self.0).trim_end().to_string();
        if !SYSLOG.load(Ordering::Relaxed) {
            if let Some(f) = FILE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                let _ = writeln!(f, "{} veilfs[{}]: {text}", timestamp(), std::process::id());
            }
            self.0.clear();
            return Ok(());
        }
        let prio = if text.contains("ERROR") {
            libc::LOG_ERR
        } else if text.contains("WARN") {
            libc::LOG_WARNING
        } else {
            libc::LOG_INFO
        };
        veilfs_core::sys::process::syslog(prio, &text);
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
/// A mount (`!offline`) also connects to the journal when its socket is there.
pub fn init(verbose: u8, quiet: bool, offline: bool) {
    use tracing_subscriber::prelude::*;
    QUIET.store(quiet, Ordering::Relaxed);
    let level = level(verbose, quiet);
    let from_env = tracing_subscriber::EnvFilter::try_from_env("VEILFS_LOG").ok();
    let hide_core_errors = offline && verbose == 0 && from_env.is_none();
    let make_filter = || {
        tracing_subscriber::EnvFilter::try_from_env("VEILFS_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},fuser=warn")))
    };
    let filter = make_filter();
    let journal = if offline || !std::path::Path::new("/run/systemd/journal/socket").exists() {
        None
    } else {
        tracing_journald::layer().ok().map(|l| Journal(l.with_syslog_identifier("veilfs".into())))
    };
    HAVE_JOURNAL.store(journal.is_some(), Ordering::SeqCst);
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
    tracing_subscriber::registry()
        .with(Incidents)
        .with(layer)
        .with(journal.map(|j| j.with_filter(make_filter())))
        .init();
    // `init` bridges the `log` crate (fuser's logging) at every level; fuser logs each request
    // at debug level, which the filter above always drops. Stopping those records at the
    // `log` macro spares every request building one and asking the filters.
    log::set_max_level(log::LevelFilter::Warn);
}
