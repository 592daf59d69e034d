//! `fuse-floor`: a minimal, tuned, no-crypto FUSE passthrough built on the
//! same FUSE crate as veilfs (fuser 0.18). It is the baseline veilfs is
//! benchmarked against, so it uses every kernel-side optimisation veilfs can
//! also use (multi-threaded workers with cloned /dev/fuse fds, 1 MiB
//! requests, writeback cache, readdirplus, long cache timeouts, kept page
//! cache) and none it cannot (no FUSE kernel passthrough, no
//! copy_file_range, which would bypass user space entirely).
//!
//! Modules: `options` (command line), `daemon` (fork/readiness/signals),
//! `fs` (the `Filesystem` impl), `inodes` (node id ↔ O_PATH fd table),
//! `dirstream` (directory handles), `attr` (stat conversions), `sys`
//! (syscall wrappers; the only `unsafe` code besides process plumbing).
//!
//! Why its own copy of syscall wrappers and attribute conversion instead of
//! `veilfs_core::sys` and `veilfs-fuse`'s `attr`: the floor is the yardstick.
//! It must not get faster or slower when veilfs's own code changes, and it
//! must not carry veilfs's checks (no-follow fds re-verified by type, acting
//! as the caller, integrity bookkeeping) whose cost is part of what is
//! measured. The shared shapes (`duplicates` lists them) are on purpose.

mod attr;
mod daemon;
mod dirstream;
mod fs;
mod inodes;
mod options;
mod sys;

use std::io;
use std::process::ExitCode;

use fuser::{Config, MountOption, Session, SessionACL};

use crate::fs::{FloorFs, FsOptions};
use crate::options::{Options, Parsed};

fn main() -> ExitCode {
    let opts = match options::parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(opts)) => opts,
        Ok(Parsed::Help) => {
            print!("{}", options::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("fuse-floor: {msg}\n\n{}", options::USAGE);
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fuse-floor: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The fuser session configuration for these options.
fn session_config(opts: &Options, backing: &std::path::Path) -> Config {
    let root = sys::geteuid() == 0;
    let mut mount_options = vec![
        MountOption::FSName(backing.display().to_string()),
        MountOption::Subtype("fuse-floor".into()),
        // Permission checks in the kernel against cached attributes: no
        // ACCESS round trips, and safe with allow_other since the daemon
        // does not switch credentials.
        MountOption::DefaultPermissions,
    ];
    if opts.auto_unmount {
        mount_options.push(MountOption::AutoUnmount);
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    // allow_other when we can (root, or required by auto_unmount).
    config.acl = if root || opts.auto_unmount { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(opts.threads);
    config.clone_fd = opts.clone_fd;
    config
}

fn run(opts: &Options) -> io::Result<()> {
    // Resolve paths before mounting: afterwards, resolving the mountpoint
    // would itself be a request to this very process.
    let mountpoint = opts.mountpoint.canonicalize()?;
    let backing = opts.backing.canonicalize()?;
    let ready_pipe = if opts.foreground { None } else { Some(daemon::daemonize()?) };
    let signals = daemon::block_termination_signals()?;
    // The kernel has already applied the caller's umask to create modes.
    sys::set_umask(0);
    sys::raise_nofile_limit();

    let fs = FloorFs::new(
        &backing,
        FsOptions { ttl: opts.ttl, negative_ttl: opts.negative_ttl, writeback: opts.writeback },
    )?;
    let mut session = Session::new(fs, &mountpoint, &session_config(opts, &backing))?;
    daemon::spawn_signal_handler(signals, session.unmount_callable(), mountpoint.clone())?;

    if let Some(path) = &opts.pid_file {
        std::fs::write(path, format!("{}\n", std::process::id()))?;
    }
    match ready_pipe {
        Some(pipe) => daemon::notify_ready(pipe)?,
        None => eprintln!(
            "fuse-floor: {} mounted at {} ({} threads)",
            backing.display(),
            mountpoint.display(),
            opts.threads
        ),
    }
    session.run()
}
