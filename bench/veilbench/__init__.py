"""veilbench: the benchmark driver behind ``bench/run``.

Every performance claim of veilfs is made with this package, so it is built to
be boring and trustworthy: each measurement is a plain shell tool (dd, tar,
rsync, fio, ...) timed from outside, run on a fresh mount with caches dropped,
repeated in interleaved order, and recorded raw in ``results.json`` next to the
summarised Markdown tables and chart.

Modules, one concern each:

* ``proc``        -- running commands with timeouts, cleanup on any exit.
* ``backing``     -- where ciphertext lives: a size-capped tmpfs or the disk.
* ``filesystems`` -- a declarative table of the filesystems under test.
* ``datasets``    -- deterministic inputs (kernel tree tarball, random files).
* ``workloads``   -- the benchmark steps, grouped by fresh mount.
* ``report``      -- medians, Markdown tables, the PNG chart.
* ``cli``         -- argument parsing and the interleaved run loop.
"""

SCHEMA = "veilbench/1"
