"""`python -m bench.peak FILE ARGS...`: run `python -m job ARGS...` and write its peak resident
memory in MB to FILE as it exits.

The parent cannot measure it: `ru_maxrss` of a child started by fork or vfork and exec also
counts the parent's memory at the fork (Linux keeps the larger of the old and new image), and
the benchmark's own process holds a whole read. VmHWM counts only this process's own image.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path


def _record(path: Path) -> None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            path.write_text(str(int(line.split()[1]) / 1024))


if __name__ == "__main__":
    atexit.register(_record, Path(sys.argv[1]))
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    from job.cli import console

    console()
