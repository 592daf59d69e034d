//! A directory of this machine mounted through sshfs over loopback: the network file system
//! of the tests that put a vault on one (tests/sync.rs).
//!
//! Why sshfs: it is what a user reaches a vault on another machine with when there is no NFS,
//! and it is a file system veilfs does not control — its own caches, no `flock` shared with
//! the server, no `renameat2` flags. It is served by OpenSSH's `sftp-server` on a port of
//! 127.0.0.1, one server process per connection, and sshfs connects to it directly
//! (`-o directport`): the SFTP protocol and sshfs as over ssh, without an sshd to set up or
//! an ssh encryption layer in between (which changes nothing a file system sees).
//!
//! Without sshfs or sftp-server the tests skip with a message, except under `CI=true`, where
//! they fail (scripts/deps.sh installs both).

use super::{is_root, run, skip, text, which};
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Where Debian (and most distributions) install OpenSSH's SFTP server.
const SFTP_SERVERS: &[&str] =
    &["/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server"];

fn sftp_server() -> Option<&'static str> {
    SFTP_SERVERS.iter().copied().find(|p| Path::new(p).exists())
}

/// Whether sshfs and sftp-server are here. Panics under CI=true when they are not.
pub fn sshfs_available() -> bool {
    if which("sshfs") && sftp_server().is_some() {
        return true;
    }
    skip("sshfs tests need sshfs and OpenSSH's sftp-server (apt-get install sshfs openssh-sftp-server; scripts/deps.sh does)");
    false
}

/// An SFTP server on 127.0.0.1 and one sshfs mount of it; unmounted and stopped on drop.
pub struct Sshfs {
    /// Where the remote directory is mounted.
    pub mnt: PathBuf,
    port: u16,
    stop: Arc<AtomicBool>,
    servers: Arc<Mutex<Vec<Child>>>,
    acceptor: Option<std::thread::JoinHandle<()>>,
    mounted: bool,
}

impl Sshfs {
    /// Mounts `remote` (a directory of this machine) at `mnt` (created) through sshfs with
    /// `opts` (`-o` options). `None` (a skip) without sshfs, except under CI.
    pub fn mount(remote: &Path, mnt: &Path, opts: &[&str]) -> Option<Sshfs> {
        if !sshfs_available() {
            return None;
        }
        let server = sftp_server().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, servers) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let acceptor = {
            let (stop, servers) = (stop.clone(), servers.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    // The server speaks SFTP on its standard input and output: the connection.
                    let fd = OwnedFd::from(conn);
                    let child = Command::new(server)
                        .stdin(Stdio::from(fd.try_clone().unwrap()))
                        .stdout(Stdio::from(fd))
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("starting sftp-server");
                    servers.lock().unwrap().push(child);
                }
            })
        };
        std::fs::create_dir_all(mnt).unwrap();
        let mut sshfs = Sshfs { mnt: mnt.to_path_buf(), port, stop, servers, acceptor: Some(acceptor), mounted: false };
        let mut args = vec![format!("127.0.0.1:{}", remote.display()), mnt.display().to_string()];
        args.extend(["-o".into(), format!("directport={port}")]);
        for o in opts {
            args.extend(["-o".into(), o.to_string()]);
        }
        let o = Command::new("sshfs").args(&args).stdin(Stdio::null()).output().unwrap();
        assert!(o.status.success(), "sshfs {args:?}: {}", text(&o));
        sshfs.mounted = true;
        Some(sshfs)
    }
}

impl Drop for Sshfs {
    fn drop(&mut self) {
        if self.mounted {
            let m = self.mnt.to_str().unwrap();
            let o = run("fusermount3", &["-u", m]);
            if !o.status.success() {
                let _ = if is_root() { run("umount", &["-l", m]) } else { run("fusermount3", &["-uz", m]) };
            }
        }
        // Wake the acceptor so it sees the stop.
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for mut c in self.servers.lock().unwrap().drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
