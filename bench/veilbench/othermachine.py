"""Another machine writing into a synced folder while a group runs (``warm-sync``).

A vault in a synced folder (Syncthing, Dropbox, Nextcloud) gets another machine's changes
while its mount is in use: a sync tool writes them into the store, under a temporary name
renamed into place, and deletes what was deleted there.  A mount that caches must notice
(veilfs's locked mount watches its store with inotify), and the question the ``warm-sync``
group answers is what that costs a warm tree walk, and how soon the change shows.

"The other machine" is a copy of the store, taken once the tree is in place and mounted
with the same filesystem on its own (its own lock, as a second machine has): the writer
changes plaintext files through that mount, so what arrives is ciphertext the measured
mount can read, and ``rsync -d --delete`` delivers each changed directory's ciphertext into
the measured store, as a sync tool does.  plain gets the very same: a copy of its tree,
changed directly, and delivered by the same rsync -- the same files, the same renames.

The writer is a child process (``python -m veilbench.othermachine``), so its Python work
never shares a GIL with the driver's timing; it is stopped by PID (its process group: an
rsync it started goes too) and counts its changes in a status file the driver reads
before and after each timed step.

The other machine gets CPUs of its own (:func:`split_cpus`: half of them; on a 2-core host
one each).  Its mount's daemon and the writer run only there, and this machine's side -- the
driver, the timed commands, the measured mount's daemon and the sync tool's deliveries into
the measured store -- only on the rest.  Without the split, the other machine's work (a
second FUSE daemon encrypting and fsyncing every change, for veilfs; a plain write, for
plain) ran on the measured cores and was charged to the measured filesystem's row.  Every
filesystem gets the same split, so the rows still compare side by side.

This needs a store where one plaintext directory is one ciphertext directory (veilfs,
gocryptfs, EncFS, securefs, a passthrough): a directory's change is then found in one
directory of the store (:func:`cipher_dir`).  A filesystem whose store is a loop image, or
whose blocks are spread over the store (CryFS), has no such directory: its rows read n/a.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .backing import remove_tree
from .mounts import is_mounted
from .proc import StepError, kill_group, run
from .session import MountSession

#: How often the writer changes files and delivers them: a sync tool on a busy folder.
INTERVAL = 0.2
#: Files of its own the writer keeps per directory; past this it deletes the oldest.
KEEP = 4
#: How long a change may take to show in the measured mount before it counts as unseen.
FRESH_LIMIT = 30.0
#: How often the measured mount is looked at for a delivered change.
POLL = 0.05
PROBE = ".veilbench-probe"


class NotSynced(Exception):
    """The filesystem's store has no one directory per plaintext directory."""


@dataclass(frozen=True)
class Delivery:
    """One directory the other machine changes: *plain* in its mount, *source* its
    ciphertext in its store, *target* the same directory in the measured store."""
    plain: Path
    source: Path
    target: Path

    def args(self) -> list[str]:
        return [str(self.plain), str(self.source), str(self.target)]


def deliver(d: Delivery, timeout: float = 60, cpus: frozenset[int] | None = None) -> None:
    """What a sync tool does with one changed directory: new and changed files written
    under a temporary name and renamed into place, removed ones deleted; its
    subdirectories untouched (``-d``: the directory's own entries only).  The sync tool
    runs on the measured machine: *cpus* are that machine's (None: wherever the caller runs)."""
    argv = ["rsync", "-d", "-lptgoD", "--delete", f"{d.source}/", f"{d.target}/"]
    if cpus is not None:
        argv = ["taskset", "-c", cpu_list(cpus), *argv]
    run(argv, timeout=timeout)


@dataclass(frozen=True)
class CpuSplit:
    """The measured machine's CPUs and the other machine's (disjoint)."""
    here: frozenset[int]
    other: frozenset[int]


def split_cpus(available: set[int] | None = None) -> CpuSplit | None:
    """The CPUs this process may use, split in two: the first half (rounded up) for the
    measured machine, the rest for the other machine.  None on a single CPU: then both
    share it, as before."""
    cpus = sorted(os.sched_getaffinity(0) if available is None else available)
    if len(cpus) < 2:
        return None
    cut = (len(cpus) + 1) // 2
    return CpuSplit(here=frozenset(cpus[:cut]), other=frozenset(cpus[cut:]))


def cpu_list(cpus: frozenset[int]) -> str:
    """*cpus* as taskset(1) and the writer's command line spell them: ``0,2,3``."""
    return ",".join(str(c) for c in sorted(cpus))


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of *pid* (a FUSE daemon runs several) allowed only *cpus*; threads it
    starts later inherit that.  A thread that ended meanwhile is skipped."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass


def write_file(path: Path, data: bytes) -> None:
    """Write *path* durably: its ciphertext is complete in the store before a delivery."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _entry_counts(cipher: Path) -> dict[Path, int]:
    return {Path(e.path): len(os.listdir(e.path)) for e in os.scandir(cipher)
            if e.is_dir(follow_symlinks=False)}


def cipher_dir(plain_root: Path, cipher_root: Path, rel: Path) -> Path:
    """The ciphertext directory of the plaintext directory *rel* (below *plain_root*, a
    mount of the store *cipher_root*), found one level at a time: a probe file created in
    the plaintext directory must add entries to exactly one subdirectory of the ciphertext
    directory found so far.  Entry counts, not times: a directory changed twice within one
    clock tick keeps its modification time."""
    plain, cipher = plain_root, cipher_root
    for part in rel.parts:
        plain = plain / part
        before = _entry_counts(cipher)
        write_file(plain / PROBE, b"probe\n")
        after = _entry_counts(cipher)
        (plain / PROBE).unlink()
        changed = [d for d, n in after.items() if n != before.get(d)]
        if len(changed) != 1:
            raise NotSynced(f"a file created in one directory added entries to {len(changed)} "
                            "directories of the store, not one: no directory a sync tool "
                            "could deliver on its own")
        cipher = changed[0]
    return cipher


class OtherMachine:
    """The copy of a store, mounted, and the writer process working in it.

    ``start`` copies and mounts; every resource is registered with the run's cleanup the
    moment it exists, and ``stop`` releases them in reverse order (also after a failure)."""

    def __init__(self, session, store: Path, main_root: Path, logdir: Path) -> None:
        self.session = session            # the measured mount's MountSession
        self.store = store                # the measured store
        self.main_root = main_root        # the measured mount's root
        self.logdir = logdir
        self.copy = store.parent / f"{store.name}-other"
        self.mnt = session.mountpoint.parent / f"{session.mountpoint.name}-other"
        self.status = logdir / f"{self.mnt.name}-writer.status"
        self.root: Path | None = None     # the other machine's view of the tree
        self.other = None                 # its MountSession
        self.writer: subprocess.Popen | None = None
        self.tokens: list[int] = []
        self.cpus: CpuSplit | None = None

    def copy_store(self, timeout: float) -> None:
        """Run while the measured filesystem is unmounted: the other machine's copy."""
        cleanup = self.session.cleanup
        self.tokens.append(cleanup.push(f"rm -r {self.copy}", lambda: remove_tree(self.copy)))
        run(["cp", "-a", str(self.store), str(self.copy)], timeout=timeout)

    def mount(self) -> None:
        s = self.session
        self.mnt.mkdir()
        self.tokens.append(s.cleanup.push(f"rmdir {self.mnt}", self._remove_mountpoint))
        self.other = MountSession(s.fs, self.copy, self.mnt, s.secrets, s.logdir, s.timeout,
                                  s.cleanup, reverse=False)
        m = self.other.open(fresh=False)
        self.root = m.path
        self.copy_root = m.store

    def split(self, cpus: CpuSplit | None) -> None:
        """Gives the other machine *cpus.other* (its mount's daemon now, the writer when it
        starts) and leaves *cpus.here* to the caller; see the module's docstring."""
        self.cpus = cpus
        pid = self.other.mount.pid if self.other is not None and self.other.mount else None
        if cpus is not None and pid is not None:
            pin_process(pid, cpus.other)

    def _remove_mountpoint(self) -> None:
        if not is_mounted(self.mnt):
            self.mnt.rmdir()

    def delivery(self, rel: Path) -> Delivery:
        """The other machine's directory *rel* (relative to the tree's root) and where its
        ciphertext goes in the measured store."""
        source = cipher_dir(self.root, self.copy_root, rel)
        return Delivery(plain=self.root / rel, source=source,
                        target=self.store / source.relative_to(self.copy_root))

    def start_writer(self, deliveries: list[Delivery]) -> None:
        """The writer: every INTERVAL, in each directory, a file created, one replaced and
        (past KEEP) the oldest deleted, then each directory delivered."""
        log = open(self.logdir / f"{self.mnt.name}-writer.log", "wb")
        argv = [sys.executable, "-m", "veilbench.othermachine", str(self.status), str(INTERVAL),
                cpu_list(self.cpus.here) if self.cpus else "-",
                *[a for d in deliveries for a in d.args()]]
        other_cpus = self.cpus.other if self.cpus else None
        try:
            self.writer = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[1],
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                           start_new_session=True,
                                           preexec_fn=(lambda: os.sched_setaffinity(0, other_cpus))
                                           if other_cpus else None)
        finally:
            log.close()
        writer = self.writer
        self.tokens.append(self.session.cleanup.push(f"kill writer {writer.pid}",
                                                     lambda: kill_group(writer)))
        deadline = time.monotonic() + 30
        while self.changes() == 0:   # the first delivery made: the walks see a live folder
            self.check()
            if time.monotonic() > deadline:
                raise StepError("the other machine's writer made no change within 30 s")
            time.sleep(POLL)

    def changes(self) -> int:
        """Changes the writer has delivered so far."""
        try:
            return int(self.status.read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return 0

    def check(self) -> None:
        """Fails the step if the writer stopped (a write or a delivery failed)."""
        if self.writer is not None and self.writer.poll() is not None:
            log = self.logdir / f"{self.mnt.name}-writer.log"
            tail = log.read_text(errors="replace").strip()[-300:] if log.exists() else ""
            raise StepError(f"the other machine's writer exited {self.writer.returncode}: {tail}")

    def freshness(self, d: Delivery, name: str) -> float | None:
        """Seconds from the delivery of a new file in *d* until the measured mount shows
        it, by name and in its directory's listing (None: not within FRESH_LIMIT).  The
        mount is asked first, so the kernel may remember the name as absent and the listing
        without it: the case a cache must not keep."""
        seen_dir = self.main_root / d.plain.relative_to(self.root)
        seen = seen_dir / name
        if seen.exists():
            raise StepError(f"{name} exists before the other machine wrote it")
        os.listdir(seen_dir)
        write_file(d.plain / name, b"written by the other machine\n")
        deliver(d, cpus=self.cpus.here if self.cpus else None)
        start = time.monotonic()
        while time.monotonic() - start < FRESH_LIMIT:
            if seen.exists() and name in os.listdir(seen_dir):
                return time.monotonic() - start
            time.sleep(POLL)
        return None

    def stop(self) -> None:
        """Writer killed by PID, the copy unmounted and deleted (reverse order)."""
        cleanup = self.session.cleanup
        writer_token = self.tokens.pop() if self.writer is not None else None
        if writer_token is not None:
            cleanup.release(writer_token)
        if self.other is not None:
            self.other.close()
        while self.tokens:
            cleanup.release(self.tokens.pop())


# ------------------------------------------------------------------ the writer process

def write_loop(status: Path, interval: float, deliveries: list[Delivery],
               deliver_on: frozenset[int] | None = None) -> None:
    """The other machine at work until killed (see :meth:`OtherMachine.start_writer`);
    its deliveries run on *deliver_on*, the measured machine's CPUs."""
    mine: dict[Delivery, list[Path]] = {d: [] for d in deliveries}
    changes = tick = 0
    while True:
        start = time.monotonic()
        tick += 1
        for d in deliveries:
            changes += _change(d, mine[d], tick)
            deliver(d, cpus=deliver_on)
            tmp = status.with_suffix(".tmp")   # counted once delivered
            tmp.write_text(f"{changes} {tick}\n")
            os.replace(tmp, status)
        time.sleep(max(0.0, interval - (time.monotonic() - start)))


def _change(d: Delivery, files: list[Path], tick: int) -> int:
    """One tick's changes in *d*: a file created, an older one replaced as an editor saves
    (a new file renamed over it), the oldest deleted past KEEP.  Returns how many."""
    new = d.plain / f"veilbench-sync-{tick:06d}.txt"
    write_file(new, os.urandom(512) * (1 + tick % 4))
    files.append(new)
    n = 1
    if len(files) > 1:
        tmp = d.plain / f".veilbench-sync-{tick:06d}.tmp"
        write_file(tmp, os.urandom(700))
        os.replace(tmp, files[0])
        n += 1
    if len(files) > KEEP:
        files.pop(0).unlink()
        n += 1
    return n


def main(argv: list[str]) -> int:
    if len(argv) < 6 or (len(argv) - 3) % 3:
        print("usage: othermachine STATUS INTERVAL DELIVER-CPUS|- (PLAIN SOURCE TARGET)...", file=sys.stderr)
        return 2
    status, interval, cpus, rest = Path(argv[0]), float(argv[1]), argv[2], argv[3:]
    deliver_on = None if cpus == "-" else frozenset(int(c) for c in cpus.split(","))
    deliveries = [Delivery(Path(rest[i]), Path(rest[i + 1]), Path(rest[i + 2]))
                  for i in range(0, len(rest), 3)]
    write_loop(status, interval, deliveries, deliver_on)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
