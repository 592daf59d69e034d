//! Where passwords come from: a prompt, a file, stdin or an external program, in the
//! conventions of gocryptfs and cryptsetup. Passwords live in `SecretString`s (zeroized).
//!
//! Every source is read into one buffer allocated once and zeroized, so no copy is left in
//! freed memory. The prompt reads the terminal itself rather than through `rpassword`, whose
//! password `String` grows one character at a time (each reallocation left a prefix of the
//! password behind) and which turned echo off only after showing the prompt (a password typed
//! at once was echoed). Measured by `tests/attack.rs`, which types the password on a real
//! pseudo-terminal and scans the memory of the mount daemon and of `veilfs passwd`.

use crate::exit::{Exit, PASSWORD_SOURCE};
use anyhow::Result;
use secrecy::{ExposeSecret, SecretString};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use veilfs_core::sys::process;
use veilfs_core::sys::term::Unechoed;
use zeroize::Zeroize;

/// Password source options shared by every command that opens or creates a vault.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PasswordArgs {
    /// Read the password from the first line of FILE.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["password_stdin", "extpass"])]
    pub passfile: Option<std::path::PathBuf>,
    /// Read the password from the first line of standard input.
    #[arg(long, conflicts_with = "extpass")]
    pub password_stdin: bool,
    /// Run CMD (with /bin/sh -c) and use the first line it prints as the password.
    #[arg(long, value_name = "CMD")]
    pub extpass: Option<String>,
}

fn source_err(msg: impl Into<String>) -> anyhow::Error {
    Exit::new(PASSWORD_SOURCE, anyhow::anyhow!(msg.into())).into()
}

/// Longest input read as a password source (a file, standard input, an --extpass program).
const SOURCE_MAX: usize = 64 * 1024;

/// Reads `r` to its end (at most [`SOURCE_MAX`] bytes) into one buffer that is allocated once
/// and zeroized when dropped, so no copy of the secret is left behind in freed memory (a
/// growing `Vec` or `String` would leave one at each reallocation).
fn read_secret(mut r: impl std::io::Read, from: &str) -> Result<zeroize::Zeroizing<Vec<u8>>> {
    let mut buf = zeroize::Zeroizing::new(vec![0u8; SOURCE_MAX + 1]);
    let mut n = 0;
    loop {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                if n > SOURCE_MAX {
                    return Err(source_err(format!("{from} is longer than 64 KiB; it is not a password")));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(source_err(format!("reading {from}: {e}"))),
        }
    }
    buf.truncate(n); // truncating never reallocates
    Ok(buf)
}

/// The first line of `bytes` as a secret (rejects empty or non-UTF-8 passwords).
fn first_line_of(bytes: &[u8], from: &str) -> Result<SecretString> {
    let end = bytes.iter().position(|&b| b == b'\n' || b == b'\r').unwrap_or(bytes.len());
    let line =
        std::str::from_utf8(&bytes[..end]).map_err(|_| source_err(format!("the password from {from} is not UTF-8")))?;
    if line.is_empty() {
        return Err(source_err(format!("the password from {from} is empty")));
    }
    Ok(SecretString::from(line.to_string()))
}

/// Standard input, read whole on first use (so `passwd` can take old and new password as two
/// lines), and how much of it is used. Used lines are overwritten with zeros at once.
static STDIN: std::sync::Mutex<Option<(zeroize::Zeroizing<Vec<u8>>, usize)>> = std::sync::Mutex::new(None);

/// Next line of standard input.
fn stdin_line() -> Result<SecretString> {
    let mut guard = STDIN.lock().expect("stdin lock");
    if guard.is_none() {
        // The raw fd, not `std::io::stdin()`: its buffer lives as long as the process and
        // would keep a copy of the password (measured by scanning the mount daemon's memory).
        // A duplicate of fd 0 read unbuffered, closed after.
        let fd0 = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| source_err(format!("reading standard input: {e}")))?;
        *guard = Some((read_secret(std::fs::File::from(fd0), "standard input")?, 0));
    }
    let (buf, pos) = guard.as_mut().expect("just read");
    let rest = &mut buf[*pos..];
    if rest.is_empty() {
        return Err(source_err("standard input has no (more) password lines"));
    }
    let line_len = rest.iter().position(|&b| b == b'\n').map_or(rest.len(), |i| i + 1);
    let pw = first_line_of(&rest[..line_len], "standard input");
    rest[..line_len].zeroize();
    *pos += line_len;
    pw
}

fn from_extpass(cmd: &str) -> Result<SecretString> {
    let mut child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::inherit())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .map_err(|e| source_err(format!("--extpass: cannot run /bin/sh: {e}")))?;
    let out = read_secret(child.stdout.take().expect("piped"), "--extpass");
    let status = child.wait().map_err(|e| source_err(format!("--extpass: {e}")))?;
    if !status.success() {
        return Err(source_err(format!("--extpass program failed ({status})")));
    }
    first_line_of(&out?, "--extpass")
}

/// Opens a password file as ssh opens a private key: it must be a regular file (a FIFO is
/// refused at once instead of blocking until someone writes to it, a pipe from `<(…)` is
/// pointed to --password-stdin or --extpass), and a file that other users may read is
/// named in a warning, since the password in it is theirs too. Checked on the open file.
fn open_passfile(f: &std::path::Path, from: &str) -> Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(f)
        .map_err(|e| source_err(format!("{from}: {e}")))?;
    let meta = file.metadata().map_err(|e| source_err(format!("{from}: {e}")))?;
    if !meta.is_file() {
        return Err(source_err(format!(
            "{from} is {}, not a regular file; for a password from a program or a pipe use --extpass CMD or \
             --password-stdin",
            veilfs_core::sys::type_name(meta.mode())
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o004 != 0 {
        eprintln!(
            "veilfs: warning: {from} is readable by every user of this machine (mode {mode:04o}); chmod 600 {}",
            f.display()
        );
    }
    Ok(file)
}

/// Longest password typed at the prompt.
const TYPED_MAX: usize = 4096;

/// Asks for a password on the terminal (`/dev/tty`): echo is off before the prompt is shown,
/// and the keys go into one fixed, zeroized buffer. Backspace, Ctrl-U and Ctrl-W edit; Ctrl-C
/// puts the terminal back and interrupts; escape sequences (arrow keys) are ignored.
fn prompt(text: &str) -> Result<SecretString> {
    let tty = std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").map_err(|_| {
        source_err("no terminal to ask for the password: use --passfile FILE, --password-stdin or --extpass CMD")
    })?;
    let typed = {
        let _raw = Unechoed::new(tty.as_fd()).map_err(|e| source_err(format!("setting up the terminal: {e}")))?;
        let mut w = &tty;
        w.write_all(text.as_bytes()).and_then(|()| w.flush()).map_err(|e| source_err(format!("the terminal: {e}")))?;
        let typed = read_typed(&tty);
        let _ = w.write_all(b"\n");
        typed
    };
    match typed? {
        Some(buf) => first_line_of(&buf, "the prompt"),
        None => {
            // Ctrl-C: the terminal is back as it was; stop as the key asks.
            process::raise(libc::SIGINT);
            Err(source_err("interrupted"))
        }
    }
}

/// The keys typed up to Enter (`None`: Ctrl-C), edited as they come, in one buffer that is
/// never reallocated and is zeroized when dropped.
fn read_typed(mut tty: &std::fs::File) -> Result<Option<zeroize::Zeroizing<Vec<u8>>>> {
    let mut buf = zeroize::Zeroizing::new(vec![0u8; TYPED_MAX]);
    let mut n = 0;
    let mut key = zeroize::Zeroizing::new([0u8; 1]);
    let mut next = |key: &mut [u8; 1]| -> Result<bool> {
        loop {
            match tty.read(key) {
                Ok(k) => return Ok(k == 1),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(source_err(format!("reading the password: {e}"))),
            }
        }
    };
    while next(&mut key)? {
        match key[0] {
            b'\n' | b'\r' => break,
            0x03 => return Ok(None),
            0x04 if n == 0 => return Err(source_err("no password was typed (end of input)")),
            // Backspace: one character (a UTF-8 lead byte and its continuation bytes).
            0x7f | 0x08 => {
                while n > 0 {
                    n -= 1;
                    let continuation = buf[n] & 0xc0 == 0x80;
                    buf[n] = 0;
                    if !continuation {
                        break;
                    }
                }
            }
            // Ctrl-U: the whole line; Ctrl-W: the last word.
            0x15 => {
                buf[..n].zeroize();
                n = 0;
            }
            0x17 => {
                while n > 0 && buf[n - 1] == b' ' {
                    n -= 1;
                }
                while n > 0 && buf[n - 1] != b' ' {
                    n -= 1;
                    buf[n] = 0;
                }
            }
            // An escape sequence (ESC [ … or ESC O …, ending in 0x40..=0x7e).
            0x1b => {
                if next(&mut key)? && matches!(key[0], b'[' | b'O') {
                    while next(&mut key)? && !(0x40..=0x7e).contains(&key[0]) {}
                }
            }
            b if b < 0x20 => {}
            b => {
                if n == TYPED_MAX {
                    return Err(source_err("the password typed is longer than 4 KiB"));
                }
                buf[n] = b;
                n += 1;
            }
        }
    }
    buf.truncate(n); // truncating never reallocates
    Ok(Some(buf))
}

impl PasswordArgs {
    /// True when a non-interactive source was given.
    pub fn is_given(&self) -> bool {
        self.passfile.is_some() || self.password_stdin || self.extpass.is_some()
    }

    /// Reads one secret (password or recovery key) with `what` in the prompt.
    pub fn read(&self, what: &str) -> Result<SecretString> {
        if let Some(f) = &self.passfile {
            let from = format!("--passfile {}", f.display());
            return first_line_of(&read_secret(open_passfile(f, &from)?, &from)?, &from);
        }
        if self.password_stdin {
            return stdin_line();
        }
        if let Some(cmd) = &self.extpass {
            return from_extpass(cmd);
        }
        prompt(&format!("{what}: "))
    }

    /// Reads a new password: from the given source, or asked twice at the prompt.
    pub fn read_new(&self, what: &str) -> Result<SecretString> {
        if self.is_given() {
            return self.read(what);
        }
        let a = prompt(&format!("{what}: "))?;
        let b = prompt("Repeat: ")?;
        if a.expose_secret() != b.expose_secret() {
            return Err(source_err("the two passwords differ; nothing was changed"));
        }
        Ok(a)
    }
}
