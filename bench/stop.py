"""`make bench-stop`: how long a run takes to end after SIGTERM while a read hangs (goal: at most
5 s). The server accepts the call and never answers: the etcd v3 read, the etcd v2 read, and the
leak check's read of a candidate's pod. Each case runs the job as a process, sends SIGTERM once the
held call has come in, and times the exit; the run must exit 143 with its report written and its
Lease released. Only loopback traffic."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.support import calico
from tests.support.etcd_server import EtcdServer
from tests.support.hold import HoldingServer
from tests.support.kubeapi import KubeApiServer
from tests.support.scenario import LEAK_CANDIDATES_POD, cross_borrowing_fleet

LEASE = "/apis/coordination.k8s.io/v1/namespaces/calico-gc/leases"


def stop_seconds(argv: list[str], called: threading.Event, report: Path, kubeapi: KubeApiServer) -> float:
    report.unlink(missing_ok=True)
    environ = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "ETCD_ENDPOINTS")}
    called.clear()
    process = subprocess.Popen(argv, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert called.wait(timeout=60), "the held call never came"
    started = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=120)
    seconds = time.perf_counter() - started
    outcome = json.loads(report.read_text())["outcome"]
    lease = kubeapi.get(LEASE, "calico-gc") or {}
    assert code == 143 and outcome == "interrupted" and "holderIdentity" not in lease.get("spec", {}), code
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="calico-gc-bench-stop-"))
    (workdir / "etcd").mkdir()
    etcd, kubeapi, holding = EtcdServer(workdir / "etcd"), KubeApiServer().start(), HoldingServer()
    etcd.start()
    kubeapi.add_namespace("calico-gc")
    try:
        seed = cross_borrowing_fleet(3, leak=True)
        calico.load(etcd.url, seed.seed.keys)
        for name, ip in seed.k8s_nodes:
            kubeapi.add_node(name, ip)
        release = threading.Event()

        def hang() -> None:
            holding.called.set()
            release.wait(600)

        base = [
            sys.executable, "-m", "job", "--apply", f"--kubeconfig={kubeapi.write_kubeconfig(workdir / 'kubeconfig')}",
            f"--state-file={workdir / 'state.json'}", f"--report-file={workdir / 'report.json'}",
            "--grace-period=0", "--namespace=calico-gc",
        ]  # fmt: skip
        cases = {
            "etcd v3 read": [*base, "--datastore-type=etcdv3", f"--etcd-endpoints={holding.url}"],
            "etcd v2 read": [*base, "--datastore-type=etcdv2", f"--etcd-endpoints={holding.url}"],
            "Kubernetes pods read": [*base, "--datastore-type=etcdv3", f"--etcd-endpoints={etcd.url}"],
        }
        for name, argv in cases.items():
            if name == "Kubernetes pods read":
                kubeapi.on("GET", LEAK_CANDIDATES_POD, hang, times=options.repeat)
            times = [
                stop_seconds(argv, holding.called, workdir / "report.json", kubeapi) for _ in range(options.repeat)
            ]
            print(
                f"SIGTERM while the {name} hangs: ended in median {statistics.median(times):.2f}s "
                f"[{min(times):.2f}-{max(times):.2f} over {len(times)}] (goal <= 5), exit 143, report written, "
                "Lease released"
            )
        release.set()
    finally:
        holding.close()
        kubeapi.stop()
        etcd.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
