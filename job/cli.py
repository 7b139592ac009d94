"""Command line entry: parse, wire the real clients together, run, write the report."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial

from job import __version__, logs, report
from job.config import Config, ConfigError, load
from job.datastores.base import Datastore
from job.datastores.etcdv2 import EtcdV2Datastore
from job.datastores.etcdv3 import EtcdV3Datastore
from job.datastores.kdd import KddDatastore
from job.events import publish
from job.health_reads import read_health
from job.kube import Kube, KubeError, api_client
from job.lease import LeaseLock
from job.retry import RetryPolicy
from job.runner import Dependencies, ExitCode, run
from job.state import ConfigMapStateStore, FileStateStore, StateStore


def _now() -> datetime:
    return datetime.now(UTC)


def retry_policy(config: Config) -> RetryPolicy:
    return RetryPolicy(attempts=config.retry_attempts, timeout_s=config.retry_timeout.total_seconds())


def dependencies(config: Config, environ: Mapping[str, str]) -> Dependencies:
    run_id = uuid.uuid4().hex[:12]
    retry = retry_policy(config)
    kube = Kube(api_client(config), retry, clock=_now)
    state: StateStore = (
        FileStateStore(config.state_file)
        if config.state_file
        else ConfigMapStateStore(kube, config.namespace, config.state_configmap)
    )
    holder = f"{environ.get('POD_NAME') or socket.gethostname()}/{run_id}"
    lock = (
        LeaseLock(kube, config.namespace, config.lock_name, holder, config.lease_duration)
        if config.lock == "lease"
        else None
    )
    return Dependencies(
        kube,
        datastore(config, retry, kube),
        state,
        lock,
        _now,
        run_id,
        partial(read_health, kube),
        partial(publish, kube, config.namespace, environ.get("POD_NAME")),
    )


def datastore(config: Config, retry: RetryPolicy, kube: Kube) -> Datastore:
    """The adapter for DATASTORE_TYPE; unset means etcdv3, with a check for Calico 2.x data."""
    if config.datastore_type == "kubernetes":
        return KddDatastore(kube)
    if config.datastore_type == "etcdv2":
        return EtcdV2Datastore(config, retry)
    legacy = None if config.datastore_type_given else EtcdV2Datastore(config, retry).has_calico_data
    return EtcdV3Datastore(config, retry, explain_empty=legacy)


@contextmanager
def stop_on_signals(stopping: threading.Event) -> Iterator[None]:
    """SIGTERM (Kubernetes: deadline, drain, eviction) and SIGINT ask the run to stop: the write
    in flight and its host are finished, no new host is started, the report is written and the
    Lease released. Installing a handler also makes SIGTERM work when the job is PID 1, where
    the kernel would otherwise ignore it."""

    def handler(signum: int, _frame: object) -> None:
        stopping.set()
        line = {"event": "stop_requested", "signal": signal.Signals(signum).name, "level": "warning"}
        os.write(2, (json.dumps(line) + "\n").encode())  # no logging lock inside a signal handler

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run once; the return value is the process exit code."""
    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else argv
    if "--version" in argv:
        print(__version__)
        return ExitCode.OK
    try:
        config = load(argv, environ)
    except ConfigError as error:
        print(f"calico-gc: error: {error} (see --help)", file=sys.stderr)
        return ExitCode.USAGE
    logs.configure(config.log_level, config.log_format)
    try:
        deps = dependencies(config, environ)
    except KubeError as error:
        print(f"calico-gc: error: {error}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        with stop_on_signals(deps.stopping):
            document, code = run(config, deps)
    finally:
        deps.datastore.close()
    try:
        if config.report_file is not None:
            report.write_file(document, config.report_file)
    except OSError as error:
        print(f"calico-gc: error: cannot write the report to {config.report_file}: {error}", file=sys.stderr)
        code = max(code, ExitCode.ERROR)
    if config.output == "json":
        report.write(document, sys.stdout)
    else:
        sys.stdout.write(report.render_text(document))
    return code


def console() -> None:
    """The `calico-gc` command that `pip install .` puts on PATH."""
    sys.exit(main())
