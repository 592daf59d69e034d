"""The filesystems under test, as a declarative table.

Adding a filesystem means adding one entry to :func:`registry` that says how
to initialise, mount and unmount it -- never touching the workloads, which
only ever see a :class:`Mount` (a directory to work in, a directory whose
disk usage is the ciphertext, and the daemon's PID if there is one).

FUSE daemons are started in the foreground where the tool allows it, so the
driver owns the process and knows its PID exactly; tools that only daemonise
(veilfs's planned CLI) are found afterwards by their unique mount point in
``/proc/*/cmdline``.  Either way they are stopped by unmounting the path and
then, if needed, killing that one PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from . import fscrypt
from .mounts import force_unmount, wait_mounted
from .proc import (Cleanup, StepError, pid_alive, pids_with_argument, process_cpu_seconds,
                   process_peak_rss_kib, run, which)

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Secrets:
    """Throw-away credentials written once per run (never real secrets)."""
    passfile: Path
    keyfile: Path


@dataclass
class Mount:
    """What a workload gets: where to work, what ``du`` should measure and,
    for FUSE filesystems, the daemon to account CPU and memory to."""
    fs: str
    path: Path
    store: Path
    pid: int | None = None
    proc: subprocess.Popen | None = None
    mountpoint: Path | None = None
    log: Path | None = None
    store_needs_mount: bool = False
    extra: dict = field(default_factory=dict)

    def daemon_cpu(self) -> float | None:
        if self.pid is None or not pid_alive(self.pid):
            return None
        return process_cpu_seconds(self.pid)

    def daemon_peak_rss_kib(self) -> int | None:
        return None if self.pid is None else process_peak_rss_kib(self.pid)


class Filesystem:
    """Base class: a named thing that can be mounted on a fresh directory."""
    name = "?"
    title = "?"
    packages: Sequence[str] = ()
    has_daemon = False

    def unavailable_reason(self) -> str | None:
        return None

    def version(self) -> str:
        return ""

    def mount(self, store: Path, mountpoint: Path, secrets: Secrets, logdir: Path,
              timeout: float, fresh: bool = True, reverse: bool = False) -> Mount:
        """Mount *store* (initialising it first if *fresh*) on *mountpoint*.
        With *reverse*, *store* is a plaintext tree and the mount its
        encrypted read-only view (see :meth:`has_reverse`)."""
        raise NotImplementedError

    def has_reverse(self) -> bool:
        """Whether the filesystem has a reverse mode (an encrypted view of a
        plaintext directory, for backups)."""
        return False

    def fsck_args(self, store: Path, secrets: "Secrets") -> list[str] | None:
        """The command that checks every byte of *store* (None: the tool has none)."""
        return None

    def unmount(self, m: Mount, timeout: float) -> None:
        raise NotImplementedError


class PlainFs(Filesystem):
    """No filesystem at all: the workloads run directly on the backing."""
    name = "plain"
    title = "plain (backing store, no FUSE, no encryption)"

    def mount(self, store, mountpoint, secrets, logdir, timeout, fresh=True, reverse=False):
        return Mount(fs=self.name, path=store, store=store)

    def has_reverse(self):
        # The baseline of the reverse group: the plaintext tree itself.
        return True

    def unmount(self, m, timeout):
        pass


@dataclass(kw_only=True, eq=False)
class FuseFs(Filesystem):
    """A FUSE filesystem described by command templates.

    Templates may use ``{bin}``, ``{store}``, ``{mnt}``, ``{passfile}`` and
    ``{keyfile}``.  ``init`` is run once on the empty store (None if the first
    mount initialises it).  ``reverse_init_cmd`` and ``reverse_mount_cmd``
    (None: no reverse mode) do the same for a reverse view of a plaintext
    store.  With ``foreground`` the mount command is the
    daemon itself; otherwise it must daemonise and exit 0 once the mount is
    live.  ``password_stdin`` feeds the passfile to the daemon's stdin."""
    name: str
    title: str
    binary: str
    mount_cmd: Sequence[str]
    init_cmd: Sequence[str] | None = None
    unmount_cmd: Sequence[str] | None = None
    version_cmd: Sequence[str] | None = None
    #: Offline integrity check of the whole store (unmounted), if the tool has one.
    fsck_cmd: Sequence[str] | None = None
    reverse_init_cmd: Sequence[str] | None = None
    reverse_mount_cmd: Sequence[str] | None = None
    foreground: bool = True
    password_stdin: bool = False
    env: dict = field(default_factory=dict)
    packages: Sequence[str] = ()
    build_hint: str = ""
    has_daemon = True

    def bin_path(self) -> str | None:
        if "/" in self.binary:
            p = Path(self.binary)
            return str(p) if p.is_file() and os.access(p, os.X_OK) else None
        return which(self.binary)

    def unavailable_reason(self) -> str | None:
        if self.bin_path() is None:
            hint = f" ({self.build_hint})" if self.build_hint else ""
            return f"{self.binary} not found{hint}"
        return None

    def version(self) -> str:
        """The Debian package version when it comes from a package (some
        tools print no usable version), else the tool's own first line."""
        if self.packages:
            res = run(["dpkg-query", "-W", "-f", "${Version}", self.packages[0]],
                      timeout=20, check=False)
            if res.returncode == 0 and res.stdout.strip():
                return res.stdout.decode().strip()
        if not self.version_cmd:
            return ""
        res = run(self._fmt(self.version_cmd), timeout=20, check=False)
        text = (res.stdout + res.stderr).decode(errors="replace").strip()
        return text.splitlines()[0] if text else ""

    def _fmt(self, template: Sequence[str], **values) -> list[str]:
        values.setdefault("bin", self.bin_path() or self.binary)
        return [part.format(**values) for part in template]

    def _env(self, logdir: Path) -> dict:
        return {k: v.format(logdir=logdir) for k, v in self.env.items()}

    def init_args(self, reverse: bool = False) -> Sequence[str] | None:
        return self.reverse_init_cmd if reverse else self.init_cmd

    def has_reverse(self) -> bool:
        return self.reverse_mount_cmd is not None

    def fsck_args(self, store: Path, secrets: "Secrets") -> list[str] | None:
        """The command that checks every byte of *store*, or None."""
        if not self.fsck_cmd:
            return None
        return self._fmt(self.fsck_cmd, store=store, passfile=secrets.passfile, keyfile=secrets.keyfile)

    def mount(self, store, mountpoint, secrets, logdir, timeout, fresh=True, reverse=False):
        values = dict(store=store, mnt=mountpoint, passfile=secrets.passfile,
                      keyfile=secrets.keyfile)
        env = self._env(logdir)
        init = self.init_args(reverse) if fresh else None
        if init:
            run(self._fmt(init, **values), timeout=timeout, env=env,
                input=secrets.passfile.read_bytes() if self.password_stdin else None)
        log = logdir / f"{self.name}-{mountpoint.name}.log"
        argv = self._fmt(self.reverse_mount_cmd if reverse else self.mount_cmd, **values)
        full_env = {**os.environ, **env}
        with open(log, "wb") as logf:
            stdin = open(secrets.passfile, "rb") if self.password_stdin else subprocess.DEVNULL
            try:
                proc = subprocess.Popen(argv, stdin=stdin, stdout=logf, stderr=subprocess.STDOUT,
                                        env=full_env, start_new_session=True)
            finally:
                if stdin is not subprocess.DEVNULL:
                    stdin.close()
        m = Mount(fs=self.name, path=mountpoint, store=store, mountpoint=mountpoint, log=log)
        if self.foreground:
            m.proc, m.pid = proc, proc.pid
            try:
                wait_mounted(mountpoint, timeout, proc, log)
            except BaseException:
                self._stop(m, timeout=10)
                raise
            return m
        self._wait_launcher(proc, mountpoint, log, timeout)
        pids = pids_with_argument(str(mountpoint))
        m.pid = pids[0] if pids else None
        return m

    def _wait_launcher(self, proc, mountpoint, log, timeout):
        """Daemonising style: the launcher must exit 0 once the mount is live."""
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            force_unmount(mountpoint)
            raise StepError(f"mount command did not return within {timeout:.0f} s")
        if rc != 0:
            detail = log.read_text(errors="replace").strip()[-400:]
            raise StepError(f"mount command exited {rc}: {detail}")
        try:
            wait_mounted(mountpoint, 2.0, None, log)
        except StepError:
            raise StepError("mount command exited 0 but no mount appeared") from None

    def unmount(self, m, timeout):
        if self.unmount_cmd and m.mountpoint is not None:
            run(self._fmt(self.unmount_cmd, mnt=m.mountpoint), timeout=timeout, check=False)
        self._stop(m, timeout)

    def _stop(self, m: Mount, timeout: float) -> None:
        """Unmount by path, give the daemon time to flush and exit, then kill
        the PID if it is still there."""
        if m.mountpoint is not None and not force_unmount(m.mountpoint, timeout=timeout):
            timeout = 1   # the daemon did not answer: do not wait for it to exit
        if m.proc is not None:
            try:
                m.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait(timeout=10)
        elif m.pid is not None:
            deadline = time.monotonic() + timeout
            while pid_alive(m.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(m.pid):
                os.kill(m.pid, signal.SIGKILL)


class VeilFs(FuseFs):
    """veilfs (``veilfs init|mount|umount|fsck``).

    Key derivation is made cheap with ``veilfs init``'s Argon2 cost options,
    as gocryptfs gets ``-scryptn 10``: no workload measures the KDF, and
    seconds of Argon2 per mount would only slow the suite down."""
    CHEAP_KDF = ("--kdf-memory", "8", "--kdf-iterations", "1")

    def init_args(self, reverse=False):
        return list(super().init_args(reverse)) + list(self.CHEAP_KDF)


def veilfs_entry(name: str, title: str, target: Path, mount_flags: Sequence[str] = (),
                 init_flags: Sequence[str] = ()) -> VeilFs:
    """veilfs's table entry; *mount_flags* and *init_flags* make a variant
    (``--shared-storage``, ``--no-block-map``).  A variant's reverse view would be the plain
    entry's own (the flags are about the forward vault), so only the plain entry has one."""
    reverse = not mount_flags and not init_flags
    return VeilFs(
        name=name, title=title,
        binary=os.environ.get("VEILFS_BIN", str(target / "veilfs")),
        init_cmd=["{bin}", "init", "-q", *init_flags, "{store}", "--passfile", "{passfile}"],
        mount_cmd=["{bin}", "mount", "{store}", "{mnt}", "--passfile", "{passfile}", *mount_flags],
        unmount_cmd=["{bin}", "umount", "{mnt}"],
        version_cmd=["{bin}", "--version"],
        fsck_cmd=["{bin}", "fsck", "-q", "{store}", "--passfile", "{passfile}"],
        reverse_init_cmd=["{bin}", "init", "-q", "--reverse", "{store}", "--passfile", "{passfile}"]
        if reverse else None,
        reverse_mount_cmd=["{bin}", "mount", "--reverse", "{store}", "{mnt}", "--passfile", "{passfile}"]
        if reverse else None,
        # The client state (what each vault's client has seen, docs/FORMAT.md §18) of the
        # run's own vaults stays beside the run's logs, as CryFS's does, never in the
        # machine's ~/.local/state.
        env={"VEILFS_STATE_DIR": "{logdir}/veilfs-state"},
        foreground=False, build_hint="cargo build --release")


class Ext4LoopFs(Filesystem):
    """ext4 on a loop image stored on the backing; optionally with an fscrypt
    (in-kernel, per-file encryption) policy on the working directory.

    The unencrypted variant is the fair floor for fscrypt: both pay for the
    loop device and ext4 on top of the backing store."""
    packages = ("e2fsprogs", "mount")
    IMAGE_SIZE = "6G"

    def __init__(self, encrypt: bool) -> None:
        self.encrypt = encrypt
        self.name = "fscrypt" if encrypt else "ext4-loop"
        self.title = ("fscrypt v2 policy (AES-256-XTS / AES-256-CTS names) on ext4 loop image"
                      if encrypt else "ext4 on a loop image (no encryption; fscrypt's floor)")

    def unavailable_reason(self):
        if not which("mkfs.ext4") or not which("losetup"):
            return "mkfs.ext4/losetup not installed"
        if not Path("/dev/loop-control").exists():
            return "no loop device support (/dev/loop-control missing)"
        if self.encrypt and not Path("/sys/fs/ext4/features/encryption").exists():
            return "kernel ext4 lacks encryption support (CONFIG_FS_ENCRYPTION)"
        return None

    def version(self):
        text = "kernel " + os.uname().release
        if self.encrypt:
            text += f", xts(aes) driver {kernel_crypto_driver('xts(aes)')}"
        return text

    def mount(self, store, mountpoint, secrets, logdir, timeout, fresh=True, reverse=False):
        image = store / "ext4.img"
        if fresh:
            run(["truncate", "-s", self.IMAGE_SIZE, str(image)], timeout=timeout)
            features = ["-O", "encrypt"] if self.encrypt else []
            run(["mkfs.ext4", "-q", "-F", *features, "-E",
                 "lazy_itable_init=0,lazy_journal_init=0", str(image)], timeout=timeout)
        run(["mount", "-o", "loop", str(image), str(mountpoint)], timeout=timeout)
        work = mountpoint / "work"
        # The ciphertext is only reachable through the mount: du must run
        # while mounted (it then sees ciphertext block usage all the same).
        m = Mount(fs=self.name, path=work, store=work, mountpoint=mountpoint,
                  store_needs_mount=True)
        try:
            if fresh:
                work.mkdir()
            if self.encrypt:
                key = secrets.keyfile.read_bytes()[:64]
                identifier = fscrypt.add_key(mountpoint, key)
                if fresh:
                    fscrypt.set_policy(work, identifier)
                m.extra["key_identifier"] = identifier.hex()
        except BaseException:
            force_unmount(mountpoint, timeout)
            raise
        return m

    def unmount(self, m, timeout):
        if self.encrypt and "key_identifier" in m.extra:
            try:
                fscrypt.remove_key(m.mountpoint, bytes.fromhex(m.extra["key_identifier"]))
            except OSError:
                pass  # the unmount below forgets the key anyway
        force_unmount(m.mountpoint, timeout)


def kernel_crypto_driver(name: str) -> str:
    """Which implementation the kernel picked for *name* (e.g. whether
    xts(aes) runs on AES-NI or on the generic C code) -- it decides how fast
    fscrypt can be on this machine."""
    best = ("?", -1)
    current: dict = {}
    for line in Path("/proc/crypto").read_text().splitlines() + [""]:
        if not line.strip():
            if current.get("name") == name and int(current.get("priority", 0)) > best[1]:
                best = (current.get("driver", "?"), int(current.get("priority", 0)))
            current = {}
            continue
        key, _, val = line.partition(":")
        current[key.strip()] = val.strip()
    return best[0]


def registry() -> dict[str, Filesystem]:
    """Every filesystem the suite knows, in report order."""
    target = REPO / "target" / "release"
    entries: list[Filesystem] = [
        PlainFs(),
        FuseFs(name="fuse-floor", title="fuse-floor (no-crypto FUSE passthrough, bench/fuse-floor)",
               binary=os.environ.get("FUSE_FLOOR_BIN", str(target / "fuse-floor")),
               mount_cmd=["{bin}", "--foreground", "{store}", "{mnt}"],
               build_hint="cargo build --release -p fuse-floor"),
        veilfs_entry("veilfs", "veilfs", target),
        # The mount for several writers: no vault lock, nothing cached (1 s timeouts).
        veilfs_entry("veilfs-shared", "veilfs --shared-storage (no lock, caches nothing)", target,
                     mount_flags=["--shared-storage"]),
        # The file format of vaults made before the block map (no rollback detection inside a
        # file): the cost of the map is veilfs's row against this one.
        veilfs_entry("veilfs-v1", "veilfs, vault made with init --no-block-map (v1 files)", target,
                     init_flags=["--no-block-map"]),
        FuseFs(name="gocryptfs", title="gocryptfs (AES-256-GCM, -scryptn 10)", binary="gocryptfs",
               init_cmd=["{bin}", "-init", "-q", "-scryptn", "10", "-passfile", "{passfile}", "{store}"],
               mount_cmd=["{bin}", "-fg", "-q", "-passfile", "{passfile}", "{store}", "{mnt}"],
               fsck_cmd=["{bin}", "-fsck", "-q", "-passfile", "{passfile}", "{store}"],
               reverse_init_cmd=["{bin}", "-init", "-reverse", "-q", "-scryptn", "10", "-passfile",
                                 "{passfile}", "{store}"],
               reverse_mount_cmd=["{bin}", "-reverse", "-fg", "-q", "-passfile", "{passfile}", "{store}",
                                  "{mnt}"],
               version_cmd=["{bin}", "-version"], packages=["gocryptfs"]),
        FuseFs(name="encfs", title="EncFS --standard (AES-192 CBC, 1 KiB blocks)", binary="encfs",
               mount_cmd=["{bin}", "-f", "--standard", "--extpass", "cat {passfile}", "{store}", "{mnt}"],
               version_cmd=["{bin}", "--version"], packages=["encfs"]),
        FuseFs(name="cryfs", title="CryFS (XChaCha20-Poly1305, 16 KiB blocks)", binary="cryfs",
               mount_cmd=["{bin}", "-f", "{store}", "{mnt}"],
               password_stdin=True,
               env={"CRYFS_FRONTEND": "noninteractive", "CRYFS_NO_UPDATE_CHECK": "true",
                    "XDG_DATA_HOME": "{logdir}/cryfs-state"},
               version_cmd=["{bin}", "--version"], packages=["cryfs"]),
        FuseFs(name="securefs", title="securefs lite format (AES-GCM 4 KiB, keyfile)", binary="securefs",
               init_cmd=["{bin}", "create", "--keyfile", "{keyfile}", "{store}"],
               mount_cmd=["{bin}", "mount", "--keyfile", "{keyfile}", "{store}", "{mnt}"],
               version_cmd=["{bin}", "version"], packages=["securefs"]),
        Ext4LoopFs(encrypt=False),
        Ext4LoopFs(encrypt=True),
    ]
    return {fs.name: fs for fs in entries}


def ensure_installed(selected: Sequence[Filesystem], extra_packages: Sequence[str],
                     log) -> str | None:
    """Install the Debian packages of selected filesystems whose tools are
    missing (plus *extra_packages*), with one apt-get call.  Returns an error
    string if apt-get failed, so the affected rows can say why."""
    wanted = [p for fs in selected if fs.unavailable_reason() for p in fs.packages]
    wanted += [p for p in extra_packages]
    if not wanted:
        return None
    log(f"installing missing packages: {' '.join(sorted(set(wanted)))}")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(["apt-get", "install", "-y", "-q", *sorted(set(wanted))], timeout=1200, env=env)
    except StepError as exc:
        return f"apt-get install failed: {exc}"
    return None
