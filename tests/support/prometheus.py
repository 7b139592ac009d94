"""A real Prometheus Pushgateway and a real Prometheus (Debian's `prometheus-pushgateway` and
`prometheus`), each started on a free loopback port for a test and stopped after it. Readiness
and every later expectation are waited for with a deadline, never a fixed sleep."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

PUSHGATEWAY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
DEADLINE_S = 30.0
T = TypeVar("T")


def needs(binary: str | None, name: str) -> None:
    """Debian's prometheus and prometheus-pushgateway: .ci/run installs them, so CI skips nothing."""
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (apt-get install prometheus prometheus-pushgateway)")
        pytest.skip(f"{name} is not installed (apt-get install prometheus prometheus-pushgateway)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def until(what: str, check: Callable[[], T | None], deadline_s: float = DEADLINE_S) -> T:
    """The first truthy answer of `check`, asked again until it comes (each answer is an event:
    a server's state); an AssertionError naming `what` at the deadline."""
    ends = time.monotonic() + deadline_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > ends:
            raise AssertionError(f"not within {deadline_s:g}s: {what}")
        time.sleep(0.05)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()
    except OSError:
        return 0, b""


@dataclass
class Server:
    """One server process on loopback."""

    argv: list[str]
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        until(f"{self.argv[0]} ready on {self.url} (log: {self.log})", lambda: get(f"{self.url}/-/ready")[0] == 200)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


@dataclass
class Pushgateway(Server):
    def groups(self) -> list[dict[str, Any]]:
        """Every group with its labels and metrics, as the Pushgateway's API lists them."""
        status, body = get(f"{self.url}/api/v1/metrics")
        assert status == 200, body[:200]
        return list(json.loads(body)["data"])

    def group(self, **labels: str) -> dict[str, Any] | None:
        return next((g for g in self.groups() if g["labels"] == labels), None)

    @staticmethod
    def samples(group: dict[str, Any], name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """A metric of a group: labels (without job and the grouping key) to value."""
        family = group.get(name) or {}
        found = {}
        for metric in family.get("metrics") or []:
            labels = {k: v for k, v in metric["labels"].items() if k not in group["labels"] and k != "instance"}
            found[tuple(sorted(labels.items()))] = float(metric["value"])
        return found


def pushgateway(directory: Path) -> Pushgateway:
    assert PUSHGATEWAY is not None
    port = free_port()
    # Debian's build persists to /var/lib/prometheus by default: each test has a file of its own.
    argv = [PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{port}", f"--persistence.file={directory / 'pushed.data'}"]
    return Pushgateway(argv, port, directory / "pushgateway.log")


@dataclass
class Prometheus(Server):
    rules: list[Path] = field(default_factory=list)

    def query(self, expr: str) -> list[dict[str, Any]]:
        status, body = get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert status == 200, body[:300]
        return list(json.loads(body)["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        status, body = get(f"{self.url}/api/v1/alerts")
        assert status == 200, body[:300]
        return list(json.loads(body)["data"]["alerts"])


def prometheus(directory: Path, scrape: str, rules: list[Path]) -> Prometheus:
    """A Prometheus scraping `scrape` (host:port) every second, as a Pushgateway is scraped
    (honor_labels: the pushed job and cluster stay), evaluating `rules` every second."""
    assert PROMETHEUS is not None
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(r) for r in rules],
        "scrape_configs": [
            {"job_name": "pushgateway", "honor_labels": True, "static_configs": [{"targets": [scrape]}]}
        ],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        PROMETHEUS,
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return Prometheus(argv, port, directory / "prometheus.log", rules=rules)
