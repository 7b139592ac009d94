"""The job as the CronJob runs it: `python -m job` in its own process, so that signals and
SIGKILL are real; or, for tests that start it hundreds of times, a child forked by a Zygote that
has done its imports once (tests/support/job_zygote.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.hold import HoldingGrpcServer, HoldingServer
from tests.support.kubeapi import KubeApiServer
from tests.support.write_relay import Trigger, WriteRelay

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Finished:
    code: int
    stderr: str
    report: dict[str, Any] | None


def job_argv(
    kubeapi: KubeApiServer,
    relay: WriteRelay | HoldingServer | HoldingGrpcServer,
    tmp: Path,
    *extra: str,
    etcd_url: str | None = None,
) -> list[str]:
    """The job's command line with its etcd behind `relay` (the v2 keys API's when `extra` asks
    for etcdv2), or at `etcd_url` when given."""
    kubeconfig = kubeapi.write_kubeconfig(tmp / "kubeconfig")
    url = relay.v2_url if isinstance(relay, WriteRelay) and "--datastore-type=etcdv2" in extra else relay.url
    url = etcd_url or url
    return [
        sys.executable,
        "-m",
        "job",
        "--apply",
        "--datastore-type=etcdv3",
        f"--etcd-endpoints={url}",
        f"--kubeconfig={kubeconfig}",
        f"--state-file={tmp / 'process-state.json'}",
        f"--report-file={tmp / 'process-report.json'}",
        "--grace-period=0",
        "--max-orphan-fraction=1",
        "--max-deletions=100",
        "--page-size=50",
        "--namespace=calico-gc",
        *extra,
    ]


JOB_TIMEOUT = 120.0  # seconds a run may take before the test gives up on it (no test waits on it)


class Zygote:
    """A process that has imported the job and forks a child for each run (job_zygote.py)."""

    def __init__(self, environ: dict[str, str]) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.job_zygote"],
            cwd=REPO,
            env=environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def start(self, argv: Sequence[str], stderr: Path) -> int:
        """Fork a child running the job with `argv` (after `python -m job`); its pid."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"argv": list(argv), "stderr": str(stderr)}) + "\n")
        self._process.stdin.flush()
        word, pid = self._answer().split()
        assert word == "pid", word
        return int(pid)

    def wait(self, pid: int) -> int:
        """The child's exit code, as Popen gives it (-N when signal N ended it)."""
        word, code = self._answer(pid).split()
        assert word == "exit", word
        return int(code)

    def _answer(self, pid: int | None = None) -> str:
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], JOB_TIMEOUT)
        if not ready:
            if pid is not None:
                os.kill(pid, signal.SIGKILL)  # a run that never ends: end it, then fail the test
            raise AssertionError(f"no answer from the zygote within {JOB_TIMEOUT:.0f}s")
        line = self._process.stdout.readline()
        assert line, "the zygote is gone"
        return line

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=JOB_TIMEOUT)


def job_environ() -> dict[str, str]:
    """The environment a run starts with: the tests', without what would point it elsewhere."""
    return {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "ETCD_ENDPOINTS")}


def pid_one_child(launcher: int) -> int:
    """The process that `unshare --pid --fork` started as PID 1 of its namespace."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    return int(children[0])


def run_job(
    argv: Sequence[str],
    relay: WriteRelay,
    trigger: Trigger | None,
    launcher: Sequence[str] = (),
    zygote: Zygote | None = None,
) -> Finished:
    """Run the job to its end (or its death), acting at `trigger`; never waits on a timer. With a
    `zygote`, `argv` (`python -m job ...`) runs in a child it forks."""
    report = next(Path(a.split("=", 1)[1]) for a in argv if a.startswith("--report-file="))
    report.unlink(missing_ok=True)
    if zygote is not None:
        assert list(argv[:3]) == [sys.executable, "-m", "job"] and not launcher, argv
        started = threading.Event()
        child: list[int] = []

        def signal_child(signum: int) -> None:
            started.wait()
            os.kill(child[0], signum)

        relay.send_signal = signal_child
        relay.reset(trigger)
        stderr_file = report.with_name("process-stderr.txt")
        child.append(zygote.start(argv[3:], stderr_file))
        started.set()
        code, stderr = zygote.wait(child[0]), stderr_file.read_text()
    else:
        process = subprocess.Popen(
            [*launcher, *argv], cwd=REPO, env=job_environ(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

        def send(signum: int) -> None:
            os.kill(pid_one_child(process.pid) if launcher else process.pid, signum)

        relay.send_signal = send
        relay.reset(trigger)
        _, raw = process.communicate(timeout=JOB_TIMEOUT)
        code, stderr = process.returncode, raw.decode()
    if trigger is not None:
        assert relay.fired.is_set(), f"write {trigger.index} never came"
    if launcher and code == 128 + signal.SIGKILL:
        code = -signal.SIGKILL  # unshare reports its child's death by signal as 128+N
    return Finished(code, stderr, json.loads(report.read_text()) if report.exists() else None)
