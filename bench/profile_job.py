"""`python -m bench.profile_job ARGS...`: one `python -m job ARGS...` under cProfile, every thread
included (the reads run in threads of their own), and the functions that took the most time."""

from __future__ import annotations

import cProfile
import pstats
import sys
import threading
from typing import Any

from job.cli import main

profiles: list[cProfile.Profile] = []
_run = threading.Thread.run


def _profiled(self: threading.Thread) -> None:
    profile = cProfile.Profile()
    profiles.append(profile)
    profile.enable()
    try:
        _run(self)
    finally:
        profile.disable()


def profiled(argv: list[str]) -> pstats.Stats:
    threading.Thread.run = _profiled  # type: ignore[method-assign]
    profile = cProfile.Profile()
    profile.enable()
    main(argv)
    profile.disable()
    stats = pstats.Stats(profile)
    for each in profiles:
        stats.add(each)
    return stats


if __name__ == "__main__":
    result: Any = profiled(sys.argv[1:])
    result.sort_stats("tottime").print_stats(20)
