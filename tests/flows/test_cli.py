"""The command line through main(argv, environ): flags, environment, exit codes, the report."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from job.adapters.datastores import etcdv3
from job.adapters.datastores.base import Datastore
from job.adapters.health import LOG_READERS
from job.adapters.kube import POOL_CONNECTIONS, KubeError, api_client
from job.cli import main
from job.config import OPTIONS, Config, ConfigError, format_duration, load, parse_duration
from job.flows import run as runner
from tests.conftest import Harness, validate_report
from tests.support import scenario as s
from tests.support.job_process import REPO


def environment(harness: Harness, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Machine output, as a log pipeline takes it: the JSON report on stdout, JSON log lines."""
    return {
        "ETCD_ENDPOINTS": harness.etcd.url,
        "KUBECONFIG": str(harness.kubeapi.write_kubeconfig(tmp_path / "kubeconfig")),
        "POD_NAMESPACE": "calico-gc",
        "CALICO_GC_OUTPUT": "json",
        "CALICO_GC_LOG_FORMAT": "json",
        **extra,
    }


def test_dry_run_by_default_report_on_stdout_and_in_a_file(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.seed(s.kops_cluster())
    before = harness.dump()
    fetched: list[str] = []
    fetch = runner.before_values

    def counted(datastore: Datastore, wanted: Sequence[tuple[str, int]]) -> dict[str, str]:
        fetched.extend(key for key, _ in wanted)
        return fetch(datastore, wanted)

    monkeypatch.setattr(runner, "before_values", counted)
    monkeypatch.setattr(etcdv3, "ORPHAN_VALUE_BYTES", 0)  # the read holds no endpoint value: all fetched
    report_file = tmp_path / "out" / "report.json"
    code = main(
        ["--grace-period", "0s", "--state-file", str(tmp_path / "state.json"), "--report-file", str(report_file)],
        environment(harness, tmp_path),
    )
    out = capsys.readouterr()
    assert code == 0
    report = json.loads(out.out)
    validate_report(report)
    assert report == json.loads(report_file.read_text())
    assert report["mode"] == "dry-run" and report["summary"]["would_delete"] == 2
    # The before-values the dry run did not hold are fetched once, for both outputs.
    changes = [c for h in report["hosts"] for c in h["changes"]]
    assert all(c["before"] is not None for c in changes)
    assert fetched and sorted(fetched) == sorted(set(fetched))
    assert harness.dump() == before
    # Every line on stderr is a JSON log event, so `kubectl logs ... | jq` reads the whole stream.
    log_lines = [json.loads(line) for line in out.err.splitlines()]
    assert {"run_started", "decision", "run_finished"} <= {line["event"] for line in log_lines}


@pytest.mark.parametrize(
    "args",
    [
        ["--output", "json"],
        ["--output", "json", "--report-file", "{tmp}/report.json"],
        ["--output", "text", "--report-file", "{tmp}/report.json"],
        ["reports"],
        ["--version"],
    ],
)
def test_a_reader_that_leaves_first_costs_the_run_nothing(harness: Harness, tmp_path: Path, args: list[str]) -> None:
    """`calico-gc ... | head`, as a process: the pipe's reader is gone before anything is written.
    The run's exit code and its report file stand; one line on stderr says what was not shown."""
    harness.seed(s.kops_cluster())
    argv = [arg.format(tmp=tmp_path) for arg in args]
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "job", *argv, "--grace-period=0s", f"--state-file={tmp_path / 'state.json'}"]
            if argv[0].startswith("--output")
            else [sys.executable, "-m", "job", *argv],
            env={**os.environ, **environment(harness, tmp_path), "CALICO_GC_LOCK": "none"},
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "calico-gc: warning: standard output closed before all of it was written" in done.stderr
    assert ('"run_started"' in done.stderr) is argv[0].startswith("--output"), "only a run runs"
    if "--report-file" in args:
        validate_report(json.loads((tmp_path / "report.json").read_text()))


def test_started_with_standard_output_closed_the_run_writes_its_file(harness: Harness, tmp_path: Path) -> None:
    harness.seed(s.kops_cluster())
    job = [sys.executable, "-m", "job", "--grace-period=0s", f"--report-file={tmp_path / 'report.json'}"]
    done = subprocess.run(
        ["bash", "-c", 'exec "$@" >&-', "bash", *job],  # the shell closes fd 1, then runs the job
        env={**os.environ, **environment(harness, tmp_path), "CALICO_GC_LOCK": "none"},
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    validate_report(json.loads((tmp_path / "report.json").read_text()))


def test_people_get_a_readable_summary_by_default(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.seed(s.kops_cluster())
    env = {k: v for k, v in environment(harness, tmp_path).items() if not k.startswith("CALICO_GC_")}
    report_file = tmp_path / "report.json"
    code = main(
        ["--state-file", str(tmp_path / "state.json"), "--lock", "none", "--report-file", str(report_file)], env
    )
    out = capsys.readouterr()
    assert code == 0
    text = out.out.splitlines()
    assert text[0].startswith("dry-run ok (exit 0): calico_hosts=6")
    rows = {line.split()[0]: line.split()[1:3] for line in text if line.startswith(("ip-", "legacy-"))}
    assert rows == {
        s.CONFLICT_ORPHAN: ["would_delete", "k8s_node_missing"],  # the conflict grace is 0s
        s.UNREFERENCED: ["skipped", "no_k8s_orchref"],
    }
    assert f"1 waiting_grace (grace_period): {s.POD_ORPHAN}" in text  # held back: a line for all alike
    conflict_row = next(line for line in text if line.startswith(s.CONFLICT_ORPHAN))
    assert "holds 10.0.1.13, needed by ip-10-0-1-13.ec2.internal" in conflict_row
    assert "network health:" in out.out
    assert not out.err.lstrip().startswith("{"), "readable log lines"
    assert json.loads(report_file.read_text())["summary"]["calico_hosts"] == 6, "the file is always JSON"


def test_environment_configures_the_run_and_flags_win(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.seed(s.kops_cluster())
    env = environment(
        harness,
        tmp_path,
        CALICO_GC_APPLY="true",
        CALICO_GC_GRACE_PERIOD="0s",
        CALICO_GC_MAX_DELETIONS="5",
        CALICO_GC_STATE_FILE=str(tmp_path / "state.json"),
        CALICO_GC_LOCK="none",
    )
    code = main(["--max-deletions", "1"], env)
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["mode"] == "apply"
    assert report["summary"]["deleted"] == 1 and report["summary"]["deferred"] == 1


def test_lease_lock_is_the_default(harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    harness.seed(s.kops_cluster())
    code = main(["--grace-period", "0s", "--state-file", str(tmp_path / "s.json")], environment(harness, tmp_path))
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["lock"]["mode"] == "lease" and report["lock"]["acquired"]
    assert harness.kubeapi.get("/apis/coordination.k8s.io/v1/namespaces/calico-gc/leases", "calico-gc") is not None


def test_a_namespace_that_does_not_exist_is_a_setting_to_fix_and_nothing_is_deleted(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real server refuses a create in a namespace it does not hold (404, NamespaceLifecycle): the
    Lease is the run's first write, so the run stops there, before it reads or deletes anything."""
    harness.seed(s.kops_cluster())
    before = harness.dump()
    env = environment(harness, tmp_path, POD_NAMESPACE="calico-gc-typo", CALICO_GC_APPLY="true")
    code = main(["--grace-period", "0s", "--state-file", str(tmp_path / "s.json")], env)
    report = json.loads(capsys.readouterr().out)
    assert code == 2 and report["errors"][0]["kind"] == "config"
    assert report["errors"][0]["message"].startswith('namespace "calico-gc-typo" does not exist (POST /apis/')
    assert "set --namespace (POD_NAMESPACE)" in report["errors"][0]["message"]
    assert harness.dump() == before and report["summary"]["deleted"] == 0


def test_a_namespace_being_deleted_is_said_as_such_not_as_rbac(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A create in a terminating namespace (an uninstall under way) is NamespaceLifecycle's 403,
    not a missing RBAC grant: one line naming the namespace, exit 2, nothing deleted."""
    harness.seed(s.kops_cluster())
    before = harness.dump()
    harness.kubeapi.terminating.add("calico-gc")
    env = environment(harness, tmp_path, CALICO_GC_APPLY="true")
    code = main(["--grace-period", "0s", "--state-file", str(tmp_path / "s.json")], env)
    report = json.loads(capsys.readouterr().out)
    assert code == 2 and report["errors"][0]["kind"] == "config"
    assert report["errors"][0]["message"].startswith('namespace "calico-gc" is being deleted (POST /apis/')
    assert "RBAC" not in report["errors"][0]["message"]
    assert harness.dump() == before and report["summary"]["deleted"] == 0


WEBHOOK_DENIAL = {  # as Gatekeeper answers, through the API server's webhook errors
    "status": 403,
    "reason": "Forbidden",
    "message": 'admission webhook "validation.gatekeeper.sh" denied the request: [must-have-team] you must provide '
    'labels: {"team"}',
}
POLICY_DENIAL = {  # a ValidatingAdmissionPolicy whose validation has no reason: Invalid, 422
    "status": 422,
    "reason": "Invalid",
    "message": "leases.coordination.k8s.io \"calico-gc\" is forbidden: ValidatingAdmissionPolicy 'team-label' with "
    "binding 'team-label' denied request: failed expression: has(object.metadata.labels.team)",
}


@pytest.mark.parametrize(
    ("denial", "refuser"),
    [
        (WEBHOOK_DENIAL, 'admission webhook "validation.gatekeeper.sh"'),
        (POLICY_DENIAL, "ValidatingAdmissionPolicy 'team-label'"),
    ],
)
def test_a_write_refused_by_admission_names_the_webhook_or_policy(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str], denial: dict[str, Any], refuser: str
) -> None:
    """A cluster policy that refuses the job's Lease is a setting to fix (exit 2), not RBAC to grant."""
    harness.seed(s.kops_cluster())
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", **denial}
    status["code"] = status.pop("status")
    harness.kubeapi.fail("POST", "/leases$", status["code"], body=status)
    code = main(["--grace-period", "0s", "--state-file", str(tmp_path / "s.json")], environment(harness, tmp_path))
    report = json.loads(capsys.readouterr().out)
    (error,) = report["errors"]
    assert code == 2 and error["kind"] == "admission"
    assert error["message"].startswith(f"refused by {refuser} (HTTP {status['code']}) POST /apis/coordination")
    assert denial["message"] in error["message"] and "RBAC" not in error["message"]


def test_an_object_the_server_refuses_as_invalid_is_said_as_calico_gcs_bug(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not an unavailable server (exit 1 all the same): the server's words, and whose fault it is."""
    harness.seed(s.kops_cluster())
    said = (
        'Lease.coordination.k8s.io "calico-gc" is invalid: spec.leaseDurationSeconds: Invalid value: 0: must be '
        "greater than 0"
    )
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": said}
    harness.kubeapi.fail("POST", "/leases$", 422, body={**status, "reason": "Invalid", "code": 422})
    code = main(["--grace-period", "0s", "--state-file", str(tmp_path / "s.json")], environment(harness, tmp_path))
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert code == 1 and error["kind"] == "invalid" and said in error["message"]
    assert error["message"].startswith("the API server refused what calico-gc wrote (HTTP 422) POST /apis/coordination")


def test_refused_run_exits_3(harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = s.kops_cluster()
    scenario.k8s_nodes = []
    harness.seed(scenario)
    code = main(["--apply", "--lock", "none", "--state-file", str(tmp_path / "s.json")], environment(harness, tmp_path))
    report = json.loads(capsys.readouterr().out)
    assert code == 3 and report["guards"][0]["name"] == "empty_k8s_node_list"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--grace-period", "soon"], {}, "invalid duration 'soon'"),
        (["--max-deletions", "-1"], {}, "--max-deletions: must be at least 0"),
        (["--max-orphan-fraction", "2"], {}, "--max-orphan-fraction"),
        (["--unreferenced", "guess"], {}, "invalid choice"),
        (["--exclude", "("], {}, "--exclude '('"),
        (["--no-such-flag"], {}, "unrecognized arguments"),
        ([], {"CALICO_GC_APPLY": "maybe"}, "--apply: expected true or false"),
        ([], {"CALICO_GC_LOCK": "flock"}, "CALICO_GC_LOCK: expected one of lease, none"),
        ([], {"ETCD_ENDPOINTS": "etcd:2379"}, "invalid etcd endpoint"),
        ([], {"ETCD_ENDPOINTS": "https://user:pw@etcd:2379"}, "must not carry credentials"),
        ([], {"ETCD_CERT_FILE": "/etc/hostname"}, "must be given together"),
        ([], {"ETCD_USERNAME": "calico"}, "ETCD_USERNAME (--etcd-username) and its password (ETCD_PASSWORD or"),
        ([], {"ETCD_PASSWORD": "secret"}, "ETCD_USERNAME (--etcd-username) and its password (ETCD_PASSWORD or"),
        ([], {"ETCD_PASSWORD": "a", "ETCD_PASSWORD_FILE": "/etc/hostname"}, "give the etcd password once"),
        ([], {"ETCD_USERNAME": "calico", "ETCD_PASSWORD_FILE": "/no/such"}, "ETCD_PASSWORD_FILE): cannot read"),
        ([], {"ETCD_USERNAME": "calico", "ETCD_PASSWORD_FILE": "/dev/null"}, "ETCD_PASSWORD_FILE): cannot read"),
        ([], {"ETCD_CA_CERT_FILE": "/no/such/ca.pem"}, "ETCD_CA_CERT_FILE: cannot read"),
        ([], {"DATASTORE_TYPE": "consul"}, "DATASTORE_TYPE: expected one of etcdv3, etcdv2, kubernetes"),
        ([], {"KUBECONFIG": "/no/such/kubeconfig"}, "kubeconfig /no/such/kubeconfig is not usable"),
        ([], {"ETCD_ENDPOINTS": "http://[::1"}, "invalid etcd endpoint 'http://[::1'"),
        ([], {"ETCD_ENDPOINTS": " "}, "ETCD_ENDPOINTS is set but empty"),
        ([], {"ETCD_DISCOVERY_SRV": "example.com"}, "ETCD_DISCOVERY_SRV is set but calico-gc does not look up SRV"),
        ([], {"ETCD_DISCOVERY_SRV": "example.com", "ETCD_ENDPOINTS": ""}, "does not look up SRV records"),
        ([], {"ETCD_ENDPOINTS": "", "DATASTORE_TYPE": "etcdv2"}, "ETCD_ENDPOINTS is set but empty"),
        (["--grace-period", "5x"], {}, "--grace-period (CALICO_GC_GRACE_PERIOD): invalid duration '5x'"),
        ([], {"CALICO_GC_GRACE_PERIOD": "30"}, "--grace-period (CALICO_GC_GRACE_PERIOD): invalid duration '30'"),
        (["--lease-duration", "1s"], {}, "--lease-duration: must be at least 3s"),
        # The route-reflector pattern, written the old comma-separated way, must not lose its meaning.
        ([], {"CALICO_GC_EXCLUDE": "rr-.*,edge-.*"}, "a comma outside a {m,n} quantifier"),
        (["--exclude", "rr-1,rr-2"], {}, "a comma outside a {m,n} quantifier"),
        (["--ip-cooldown-seconds", "1201"], {}, "--ip-cooldown-seconds: at most 1200"),
        ([], {"CALICO_GC_IP_COOLDOWN_SECONDS": "-1"}, "--ip-cooldown-seconds: must be at least 0"),
        ([], {"CALICO_GC_IP_COOLDOWN_SECONDS": "10m"}, "--ip-cooldown-seconds: expected a whole number"),
        (
            ["--ip-cooldown-seconds", "600"],
            {"DATASTORE_TYPE": "kubernetes"},
            "--ip-cooldown-seconds: only for etcd datastores",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, env) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert "Traceback" not in err[0]


@pytest.mark.parametrize(
    "content",
    [b"clusters: [\n  - bad: yaml: here", b"\x00\xff\xfe binary junk \x89PNG", b"clusters: 5\nusers: 7\n", b""],
    ids=["yaml-syntax", "binary", "wrong-types", "empty"],
)
def test_a_malformed_kubeconfig_is_one_line_and_exit_2(
    content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    assert main(["--lock", "none"], {"KUBECONFIG": str(kubeconfig), "ETCD_ENDPOINTS": "http://127.0.0.1:9"}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"kubeconfig {kubeconfig} is not usable" in err[0] and "KUBECONFIG" in err[0], err


def test_exclude_patterns_with_quantifiers_survive_the_variable() -> None:
    config = load([], {"CALICO_GC_EXCLUDE": "rr-[0-9]{1,3}\n  edge-[a,b]\n"})
    assert config.exclude == ("rr-[0-9]{1,3}", "edge-[a,b]")
    assert config.is_excluded("rr-12") and not config.is_excluded("rr-1234") and config.is_excluded("edge-a")


def test_help_documents_every_flag_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"], {})
    text = capsys.readouterr().out
    assert exit_info.value.code == 0
    for needle in (
        "--apply",
        "--grace-period",
        "--conflict-grace-period",
        "--max-deletions",
        "--max-orphan-fraction",
        "--unreferenced",
        "--exclude",
        "--state-file",
        "--report-file",
        "--lock",
        "--kubeconfig",
        "--log-level",
        "ETCD_ENDPOINTS",
        "DATASTORE_TYPE",
        "POD_NAMESPACE",
        "Exit codes",
    ):
        assert needle in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"], {}) == 0
    assert capsys.readouterr().out.strip() == "0.1.0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("1h30m", timedelta(minutes=90)),
        ("0", timedelta(0)),
        ("1.5h", timedelta(minutes=90)),
        ("365d", timedelta(days=365)),
        ("500ms", timedelta(milliseconds=500)),
        ("1.25s", timedelta(seconds=1.25)),
        ("1.000001s", timedelta(seconds=1, microseconds=1)),  # `:g` said 1s
        ("0.000001s", timedelta(microseconds=1)),  # `:g` said 1e-06s, which no duration is
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected, "said as it is read back (500ms was 0s)"


# Past 365d: 366d, a timedelta's overflow (an OverflowError before the limit), float() of 400
# nines (inf); Arabic-Indic digits, which \d and float() read and Go's ParseDuration does not.
@pytest.mark.parametrize(
    "text",
    [
        "",
        "5",
        "m5",
        "5x",
        "1h 30m",
        "-5m",
        "366d",
        "364d25h",
        "99999999999999999999d",
        "9" * 400 + "s",
        "\u0663\u0660s",
    ],
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("flag", "most"),
    [("--page-size", 1_000_000), ("--log-tail-lines", 10_000), ("--ip-cooldown-seconds", 1200), ("--keep-reports", 10)],
)
def test_a_whole_number_setting_past_its_most_is_refused_in_one_line(flag: str, most: int) -> None:
    """A page size past etcd's int64 failed mid-read with a traceback (protobuf's `Value out of
    range`); a log tail is read whole, one pod at a time."""
    assert getattr(load([flag, str(most)], {}), flag[2:].replace("-", "_")) == most
    for text in (str(most + 1), "9" * 30):
        with pytest.raises(ConfigError, match=rf"^{flag}: at most {most} \(.+\), got {text[:40]}$"):
            load([flag, text], {})


def test_defaults_are_safe() -> None:
    config = load([], {})
    assert not config.apply
    assert config.grace_period == timedelta(minutes=30) and config.conflict_grace_period == timedelta(0)
    assert (config.max_deletions, config.max_orphan_fraction, config.unreferenced) == (20, 0.5, "skip")
    assert config.lock == "lease" and config.datastore_type == "etcdv3"


def test_exclude_from_the_environment_is_one_pattern_per_line() -> None:
    config = load([], {"CALICO_GC_EXCLUDE": "rr-.*\n bastion\n"})
    assert config.exclude == ("rr-.*", "bastion")
    assert config.is_excluded("rr-1") and config.is_excluded("bastion") and not config.is_excluded("bastion-2")


SETTINGS_OF_ANY_SHAPE = (
    "", " ", "x" * 300, "\x00", "\u00b2", "\u0663", "-1", "1_0", "1e309", "nan", "99999999999999999999999",
    "http://[::1", "http://h:99999", "://", "a,,b", "PT5M", "99999999999999999999999d",
)  # fmt: skip


@pytest.mark.parametrize("value", SETTINGS_OF_ANY_SHAPE)
def test_a_setting_of_any_shape_is_taken_or_refused_in_one_line(value: str) -> None:
    """Every variable (and so every flag) set to values people and templates get wrong: the
    setting is taken or refused with a ConfigError (one line, exit 2), never another exception
    (a traceback). Found this way: a Pushgateway URL that urlsplit refuses (`http://[::1`), and a
    certificate file name longer than the system takes."""
    for option in OPTIONS:
        with contextlib.suppress(ConfigError):
            load([], {option.env: value})


def test_the_etcd_password_is_read_from_its_file_less_a_final_newline(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    config = load(["--etcd-username", "calico-gc", "--etcd-password-file", str(password)], {})
    assert config.etcd_password.value == "s3cret" and config.etcd_username == "calico-gc"
    for content in (b"", b"\n", b"\xff\xfe"):
        password.write_bytes(content)
        with pytest.raises(ConfigError, match="ETCD_PASSWORD_FILE"):
            load(["--etcd-username", "calico-gc", "--etcd-password-file", str(password)], {})


def test_readme_documents_every_flag_and_variable() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for option in OPTIONS:
        assert f"`{option.flag}" in readme and f"`{option.env}`" in readme, option.flag
    assert readme.index("make demo") < readme.index("## Why") and readme.index("make test") < readme.index("## Why")


def test_dry_run_wins_over_apply_from_the_environment() -> None:
    assert load([], {"CALICO_GC_APPLY": "true"}).apply
    assert not load(["--dry-run"], {"CALICO_GC_APPLY": "true"}).apply
    assert not load(["--apply"], {"CALICO_GC_DRY_RUN": "true"}).apply


def test_the_effective_configuration_is_logged_once_at_start(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.seed(s.kops_cluster())
    env = environment(harness, tmp_path, CALICO_GC_LOCK="none", CALICO_GC_STATE_FILE=str(tmp_path / "state.json"))
    assert main(["--grace-period", "45m"], env) == 0
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    (started,) = [line for line in lines if line["event"] == "run_started"]
    config = started["config"]
    assert set(config) == {f.name for f in fields(Config)}
    assert config["grace_period"] == "45m" and config["etcd_endpoints"] == [harness.etcd.url]
    assert "test-token" not in json.dumps(started), "no credential is logged"


def test_kubeconfig_files_are_merged_as_kubectl_merges_them(harness: Harness, tmp_path: Path) -> None:
    """KUBECONFIG=a:b (a file of one's own before the cluster's, as kubectx-style setups have):
    the files are merged, the first to set a value winning; before, only the first was read."""
    own = tmp_path / "own"
    own.write_text("apiVersion: v1\nkind: Config\npreferences: {colors: true}\n")
    cluster = harness.kubeapi.write_kubeconfig(tmp_path / "cluster")
    config = load([], {"KUBECONFIG": f"{own}{os.pathsep}{cluster}{os.pathsep}"})
    assert config.kubeconfig == (own, cluster)
    assert api_client(config).configuration.host == harness.kubeapi.url
    with pytest.raises(KubeError, match=f"kubeconfig {own} is not usable"):
        api_client(load(["--kubeconfig", str(own)], {}))


def test_outside_a_cluster_the_default_kubeconfig_is_used_as_kubectl_does(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / ".kube").mkdir()
    harness.kubeapi.write_kubeconfig(tmp_path / ".kube" / "config")
    assert api_client(Config()).configuration.host == harness.kubeapi.url
    (tmp_path / ".kube" / "config").unlink()
    with pytest.raises(KubeError, match="set --kubeconfig or KUBECONFIG"):
        api_client(Config())


def test_in_a_pod_the_service_account_is_used_and_the_pool_holds_the_runs_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a pod: the Service's address and the mounted token and CA, with the token re-read as it
    rotates, as the client loads them. On a node of one core the client's pool is 5 connections,
    fewer than the 8 previous logs a run reads at once (each past the pool opened and dropped a
    connection, with a warning): it holds POOL_CONNECTIONS, in a pod or with a kubeconfig."""
    from kubernetes.config import incluster_config

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr("multiprocessing.cpu_count", lambda: 1)
    client = api_client(Config())
    assert client.configuration.host == "https://10.96.0.1:443"
    assert client.configuration.api_key["BearerToken"].endswith(" sa-token")
    assert client.configuration.refresh_api_key_hook is not None
    assert client.rest_client.pool_manager.connection_pool_kw["maxsize"] == POOL_CONNECTIONS > LOG_READERS


@pytest.mark.parametrize("text", ["{not json", "[" * 100_000 + "]" * 100_000])
def test_a_report_file_restore_cannot_read_is_said_in_one_line(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """`restore --from-file` of a file that is no JSON, or JSON nested past Python's limit (a
    RecursionError, which was a traceback), is a setting to fix: exit 2, nothing written."""
    harness.seed(s.kops_cluster())
    before = harness.dump()
    report_file = tmp_path / "report.json"
    report_file.write_text(text)
    code = main(["restore", "--from-file", str(report_file)], environment(harness, tmp_path))
    out = capsys.readouterr()
    assert code == 2 and "Traceback" not in out.err
    assert f"cannot read the report {report_file}" in out.out + out.err
    assert harness.dump() == before
