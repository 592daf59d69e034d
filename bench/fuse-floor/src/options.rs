//! Command-line parsing (hand-rolled: a handful of flags does not justify a
//! parser dependency in a benchmark binary).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
usage: fuse-floor [OPTIONS] BACKING_DIR MOUNTPOINT

Minimal no-crypto FUSE passthrough (fuser 0.18): the floor veilfs is
benchmarked against. By default it daemonizes and returns (exit 0) only once
the mount is live; unmount with `fusermount3 -u MOUNTPOINT`, `umount
MOUNTPOINT` or SIGTERM/SIGINT to the daemon.

options:
  -f, --foreground          stay in the foreground (prints a line to stderr
                            once the mount is live)
      --daemon              daemonize (the default)
      --threads N           worker threads reading /dev/fuse (default: 2 x CPUs,
                            at least 4)
      --no-clone-fd         share one /dev/fuse fd between workers instead of
                            one cloned fd each
      --no-writeback        disable the kernel writeback cache
      --attr-timeout SECS   attribute and entry cache timeout (default 1)
      --negative-timeout SECS
                            cache time for failed lookups (default: the attr
                            timeout; 0 disables)
      --auto-unmount        let fusermount3 unmount if the daemon dies (adds
                            allow_other; mounts through fusermount3)
      --pid-file PATH       write the daemon's pid to PATH before reporting
                            readiness
  -h, --help                show this help
";

/// Parsed command line.
#[derive(Debug, Clone)]
pub struct Options {
    pub backing: PathBuf,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub threads: usize,
    pub clone_fd: bool,
    pub writeback: bool,
    pub ttl: Duration,
    pub negative_ttl: Duration,
    pub auto_unmount: bool,
    pub pid_file: Option<PathBuf>,
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    Run(Options),
    Help,
}

fn default_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (2 * cpus).max(4)
}

fn seconds(flag: &str, value: Option<OsString>) -> Result<Duration, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    let text = value.to_string_lossy();
    let secs: f64 = text.parse().map_err(|_| format!("{flag}: not a number of seconds: {text}"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{flag}: out of range: {text}"))
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, String> {
    let mut args = args.into_iter();
    let mut positional = Vec::new();
    let mut foreground = false;
    let mut threads = None;
    let mut clone_fd = true;
    let mut writeback = true;
    let mut ttl = Duration::from_secs(1);
    let mut negative_ttl = None;
    let mut auto_unmount = false;
    let mut pid_file = None;
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("-h" | "--help") => return Ok(Parsed::Help),
            Some("-f" | "--foreground") => foreground = true,
            Some("--daemon") => foreground = false,
            Some("--threads") => {
                let v = args.next().ok_or("--threads needs a value")?;
                let n: usize = v.to_string_lossy().parse().map_err(|_| "--threads: not a number".to_string())?;
                if n == 0 {
                    return Err("--threads must be at least 1".into());
                }
                threads = Some(n);
            }
            Some("--no-clone-fd") => clone_fd = false,
            Some("--no-writeback") => writeback = false,
            Some("--attr-timeout") => ttl = seconds("--attr-timeout", args.next())?,
            Some("--negative-timeout") => negative_ttl = Some(seconds("--negative-timeout", args.next())?),
            Some("--auto-unmount") => auto_unmount = true,
            Some("--pid-file") => pid_file = Some(PathBuf::from(args.next().ok_or("--pid-file needs a value")?)),
            Some("--") => positional.extend(args.by_ref()),
            Some(s) if s.starts_with('-') && s.len() > 1 => {
                return Err(format!("unknown option {s}"));
            }
            _ => positional.push(arg),
        }
    }
    let [backing, mountpoint]: [OsString; 2] =
        positional.try_into().map_err(|_| "expected exactly BACKING_DIR and MOUNTPOINT".to_string())?;
    Ok(Parsed::Run(Options {
        backing: backing.into(),
        mountpoint: mountpoint.into(),
        foreground,
        threads: threads.unwrap_or_else(default_threads),
        clone_fd,
        writeback,
        ttl,
        negative_ttl: negative_ttl.unwrap_or(ttl),
        auto_unmount,
        pid_file,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, String> {
        match parse(args.iter().map(OsString::from))? {
            Parsed::Run(o) => Ok(o),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults() {
        let o = run(&["/b", "/m"]).unwrap();
        assert!(!o.foreground && o.writeback && o.clone_fd);
        assert_eq!(o.ttl, Duration::from_secs(1));
        assert_eq!(o.negative_ttl, o.ttl);
        assert!(o.threads >= 4);
    }

    #[test]
    fn flags() {
        let o = run(&[
            "--foreground",
            "--threads",
            "3",
            "--no-writeback",
            "--attr-timeout",
            "0.5",
            "--negative-timeout",
            "0",
            "/b",
            "/m",
        ])
        .unwrap();
        assert!(o.foreground && !o.writeback);
        assert_eq!(o.threads, 3);
        assert_eq!(o.ttl, Duration::from_millis(500));
        assert!(o.negative_ttl.is_zero());
    }

    #[test]
    fn errors() {
        assert!(run(&["/b"]).is_err());
        assert!(run(&["--bogus", "/b", "/m"]).is_err());
        assert!(run(&["--threads", "0", "/b", "/m"]).is_err());
    }
}
