//! `veilfs`: create, inspect and use encrypted vaults from the command line.

// Every system call goes through `veilfs_core::sys`, the workspace's one `unsafe` module.
#![forbid(unsafe_code)]

mod cmd;
mod exit;
mod helper;
mod interrupt;
mod logging;
mod mountinfo;
mod password;
mod target;

use clap::{Parser, Subcommand};

const ABOUT: &str = "veilfs: an encrypted overlay filesystem.

A vault is an ordinary directory (CIPHERDIR) in which every file is encrypted on its own,
names included; copy, sync or back it up like any folder. Create one with `veilfs init`,
then mount it or use the offline tools (import, export, cat, ls) that need no FUSE.";

#[derive(Parser, Debug)]
#[command(name = "veilfs", version, about = "An encrypted overlay filesystem (FUSE) with offline tools", long_about = ABOUT, after_help = exit::HELP, propagate_version = true)]
struct Cli {
    /// More log output: -v info, -vv debug, -vvv trace (default: warnings and errors). Keys
    /// and plaintext names are never logged.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Only errors: no progress bars, hints or summaries.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new vault in CIPHERDIR (created if missing; must be empty).
    Init(cmd::init::Args),
    /// Mount a vault: a plaintext view of CIPHERDIR at MOUNTPOINT.
    Mount(cmd::mountargs::Args),
    /// Unmount a vault.
    Umount(cmd::mount::UmountArgs),
    /// Show a vault's format, cipher, KDF and key slots (no password needed).
    Info(cmd::info::Args),
    /// Change a password, add or remove a key slot, or reset a password with the recovery key.
    Passwd(cmd::passwd::Args),
    /// Encrypt a plaintext file or tree into the vault (offline; no mount needed).
    Import(cmd::import::Args),
    /// Decrypt a vault (or a path in it) into a plain folder (offline; for recovery too).
    Export(cmd::export::Args),
    /// Print a decrypted file to standard output.
    Cat(cmd::cat::Args),
    /// List a vault directory with decrypted names.
    Ls(cmd::ls::Args),
    /// Check a whole vault (every name, binding, IV and block); --repair fixes crash leftovers.
    Fsck(cmd::fsck::Args),
    /// Convert a vault made without block maps to them, in place (resumable after a crash).
    Upgrade(cmd::upgrade::Args),
    /// List the sync tools' conflict copies in a vault and the names they are shown under.
    Conflicts(cmd::conflicts::Args),
    /// Print the ciphertext path of a plaintext path.
    EncryptPath(cmd::paths::EncryptArgs),
    /// Print the plaintext path of a ciphertext path.
    DecryptPath(cmd::paths::DecryptArgs),
    /// Measure this machine's speed for veilfs's ciphers and key derivation.
    Speed(cmd::speed::Args),
    /// Write man pages or shell completions (for packagers and scripts/install.sh).
    #[command(hide = true)]
    Generate(cmd::generate::Args),
}

/// The command line as `veilfs mount …` when veilfs runs as a mount(8) helper (see
/// `helper`); exits at once for `mount -f`.
fn mount_helper_args() -> Option<Vec<std::ffi::OsString>> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
    names.push("help");
    match helper::invocation(&argv, &names) {
        helper::Invocation::Cli => None,
        helper::Invocation::Fake => std::process::exit(exit::OK),
        helper::Invocation::Mount(args) => Some(args),
    }
}

/// Lets a closed pipe end the process silently, as it ends `ls` or `cat` (Rust ignores
/// SIGPIPE, so every write would instead fail with EPIPE and print "Broken pipe").
fn default_sigpipe() {
    veilfs_core::sys::process::default_signal(libc::SIGPIPE);
}

/// Test builds with `--features failpoints`: arms the crash points named in `FAILPOINTS`
/// (veilfs_core::crash) and makes any panic end the process at once, as `SIGKILL` would.
#[cfg(feature = "failpoints")]
fn arm_crash_points() -> fail::FailScenario<'static> {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("veilfs: crash point: {info}");
        std::process::abort()
    }));
    fail::FailScenario::setup()
}

fn main() {
    #[cfg(feature = "failpoints")]
    let _crash_points = arm_crash_points();
    default_sigpipe();
    let cli = match mount_helper_args() {
        None => Cli::parse(),
        Some(args) => Cli::parse_from(args),
    };
    if matches!(cli.command, Command::Mount(_)) {
        // The mount daemon must not die of a write to a closed pipe (its readiness report
        // to a parent that was killed): errors are handled where they happen.
        veilfs_core::sys::process::ignore_signal(libc::SIGPIPE);
    }
    logging::init(cli.verbose, cli.quiet, !matches!(cli.command, Command::Mount(_)));
    if !matches!(cli.command, Command::Mount(_)) {
        // No core dumps of a process that may hold keys (the mount decides for itself).
        let _ = veilfs_core::sys::process::set_undumpable();
    }
    let result = match cli.command {
        Command::Init(a) => cmd::init::run(a),
        Command::Mount(a) => cmd::mount::run(a),
        Command::Umount(a) => cmd::mount::umount(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Passwd(a) => cmd::passwd::run(a),
        Command::Import(a) => cmd::import::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Cat(a) => cmd::cat::run(a),
        Command::Ls(a) => cmd::ls::run(a),
        Command::Fsck(a) => cmd::fsck::run(a),
        Command::Upgrade(a) => cmd::upgrade::run(a),
        Command::Conflicts(a) => cmd::conflicts::run(a),
        Command::EncryptPath(a) => cmd::paths::encrypt(a),
        Command::DecryptPath(a) => cmd::paths::decrypt(a),
        Command::Speed(a) => cmd::speed::run(a),
        Command::Generate(a) => cmd::generate::run(a, <Cli as clap::CommandFactory>::command()),
    };
    // An import or export stopped by Ctrl-C ends by that signal, as the shell expects.
    interrupt::die_if_interrupted();
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let code = exit::classify(&e);
            eprintln!("veilfs: error: {}", exit::message(&e));
            std::process::exit(code);
        }
    }
}
