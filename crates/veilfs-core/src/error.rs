//! Errors of the core library.
//!
//! Every variant says what was wrong; the FUSE layer maps them to errno values with
//! [`Error::errno`] and the CLI maps them to exit codes. Authentication failures are a
//! variant of their own so they can never be mistaken for ordinary I/O trouble.

use std::io;
use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A backing-store system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the ciphertext path where known.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Ciphertext failed authentication: it was modified, moved, swapped, truncated or is
    /// damaged. Never returned together with data.
    #[error("integrity error in {what}: {detail}")]
    Auth {
        /// The object (ciphertext file, block, name) that failed.
        what: String,
        /// What exactly did not verify.
        detail: String,
    },

    /// An object (a file, the config) authenticates but is older than what this client
    /// remembers having seen of it (`crate::known`): it was put back to an older version.
    /// An integrity error like [`Error::Auth`], of its own kind so that it can be told apart
    /// (and accepted with `fsck --accept`). Never returned together with data.
    #[error("integrity error in {what}: {detail}")]
    Rollback {
        /// The ciphertext file (or config) that is older than remembered.
        what: String,
        /// The generations seen and remembered, and what to do.
        detail: String,
    },

    /// None of the key slots accepted the password or recovery key.
    #[error("the password (or recovery key) is incorrect")]
    WrongPassword,

    /// The vault configuration is missing, malformed, tampered with or of an unsupported version.
    #[error("vault config {path}: {detail}")]
    Config {
        /// Path of the config file.
        path: PathBuf,
        /// What is wrong with it and what to do.
        detail: String,
    },

    /// CIPHERDIR is not a vault: it does not exist, is not a directory, or holds no config.
    /// Build it with [`Error::not_a_vault`], which says which of these it is.
    #[error("{} is not a veilfs vault: {detail}", path.display())]
    NotAVault {
        /// The directory given as CIPHERDIR.
        path: PathBuf,
        /// What is there instead, and what to do.
        detail: String,
    },

    /// A new vault was asked for in a directory that is not empty.
    #[error("{} is not empty; a vault must be created in an empty directory", .0.display())]
    NotEmpty(PathBuf),

    /// The caller asked for something invalid (bad name, bad argument).
    #[error("{0}")]
    Invalid(String),

    /// A plaintext name that Linux would reject (empty, `/`, NUL, longer than 255 bytes).
    #[error("invalid file name: {0}")]
    BadName(String),

    /// The vault is in use by another writer: it holds the vault lock ([`crate::lock`]).
    #[error("{}", locked_message(cipherdir, holder, *shared))]
    Locked {
        /// The vault.
        cipherdir: PathBuf,
        /// Who holds the lock, as the kernel says.
        holder: crate::holder::Holder,
        /// Asked for by a `--shared-storage` mount (refused by a mount that caches).
        shared: bool,
    },
}

/// The message of [`Error::Locked`]: who holds the vault, and what to do.
fn locked_message(cipherdir: &std::path::Path, holder: &crate::holder::Holder, shared: bool) -> String {
    let what = format!("{} is {}", cipherdir.display(), holder.describe());
    if holder.command == crate::holder::SHARED_MOUNTS {
        format!(
            "{what}; a mount that caches needs the vault to itself: unmount those first, or mount with \
             --shared-storage too (veilfs mount --help)"
        )
    } else if shared && holder.command == "mount" {
        format!(
            "{what}, a mount that caches, which would not see a --shared-storage mount's changes; unmount it \
             first, then mount every writer with --shared-storage (veilfs mount --help)"
        )
    } else if holder.command == "mount" {
        format!("{what}; unmount it first, or use --shared-storage (veilfs mount --help)")
    } else {
        format!("{what}; wait until it has finished")
    }
}

impl Error {
    /// Wraps an `io::Error` with a context string.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// An authentication failure for `what` with `detail`.
    pub fn auth(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Auth { what: what.into(), detail: detail.into() }
    }

    /// A [`Error::NotAVault`] for `cipherdir`, saying whether it is missing, not a directory,
    /// or a directory without a config (looked up now, without following a final symlink).
    pub fn not_a_vault(cipherdir: &std::path::Path) -> Self {
        let detail = match std::fs::metadata(cipherdir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => "it does not exist".to_string(),
            Err(e) => format!("it cannot be examined ({e})"),
            Ok(m) if !m.is_dir() => "it is not a directory".to_string(),
            Ok(_) => "it holds no veilfs.conf (create a vault with `veilfs init DIR`)".to_string(),
        };
        Error::NotAVault { path: cipherdir.to_path_buf(), detail }
    }

    /// The errno a filesystem should return for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Auth { .. } | Error::Rollback { .. } => libc::EIO,
            Error::WrongPassword | Error::Config { .. } => libc::EACCES,
            Error::NotAVault { .. } => libc::ENOENT,
            Error::NotEmpty(_) => libc::ENOTEMPTY,
            Error::Invalid(_) => libc::EINVAL,
            Error::BadName(_) => libc::ENAMETOOLONG,
            Error::Locked { .. } => libc::EBUSY,
        }
    }

    /// True when this error means "no such file or directory".
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Extension to attach context to `io::Result`s.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(context(), e))
    }
}
