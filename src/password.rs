//! Where passwords come from: a prompt, a file, stdin or an external program, in the
//! conventions of gocryptfs and cryptsetup. Passwords live in `SecretString`s (zeroized).

use crate::exit::{Exit, PASSWORD_SOURCE};
use anyhow::Result;
use secrecy::{ExposeSecret, SecretString};
use std::io::{BufRead, IsTerminal};
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

/// First line of `text` without the line ending, as a secret; rejects empty passwords.
fn first_line(mut text: String, from: &str) -> Result<SecretString> {
    let line_end = text.find(['\n', '\r']).unwrap_or(text.len());
    let pw: String = text[..line_end].to_string();
    text.zeroize();
    if pw.is_empty() {
        return Err(source_err(format!("the password from {from} is empty")));
    }
    Ok(SecretString::from(pw))
}

/// Lines read from stdin so far (so `passwd` can take old and new password as two lines).
static STDIN_LINES: std::sync::Mutex<Option<std::collections::VecDeque<String>>> = std::sync::Mutex::new(None);

/// Next line of standard input.
fn stdin_line() -> Result<SecretString> {
    let mut guard = STDIN_LINES.lock().expect("stdin lock");
    let lines = guard.get_or_insert_with(|| std::io::stdin().lock().lines().map_while(|l| l.ok()).collect());
    let line = lines.pop_front().ok_or_else(|| source_err("standard input has no (more) password lines"))?;
    first_line(line, "standard input")
}

fn from_extpass(cmd: &str) -> Result<SecretString> {
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| source_err(format!("--extpass: cannot run /bin/sh: {e}")))?;
    if !out.status.success() {
        return Err(source_err(format!("--extpass program failed ({})", out.status)));
    }
    let text =
        String::from_utf8(out.stdout).map_err(|_| source_err("--extpass printed a password that is not UTF-8"))?;
    first_line(text, "--extpass")
}

fn prompt(text: &str) -> Result<SecretString> {
    if !std::io::stdin().is_terminal() && std::fs::File::open("/dev/tty").is_err() {
        return Err(source_err(
            "no terminal to ask for the password: use --passfile FILE, --password-stdin or --extpass CMD",
        ));
    }
    let pw = rpassword::prompt_password(text).map_err(|e| source_err(format!("reading the password: {e}")))?;
    first_line(pw, "the prompt")
}

impl PasswordArgs {
    /// True when a non-interactive source was given.
    pub fn is_given(&self) -> bool {
        self.passfile.is_some() || self.password_stdin || self.extpass.is_some()
    }

    /// Reads one secret (password or recovery key) with `what` in the prompt.
    pub fn read(&self, what: &str) -> Result<SecretString> {
        if let Some(f) = &self.passfile {
            let text =
                std::fs::read_to_string(f).map_err(|e| source_err(format!("--passfile {}: {e}", f.display())))?;
            return first_line(text, &format!("--passfile {}", f.display()));
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
