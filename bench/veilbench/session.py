"""One filesystem instance for one workload group: mount, remount, unmount.

The session owns the cleanup registration of the mount, so an exception or
Ctrl-C anywhere inside a group still unmounts it, and it remembers the
daemon's peak RSS across remounts (a remount starts a new daemon).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .filesystems import Filesystem, Mount, Secrets
from .proc import Cleanup


class MountSession:
    def __init__(self, fs: Filesystem, store: Path, mountpoint: Path, secrets: Secrets,
                 logdir: Path, timeout: float, cleanup: Cleanup, reverse: bool = False) -> None:
        self.fs = fs
        self.store = store
        self.mountpoint = mountpoint
        self.secrets = secrets
        self.logdir = logdir
        self.timeout = timeout
        self.cleanup = cleanup
        #: Mount the filesystem's reverse view of the (plaintext) store.
        self.reverse = reverse
        self.mount: Mount | None = None
        self._token: int | None = None
        self.rss_kib: list[int] = []
        self.had_daemon = False

    def open(self, fresh: bool = True) -> Mount:
        m = self.fs.mount(self.store, self.mountpoint, self.secrets, self.logdir,
                          self.timeout, fresh=fresh, reverse=self.reverse)
        self.mount = m
        self.had_daemon = self.had_daemon or m.pid is not None
        self._token = self.cleanup.push(f"unmount {self.mountpoint}",
                                        lambda: self.fs.unmount(m, self.timeout))
        return m

    def close(self) -> None:
        if self.mount is None:
            return
        rss = self.mount.daemon_peak_rss_kib()
        if rss is not None:
            self.rss_kib.append(rss)
        token, self._token, self.mount = self._token, None, None
        self.cleanup.release(token)

    def reopen(self, between: Callable[[], None] | None = None) -> Mount:
        """Unmount (flushing everything the daemon buffered), run *between*
        while nothing is mounted, and mount the same store again."""
        self.close()
        if between is not None:
            between()
        return self.open(fresh=False)

    def peak_rss_mib(self) -> float | None:
        return max(self.rss_kib) / 1024 if self.rss_kib else None
