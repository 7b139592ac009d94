"""Fixtures: a real etcd per test session, a Kubernetes API test server per test, and a
helper that runs the real job flow against both and checks every report against its schema.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from job import logs
from job.adapters.events import publish
from job.adapters.health import read_health
from job.adapters.keep import ReportKeeper
from job.adapters.kube import Kube, api_client
from job.adapters.lease import LeaseLock
from job.adapters.retry import RetryPolicy
from job.adapters.state import FileStateStore, StateStore
from job.cli import datastore
from job.config import Config, EtcdEndpoint
from job.core.report import SCHEMA_PATH, write
from job.flows.restore import restore
from job.flows.run import Dependencies, keep, report_befores, run
from tests.support import calico, calico2, crds, prometheus
from tests.support.cut_link import CutLink
from tests.support.etcd_server import EtcdServer
from tests.support.groups import V1, V3, Group
from tests.support.kubeapi import KubeApiServer
from tests.support.scenario import Scenario

SCHEMA = json.loads(SCHEMA_PATH.read_text())
RESTORE_SCHEMA = json.loads(SCHEMA_PATH.with_name("restore.schema.json").read_text())
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def validate_report(report: dict[str, Any]) -> None:
    jsonschema.validate(report, SCHEMA)


def no_sleep_retry(attempts: int = 4, **hooks: Any) -> RetryPolicy:
    """Real retry policy, no waiting between attempts (tests never sleep)."""
    return RetryPolicy(attempts=attempts, timeout_s=60, sleep=lambda _: None, **hooks)


@pytest.fixture(scope="session", autouse=True)
def json_logs() -> None:
    logs.configure("info")


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    server = EtcdServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> Iterator[EtcdServer]:
    if etcd_server.process is None:  # a test stopped it and did not bring it back
        etcd_server.start()
    calico.wipe(etcd_server.url)
    calico2.wipe(etcd_server.url)
    yield etcd_server
    if etcd_server.process is None:
        etcd_server.start()


@pytest.fixture
def pushgateway(tmp_path: Path) -> Iterator[prometheus.Pushgateway]:
    """A real Prometheus Pushgateway on loopback (Debian's prometheus-pushgateway)."""
    prometheus.needs(prometheus.PUSHGATEWAY, "prometheus-pushgateway")
    gateway = prometheus.pushgateway(tmp_path)
    gateway.start()
    yield gateway
    gateway.stop()


@pytest.fixture
def kubeapi() -> Iterator[KubeApiServer]:
    server = KubeApiServer().start()
    server.add_namespace("calico-gc")  # the job's own, as its chart and manifests create it
    yield server
    server.stop()
    assert server.unconditional_writes == [], "every update carries the resourceVersion it was decided on"


@pytest.fixture(params=[V1, V3], ids=["v1", "v3"])
def group(request: pytest.FixtureRequest, kubeapi: KubeApiServer) -> Group:
    """Each test on either group: the API test server installs that group's CRDs alone (v3: Calico
    3.32+ on native CRDs), and the job chooses the group as Calico does, by discovery."""
    chosen: Group = request.param
    if chosen is V3 and not crds.available():
        pytest.skip("Calico's v3 CRDs are not beside the checkout (../shared)")
    kubeapi.install(*crds.calico(chosen.crd_file))
    return chosen


@dataclass
class Harness:
    """Runs the job's real flow against the test servers, with an injectable clock."""

    etcd: EtcdServer
    kubeapi: KubeApiServer
    tmp: Path
    now: datetime = NOW
    retry: RetryPolicy = field(default_factory=no_sleep_retry)
    runs: Iterator[int] = field(default_factory=count)  # each run its own id, as each Job pod's is

    def run_id(self) -> str:
        return f"test-run-{next(self.runs)}"

    def seed(self, scenario: Scenario) -> None:
        calico.load(self.etcd.url, scenario.seed.keys)
        for name, ip in scenario.k8s_nodes:
            self.kubeapi.add_node(name, ip)

    def config(self, **overrides: Any) -> Config:
        base = Config(
            etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", self.etcd.client_port),),
            kubeconfig=(self.kubeapi.write_kubeconfig(self.tmp / "kubeconfig"),),
            state_file=self.tmp / "state.json",
            lock="none",
            namespace="calico-gc",
            grace_period=timedelta(0),
            datastore_type_given=True,
            page_size=3,
        )
        return replace(base, **overrides)

    def dependencies(self, config: Config, state: StateStore | None = None, lock: bool = False) -> Dependencies:
        kube = Kube(api_client(config), self.retry, page_size=2, clock=lambda: self.now)
        run_id = self.run_id()
        lease = LeaseLock(kube, config.namespace, "calico-gc", run_id, config.lease_duration) if lock else None
        return Dependencies(
            kube,
            datastore(config, self.retry, kube),
            state or FileStateStore(config.state_file or self.tmp / "state.json"),
            lease,
            lambda: self.now,
            run_id,
            partial(read_health, kube),
            partial(publish, kube, config.namespace, "calico-gc-test-pod"),
            reports=ReportKeeper(kube, config.namespace, config.keep_reports),
        )

    def run(self, config: Config | None = None, **kwargs: Any) -> tuple[dict[str, Any], int]:
        config = config or self.config()
        deps = self.dependencies(config, **kwargs)
        try:
            document, code = run(config, deps)
            # The report as the CLI writes it: a dry run's before-values are fetched while writing.
            text = io.StringIO()
            write(document, text, report_befores(deps.datastore))
        finally:
            deps.datastore.close()
        report: dict[str, Any] = json.loads(text.getvalue())
        validate_report(report)
        return report, code

    def restore(
        self, config: Config | None = None, source: dict[str, Any] | None = None, **kwargs: Any
    ) -> tuple[dict[str, Any], int]:
        """`calico-gc restore` of `source` (default: the newest kept report), through the real flow."""
        config = config or self.config()
        deps = self.dependencies(config, **kwargs)
        assert deps.reports is not None
        load = (lambda: source) if source is not None else partial(deps.reports.fetch, "latest")
        try:
            document, code = restore(config, deps, load, config.command.hosts)
            keep(config, deps, document)
        finally:
            deps.datastore.close()
        jsonschema.validate(document, RESTORE_SCHEMA)
        return document, code

    def dump(self) -> dict[str, tuple[str, int]]:
        return calico.dump(self.etcd.url)


@pytest.fixture
def harness(etcd: EtcdServer, kubeapi: KubeApiServer, tmp_path: Path) -> Harness:
    return Harness(etcd, kubeapi, tmp_path)


def hosts_by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in report["hosts"]}


def down_at_the_first_write(harness: Harness, stop: Callable[[], None]) -> None:
    """`stop` the datastore's server as the run's first write starts: each write from then on
    finds no connection (refused)."""
    dependencies = harness.dependencies
    stopped: list[bool] = []

    def stopping(config: Config, **kwargs: Any) -> Dependencies:
        made = dependencies(config, **kwargs)
        commit = made.datastore.commit

        def commit_with_the_server_down(step: Any) -> int:
            if not stopped:
                stopped.append(True)
                stop()
            return commit(step)

        made.datastore.commit = commit_with_the_server_down  # type: ignore[method-assign]
        return made

    harness.dependencies = stopping


def applied_losing_answers(
    harness: Harness, config: Config, marker: bytes, losses: int = 1
) -> tuple[dict[str, Any], int, CutLink]:
    """`config` run through a link to etcd that loses the answers to the first `losses` requests
    holding `marker` (CutLink); the report, the exit code and the link."""
    link = CutLink(harness.etcd.client_port, lose_answer_to=marker, losses=losses)
    try:
        report, code = harness.run(replace(config, etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", link.port),)))
    finally:
        link.close()
    return report, code, link
