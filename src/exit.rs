//! Exit codes (documented in the README, `veilfs --help` and veilfs(1)), chosen from the
//! *kind* of an error — a typed core [`Error`] variant, an `io::ErrorKind`, or an explicit
//! [`Exit`] — never from its message text.

use std::io;
use veilfs_core::Error;

/// Success.
pub const OK: i32 = 0;
/// An error not covered below.
pub const OTHER: i32 = 1;
/// Bad command line: clap's own code, and option values checked before any prompt (an
/// out-of-range `--block-size`, a `--slot N` that names no slot of the right kind, …).
pub const USAGE: i32 = 2;
/// The password or recovery key is incorrect, or the recovery key is mistyped.
pub const WRONG_PASSWORD: i32 = 3;
/// CIPHERDIR or a path is wrong: not a vault, not a directory, not empty, missing; a mount
/// point that is not a veilfs mount.
pub const BAD_PATH: i32 = 4;
/// The vault config is damaged, was edited, or is of an unsupported version.
pub const BAD_CONFIG: i32 = 5;
/// Integrity error in file contents or names (some data failed authentication).
pub const INTEGRITY: i32 = 6;
/// No usable password source (no terminal, `--extpass` failed, empty or mismatched).
pub const PASSWORD_SOURCE: i32 = 7;
/// The mount failed.
pub const MOUNT: i32 = 8;
/// The vault is in use: another mount or a writing command holds its lock.
pub const IN_USE: i32 = 9;

/// The exit-code table: (code, meaning). `--help`, veilfs(1) and the README show it.
pub const TABLE: [(i32, &str); 10] = [
    (OK, "success"),
    (OTHER, "other error"),
    (USAGE, "bad command line, or an option value that names nothing (--slot N, --remove-slot N)"),
    (WRONG_PASSWORD, "wrong password or recovery key (also a mistyped recovery key)"),
    (BAD_PATH, "CIPHERDIR or path is wrong (not a vault or directory, not empty, not found, not a veilfs mount)"),
    (BAD_CONFIG, "config damaged, edited or of an unsupported version"),
    (INTEGRITY, "integrity error: some ciphertext failed authentication (tampered or damaged)"),
    (PASSWORD_SOURCE, "no usable password (no terminal, --extpass failed, empty or mismatched)"),
    (MOUNT, "mount failed"),
    (IN_USE, "vault in use: mounted, or locked by another veilfs command that writes it"),
];

/// The text shown under "EXIT CODES" in `--help`.
pub const HELP: &str = "EXIT CODES:
  0  success
  1  other error
  2  bad command line, or an option value that names nothing (--slot N, --remove-slot N)
  3  wrong password or recovery key (also a mistyped recovery key)
  4  CIPHERDIR or path is wrong (not a vault or directory, not empty, not found, not a veilfs mount)
  5  config damaged, edited or of an unsupported version
  6  integrity error: some ciphertext failed authentication (tampered or damaged)
  7  no usable password (no terminal, --extpass failed, empty or mismatched)
  8  mount failed
  9  vault in use: mounted, or locked by another veilfs command that writes it

ENVIRONMENT:
  VEILFS_LOG  log filter in tracing's EnvFilter syntax (e.g. debug, or warn,veilfs_core=trace);
              overrides -v and -q for log lines";

/// An error with the exit code it should produce.
#[derive(Debug)]
pub struct Exit {
    /// Exit code.
    pub code: i32,
    /// The error.
    pub error: anyhow::Error,
}

impl Exit {
    /// An error with an explicit code.
    pub fn new(code: i32, error: impl Into<anyhow::Error>) -> Self {
        Exit { code, error: error.into() }
    }
}

/// The code for an I/O error: a path that is missing or of the wrong type is the user's
/// path being wrong (4); anything else (no space, I/O error, …) is "other".
fn io_code(e: &io::Error) -> i32 {
    use io::ErrorKind as K;
    match e.kind() {
        K::NotFound | K::NotADirectory | K::IsADirectory | K::AlreadyExists | K::DirectoryNotEmpty => BAD_PATH,
        K::InvalidFilename => BAD_PATH,
        _ => OTHER,
    }
}

/// The code for a core error, by variant (exhaustive: a new variant must be given a code).
fn core_code(e: &Error) -> i32 {
    match e {
        Error::WrongPassword => WRONG_PASSWORD,
        Error::NotAVault { .. } | Error::NotEmpty(_) | Error::BadName(_) => BAD_PATH,
        Error::Io { source, .. } => io_code(source),
        Error::Config { .. } => BAD_CONFIG,
        Error::Auth { .. } | Error::Rollback { .. } => INTEGRITY,
        Error::Invalid(_) => OTHER,
        Error::Locked { .. } => IN_USE,
    }
}

/// Picks the exit code for an error chain: the outermost typed error in it decides.
pub fn classify(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(x) = cause.downcast_ref::<Exit>() {
            return x.code;
        }
        if let Some(ce) = cause.downcast_ref::<Error>() {
            return core_code(ce);
        }
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            return io_code(io);
        }
    }
    OTHER
}

/// The one-line message for an error chain: each layer once. Core errors embed their
/// source's text ("context: No such file or directory (os error 2)") and also expose it as
/// the source; a layer whose text is already in the message is not repeated.
pub fn message(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = match cause.downcast_ref::<Exit>() {
            Some(x) => message(&x.error),
            None => cause.to_string(),
        };
        if text.is_empty() || msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    without_os_error_numbers(&msg)
}

/// `text` without Rust's " (os error N)" after each system error: the message says
/// "No such file or directory", as coreutils do, not the number too.
fn without_os_error_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(" (os error ") {
        let tail = &rest[i + " (os error ".len()..];
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && tail[digits..].starts_with(')') {
            out.push_str(&rest[..i]);
            rest = &tail[digits + 1..];
        } else {
            out.push_str(&rest[..i + 1]);
            rest = &rest[i + 1..];
        }
    }
    out.push_str(rest);
    out
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&message(&self.error))
    }
}

impl std::error::Error for Exit {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_every_code_of_the_table() {
        for (code, meaning) in TABLE {
            assert!(HELP.contains(&format!("  {code}  {meaning}\n")), "{code} {meaning}");
        }
    }

    #[test]
    fn an_os_error_is_printed_once() {
        let e: anyhow::Error = Error::io("x/y", io::Error::from_raw_os_error(libc::ENOENT)).into();
        let m = message(&e.context("cannot open"));
        assert_eq!(m.matches("No such file or directory").count(), 1, "{m}");
        assert!(!m.contains("os error"), "{m}");
        assert_eq!(without_os_error_numbers("a (os error 13): b (os error x)"), "a: b (os error x)");
        assert_eq!(classify(&anyhow::anyhow!(Error::io("x", io::Error::from_raw_os_error(libc::ENOSPC)))), OTHER);
    }
}
