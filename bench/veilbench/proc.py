"""Running commands, timing them, and undoing everything on any exit.

A benchmark that leaves a FUSE mount or a 1 GiB file behind after a Ctrl-C is
worse than no benchmark, so every resource the driver creates is registered
with :class:`Cleanup` the moment it exists, and is released in reverse order
from a ``finally`` block.  SIGINT/SIGTERM/SIGHUP are turned into an exception
so that ``finally`` blocks really run.

Every external command runs in its own session (process group).  That lets a
step that hangs -- typically a process blocked on a wedged FUSE daemon -- be
killed as a whole group when its timeout expires, without touching anything
the driver did not start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence


class StepError(Exception):
    """A benchmark step failed; the message is what goes into the results."""


class StepTimeout(StepError):
    """A benchmark step exceeded its time budget and was killed."""


class Interrupted(BaseException):
    """Raised from a signal handler so that ``finally`` blocks run."""


def _tail(text: str | bytes | None, limit: int = 400) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """Kill the process group that *proc* leads (it was started with its own
    session), first politely, then with SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run(cmd: Sequence[str] | str, *, timeout: float, cwd: Path | None = None,
        env: Mapping[str, str] | None = None, input: bytes | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """Run *cmd* (a list, or a string for ``sh -c``) with a hard timeout.

    On timeout or interruption the whole process group is killed; a non-zero
    exit raises :class:`StepError` carrying the tail of stderr, because that is
    the most useful thing to show in a results table.
    """
    shell = isinstance(cmd, str)
    argv = ["sh", "-c", cmd] if shell else list(map(str, cmd))
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    proc = subprocess.Popen(argv, cwd=cwd, env=full_env, start_new_session=True,
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise StepTimeout(f"timed out after {timeout:.0f} s: {_short(argv)}") from None
    except BaseException:
        kill_group(proc)
        raise
    if check and proc.returncode != 0:
        detail = _tail(err) or _tail(out)
        raise StepError(f"{_short(argv)} exited {proc.returncode}: {detail}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _short(argv: Sequence[str], limit: int = 160) -> str:
    text = " ".join(argv)
    return text if len(text) <= limit else text[:limit] + "..."


def timed(cmd: Sequence[str] | str, *, timeout: float, **kw) -> float:
    """Run *cmd* and return its wall-clock duration in seconds."""
    start = time.perf_counter()
    run(cmd, timeout=timeout, **kw)
    return time.perf_counter() - start


def sync(timeout: float = 600) -> None:
    run(["sync"], timeout=timeout)


def drop_caches(timeout: float = 600) -> None:
    """Flush dirty data and drop page, dentry and inode caches, so the next
    step reads through the filesystem instead of from RAM."""
    sync(timeout)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def which(name: str) -> str | None:
    for d in os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").split(":"):
        p = Path(d) / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


# --------------------------------------------------------------- daemons

CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User+system CPU time of *pid* (all its threads), from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_peak_rss_kib(pid: int) -> int | None:
    """Peak resident set size (VmHWM) of *pid* in KiB, or None if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def wakeup_round_trip_us(rounds: int = 2000) -> float:
    """Median microseconds for one byte to go to another process over a pipe and back.

    Each FUSE request is such a round trip (the caller wakes the daemon, the daemon wakes
    the caller), so this is the transport's cost on the machine as it is right now: on a
    virtual machine whose idle CPUs halt without polling (``guest_halt_poll_ns`` 0) or
    whose host is busy it grows several times over, and every FUSE row of a run slows down
    with it while plain storage does not.  Recorded per run, so a run made on such a host
    can be told from one made on a quiet one."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the echo side: no Python cleanup, no exceptions out of the child
        try:
            os.close(a_w)
            os.close(b_r)
            while os.read(a_r, 1):
                os.write(b_w, b"x")
        finally:
            os._exit(0)
    os.close(a_r)
    os.close(b_w)
    samples = []
    try:
        for _ in range(rounds):
            t = time.perf_counter_ns()
            os.write(a_w, b"x")
            os.read(b_r, 1)
            samples.append(time.perf_counter_ns() - t)
    finally:
        os.close(a_w)
        os.close(b_r)
        os.waitpid(pid, 0)
    samples.sort()
    return samples[len(samples) // 2] / 1000


def cpu_times() -> tuple[int, int]:
    """(all CPU time, time stolen by the hypervisor) from /proc/stat, in clock ticks."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def pids_with_argument(arg: str) -> list[int]:
    """PIDs whose command line contains *arg* as one whole argument.

    Used to find a daemonising FUSE server after its launcher exited: every
    mount point is a unique temporary path, so this is unambiguous."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if arg.encode() in argv:
            found.append(int(entry.name))
    return sorted(found)


# --------------------------------------------------------------- cleanup

class Cleanup:
    """A stack of undo actions, run in reverse order exactly once each.

    ``push`` returns a token; ``release(token)`` runs that action early (the
    normal path: unmount after a workload group).  ``run_all`` runs whatever
    is left, logging failures instead of raising, because the job of cleanup
    on an error path is to try everything."""

    def __init__(self, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)):
        self._actions: dict[int, tuple[str, Callable[[], None]]] = {}
        self._next = 0
        self._log = log

    def push(self, what: str, action: Callable[[], None]) -> int:
        self._next += 1
        self._actions[self._next] = (what, action)
        return self._next

    def release(self, token: int) -> None:
        what, action = self._actions.pop(token)
        action()

    def discard(self, token: int) -> None:
        self._actions.pop(token, None)

    def run_all(self) -> None:
        for token in sorted(self._actions, reverse=True):
            what, action = self._actions.pop(token)
            try:
                action()
            except BaseException as exc:  # noqa: BLE001 - keep cleaning
                self._log(f"cleanup: {what}: {exc}")


def install_signal_handlers() -> None:
    """Turn SIGINT/SIGTERM/SIGHUP into :class:`Interrupted`."""
    def handler(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def ignore_signals() -> None:
    """While cleaning up, a second Ctrl-C must not abandon mounts half-way."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
