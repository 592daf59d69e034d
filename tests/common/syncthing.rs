//! Two Syncthing instances on 127.0.0.1 that share one folder: the real sync client a vault
//! in a synced folder lives with (tests/sync.rs).
//!
//! Why the real client: what a sync tool leaves in the folder (its marker, temporary files,
//! conflict copies), the order in which files arrive and when a lock file travels are what
//! veilfs must cope with; a copy loop written here would test only our idea of them.
//!
//! Each instance has its own home (config, keys, database) in a directory of the test, its
//! REST API on a free port of 127.0.0.1 with a known API key, and listens for the other on
//! 127.0.0.1 only, at an address the other is told. Global and local discovery, relays, NAT
//! traversal, usage and crash reporting and upgrades are off: nothing leaves the machine.
//! The shared folder is send-receive, watched (inotify, 1 s delay) and rescanned every
//! 10 s. Both processes (each its own process group) are killed when the pair is dropped,
//! also when the test panics, and die with the test thread that started them if the test
//! binary is killed.
//!
//! Without the `syncthing` binary the tests skip with a message, except under `CI=true`,
//! where they fail (scripts/deps.sh installs it).

use super::{skip, text, which};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The id of the shared folder on both sides.
pub const FOLDER: &str = "vault";
const API_KEY: &str = "veilfs-test-api-key";

/// Whether the `syncthing` binary is here. Panics under CI=true when it is not.
pub fn syncthing_available() -> bool {
    if which("syncthing") {
        return true;
    }
    skip("sync tests need syncthing (apt-get install syncthing; scripts/deps.sh does)");
    false
}

/// One Syncthing instance.
pub struct Peer {
    pub name: &'static str,
    /// Its device id.
    pub id: String,
    /// Its copy of the shared folder.
    pub dir: PathBuf,
    home: PathBuf,
    gui: u16,
    listen: u16,
    child: Option<Child>,
}

/// Two instances, A and B, that share [`FOLDER`].
pub struct SyncPair {
    pub a: Peer,
    pub b: Peer,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Sets the text of the first element `<tag>…</tag>` of `xml`; it must be there.
fn set_element(xml: &mut String, tag: &str, value: &str) {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let start = xml.find(&open).unwrap_or_else(|| panic!("syncthing config without <{tag}>")) + open.len();
    let end = start + xml[start..].find(&close).unwrap();
    xml.replace_range(start..end, value);
}

/// Sets the first attribute `name="…"` of `xml`; it must be there.
fn set_attribute(xml: &mut String, name: &str, value: &str) {
    let key = format!(" {name}=\"");
    let start = xml.find(&key).unwrap_or_else(|| panic!("syncthing config without {name}")) + key.len();
    let end = start + xml[start..].find('"').unwrap();
    xml.replace_range(start..end, value);
}

/// The first element `<tag …>…</tag>` of `xml` at or after `from`: its byte range.
fn element(xml: &str, tag: &str, from: usize) -> std::ops::Range<usize> {
    let start = from + xml[from..].find(&format!("<{tag} ")).unwrap_or_else(|| panic!("no <{tag}> in config"));
    let close = format!("</{tag}>");
    start..start + xml[start..].find(&close).unwrap() + close.len()
}

impl Peer {
    /// Makes its home with `syncthing generate` (keys and a config of this version's layout).
    fn generate(name: &'static str, work: &Path, dir: &Path) -> Peer {
        let home = work.join(format!("syncthing-{name}"));
        let o = Command::new("syncthing")
            .args(["generate", "--no-default-folder", "--skip-port-probing", "--home"])
            .arg(&home)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "syncthing generate: {}", text(&o));
        let out = text(&o);
        let id = out.lines().find_map(|l| l.split_once("Device ID: ")).map(|(_, id)| id.trim().to_string());
        let id = id.unwrap_or_else(|| panic!("no device id from syncthing generate: {out}"));
        Peer { name, id, dir: dir.to_path_buf(), home, gui: free_port(), listen: free_port(), child: None }
    }

    /// Rewrites the generated config: both devices at their 127.0.0.1 addresses, the shared
    /// folder, and everything that would reach beyond this machine off.
    fn configure(&self, peers: [&Peer; 2]) {
        let path = self.home.join("config.xml");
        let mut xml = std::fs::read_to_string(&path).unwrap();
        // The folder from the template the generated config carries for new folders (all of
        // this version's fields with their defaults), shared by both devices.
        let defaults = xml.find("<defaults>").expect("syncthing config without <defaults>");
        let mut folder = xml[element(&xml, "folder", defaults)].to_string();
        let own = element(&folder, "device", 0);
        let devices: String =
            peers.iter().map(|p| format!(r#"<device id="{}" introducedBy=""></device>"#, p.id)).collect();
        folder.replace_range(own, &devices);
        set_attribute(&mut folder, "id", FOLDER);
        set_attribute(&mut folder, "label", FOLDER);
        set_attribute(&mut folder, "path", self.dir.to_str().unwrap());
        set_attribute(&mut folder, "type", "sendreceive");
        set_attribute(&mut folder, "rescanIntervalS", "10");
        set_attribute(&mut folder, "fsWatcherEnabled", "true");
        set_attribute(&mut folder, "fsWatcherDelayS", "1");
        // Both devices; only B dials, A at the one address it listens on (A knows B as
        // "dynamic", which without discovery it never dials). When both dialed at once, both
        // connections could hang in the Hello exchange until its 20 s timeout (seen once in
        // CI, Syncthing 1.19), and the pair came up too late.
        let mine = element(&xml, "device", 0);
        let devices: String = peers
            .iter()
            .map(|p| {
                let address = if self.name == "a" && p.name != "a" {
                    "dynamic".to_string()
                } else {
                    format!("tcp://127.0.0.1:{}", p.listen)
                };
                format!(
                    r#"<device id="{}" name="{}" compression="metadata" introducer="false" skipIntroductionRemovals="false" introducedBy=""><address>{address}</address><paused>false</paused><autoAcceptFolders>false</autoAcceptFolders></device>"#,
                    p.id, p.name
                )
            })
            .collect();
        xml.replace_range(mine, &format!("{folder}{devices}"));
        for (tag, value) in [
            ("listenAddress", format!("tcp://127.0.0.1:{}", self.listen).as_str()),
            ("globalAnnounceEnabled", "false"),
            ("localAnnounceEnabled", "false"),
            ("relaysEnabled", "false"),
            ("natEnabled", "false"),
            ("startBrowser", "false"),
            ("urAccepted", "-1"),
            ("autoUpgradeIntervalH", "0"),
            ("crashReportingEnabled", "false"),
            ("reconnectionIntervalS", "1"),
            ("setLowPriority", "false"),
        ] {
            set_element(&mut xml, tag, value);
        }
        std::fs::write(&path, xml).unwrap();
    }

    fn start(&mut self) {
        use std::os::unix::process::CommandExt;
        let log = std::fs::File::create(self.home.join("syncthing.log")).unwrap();
        let mut cmd = Command::new("syncthing");
        cmd.args(["serve", "--no-browser", "--no-restart", "--no-upgrade", "--logflags=3", "--home"])
            .arg(&self.home)
            .arg(format!("--gui-address=http://127.0.0.1:{}", self.gui))
            .arg(format!("--gui-apikey={API_KEY}"))
            // Without it syncthing runs as a monitor that restarts a second process of its
            // own, which a SIGKILL of the first would leave running: this is the one that syncs.
            .env("STMONITORED", "1")
            .env("STNOUPGRADE", "1")
            .env("STNODEFAULTFOLDER", "1")
            .env("HOME", &self.home)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self.child = Some(cmd.spawn().expect("starting syncthing"));
    }

    /// The last lines of its log (for failure messages).
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.home.join("syncthing.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// One REST call: the status code and the body.
    fn http(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.gui))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        // HTTP/1.0: the answer is the rest of the stream, never chunked.
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nX-API-Key: {API_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.gui,
            body.len()
        )?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
        let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        Ok((code, body.to_string()))
    }

    fn call(&self, method: &str, path: &str, body: &str) -> String {
        let (code, text) =
            self.http(method, path, body).unwrap_or_else(|e| panic!("syncthing {}: {method} {path}: {e}", self.name));
        assert!(code / 100 == 2, "syncthing {}: {method} {path}: HTTP {code}: {text}", self.name);
        text
    }

    /// GET a REST endpoint, as JSON.
    pub fn get(&self, path: &str) -> Value {
        serde_json::from_str(&self.call("GET", path, "")).unwrap()
    }

    /// POST to a REST endpoint (body ignored).
    pub fn post(&self, path: &str) {
        self.call("POST", path, "");
    }

    /// PATCH a REST endpoint with a JSON object.
    pub fn patch(&self, path: &str, body: &Value) {
        self.call("PATCH", path, &body.to_string());
    }

    /// The shared folder's state as this side sees it (`/rest/db/status`).
    pub fn status(&self) -> Value {
        self.get(&format!("/rest/db/status?folder={FOLDER}"))
    }

    /// The device that made the global version of `file` (a path in the folder), by its
    /// short id, as this side knows it (`/rest/db/file`).
    pub fn modified_by(&self, file: &str) -> String {
        let v = self.get(&format!("/rest/db/file?folder={FOLDER}&file={file}"));
        v["global"]["modifiedBy"].as_str().unwrap_or_else(|| panic!("no modifiedBy for {file}: {v}")).to_string()
    }

    /// Its short device id, as [`modified_by`](Self::modified_by) names devices.
    pub fn short_id(&self) -> &str {
        &self.id[..7]
    }

    /// Scans the shared folder now; returns when the scan is done.
    pub fn scan(&self) {
        self.post(&format!("/rest/db/scan?folder={FOLDER}"));
    }

    /// Whether it is connected to `other`.
    pub fn connected_to(&self, other: &Peer) -> bool {
        self.get("/rest/system/connections")["connections"][&other.id]["connected"].as_bool() == Some(true)
    }

    /// How complete `other`'s copy is, by what this side knows of it (`/rest/db/completion`).
    fn completion(&self, other: &Peer) -> Value {
        self.get(&format!("/rest/db/completion?folder={FOLDER}&device={}", other.id))
    }

    fn wait_up(&self, deadline: Instant) {
        while self.http("GET", "/rest/system/ping", "").map(|(c, _)| c).ok() != Some(200) {
            assert!(Instant::now() < deadline, "syncthing {} did not start:\n{}", self.name, self.log_tail());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Its process group, in case it started helpers of its own.
            // SAFETY: kill(2) of a process group this test made; no memory involved.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl SyncPair {
    /// Starts A syncing `dir_a` and B syncing `dir_b` (each created if missing; A's may
    /// already hold a vault, whose files then go to B), with their homes under `work`, and
    /// waits until they are connected. `None` (a skip) without syncthing, except under CI.
    pub fn start(work: &Path, dir_a: &Path, dir_b: &Path) -> Option<SyncPair> {
        if !syncthing_available() {
            return None;
        }
        std::fs::create_dir_all(dir_a).unwrap();
        std::fs::create_dir_all(dir_b).unwrap();
        let mut pair = SyncPair { a: Peer::generate("a", work, dir_a), b: Peer::generate("b", work, dir_b) };
        pair.a.configure([&pair.a, &pair.b]);
        pair.b.configure([&pair.a, &pair.b]);
        pair.a.start();
        pair.b.start();
        let deadline = Instant::now() + Duration::from_secs(30);
        pair.a.wait_up(deadline);
        pair.b.wait_up(deadline);
        pair.wait_connected(true, deadline);
        Some(pair)
    }

    fn wait_connected(&self, want: bool, deadline: Instant) {
        while self.a.connected_to(&self.b) != want || self.b.connected_to(&self.a) != want {
            assert!(
                Instant::now() < deadline,
                "syncthing: A and B not {} in time\nA:\n{}\nB:\n{}",
                if want { "connected" } else { "disconnected" },
                self.a.log_tail(),
                self.b.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Scans both sides now, then waits (at most `budget`) until both hold the same
    /// version of every file: connected, idle, nothing needed, no pull errors, each sees
    /// the other 100 % complete, and the same global totals on both sides — twice in a
    /// row, 300 ms apart. Panics with both sides' state and logs when it does not happen.
    pub fn wait_in_sync(&self, budget: Duration) {
        let deadline = Instant::now() + budget;
        self.a.scan();
        self.b.scan();
        let mut stable = 0;
        let mut last = String::new();
        while stable < 2 {
            assert!(
                Instant::now() < deadline,
                "syncthing: not in sync after {budget:?}: {last}\nA:\n{}\nB:\n{}",
                self.a.log_tail(),
                self.b.log_tail()
            );
            std::thread::sleep(Duration::from_millis(300));
            let (sa, sb) = (self.a.status(), self.b.status());
            let (ca, cb) = (self.a.completion(&self.b), self.b.completion(&self.a));
            let side_ok = |s: &Value| {
                s["state"] == "idle" && s["needTotalItems"] == 0 && s["pullErrors"] == 0 && s["errors"] == 0
            };
            let same_global = ["globalTotalItems", "globalBytes", "globalDeleted"].iter().all(|k| sa[*k] == sb[*k]);
            let ok = side_ok(&sa)
                && side_ok(&sb)
                && ca["completion"] == 100.0
                && cb["completion"] == 100.0
                && ca["needItems"] == 0
                && cb["needItems"] == 0
                && same_global
                && self.a.connected_to(&self.b)
                && self.b.connected_to(&self.a);
            stable = if ok { stable + 1 } else { 0 };
            last = format!("A status {sa}\nB status {sb}\nA's view of B {ca}\nB's view of A {cb}");
        }
    }

    /// Stops syncing: each side pauses the other device (the connection closes, local
    /// changes stay local), and waits until they are disconnected.
    pub fn pause(&self) {
        self.a.post(&format!("/rest/system/pause?device={}", self.b.id));
        self.b.post(&format!("/rest/system/pause?device={}", self.a.id));
        self.wait_connected(false, Instant::now() + Duration::from_secs(30));
    }

    /// Syncs again after [`pause`](Self::pause), once reconnected.
    pub fn resume(&self) {
        self.a.post(&format!("/rest/system/resume?device={}", self.b.id));
        self.b.post(&format!("/rest/system/resume?device={}", self.a.id));
        self.wait_connected(true, Instant::now() + Duration::from_secs(30));
    }
}
