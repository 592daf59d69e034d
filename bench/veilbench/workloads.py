"""The workloads, organised in groups that each get a fresh mount.

A group is a function that runs its steps in order on one :class:`Mount` and
records each metric as soon as it is measured.  If a step fails or times out,
the driver marks every metric the group had not yet recorded with that error
and moves on: steps within a group depend on each other (``du`` is
meaningless if ``extract`` failed), groups do not.

Every timed step is an external command timed from the outside, preceded by
``sync`` + ``drop_caches`` (:meth:`Context.settle`), as in the EncFS and
gocryptfs scripts -- except in the ``warm`` group, which measures what the
caches give a second walk of a tree (and ``warm-sync``, the same while another
machine's changes arrive in the store).  Writes include a trailing ``sync`` inside the timed part,
so data a filesystem merely buffered is not counted as written.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .datasets import Datasets
from .filesystems import Mount
from .othermachine import FRESH_LIMIT, CpuSplit, NotSynced, OtherMachine, pin_process, split_cpus
from .proc import StepError, cpu_times, drop_caches, pid_alive, run, timed

MiB = 1 << 20
GiB = 1 << 30
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    higher_is_better: bool


@dataclass(frozen=True)
class Sizes:
    """Workload sizes; ``quick`` shrinks everything for smoke tests."""
    stream: int = 100 * MiB
    bigfile: int = 1 * GiB
    many_count: int = 2000
    many_size: int = 512 * 1024
    mixed_total: int = 400 * 1000 * 1000
    fio_file: int = 256 * MiB
    fio_io: int = 64 * MiB
    fio_runtime: int = 30
    md_files: int = 2000
    par_file: int = 512 * MiB

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(stream=16 * MiB, bigfile=32 * MiB, many_count=64, mixed_total=8 * 1000 * 1000,
                   fio_file=16 * MiB, fio_io=4 * MiB, fio_runtime=5, md_files=200,
                   par_file=32 * MiB)


@dataclass
class Context:
    """What a group function gets: the mount, the inputs and a place to put
    its numbers."""
    mount: Mount
    data: Datasets
    sizes: Sizes
    quick: bool
    timeout: float
    session: object = None
    values: dict = field(default_factory=dict)
    na: dict = field(default_factory=dict)
    #: Per metric, the share of all CPU time (%) the hypervisor took during the step that
    #: measured it: from the end of the step's ``settle`` (or the start of its ``timed``
    #: command) to its ``record``.  A step that lost much of it says little.
    stolen: dict = field(default_factory=dict)
    step_start: tuple | None = None

    def settle(self) -> None:
        drop_caches(timeout=self.timeout)
        self.step_start = cpu_times()

    def timed(self, cmd, **kw) -> float:
        self.step_start = cpu_times()
        return timed(cmd, timeout=self.timeout, **kw)

    def record(self, name: str, value: float, timed: bool = True) -> None:
        """Stores *value*; a *timed* one also gets the stolen share of the step that gave it."""
        self.values[name] = value
        if self.step_start is not None and timed:
            total, steal = cpu_times()
            ticks = total - self.step_start[0]   # 0 for a step shorter than a clock tick
            self.stolen[name] = round(100 * (steal - self.step_start[1]) / ticks, 1) if ticks > 0 else 0.0
        self.step_start = None

    def not_applicable(self, name: str, why: str) -> None:
        self.na[name] = why

    def daemon_cpu(self) -> float | None:
        return self.mount.daemon_cpu()

    def remount(self, between=None) -> None:
        """Unmount and mount the same store again (see MountSession)."""
        self.mount = self.session.reopen(between)


def q(path: Path) -> str:
    """Single-quote a path for ``sh -c``."""
    return "'" + str(path).replace("'", "'\\''") + "'"


# ------------------------------------------------------------------ groups

def run_stream(ctx: Context) -> None:
    """stream_write: zeros in 4 KiB writes, ``sync`` timed (EncFS's
    stream_write); stream_read: read back with 128 KiB reads after dropping
    caches.  The daemon's CPU over both is reported per GiB streamed."""
    path = ctx.mount.path / "stream.bin"
    size = ctx.sizes.stream
    ctx.settle()
    cpu0 = ctx.daemon_cpu()
    secs = ctx.timed(f"dd if=/dev/zero of={q(path)} bs=4k count={size // 4096} status=none && sync")
    ctx.record("stream_write", size / MiB / secs)
    ctx.settle()
    secs = ctx.timed(["dd", f"if={path}", "of=/dev/null", "bs=128k", "status=none"])
    ctx.record("stream_read", size / MiB / secs)
    cpu1 = ctx.daemon_cpu()
    if cpu0 is None or cpu1 is None:
        ctx.not_applicable("cpu_per_gib", "no FUSE daemon")
    else:
        ctx.record("cpu_per_gib", (cpu1 - cpu0) / (2 * size / GiB))


def run_bigfile(ctx: Context) -> None:
    """A large random file copied in with ``cp`` (+ sync) and, after dropping
    caches, copied out to RAM -- the German shoot-out's 4 GB test, at 1 GiB."""
    src = ctx.data.random_file("random-big", ctx.sizes.bigfile)
    inside = ctx.mount.path / "big.bin"
    ctx.settle()
    secs = ctx.timed(f"cp {q(src)} {q(inside)} && sync")
    ctx.record("bigfile_in", ctx.sizes.bigfile / MiB / secs)
    ctx.settle()
    out = ctx.data.out_dir()
    secs = ctx.timed(f"cp {q(inside)} {q(out)}/ && sync")
    ctx.record("bigfile_out", ctx.sizes.bigfile / MiB / secs)
    shutil.rmtree(out)


def run_kernel(ctx: Context) -> None:
    """The classic source-tree sequence on one mount: extract (tar xf +
    sync), du of the ciphertext, rsync -an against an almost up-to-date copy,
    ls -lR, md5sum -c, and rm -rf + sync."""
    tree = ctx.data.tree()
    mnt = ctx.mount.path
    top = mnt / tree.top
    run(["cat", str(tree.tarball)], timeout=ctx.timeout)   # warm the tarball (EncFS does too)
    ctx.settle()
    ctx.record("extract", ctx.timed(f"tar xf {q(tree.tarball)} -C {q(mnt)} && sync"))
    _du_after_remount(ctx)
    mnt = ctx.mount.path
    top = mnt / tree.top
    dest = ctx.data.rsync_destination()
    ctx.settle()
    ctx.record("rsync", ctx.timed(["rsync", "-an", "--delete", f"{top}/", f"{dest / tree.top}/"]))
    ctx.settle()
    ctx.record("ls_lR", ctx.timed(f"ls -lR {q(top)} > /dev/null"))
    ctx.settle()
    ctx.record("md5sum", ctx.timed(["md5sum", "--quiet", "-c", str(tree.md5_list)], cwd=mnt))
    ctx.settle()
    ctx.record("delete", ctx.timed(f"rm -rf {q(top)} && sync"))


def run_fsck(ctx: Context) -> None:
    """The kernel tree extracted (untimed), then each tool's own whole-vault check
    (veilfs fsck, gocryptfs -fsck) timed on the unmounted store after dropping
    caches: every name, IV and content block read and authenticated."""
    tree = ctx.data.tree()
    run(f"tar xf {q(tree.tarball)} -C {q(ctx.mount.path)} && sync", timeout=ctx.timeout)
    cmd = ctx.session.fs.fsck_args(ctx.mount.store, ctx.session.secrets) if ctx.session else None
    if cmd is None:
        ctx.not_applicable("fsck", "no offline check")
        return

    def check() -> None:
        ctx.settle()
        ctx.record("fsck", ctx.timed(cmd))

    ctx.remount(between=check)


def prepare_reverse(store: Path, data: Datasets, timeout: float) -> None:
    """Before a reverse mount: the source tree extracted as plaintext into the
    store (untimed); the reverse view is mounted over it afterwards."""
    tree = data.tree()
    run(f"tar xf {q(tree.tarball)} -C {q(store)} && sync", timeout=timeout)


def _rsync_files(out: bytes) -> int:
    """rsync --stats' "Number of regular files transferred"."""
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("Number of regular files transferred:"):
            return int(line.rsplit(":", 1)[1].strip().replace(",", ""))
    raise StepError("rsync --stats printed no transfer count")


def _timed_rsync(ctx: Context, view: Path, dest: Path) -> tuple[float, int]:
    """``rsync -a --delete --stats VIEW/ DEST/``: seconds and files sent."""
    start = time.perf_counter()
    res = run(["rsync", "-a", "--delete", "--stats", f"{view}/", f"{dest}/"], timeout=ctx.timeout)
    return time.perf_counter() - start, _rsync_files(res.stdout)


def _change_tree(top: Path) -> None:
    """One file changed, one added, one deleted in the plaintext tree (the
    first and last regular files in sorted order, so every filesystem gets
    the same change)."""
    files = sorted(p for p in top.rglob("*") if p.is_file() and not p.is_symlink())
    with open(files[0], "ab") as f:
        f.write(b"\n/* changed by veilbench */\n")
    (files[0].parent / "veilbench-added.txt").write_bytes(b"added by veilbench\n" * 100)
    files[-1].unlink()


def run_reverse(ctx: Context) -> None:
    """A backup through a reverse (encrypted, read-only) view of a plaintext
    tree: a cold ``rsync -a`` of the whole view into an empty directory; one
    file changed, one added, one deleted in the plaintext, then an
    incremental ``rsync -a --delete`` into the same directory (its time and
    the files it sent); a raw read of the view (``tar cf - | cat``).  plain
    rsyncs the plaintext itself."""
    view = ctx.mount.path
    dest = ctx.data.out_dir()
    ctx.settle()
    secs, _ = _timed_rsync(ctx, view, dest)
    ctx.record("rev_full", secs)
    tree = ctx.data.tree()
    _change_tree(ctx.mount.store / tree.top)
    # Past every attribute timeout (1 s for veilfs and gocryptfs), so the view shows the change.
    time.sleep(1.5)
    ctx.settle()
    secs, sent = _timed_rsync(ctx, view, dest)
    ctx.record("rev_incr", secs)
    ctx.record("rev_incr_files", sent)
    shutil.rmtree(dest)
    ctx.settle()
    ctx.record("rev_tar", ctx.timed(f"tar cf - -C {q(view)} . | cat > /dev/null"))


def _du_after_remount(ctx: Context) -> None:
    """Disk usage of the ciphertext, measured with the filesystem unmounted
    where possible: daemons such as CryFS keep written blocks in memory until
    unmount, and ``du`` right after ``sync`` would miss them.  The remount
    also means rsync/ls/md5sum start with a cold daemon, like a new session."""
    store = ctx.mount.store

    def measure() -> None:
        ctx.settle()
        out = run(["du", "-sm", str(store)], timeout=ctx.timeout).stdout.split()[0]
        ctx.record("du", float(out), timed=False)   # a size: no step to lose time in

    if ctx.mount.store_needs_mount:
        ctx.remount()
        measure()
    else:
        ctx.remount(between=measure)


def _copy_in_out(ctx: Context, src: Path, prefix: str) -> None:
    inside = ctx.mount.path / src.name
    ctx.settle()
    ctx.record(f"{prefix}_in", ctx.timed(f"cp -r {q(src)} {q(inside)} && sync"))
    ctx.settle()
    out = ctx.data.out_dir()
    ctx.record(f"{prefix}_out", ctx.timed(f"cp -r {q(inside)} {q(out)}/ && sync"))
    shutil.rmtree(out)


def run_manyfiles(ctx: Context) -> None:
    """2000 files of 512 KiB with random names, copied in and out."""
    _copy_in_out(ctx, ctx.data.many_files(ctx.sizes.many_count, ctx.sizes.many_size), "many")


def run_mixed(ctx: Context) -> None:
    """A ~400 MB folder of files from 4 KiB to 32 MiB, copied in and out."""
    _copy_in_out(ctx, ctx.data.mixed_folder(ctx.sizes.mixed_total), "mixed")


def run_build(ctx: Context) -> None:
    """A real compile inside the mount: the kernel tree's ``perf`` tool
    (quick mode: a generated C project).  Sources are unpacked untimed."""
    project = ctx.data.build_project()
    run(["tar", "xf", str(project.tarball), "-C", str(ctx.mount.path), *project.members],
        timeout=ctx.timeout)
    ctx.settle()
    ctx.record("build", ctx.timed(project.command, cwd=ctx.mount.path))


#: git as the benchmark runs it: trusting every directory (the checkout's
#: owner may differ from the caller's on some filesystems) and packing without
#: deltas (the untimed clone of a 38k-file tree then takes seconds, not minutes).
GIT = ["git", "-c", "safe.directory=*", "-c", "pack.window=0"]


def warm_steps(ctx: Context, tree_top: Path) -> list[tuple[str, list | str]]:
    """The tree walks of the ``warm`` group, each run once untimed and then
    timed: (metric, command)."""
    dest = ctx.data.rsync_destination() / ctx.data.tree().top
    ref = ctx.mount.path / "warm-ref"
    return [
        ("warm_rsync", ["rsync", "-an", "--delete", f"{tree_top}/", f"{dest}/"]),
        ("warm_ls", f"ls -lR {q(tree_top)} > /dev/null"),
        ("warm_find", ["find", str(tree_top), "-newer", str(ref)]),
    ]


def run_warm(ctx: Context) -> None:
    """Warm metadata, the one group whose timed steps follow no drop_caches:
    what a developer repeats all day.  The kernel tree is extracted and walked
    once (untimed), then timed: a second ``rsync -an``, ``ls -lR`` and
    ``find -newer`` over it; a no-op ``make`` of the build group's project
    once built; ``git status`` in a checkout of the tree (cloned from a
    repository on the source tmpfs, untimed)."""
    _extract_warm_tree(ctx)
    walks, make, status = warm_measurements(ctx)
    for metric, cmd, cwd in walks:
        _untimed_then_timed(ctx, metric, cmd, cwd)
    _build_warm_project(ctx)
    _untimed_then_timed(ctx, *make, untimed=False)   # its build was the untimed run
    _clone_warm_checkout(ctx)
    _untimed_then_timed(ctx, *status)


def warm_measurements(ctx: Context) -> tuple[list, tuple, tuple]:
    """The warm group's timed steps as (metric, command, cwd): the tree walks, the no-op
    make, git status."""
    mnt = ctx.mount.path
    walks = [(m, cmd, None) for m, cmd in warm_steps(ctx, mnt / ctx.data.tree().top)]
    make = ("noop_make", ctx.data.build_project().command, mnt)
    status = ("git_status", [*GIT, "-C", str(mnt / "checkout"), "status", "--porcelain"], None)
    return walks, make, status


def _extract_warm_tree(ctx: Context) -> None:
    mnt = ctx.mount.path
    run(f"tar xf {q(ctx.data.tree().tarball)} -C {q(mnt)} && sync", timeout=ctx.timeout)
    run(["touch", str(mnt / "warm-ref")], timeout=60)


def _build_warm_project(ctx: Context) -> None:
    project = ctx.data.build_project()
    mnt = ctx.mount.path
    run(["tar", "xf", str(project.tarball), "-C", str(mnt), *project.members], timeout=ctx.timeout)
    run(project.command, cwd=mnt, timeout=ctx.timeout)


def _clone_warm_checkout(ctx: Context) -> None:
    run([*GIT, "clone", "-q", "--no-local", str(ctx.data.git_repo()), str(ctx.mount.path / "checkout")],
        timeout=ctx.timeout)


#: Steps timed several times, their median recorded: ``git status`` takes ~50 ms, where one
#: run's scheduling noise alone moved the ratio to plain between 0.87 and 2.04 (round10).
RUNS = {"git_status": 5}


def _untimed_then_timed(ctx: Context, metric: str, cmd, cwd: Path | None, untimed: bool = True) -> float:
    """Runs *cmd* once untimed (the caches warm), then records its timed run (the median of
    :data:`RUNS` runs for the steps named there)."""
    if untimed:
        run(cmd, cwd=cwd, timeout=ctx.timeout)
    start = cpu_times()
    secs = statistics.median([ctx.timed(cmd, cwd=cwd) for _ in range(RUNS.get(metric, 1))])
    ctx.step_start = start   # the stolen share of all the runs
    ctx.record(metric, secs)
    return secs


#: The warm group's metrics and their names in ``warm-sync``.
SYNC_KEYS = {"warm_rsync": "wsync_rsync", "warm_ls": "wsync_ls", "warm_find": "wsync_find",
             "noop_make": "wsync_make", "git_status": "wsync_git_status"}


def sync_directories(tree_top: str, subdirs: list[str]) -> tuple[list[Path], Path]:
    """Where the other machine writes in ``warm-sync`` (relative to the mount's root): the
    first top-level directory of the tree, the same directory in the git checkout, and a
    directory beside the tree; and the tree's last top-level directory, which only the
    freshness probes change."""
    first, last = subdirs[0], subdirs[-1]
    return ([Path(tree_top) / first, Path("checkout") / tree_top / first, Path("sync-inbox")],
            Path(tree_top) / last)


#: The names of the other machine's files (and of rsync's temporary names for them).
SYNC_FILES = "veilbench-sync-"


def only_vanished(returncode: int, stderr: bytes) -> bool:
    """Whether a walk failed only because files of the other machine vanished under it
    (listed, then deleted or renamed before it looked at them): normal in a folder another
    machine changes.  ``find`` and ``ls`` then exit 1 naming each file ("No such file or
    directory"), ``rsync`` 24 ("file has vanished", and a closing "some files vanished").
    A message about any other file is a real failure."""
    lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]

    def vanished(line: str) -> bool:
        if "some files vanished before they could be transferred" in line:
            return True
        return SYNC_FILES in line and ("No such file or directory" in line or "file has vanished" in line)

    return returncode in (1, 24) and bool(lines) and all(vanished(line) for line in lines)


def _run_in_live_tree(ctx: Context, cmd, cwd: Path | None) -> float:
    """Runs *cmd* and returns its seconds; files that vanished under it are no failure."""
    start = time.perf_counter()
    res = run(cmd, cwd=cwd, timeout=ctx.timeout, check=False)
    secs = time.perf_counter() - start
    if res.returncode != 0 and not only_vanished(res.returncode, res.stderr):
        detail = res.stderr.decode(errors="replace").strip()[-400:]
        raise StepError(f"{' '.join(res.args)} exited {res.returncode}: {detail}")
    return secs


def run_warm_sync(ctx: Context) -> None:
    """The warm group while another machine writes into the synced store: the same
    steps, untimed then timed, while a writer (:mod:`othermachine`) changes a few small
    files every 200 ms in two directories walked (one in the tree, one in the checkout)
    and one beside them, and delivers them into the store as a sync tool does.  Per step,
    the writer's changes during the timed run, and after it one freshness sample: a file
    the other machine wrote, delivered into a directory the walks cached, and the
    seconds until the measured mount shows it (the worst of the samples is recorded)."""
    if ctx.mount.store_needs_mount or ctx.session is None:
        for m in GROUPS_BY_NAME["warm-sync"].metrics:
            ctx.not_applicable(m.name, "the store is a disk image, not a folder a sync tool writes into")
        return
    _extract_warm_tree(ctx)
    _build_warm_project(ctx)
    _clone_warm_checkout(ctx)
    run(["mkdir", str(ctx.mount.path / "sync-inbox")], timeout=60)
    other = OtherMachine(ctx.session, ctx.mount.store, ctx.mount.path, ctx.session.logdir)
    try:
        # Unmounted while copied, so the copy is the store as the filesystem leaves it.
        ctx.remount(between=lambda: other.copy_store(ctx.timeout))
        other.main_root = ctx.mount.path
        other.mount()
        other.split(split_cpus())
        top = ctx.mount.path / ctx.data.tree().top
        subdirs = sorted(p.name for p in top.iterdir() if p.is_dir() and not p.is_symlink())
        writes, probed = sync_directories(ctx.data.tree().top, subdirs)
        try:
            deliveries = [other.delivery(rel) for rel in writes]
            probe = other.delivery(probed)
        except NotSynced as exc:
            for m in GROUPS_BY_NAME["warm-sync"].metrics:
                ctx.not_applicable(m.name, str(exc))
            return
        walks, make, status = warm_measurements(ctx)   # its inputs made before the writer starts
        other.start_writer(deliveries)
        fresh = []
        with _on_this_machine(ctx, other.cpus):
            for i, (metric, cmd, cwd) in enumerate([*walks, make, status]):
                _run_in_live_tree(ctx, cmd, cwd)
                runs = RUNS.get(metric, 1)
                before = other.changes()
                ctx.step_start = cpu_times()
                secs = statistics.median(_run_in_live_tree(ctx, cmd, cwd) for _ in range(runs))
                after = other.changes()
                other.check()
                ctx.record(SYNC_KEYS[metric], secs)
                ctx.record(f"{SYNC_KEYS[metric]}_changes", (after - before) / runs, timed=False)
                fresh.append(other.freshness(probe, f"veilbench-fresh-{i}.txt"))
        if None in fresh:
            raise StepError(f"a delivered change was not visible in the mount after "
                            f"{FRESH_LIMIT:.0f} s: {fresh.count(None)} of {len(fresh)} samples")
        ctx.record("wsync_fresh", max(fresh), timed=False)
    finally:
        other.stop()


@contextmanager
def _on_this_machine(ctx: Context, cpus: CpuSplit | None):
    """While inside, the driver (so every command it starts) and the measured mount's
    daemon run only on the measured machine's CPUs; their affinity is given back after,
    also when a step fails."""
    if cpus is None:
        yield
        return
    before = frozenset(os.sched_getaffinity(0))
    pid = ctx.mount.pid
    os.sched_setaffinity(0, cpus.here)
    if pid is not None:
        pin_process(pid, cpus.here)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        if pid is not None and pid_alive(pid):
            pin_process(pid, before)


def _fio(ctx: Context, path: Path, rw: str) -> float:
    s = ctx.sizes
    argv = ["fio", f"--name={rw}", f"--filename={path}", f"--rw={rw}", "--bs=4k",
            f"--size={s.fio_file}", f"--io_size={s.fio_io}", f"--runtime={s.fio_runtime}",
            "--ioengine=psync", "--iodepth=1", "--numjobs=1", "--randrepeat=1",
            "--invalidate=1", "--output-format=json"]
    if rw == "randwrite":
        argv.append("--end_fsync=1")
    out = run(argv, timeout=ctx.timeout).stdout.decode()
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read" if rw == "randread" else "write"]
    if not side.get("total_ios"):
        raise StepError(f"fio {rw} did no I/O")
    return float(side["iops"])


def run_randio(ctx: Context) -> None:
    """fio 4 KiB random reads, then random writes (with a final fsync), on a
    256 MiB file; a quarter of the file is touched so dropped caches stay
    cold (fio's random map visits each block at most once)."""
    path = ctx.mount.path / "fio.dat"
    src = ctx.data.random_file("random-fio", ctx.sizes.fio_file)
    run(f"cp {q(src)} {q(path)} && sync", timeout=ctx.timeout)
    ctx.settle()
    ctx.record("randread", _fio(ctx, path, "randread"))
    ctx.settle()
    ctx.record("randwrite", _fio(ctx, path, "randwrite"))


def _fio_writers(ctx: Context, path: Path, jobs: int) -> float:
    """MiB/s of *jobs* fio writers, each on its own contiguous share of one
    existing file (128 KiB writes, final fsync timed)."""
    share = ctx.sizes.par_file // jobs
    argv = ["fio", "--name=writers", f"--filename={path}", "--rw=write", "--bs=128k",
            f"--size={share}", f"--offset_increment={share}", f"--numjobs={jobs}",
            "--ioengine=psync", "--group_reporting", "--end_fsync=1", "--fallocate=none",
            "--output-format=json"]
    out = run(argv, timeout=ctx.timeout).stdout.decode()
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"]
    if not side.get("io_bytes"):
        raise StepError("fio writers did no I/O")
    return side["io_bytes"] / MiB / (side["runtime"] / 1000.0)


def run_parallel(ctx: Context) -> None:
    """One writer, then two writers on disjoint halves of one file of the
    same size (a database or VM image): MiB/s of each and the scaling
    ratio.  The file exists at full size first, so no write changes its
    size (appends serialize in every filesystem)."""
    path = ctx.mount.path / "parallel.dat"
    run(["truncate", "-s", str(ctx.sizes.par_file), str(path)], timeout=ctx.timeout)
    ctx.settle()
    one = _fio_writers(ctx, path, 1)
    ctx.settle()
    two = _fio_writers(ctx, path, 2)
    ctx.record("par1", one)
    ctx.record("par2", two)
    ctx.record("par_scaling", two / one)


def _md_phase(ctx: Context, phase: str, directory: Path) -> float:
    argv = [sys.executable, "-m", "veilbench.mdtest", phase, str(directory), str(ctx.sizes.md_files)]
    out = run(argv, timeout=ctx.timeout, cwd=PACKAGE_DIR.parent).stdout.decode()
    return json.loads(out)["seconds"]


def run_metadata(ctx: Context) -> None:
    """mdtest-style: create (4 KiB each), stat and delete N files in one
    directory, caches dropped between phases; ops/s per phase, and the
    daemon's CPU milliseconds per file created."""
    directory = ctx.mount.path / "mdtest"
    n = ctx.sizes.md_files
    ctx.settle()
    cpu0 = ctx.daemon_cpu()
    ctx.record("md_create", n / _md_phase(ctx, "create", directory))
    cpu1 = ctx.daemon_cpu()
    if cpu0 is None or cpu1 is None:
        ctx.not_applicable("cpu_per_file", "no FUSE daemon")
    else:
        ctx.record("cpu_per_file", (cpu1 - cpu0) * 1000 / n)
    ctx.settle()
    ctx.record("md_stat", n / _md_phase(ctx, "stat", directory))
    ctx.settle()
    ctx.record("md_delete", n / _md_phase(ctx, "delete", directory))


# ------------------------------------------------------------------ table

@dataclass(frozen=True)
class Group:
    name: str
    title: str
    run: Callable[[Context], None]
    metrics: tuple[Metric, ...]
    #: A reverse-mode group: the store is a plaintext tree that ``prepare``
    #: fills before the filesystem's reverse view is mounted over it.
    reverse: bool = False
    prepare: Callable[[Path, Datasets, float], None] | None = None


def M(name, label, unit, higher=True):  # noqa: N802 - table shorthand
    return Metric(name, label, unit, higher)


PEAK_RSS = M("peak_rss", "daemon peak RSS (max over groups)", "MiB", higher=False)

GROUPS: tuple[Group, ...] = (
    Group("stream", "stream: zeros in 4 KiB writes + sync; read back after drop_caches", run_stream, (
        M("stream_write", "stream_write", "MiB/s"),
        M("stream_read", "stream_read", "MiB/s"),
        M("cpu_per_gib", "daemon CPU per GiB streamed", "s/GiB", higher=False))),
    Group("bigfile", "big random file, cp in / cp out", run_bigfile, (
        M("bigfile_in", "big file cp in", "MiB/s"),
        M("bigfile_out", "big file cp out", "MiB/s"))),
    Group("kernel", "kernel tree: extract, du, rsync, ls -lR, md5sum -c, rm -rf", run_kernel, (
        M("extract", "extract (tar xf + sync)", "s", higher=False),
        M("du", "du -sm of ciphertext", "MiB", higher=False),
        M("rsync", "rsync -an (stat-heavy)", "s", higher=False),
        M("ls_lR", "ls -lR", "s", higher=False),
        M("md5sum", "md5sum -c", "s", higher=False),
        M("delete", "delete (rm -rf + sync)", "s", higher=False))),
    Group("fsck", "whole-vault integrity check of the kernel tree (unmounted)", run_fsck, (
        M("fsck", "fsck of the kernel tree", "s", higher=False),)),
    Group("warm", "warm metadata (no drop_caches): 2nd rsync -an, ls -lR, find -newer of the kernel tree; "
          "no-op make; git status in a checkout of the tree", run_warm, (
        M("warm_rsync", "warm: 2nd rsync -an", "s", higher=False),
        M("warm_ls", "warm: 2nd ls -lR", "s", higher=False),
        M("warm_find", "warm: find -newer", "s", higher=False),
        M("noop_make", "warm: no-op make of a built project", "s", higher=False),
        M("git_status", "warm: git status (kernel tree checkout)", "s", higher=False))),
    Group("warm-sync", "the warm group while another machine writes: every 200 ms a few small files "
          "created, replaced and deleted in a directory of the tree, of the checkout and beside them, "
          "delivered into the store with rsync; the writer's changes per timed step; how soon a "
          "delivered file shows", run_warm_sync, (
        M("wsync_rsync", "warm-sync: 2nd rsync -an", "s", higher=False),
        M("wsync_rsync_changes", "warm-sync: changes delivered during the rsync", "changes"),
        M("wsync_ls", "warm-sync: 2nd ls -lR", "s", higher=False),
        M("wsync_ls_changes", "warm-sync: changes delivered during ls -lR", "changes"),
        M("wsync_find", "warm-sync: find -newer", "s", higher=False),
        M("wsync_find_changes", "warm-sync: changes delivered during find", "changes"),
        M("wsync_make", "warm-sync: no-op make of a built project", "s", higher=False),
        M("wsync_make_changes", "warm-sync: changes delivered during make", "changes"),
        M("wsync_git_status", "warm-sync: git status (kernel tree checkout)", "s", higher=False),
        M("wsync_git_status_changes", "warm-sync: changes delivered during git status", "changes"),
        M("wsync_fresh", "warm-sync: a delivered file visible in the mount (worst of 5)", "s",
          higher=False))),
    Group("manyfiles", "many 512 KiB files with random names, cp in / cp out", run_manyfiles, (
        M("many_in", "many files cp in", "s", higher=False),
        M("many_out", "many files cp out", "s", higher=False))),
    Group("mixed", "mixed-size folder (4 KiB..32 MiB files), cp in / cp out", run_mixed, (
        M("mixed_in", "mixed folder cp in", "s", higher=False),
        M("mixed_out", "mixed folder cp out", "s", higher=False))),
    Group("build", "software build inside the mount", run_build, (
        M("build", "build (make -j2)", "s", higher=False),)),
    Group("randio", "fio 4 KiB random read / write", run_randio, (
        M("randread", "fio 4 KiB randread", "IOPS"),
        M("randwrite", "fio 4 KiB randwrite", "IOPS"))),
    Group("parallel", "one vs two writers on disjoint halves of one file", run_parallel, (
        M("par1", "1 writer, one file", "MiB/s"),
        M("par2", "2 writers, disjoint halves of one file", "MiB/s"),
        M("par_scaling", "2 writers / 1 writer", "×"))),
    Group("metadata", "mdtest-style create/stat/delete of 4 KiB files", run_metadata, (
        M("md_create", "file create", "ops/s"),
        M("md_stat", "file stat", "ops/s"),
        M("md_delete", "file delete", "ops/s"),
        M("cpu_per_file", "daemon CPU per file created", "ms", higher=False))),
    Group("reverse", "reverse view of a plaintext kernel tree: rsync -a cold, incremental after "
          "1 changed + 1 added + 1 deleted file, tar of the view", run_reverse, (
        M("rev_full", "reverse: rsync -a of the view (cold)", "s", higher=False),
        M("rev_incr", "reverse: incremental rsync -a --delete", "s", higher=False),
        M("rev_incr_files", "reverse: files sent by the incremental rsync", "files", higher=False),
        M("rev_tar", "reverse: tar cf - of the view (piped to cat)", "s", higher=False)),
        reverse=True, prepare=prepare_reverse),
)

GROUPS_BY_NAME = {g.name: g for g in GROUPS}


def all_metrics(groups) -> list[Metric]:
    """Metrics of *groups* in report order, plus the daemon's peak RSS."""
    return [m for g in groups for m in g.metrics] + [PEAK_RSS]
