"""`python -m tests.support.job_zygote`: the job's imports done once, then one forked child per
run, each going on exactly as `python -m job` goes on after its imports (job/__main__.py).

The tests that kill the job at every write of a run start it hundreds of times; each start spent
about half a second importing (the Kubernetes client, gRPC, protobuf) before its first request.
A child here is a process of its own: SIGKILL, its exit code, its stderr and the interpreter's
exit (threads joined, atexit) are real. It runs with the zygote's environment and directory.

Protocol, one line each way: the test writes `{"argv": [...], "stderr": PATH}`; the zygote
answers `pid N` once the child is forked, then `exit CODE` (Popen's returncode: -N for signal N).
Nothing but imports happens before a fork: no thread, no gRPC channel, no connection.
"""

from __future__ import annotations

import gc
import json
import os
import sys

gc.disable()  # as job/__main__.py imports, the collector paused; console() freezes and resumes it
from job.cli import console  # noqa: E402


def serve() -> list[str]:
    """In the zygote, runs until its stdin closes and exits; in a child, returns its arguments."""
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)  # the requests are the zygote's
            os.dup2(null, 1)  # as the tests' Popen runs it: standard output to /dev/null
            os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
            return [str(arg) for arg in request["argv"]]
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    sys.argv = ["job", *serve()]
    console()
