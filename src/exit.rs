//! Exit codes (documented in the README and `veilfs --help`).

use veilfs_core::Error;

/// Success.
pub const OK: i32 = 0;
/// An error not covered below.
pub const OTHER: i32 = 1;
/// Bad command line (clap's own code).
#[allow(dead_code)] // returned by clap itself
pub const USAGE: i32 = 2;
/// The password or recovery key is incorrect.
pub const WRONG_PASSWORD: i32 = 3;
/// CIPHERDIR or a path is wrong: not a vault, not empty, missing.
pub const BAD_PATH: i32 = 4;
/// The vault config is damaged, was edited, or is of an unsupported version.
pub const BAD_CONFIG: i32 = 5;
/// Integrity error in file contents or names (some data failed authentication).
pub const INTEGRITY: i32 = 6;
/// No usable password source (no terminal, `--extpass` failed, empty or mismatched).
pub const PASSWORD_SOURCE: i32 = 7;
/// The mount failed.
#[allow(dead_code)] // the mount (next issue) returns it
pub const MOUNT: i32 = 8;

/// The text shown under "EXIT CODES" in `--help`.
pub const HELP: &str = "EXIT CODES:
  0  success
  1  other error
  2  bad command line
  3  wrong password or recovery key
  4  CIPHERDIR or path is wrong (not a vault, not empty, not found)
  5  config damaged, edited or of an unsupported version
  6  integrity error: some ciphertext failed authentication (tampered or damaged)
  7  no usable password (no terminal, --extpass failed, empty or mismatched)
  8  mount failed";

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

/// Picks the exit code for an error chain by looking for a core error inside it.
pub fn classify(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(ce) = cause.downcast_ref::<Error>() {
            return match ce {
                Error::WrongPassword => WRONG_PASSWORD,
                Error::Config { detail, .. } if detail.starts_with("not found") => BAD_PATH,
                Error::Config { .. } => BAD_CONFIG,
                Error::Auth { .. } => INTEGRITY,
                Error::Io { .. } | Error::BadName(_) => BAD_PATH,
                Error::Invalid(_) => OTHER,
            };
        }
        if let Some(x) = cause.downcast_ref::<Exit>() {
            return x.code;
        }
    }
    OTHER
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl std::error::Error for Exit {}
