"""The one frozen run configuration: flags, then environment, then defaults.

Every option is declared once in OPTIONS, which drives argparse, the environment lookup and
the README's flag table, so the three cannot drift apart.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from job.kube_syntax import SelectorError, is_dns_label, is_dns_subdomain, parse_selector

DATASTORE_TYPES = ("etcdv3", "etcdv2", "kubernetes")
CALICO_API_GROUPS = ("crd.projectcalico.org/v1", "projectcalico.org/v3")
MAX_IP_COOLDOWN_S = 1200  # IPAMConfig's ipCooldownSeconds: 0 to 1200 (its CRD)
MAX_KEPT_REPORTS = 10  # job/adapters/keep.py's MAX_SLOTS: the Role grants exactly these names
# Past these a setting is a typo, and the servers and clocks it reaches refuse it mid-run: a
# timedelta, a gRPC deadline and a Lease's int32 seconds overflow; etcd's limit is an int64.
MAX_DURATION = timedelta(days=365)
MAX_PAGE_SIZE = 1_000_000  # a page stops at about 1.5 MiB long before (etcdv3.PAGE_BYTES)
MAX_LOG_TAIL_LINES = 10_000  # read whole, one crash-looping pod at a time


class ConfigError(ValueError):
    """A bad flag or environment value: one line for the operator, exit code 2."""


# Escapes, character classes and {m,n} quantifiers: the places a comma may stand in a pattern.
_QUANTIFIERS_AND_CLASSES = re.compile(r"\\.|\[[^\]]*\]|\{\d*,\d*\}")
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """`30s`, `15m`, `2h`, `1h30m` or `0` as a timedelta."""
    text = text.strip()
    if text == "0":
        return timedelta(0)
    position, seconds = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != position:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if not text or position != len(text):
        raise ConfigError(f"invalid duration {text!r}: use forms like 30s, 15m, 2h or 1h30m")
    if seconds > MAX_DURATION.total_seconds():  # inf included (float() of 400 nines)
        raise ConfigError(f"duration {text!r} is longer than {MAX_DURATION.days}d, the most any setting takes")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """As parse_duration reads it back; a part of a second too (`500ms` is `0.5s`, not `0s`), to
    the microsecond a timedelta holds."""
    seconds = value.days * 86400 + value.seconds
    if value.microseconds:
        return f"{seconds}.{value.microseconds:06d}".rstrip("0") + "s"
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


@dataclass(frozen=True)
class EtcdEndpoint:
    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_endpoints(text: str) -> tuple[EtcdEndpoint, ...]:
    """Calico's ETCD_ENDPOINTS: comma-separated http(s) URLs. Credentials are refused."""
    endpoints = []
    for raw in filter(None, (part.strip() for part in text.split(","))):
        try:
            parts = urlsplit(raw)
            hostname = parts.hostname
        except ValueError as error:  # e.g. an unclosed IPv6 bracket
            raise ConfigError(f"invalid etcd endpoint {raw!r}: {error}") from None
        if parts.scheme not in ("http", "https") or not hostname:
            raise ConfigError(f"invalid etcd endpoint {raw!r}: expected http(s)://host:port")
        if parts.username or parts.password:
            raise ConfigError("etcd endpoints must not carry credentials; use client certificates")
        try:
            port = parts.port or 2379
        except ValueError as error:
            raise ConfigError(f"invalid etcd endpoint {raw!r}: {error}") from None
        endpoints.append(EtcdEndpoint(parts.scheme, hostname, port))
    if not endpoints:
        raise ConfigError("no etcd endpoints given (ETCD_ENDPOINTS or --etcd-endpoints)")
    return tuple(endpoints)


@dataclass(frozen=True)
class Secret:
    """A setting never printed: the log line at start says only whether it is set."""

    value: str = field(default="", repr=False)

    def __bool__(self) -> bool:
        return bool(self.value)


@dataclass(frozen=True)
class Option:
    flag: str
    env: str
    default: str | None
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    repeatable: bool = False
    switch: bool = False


OPTIONS: tuple[Option, ...] = (
    Option(
        "--apply",
        "CALICO_GC_APPLY",
        "false",
        "Delete for real. Without it the run is a dry run that reads everything and reports exactly what it would do.",
        switch=True,
    ),
    Option(
        "--dry-run",
        "CALICO_GC_DRY_RUN",
        "false",
        "Write nothing, whatever --apply or CALICO_GC_APPLY say (for a one-off check of an applying CronJob).",
        switch=True,
    ),
    Option(
        "--grace-period",
        "CALICO_GC_GRACE_PERIOD",
        "30m",
        "How long a host must be seen orphaned, continuously, before it is deleted.",
        metavar="DURATION",
    ),
    Option(
        "--conflict-grace-period",
        "CALICO_GC_CONFLICT_GRACE_PERIOD",
        "0s",
        "Grace period for an orphan that holds the IP of a live node or host (that node is down until it goes).",
        metavar="DURATION",
    ),
    Option(
        "--release-leaked-ips",
        "CALICO_GC_RELEASE_LEAKED_IPS",
        "false",
        "Also release pod IPs that stayed leaked (their pod gone or finished, on another node or holding other "
        "IPs, and no workload endpoint) for --leak-grace-period. Off by default: leaks are always reported, and a "
        "wrong release cuts a live pod off, so turning it on is a choice.",
        switch=True,
    ),
    Option(
        "--leak-grace-period",
        "CALICO_GC_LEAK_GRACE_PERIOD",
        "15m",
        "How long an IP must be seen leaked, in every run, before it is released (kube-controllers' default; "
        "at least 5m).",
        metavar="DURATION",
    ),
    Option(
        "--max-leak-releases",
        "CALICO_GC_MAX_LEAK_RELEASES",
        "50",
        "Most leaked IPs released in one run.",
        metavar="N",
    ),
    Option(
        "--ip-cooldown-seconds",
        "CALICO_GC_IP_COOLDOWN_SECONDS",
        None,
        "etcd datastores: the ipCooldownSeconds set in Calico 3.32+'s IPAMConfig (0-1200), which calico-gc "
        "does not read there. Unset: 1200, the longest Calico allows, once any address is seen cooling; "
        "the Kubernetes datastore reads IPAMConfig itself.",
        metavar="N",
    ),
    Option(
        "--max-deletions",
        "CALICO_GC_MAX_DELETIONS",
        "20",
        "Most hosts deleted in one run; the rest are deferred to the next run. On etcd v3 the read keeps whole only "
        "twice this many gone hosts, those a plan takes first.",
        metavar="N",
    ),
    Option(
        "--max-orphan-fraction",
        "CALICO_GC_MAX_ORPHAN_FRACTION",
        "0.5",
        "Refuse the run when more than this fraction of Calico hosts look orphaned.",
        metavar="FRACTION",
    ),
    Option(
        "--unreferenced",
        "CALICO_GC_UNREFERENCED",
        "skip",
        "Hosts without a k8s orchRef: skip "
        "them, or treat one as orphaned when its name equals no Kubernetes Node name.",
        choices=("skip", "match-name"),
    ),
    Option(
        "--exclude",
        "CALICO_GC_EXCLUDE",
        None,
        "Regular expression of host names never to touch (full match; repeatable; the variable takes one "
        "pattern per line). A comma outside a {m,n} quantifier is refused: host names have none, and the "
        "variable was once comma-separated.",
        metavar="REGEX",
        repeatable=True,
    ),
    Option(
        "--state-file",
        "CALICO_GC_STATE_FILE",
        None,
        "Keep grace-period state in this JSON file instead of the ConfigMap (for runs outside a cluster).",
        metavar="PATH",
    ),
    Option(
        "--state-configmap",
        "CALICO_GC_STATE_CONFIGMAP",
        "calico-gc-state",
        "ConfigMap that keeps grace-period state.",
        metavar="NAME",
    ),
    Option("--report-file", "CALICO_GC_REPORT_FILE", None, "Also write the JSON report here.", metavar="PATH"),
    Option(
        "--keep-reports",
        "CALICO_GC_KEEP_REPORTS",
        "10",
        "Keep the reports of the last N runs that changed the datastore in ConfigMaps calico-gc-report-* of "
        "--namespace (at most 10; 0: keep none); an apply run keeps one before its first write too, which its final "
        "report replaces. `reports` lists them, `restore` undoes one.",
        metavar="N",
    ),
    Option(
        "--report-configmaps",
        "CALICO_GC_REPORT_CONFIGMAPS",
        "calico-gc-report",
        "Name prefix of the kept reports' ConfigMaps: NAME-<slot>-<part>, the names the Role grants get and "
        "update on (a second install gives its own).",
        metavar="NAME",
    ),
    Option(
        "--lock",
        "CALICO_GC_LOCK",
        "lease",
        "Serialise runs with a coordination.k8s.io Lease, or not at all.",
        choices=("lease", "none"),
    ),
    Option("--lock-name", "CALICO_GC_LOCK_NAME", "calico-gc", "Name of the Lease.", metavar="NAME"),
    Option(
        "--lease-duration",
        "CALICO_GC_LEASE_DURATION",
        "2m",
        "How long the Lease holds without renewal; a run renews it every third of this from start to end, so "
        "a run killed by SIGKILL locks later runs out for this long at most.",
        metavar="DURATION",
    ),
    Option(
        "--namespace", "POD_NAMESPACE", "kube-system", "Namespace of the Lease and the state ConfigMap.", metavar="NAME"
    ),
    Option(
        "--kubeconfig",
        "KUBECONFIG",
        None,
        "kubeconfig to use outside a cluster; several, separated by ':', are merged as kubectl merges them (in a "
        "pod the in-cluster configuration is used).",
        metavar="PATH",
    ),
    Option(
        "--datastore-type",
        "DATASTORE_TYPE",
        "etcdv3",
        "Calico datastore type.",
        choices=DATASTORE_TYPES,
    ),
    Option(
        "--calico-api-group",
        "CALICO_API_GROUP",
        "",
        "Kubernetes datastore: the API group Calico's data is in, as Calico's own CALICO_API_GROUP; unset: "
        "chosen as Calico chooses it (projectcalico.org/v3 where only it is served, else crd.projectcalico.org/v1).",
        choices=CALICO_API_GROUPS,
    ),
    Option(
        "--etcd-endpoints",
        "ETCD_ENDPOINTS",
        "http://127.0.0.1:2379",
        "Comma-separated etcd URLs, as in Calico's calico-config.",
        metavar="URLS",
    ),
    Option(
        "--etcd-ca-cert-file",
        "ETCD_CA_CERT_FILE",
        None,
        "CA bundle that signed the etcd server certificate.",
        metavar="PATH",
    ),
    Option("--etcd-cert-file", "ETCD_CERT_FILE", None, "Client certificate for etcd.", metavar="PATH"),
    Option("--etcd-key-file", "ETCD_KEY_FILE", None, "Client key for etcd.", metavar="PATH"),
    Option(
        "--etcd-username",
        "ETCD_USERNAME",
        None,
        "etcd user, where etcd's own authentication is on (as Calico's ETCD_USERNAME); its password comes "
        "from --etcd-password-file, or from ETCD_PASSWORD in the environment (Calico's name), never a flag.",
        metavar="NAME",
    ),
    Option(
        "--etcd-password-file",
        "ETCD_PASSWORD_FILE",
        None,
        "File holding the etcd user's password (a mounted Secret; a final newline is not part of it).",
        metavar="PATH",
    ),
    Option("--etcd-timeout", "CALICO_GC_ETCD_TIMEOUT", "10s", "Timeout of one etcd request.", metavar="DURATION"),
    Option(
        "--page-size",
        "CALICO_GC_PAGE_SIZE",
        "10000",
        "Most keys per paged etcd read, at most 1000000 (pages also stop at about 1.5 MiB, and a prefix's "
        "first at 1,000 keys; every page is one more request to etcd, so small pages cost time).",
        metavar="N",
    ),
    Option(
        "--retry-attempts",
        "CALICO_GC_RETRY_ATTEMPTS",
        "6",
        "Attempts for one call that fails transiently (etcd unavailable, Kubernetes 429/5xx).",
        metavar="N",
    ),
    Option(
        "--retry-timeout", "CALICO_GC_RETRY_TIMEOUT", "60s", "Longest time spent retrying one call.", metavar="DURATION"
    ),
    Option(
        "--output",
        "CALICO_GC_OUTPUT",
        "text",
        "What goes to stdout: a summary for people (hosts and actions, guards, errors, health with its next "
        "step), or the JSON report. --report-file always gets JSON.",
        choices=("text", "json"),
    ),
    Option(
        "--log-format",
        "CALICO_GC_LOG_FORMAT",
        "text",
        "Logs on stderr: one readable line per event, or JSON lines for a log pipeline.",
        choices=("text", "json"),
    ),
    Option(
        "--log-level",
        "CALICO_GC_LOG_LEVEL",
        "info",
        "Log level of the logs on stderr.",
        choices=("debug", "info", "warning", "error"),
    ),
    Option(
        "--network-unavailable-threshold",
        "CALICO_GC_NETWORK_UNAVAILABLE_THRESHOLD",
        "5m",
        "A node NetworkUnavailable (condition or taint) for longer is stuck; shorter is transient.",
        metavar="DURATION",
    ),
    Option(
        "--restart-threshold",
        "CALICO_GC_RESTART_THRESHOLD",
        "5",
        "A calico-node pod that is not ready with this many restarts is crash-looping.",
        metavar="N",
    ),
    Option(
        "--calico-node-namespaces",
        "CALICO_GC_CALICO_NODE_NAMESPACES",
        "kube-system,calico-system",
        "Namespaces where calico-node pods run (manifest installs and the operator).",
        metavar="LIST",
    ),
    Option(
        "--calico-node-selector",
        "CALICO_GC_CALICO_NODE_SELECTOR",
        "k8s-app=calico-node",
        "Label selector of the calico-node pods, in the API server's syntax (k8s-app=calico-node, "
        "'k8s-app in (calico-node,calico-node-windows)', !legacy); one the server would refuse stops the run "
        "at start.",
        metavar="SELECTOR",
    ),
    Option(
        "--log-tail-lines",
        "CALICO_GC_LOG_TAIL_LINES",
        "200",
        "Lines read from the end of a crash-looping calico-node's previous log (at most 10000).",
        metavar="N",
    ),
    Option(
        "--log-read-budget",
        "CALICO_GC_LOG_READ_BUDGET",
        "60s",
        "Longest time spent reading crash-looping calico-nodes' previous logs, 8 at a time (each waits on "
        "a kubelet, and the run's plan waits for them); a pod whose log is not read by then has cause "
        "unknown. 0: read none.",
        metavar="DURATION",
    ),
    Option(
        "--fail-on",
        "CALICO_GC_FAIL_ON",
        "never",
        "Exit 5 when network health is at or above this level, so that Job-failed alerts fire.",
        choices=("never", "degraded", "critical"),
    ),
    Option(
        "--pushgateway",
        "CALICO_GC_PUSHGATEWAY",
        None,
        "Push the run's metrics to this Prometheus Pushgateway URL (a failed push only warns).",
        metavar="URL",
    ),
    Option(
        "--events",
        "CALICO_GC_EVENTS",
        "on",
        "Post Kubernetes Events: a Warning on each Node stuck NetworkUnavailable (cause and next step; the 50 "
        "stuck longest, and past those one on the run's Pod), and one per host deleted, failed or refused.",
        choices=("on", "off"),
    ),
    Option(
        "--cluster-name",
        "CALICO_GC_CLUSTER_NAME",
        None,
        "The cluster label of pushed metrics and their Pushgateway group: set one per cluster for a fleet "
        "(default: 'default'; the Calico cluster GUID is calico_gc_info's label).",
        metavar="NAME",
    ),
)


COMMANDS = ("run", "reports", "restore")


@dataclass(frozen=True)
class Command:
    """What to do: a run (the default), list or show kept reports, or restore a run."""

    name: str = "run"
    run_id: str | None = None  # reports show / restore: a kept report's run ID ("latest": the newest)
    from_file: Path | None = None  # restore: a report file instead of a kept report
    hosts: tuple[str, ...] = ()  # restore: only these hosts


@dataclass(frozen=True)
class Config:
    command: Command = Command()
    apply: bool = False
    grace_period: timedelta = timedelta(minutes=30)
    conflict_grace_period: timedelta = timedelta(0)
    release_leaked_ips: bool = False
    leak_grace_period: timedelta = timedelta(minutes=15)
    max_leak_releases: int = 50
    ip_cooldown_seconds: int | None = None  # etcd datastores only: KDD reads IPAMConfig
    max_deletions: int = 20
    max_orphan_fraction: float = 0.5
    unreferenced: str = "skip"
    exclude: tuple[str, ...] = ()
    state_file: Path | None = None
    state_configmap: str = "calico-gc-state"
    report_file: Path | None = None
    keep_reports: int = 10
    report_configmaps: str = "calico-gc-report"
    lock: str = "lease"
    lock_name: str = "calico-gc"
    lease_duration: timedelta = timedelta(minutes=2)
    namespace: str = "kube-system"
    kubeconfig: tuple[Path, ...] = ()  # merged as kubectl merges KUBECONFIG's files: the first to set a value wins
    datastore_type: str = "etcdv3"
    datastore_type_given: bool = False  # unset means etcdv3, but an empty v3 keyspace is then explained
    calico_api_group: str = ""  # Kubernetes datastore; empty: chosen as Calico chooses it
    etcd_endpoints: tuple[EtcdEndpoint, ...] = (EtcdEndpoint("http", "127.0.0.1", 2379),)
    etcd_ca_cert_file: Path | None = None
    etcd_cert_file: Path | None = None
    etcd_key_file: Path | None = None
    etcd_username: str | None = None
    etcd_password: Secret = Secret()
    etcd_timeout: timedelta = timedelta(seconds=10)
    page_size: int = 10000
    retry_attempts: int = 6
    retry_timeout: timedelta = timedelta(seconds=60)
    log_level: str = "info"
    output: str = "text"
    log_format: str = "text"
    network_unavailable_threshold: timedelta = timedelta(minutes=5)
    restart_threshold: int = 5
    calico_node_namespaces: tuple[str, ...] = ("kube-system", "calico-system")
    calico_node_selector: str = "k8s-app=calico-node"
    log_tail_lines: int = 200
    log_read_budget: timedelta = timedelta(seconds=60)
    fail_on: str = "never"
    pushgateway: str | None = None
    cluster_name: str | None = None
    events: bool = True

    def is_excluded(self, host: str) -> bool:
        return any(re.fullmatch(pattern, host) for pattern in self.exclude)


def effective(config: Config) -> dict[str, object]:
    """Every setting as this run uses it, for the log line at start. Only paths and names:
    certificates and tokens are files it names, and the one secret it holds (ETCD_PASSWORD) is
    shown only as set or not."""
    shown: dict[str, object] = {}
    for name, value in vars(config).items():
        if isinstance(value, timedelta):
            value = format_duration(value)
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, Command):
            value = value.name
        elif isinstance(value, Secret):
            value = "(set)" if value else None
        elif isinstance(value, tuple):
            value = [item.url if isinstance(item, EtcdEndpoint) else str(item) for item in value]
        shown[name] = value
    return shown


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def build_parser(command: str = "run") -> argparse.ArgumentParser:
    if command == "restore":
        parser = _Parser(
            prog="calico-gc restore",
            description="Put back what one run removed, from its kept report (or a report file). Dry run unless "
            "--apply is given here: CALICO_GC_APPLY does not count, so a CronJob's environment never makes a "
            "restore write. Only keys that are still absent are created; an IP allocated again since, a block "
            "another host claims, or a key written since is reported as a conflict and left alone.",
        )
        parser.add_argument("run_id", nargs="?", metavar="RUN_ID", help="run ID of a kept report, or 'latest'")
        parser.add_argument("--from-file", metavar="PATH", help="restore from this report file instead")
        parser.add_argument("--host", action="append", default=None, metavar="NAME", help="only this host (repeat)")
    elif command == "reports":
        parser = _Parser(
            prog="calico-gc reports",
            description="List the kept reports (runs that changed the datastore), or show one: text, or the whole "
            "JSON report with --output json.",
        )
        parser.add_argument("action", nargs="?", choices=("list", "show"), default="list")
        parser.add_argument("run_id", nargs="?", metavar="RUN_ID", help="show: the run ID, or 'latest'")
    else:
        parser = _Parser(
            prog="calico-gc",
            description="calico-gc: delete the Calico data of Kubernetes nodes that no longer exist. "
            "Dry run unless --apply. Every option can also be set by the environment variable "
            "named in brackets; a flag wins over the variable. A DURATION is written 30s, 15m, 2h or 1h30m, "
            "at most 365d. Also: `calico-gc reports` (kept reports) and "
            "`calico-gc restore RUN_ID` (undo a run); each has its own --help.",
            epilog="Exit codes: 0 ok (also dry run, nothing to do, lock held elsewhere); 1 a server failed "
            "or a bug (the report's error kind says which); 2 bad usage or configuration; 3 refused by a "
            "safety guard; 4 partial failure (restore: something could not be put back); 5 network health at "
            "--fail-on; 143 stopped by SIGTERM or SIGINT (the host in flight finished, no new one started).",
        )
    parser.add_argument("--version", action="store_true", help="Print the version and exit.")
    for option in OPTIONS:
        text = f"{option.help} [{option.env}; default: {option.default or 'unset'}]"
        if option.switch:
            parser.add_argument(option.flag, action="store_const", const="true", default=None, help=text)
        elif option.repeatable:
            parser.add_argument(option.flag, action="append", default=None, metavar=option.metavar, help=text)
        else:
            parser.add_argument(option.flag, default=None, choices=option.choices, metavar=option.metavar, help=text)
    return parser


def _command(name: str, args: Mapping[str, object]) -> Command:
    run_id = args.get("run_id")
    if name == "restore":
        from_file = args.get("from_file")
        if bool(run_id) == bool(from_file):
            raise ConfigError("restore: give a RUN_ID (see `calico-gc reports`) or --from-file PATH, not both")
        if from_file and not Path(str(from_file)).is_file():
            raise ConfigError(f"restore --from-file: cannot read {from_file}")
        hosts = args.get("host") or ()
        assert isinstance(hosts, list | tuple)
        return Command(name, str(run_id) if run_id else None, _path(str(from_file or "")), tuple(map(str, hosts)))
    if name == "reports" and args.get("action") == "show":
        if not run_id:
            raise ConfigError("reports show: give a RUN_ID (see `calico-gc reports`) or 'latest'")
        return Command("reports-show", str(run_id))
    return Command(name)


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}: expected true or false, got {text!r}")


def _int(name: str, text: str, minimum: int, maximum: int | None = None, why: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}: expected a whole number, got {text[:40]!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}: at most {maximum} ({why}), got {text.strip()[:40]}")
    return value


def _ip_cooldown(text: str | None, datastore_type: str) -> int | None:
    """Where calico-gc cannot read IPAMConfig (etcd), the operator says the cooldown; on the
    Kubernetes datastore a second source could only disagree with the one Calico uses."""
    if text is None:
        return None
    if datastore_type == "kubernetes":
        raise ConfigError(
            "--ip-cooldown-seconds: only for etcd datastores; the Kubernetes datastore reads "
            "ipCooldownSeconds from IPAMConfig, as Calico does"
        )
    return _int("--ip-cooldown-seconds", text, 0, MAX_IP_COOLDOWN_S, "IPAMConfig's limit")


def _at_least(name: str, value: timedelta, minimum: timedelta) -> timedelta:
    if value < minimum:
        raise ConfigError(f"{name}: must be at least {format_duration(minimum)}, got {format_duration(value)}")
    return value


def _pushgateway(text: str | None) -> str | None:
    if not text:
        return None
    try:
        parts = urlsplit(text)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a bracket left open, a port that is no port
        usable = False
    if not usable:
        raise ConfigError(f"--pushgateway: expected an http(s) URL, got {text!r}")
    return text.rstrip("/")


def _object_name(flag: str, text: str, room: int = 0) -> str:
    """A ConfigMap's or a Lease's name (a DNS subdomain), with `room` characters left for what is
    added to it: one the API server would refuse on every write stops the run at start."""
    if not is_dns_subdomain(text, 253 - room):
        raise ConfigError(
            f"{flag}: {text!r} is not a Kubernetes object name: lowercase letters, digits, '-' and '.', starting and "
            f"ending with a letter or digit, at most {253 - room} characters"
        )
    return text


def _namespace(flag: str, text: str) -> str:
    if not is_dns_label(text):
        raise ConfigError(
            f"{flag}: {text!r} is not a namespace name: lowercase letters, digits and '-', starting and ending with "
            "a letter or digit, at most 63 characters"
        )
    return text


def _selector(text: str) -> str:
    """A label selector the API server will take (job.kube_syntax), as given."""
    try:
        parse_selector(text)
    except SelectorError as error:
        raise ConfigError(f"--calico-node-selector {text!r}: {error}") from None
    return text


def _path(text: str | None) -> Path | None:
    return Path(text) if text else None


def _readable(name: str, text: str | None) -> Path | None:
    if not text:
        return None
    path = Path(text)
    try:
        readable = path.is_file() and os.access(path, os.R_OK)
    except OSError as error:  # a name longer than the system takes, among others
        raise ConfigError(f"{name}: cannot read {text}: {error.strerror}") from None
    if not readable:
        raise ConfigError(f"{name}: cannot read {text}")
    return path


def _password(value: str | None, file: str | None) -> str:
    """The etcd user's password: ETCD_PASSWORD, or the file --etcd-password-file names (a mounted
    Secret, which keeps it out of the process environment), less a final newline."""
    if value and file:
        raise ConfigError("give the etcd password once: ETCD_PASSWORD or --etcd-password-file (ETCD_PASSWORD_FILE)")
    path = _readable("--etcd-password-file (ETCD_PASSWORD_FILE)", file)
    if path is None:
        return value or ""
    try:
        text = path.read_text().removesuffix("\n").removesuffix("\r")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--etcd-password-file (ETCD_PASSWORD_FILE): cannot read {file}: {error}") from None
    if not text:
        raise ConfigError(f"--etcd-password-file (ETCD_PASSWORD_FILE): {file} is empty")
    return text


def load(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    """Parse and validate everything; raise ConfigError with a one-line reason."""
    name = argv[0] if argv and argv[0] in COMMANDS else "run"
    args = vars(build_parser(name).parse_args(list(argv[1:] if argv and argv[0] == name else argv)))
    command = _command(name, args)
    if name == "restore":  # only the command line makes a restore write
        environ = {k: v for k, v in environ.items() if k != "CALICO_GC_APPLY"}
    raw: dict[str, str | list[str] | None] = {}
    for option in OPTIONS:
        dest = option.flag.lstrip("-").replace("-", "_")
        value = args[dest]
        if value is None and environ.get(option.env):
            env_value = environ[option.env]
            value = [p.strip() for p in env_value.splitlines() if p.strip()] if option.repeatable else env_value
            if option.choices and env_value not in option.choices:
                raise ConfigError(f"{option.env}: expected one of {', '.join(option.choices)}, got {env_value!r}")
        raw[dest] = value if value is not None else option.default

    def text(dest: str) -> str:
        value = raw[dest]
        assert isinstance(value, str)
        return value

    def duration(dest: str) -> timedelta:
        option = next(o for o in OPTIONS if o.flag == "--" + dest.replace("_", "-"))
        try:
            return parse_duration(text(dest))
        except ConfigError as error:
            raise ConfigError(f"{option.flag} ({option.env}): {error}") from None

    def optional(dest: str) -> str | None:
        value = raw[dest]
        assert value is None or isinstance(value, str)
        return value

    datastore_type = text("datastore_type")
    fraction_text = text("max_orphan_fraction")
    try:
        fraction = float(fraction_text)
    except ValueError:
        raise ConfigError(f"--max-orphan-fraction: expected a number, got {fraction_text!r}") from None
    if not 0 < fraction <= 1:
        raise ConfigError("--max-orphan-fraction: must be above 0 and at most 1")
    exclude = tuple(raw["exclude"] or ())
    for pattern in exclude:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(f"--exclude {pattern!r}: {error}") from None
        if "," in _QUANTIFIERS_AND_CLASSES.sub("", pattern):
            raise ConfigError(
                f"--exclude {pattern!r} (CALICO_GC_EXCLUDE): a comma outside a {{m,n}} quantifier matches no host "
                "name; give one pattern per line (or repeat --exclude)"
            )
    endpoints_given = args["etcd_endpoints"] is not None or bool(environ.get("ETCD_ENDPOINTS", "").strip())
    if environ.get("ETCD_DISCOVERY_SRV") and not endpoints_given and datastore_type != "kubernetes":
        # Calico's components may find etcd by DNS SRV records; unset, the job would try 127.0.0.1.
        raise ConfigError(
            "ETCD_DISCOVERY_SRV is set but calico-gc does not look up SRV records: set ETCD_ENDPOINTS "
            "(--etcd-endpoints) to the endpoints those records name"
        )
    if (
        args["etcd_endpoints"] is None
        and "ETCD_ENDPOINTS" in environ
        and not environ["ETCD_ENDPOINTS"].strip()
        and datastore_type != "kubernetes"
    ):
        raise ConfigError(
            "ETCD_ENDPOINTS is set but empty (does calico-config lack etcd_endpoints?): set it, or "
            "DATASTORE_TYPE=kubernetes for the Kubernetes datastore; an empty value never means 127.0.0.1"
        )
    cert, key = optional("etcd_cert_file"), optional("etcd_key_file")
    if bool(cert) != bool(key):
        raise ConfigError("ETCD_CERT_FILE and ETCD_KEY_FILE must be given together")
    username, password = (
        optional("etcd_username"),
        _password(environ.get("ETCD_PASSWORD"), optional("etcd_password_file")),
    )
    if bool(username) != bool(password):
        raise ConfigError(
            "ETCD_USERNAME (--etcd-username) and its password (ETCD_PASSWORD or --etcd-password-file) must be "
            "given together"
        )
    endpoints = parse_endpoints(text("etcd_endpoints"))
    etcd_timeout = duration("etcd_timeout")
    if etcd_timeout <= timedelta(0):
        raise ConfigError("--etcd-timeout: must be above 0")
    kubeconfig = optional("kubeconfig")
    return Config(
        command=command,
        apply=_bool("--apply", text("apply")) and not _bool("--dry-run", text("dry_run")),
        grace_period=duration("grace_period"),
        conflict_grace_period=duration("conflict_grace_period"),
        release_leaked_ips=_bool("--release-leaked-ips", text("release_leaked_ips")),
        leak_grace_period=_at_least("--leak-grace-period", duration("leak_grace_period"), timedelta(minutes=5)),
        max_leak_releases=_int("--max-leak-releases", text("max_leak_releases"), 0),
        ip_cooldown_seconds=_ip_cooldown(optional("ip_cooldown_seconds"), datastore_type),
        max_deletions=_int("--max-deletions", text("max_deletions"), 0),
        max_orphan_fraction=fraction,
        unreferenced=text("unreferenced"),
        exclude=exclude,
        state_file=_path(optional("state_file")),
        state_configmap=_object_name("--state-configmap", text("state_configmap")),
        report_file=_path(optional("report_file")),
        keep_reports=_int(
            "--keep-reports", text("keep_reports"), 0, MAX_KEPT_REPORTS, "the names manifests/base/rbac.yaml grants"
        ),
        # room for the `-<slot>-<part>` that job/adapters/keep.py adds (at most `-9-3`)
        report_configmaps=_object_name("--report-configmaps", text("report_configmaps"), room=4),
        lock=text("lock"),
        lock_name=_object_name("--lock-name", text("lock_name")),
        lease_duration=_at_least("--lease-duration", duration("lease_duration"), timedelta(seconds=3)),
        namespace=_namespace("--namespace (POD_NAMESPACE)", text("namespace")),
        kubeconfig=tuple(Path(part) for part in (kubeconfig or "").split(os.pathsep) if part),
        datastore_type=datastore_type,
        datastore_type_given=args["datastore_type"] is not None or bool(environ.get("DATASTORE_TYPE")),
        calico_api_group=text("calico_api_group"),
        etcd_endpoints=endpoints,
        etcd_ca_cert_file=_readable("ETCD_CA_CERT_FILE", optional("etcd_ca_cert_file")),
        etcd_cert_file=_readable("ETCD_CERT_FILE", cert),
        etcd_key_file=_readable("ETCD_KEY_FILE", key),
        etcd_username=username or None,
        etcd_password=Secret(password),
        etcd_timeout=etcd_timeout,
        page_size=_int("--page-size", text("page_size"), 1, MAX_PAGE_SIZE, "pages stop at about 1.5 MiB first"),
        retry_attempts=_int("--retry-attempts", text("retry_attempts"), 1),
        retry_timeout=duration("retry_timeout"),
        log_level=text("log_level"),
        output=text("output"),
        log_format=text("log_format"),
        network_unavailable_threshold=duration("network_unavailable_threshold"),
        restart_threshold=_int("--restart-threshold", text("restart_threshold"), 1),
        calico_node_namespaces=tuple(
            _namespace("--calico-node-namespaces", n.strip())
            for n in text("calico_node_namespaces").split(",")
            if n.strip()
        ),
        calico_node_selector=_selector(text("calico_node_selector")),
        log_tail_lines=_int(
            "--log-tail-lines", text("log_tail_lines"), 1, MAX_LOG_TAIL_LINES, "each log is read whole"
        ),
        log_read_budget=duration("log_read_budget"),
        fail_on=text("fail_on"),
        pushgateway=_pushgateway(optional("pushgateway")),
        cluster_name=optional("cluster_name"),
        events=text("events") == "on",
    )
