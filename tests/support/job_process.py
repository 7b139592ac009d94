"""The job as the CronJob runs it: `python -m job` in its own process, so that signals and
SIGKILL are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


def pid_one_child(launcher: int) -> int:
    """The process that `unshare --pid --fork` started as PID 1 of its namespace."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    return int(children[0])


def run_job(argv: Sequence[str], relay: WriteRelay, trigger: Trigger | None, launcher: Sequence[str] = ()) -> Finished:
    """Run the job to its end (or its death), acting at `trigger`; never waits on a timer."""
    report = next(Path(a.split("=", 1)[1]) for a in argv if a.startswith("--report-file="))
    report.unlink(missing_ok=True)
    environ = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "ETCD_ENDPOINTS")}
    process = subprocess.Popen(
        [*launcher, *argv], cwd=REPO, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )

    def send(signum: int) -> None:
        os.kill(pid_one_child(process.pid) if launcher else process.pid, signum)

    relay.send_signal = send
    relay.reset(trigger)
    _, stderr = process.communicate(timeout=120)
    if trigger is not None:
        assert relay.fired.is_set(), f"write {trigger.index} never came"
    code = process.returncode
    if launcher and code == 128 + signal.SIGKILL:
        code = -signal.SIGKILL  # unshare reports its child's death by signal as 128+N
    return Finished(code, stderr.decode(), json.loads(report.read_text()) if report.exists() else None)
