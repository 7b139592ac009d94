"""Command line entry: parse, wire the real clients together, run, write the report."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Any

from job import __version__, logs
from job.adapters.datastores.base import Datastore
from job.adapters.datastores.etcdv2 import EtcdV2Datastore
from job.adapters.datastores.etcdv3 import EtcdV3Datastore
from job.adapters.datastores.kdd import KddDatastore
from job.adapters.events import publish
from job.adapters.health import read_health
from job.adapters.keep import KeepError, ReportKeeper
from job.adapters.kube import Kube, KubeError, api_client
from job.adapters.lease import LeaseLock
from job.adapters.report_file import write_file, write_report
from job.adapters.retry import RetryPolicy
from job.adapters.state import ConfigMapStateStore, FileStateStore, StateStore
from job.config import MAX_KEPT_REPORTS, Config, ConfigError, load
from job.core import report
from job.core.model import parse_time
from job.flows.restore import render_text as render_restore
from job.flows.restore import restore
from job.flows.run import Dependencies, ExitCode, keep, report_befores, run


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
        reports=ReportKeeper(kube, config.namespace, config.keep_reports, config.report_configmaps),
    )


def datastore(config: Config, retry: RetryPolicy, kube: Kube) -> Datastore:
    """The adapter for DATASTORE_TYPE; unset means etcdv3, with a check for Calico 2.x data."""
    if config.datastore_type == "kubernetes":
        return KddDatastore(kube, config.calico_api_group)
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


@contextmanager
def _reader_may_leave() -> Iterator[None]:
    """Output to a reader that may exit before it is written (`calico-gc --output json | head`):
    said once on stderr. The run's outcome and exit code stand, and the report is still in
    --report-file and the kept reports."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        # What is still buffered goes to /dev/null, or Python would fail again flushing it at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("calico-gc: warning: standard output closed before all of it was written", file=sys.stderr)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run once; the return value is the process exit code."""
    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else argv
    if "--version" in argv:
        with _reader_may_leave():
            print(__version__)
        return ExitCode.OK
    try:
        config = load(argv, environ)
    except ConfigError as error:
        print(f"calico-gc: error: {error} (see --help)", file=sys.stderr)
        return ExitCode.USAGE
    logs.configure(config.log_level, config.log_format)
    if config.command.name.startswith("reports"):
        code: int = ExitCode.OK  # what a listing whose reader left ends with
        with _reader_may_leave():
            code = _reports(config)
        return code
    try:
        deps = dependencies(config, environ)
    except KubeError as error:
        print(f"calico-gc: error: {error}", file=sys.stderr)
        return ExitCode.USAGE
    befores = None if config.command.name == "restore" else report_befores(deps.datastore)
    try:
        with stop_on_signals(deps.stopping):
            if config.command.name == "restore":
                document, code, render = _restore(config, deps)
            else:
                (document, code), render = run(config, deps), report.render_text
        written = None
        try:
            if config.report_file is not None:
                write_file(document, config.report_file, befores)
                written = config.report_file
        except OSError as error:
            print(f"calico-gc: error: cannot write the report to {config.report_file}: {error}", file=sys.stderr)
            code = max(code, ExitCode.ERROR)
        with _reader_may_leave():
            if config.output != "json":
                sys.stdout.write(render(document))
            elif written is None:
                write_report(document, sys.stdout, befores)
            else:  # the file's text: a dry run's before-values are fetched once, and both outputs agree
                try:
                    with written.open() as text:
                        shutil.copyfileobj(text, sys.stdout)
                except BrokenPipeError:  # the reader's, not the file's: _reader_may_leave says it
                    raise
                except OSError as error:
                    print(
                        f"calico-gc: error: cannot copy the report from {written} to stdout: {error}", file=sys.stderr
                    )
                    code = max(code, ExitCode.ERROR)
    finally:
        deps.datastore.close()
    return code


def _source(config: Config, deps: Dependencies) -> dict[str, Any]:
    """The report a restore undoes: a file, or a kept report (KeepError when neither can be read)."""
    if config.command.from_file is None:
        assert config.command.run_id is not None and deps.reports is not None
        return deps.reports.fetch(config.command.run_id)
    try:
        document = json.loads(config.command.from_file.read_text())
    except (OSError, ValueError, RecursionError) as error:
        raise KeepError(f"cannot read the report {config.command.from_file}: {error}", "config") from error
    if not isinstance(document, dict):
        raise KeepError(f"{config.command.from_file} is not a JSON report", "config")
    return document


def _restore(config: Config, deps: Dependencies) -> tuple[dict[str, Any], int, Callable[[dict[str, Any]], str]]:
    document, code = restore(config, deps, partial(_source, config, deps), config.command.hosts)
    keep(config, deps, document)
    return document, code, render_restore


def _reports(config: Config) -> int:
    """`reports` and `reports show`: read-only, no lock, no datastore."""
    try:
        kube = Kube(api_client(config), retry_policy(config))
        keeper = ReportKeeper(kube, config.namespace, MAX_KEPT_REPORTS, config.report_configmaps)
        if config.command.name == "reports":
            kept = keeper.list()
            if config.output == "json":
                print(json.dumps(kept, indent=2))
                return ExitCode.OK
            print(f"{'RUN':<12}  {'STARTED':<20}  {'KIND':<7}  {'OUTCOME':<15}  SUMMARY")
            for entry in kept:
                kind = "restore" if entry.get("schema", "").startswith("calico-gc/restore") else "run"
                started = parse_time(entry.get("started-at"))  # to the second: a person reads it
                shown = started.strftime("%Y-%m-%dT%H:%M:%SZ") if started else "?"
                print(
                    f"{entry['run-id']:<12}  {shown:<20}  {kind:<7}  "
                    f"{entry.get('outcome', '?'):<15}  {entry.get('summary', '')}"
                )
            if not kept:
                print(f"(no kept reports in {config.namespace}: only runs that change the datastore are kept)")
            return ExitCode.OK
        document = keeper.fetch(str(config.command.run_id))
    except (KeepError, KubeError) as error:
        print(f"calico-gc: error: {error}", file=sys.stderr)
        return ExitCode.USAGE if error.kind == "config" else ExitCode.ERROR
    if config.output == "json":
        write_report(document, sys.stdout)
        return ExitCode.OK
    render = render_restore if str(document.get("schema", "")).startswith("calico-gc/restore") else report.render_text
    try:
        text = render(document)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as error:
        # Another run's document, maybe another version's or edited: its summary cannot be
        # printed, but the report is there, as kept.
        print(
            f"calico-gc: error: the kept report of run {config.command.run_id} is not one this version can summarise "
            f"({type(error).__name__}: {error}); --output json shows it as kept",
            file=sys.stderr,
        )
        return ExitCode.ERROR
    sys.stdout.write(text)
    return ExitCode.OK


M_ARENA_MAX = -8  # glibc's mallopt parameter


def one_malloc_arena() -> None:
    """Have every thread allocate from glibc's one main arena, as MALLOC_ARENA_MAX=1 does. gRPC's
    own threads receive the read's answers; each would otherwise fill an arena of its own that
    keeps what was freed (5,000 hosts: 34 MB of the peak, for no measurable time). Not glibc
    (musl, macOS): nothing to do."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass


def console() -> None:
    """The `calico-gc` command that `pip install .` puts on PATH (and `python -m job`)."""
    # What the imports made lives to the end: frozen out of the cyclic collector's passes, which
    # walked it again and again (with job/__main__.py's pause, 0.1 s of a 5,000-host dry run).
    gc.freeze()
    gc.enable()
    one_malloc_arena()  # before any thread starts
    if sys.stdout is None:  # started with standard output closed: the report goes to the file only
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the process's own, open to its end)
    sys.exit(main())
