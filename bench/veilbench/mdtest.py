"""mdtest-style metadata phases, run as a child process.

``python3 -m veilbench.mdtest PHASE DIR COUNT`` creates (4 KiB each), stats or
deletes COUNT files in DIR and prints the phase's own elapsed seconds as
JSON.  It runs in a child so that the driver can time it out and kill it if
the filesystem hangs, and so interpreter start-up is not timed.
"""

from __future__ import annotations

import json
import os
import sys
import time

PAYLOAD = b"\xa5" * 4096


def names(directory: str, count: int) -> list[str]:
    return [os.path.join(directory, f"md.{i:06d}") for i in range(count)]


def create(paths: list[str]) -> None:
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    for p in paths:
        fd = os.open(p, flags, 0o644)
        os.write(fd, PAYLOAD)
        os.close(fd)


def stat(paths: list[str]) -> None:
    for p in paths:
        os.stat(p)


def delete(paths: list[str]) -> None:
    for p in paths:
        os.unlink(p)


PHASES = {"create": create, "stat": stat, "delete": delete}


def main(argv: list[str]) -> int:
    phase, directory, count = argv[0], argv[1], int(argv[2])
    paths = names(directory, count)
    if phase == "create":
        os.makedirs(directory, exist_ok=True)
    start = time.perf_counter()
    PHASES[phase](paths)
    elapsed = time.perf_counter() - start
    print(json.dumps({"phase": phase, "count": count, "seconds": elapsed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
