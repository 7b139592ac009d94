"""Names and label selectors as the API server reads them: what it takes and what it refuses (the
selectors' cases are those of apimachinery's own tests of labels.Parse), and the settings that
carry them refused at start."""

from __future__ import annotations

import pytest

from job.config import ConfigError, load
from job.kube_syntax import Requirement, SelectorError, is_dns_label, is_dns_subdomain, parse_selector, whole_number

TAKEN = [
    "",
    "x=a,y=b,z=c",
    "x!=a,y=b",
    "x=",
    "x= ",
    "x=,z= ",
    "!x",
    "x>1,z<5",
    "\rx",
    "this-is-a-dns.domain.com/key-with-dash in (so,what)",
    "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
    "foo  in\t (abc)",
    "x notin\n (abc)",
    "x in (abc,)",
    "x in ()",
    "x notin (abc,def),bar,z in (),w",
    "notin=in",
    "x in (in,notin)",
    "k8s-app in (calico-node, calico-node-windows)",
]
REFUSED = [
    "x=a||y=b",  # `a||y` is one word, and no label value
    "x==a==b",
    "!x=a",  # `!key` takes no operator
    "x<a",
    "x>9223372036854775808",  # past Go's int64
    "===",
    "x in",
    "x in a",
    "x in (a b)",
    "x in (a,b,,c",
    "x,",
    ",x",
    "x y",
    "a/b/c",
    "/x",
    "x/" + "a" * 64,
    "x=-a",
    "(x)",
]


@pytest.mark.parametrize("text", TAKEN)
def test_what_the_server_takes_is_taken(text: str) -> None:
    parse_selector(text)


@pytest.mark.parametrize("text", REFUSED)
def test_what_the_server_refuses_is_refused(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(text)


def test_requirements_are_read_whole() -> None:
    assert parse_selector("x notin (abc,def),bar,z in (),!w,y>2") == (
        Requirement("x", "notin", frozenset({"abc", "def"})),
        Requirement("bar", "exists"),
        Requirement("z", "in", frozenset({""})),
        Requirement("w", "!"),
        Requirement("y", "gt", frozenset({"2"})),
    )


def test_a_selector_the_server_would_refuse_stops_the_run_at_start() -> None:
    assert load(["--calico-node-selector", "k8s-app in (calico-node)"], {}).calico_node_selector == (
        "k8s-app in (calico-node)"
    )
    with pytest.raises(ConfigError, match=r"^--calico-node-selector 'k8s-app in calico-node': .*expected: '\('$"):
        load([], {"CALICO_GC_CALICO_NODE_SELECTOR": "k8s-app in calico-node"})


def test_names_are_what_the_server_takes() -> None:
    assert is_dns_subdomain("calico-gc.state-1") and is_dns_subdomain("a" * 253)
    assert not any(map(is_dns_subdomain, ["Bad_Name", "-a", "a-", "a..b", "", "a" * 254]))
    assert is_dns_label("calico-system") and is_dns_label("a" * 63)
    assert not any(map(is_dns_label, ["kube.system", "Kube", "-a", "", "a" * 64]))


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--namespace", "Kube_System", "is not a namespace name"),
        ("--calico-node-namespaces", "kube-system,Calico_System", "'Calico_System' is not a namespace name"),
        ("--state-configmap", "Calico_GC", "is not a Kubernetes object name"),
        ("--lock-name", "calico-gc.", "is not a Kubernetes object name"),
        ("--report-configmaps", "a" * 250, "at most 249 characters"),  # `-9-3` is added to it
    ],
)
def test_a_name_the_server_would_refuse_stops_the_run_at_start(flag: str, value: str, said: str) -> None:
    assert load([flag, "a" * 249 if flag == "--report-configmaps" else "calico-gc"], {}), "the longest name taken"
    with pytest.raises(ConfigError, match=f"^{flag}.*{said}"):
        load([flag, value], {})


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("7", 7), ("+7", 7), ("-7", -7), ("007", 7), (str(2**63 - 1), 2**63 - 1), (str(-(2**63)), -(2**63)),
        (str(2**63), None), ("0" * 5000 + "1", 1), ("9" * 5000, None), ("\u0663", None), ("1_0", None), (" 7", None),
    ],
)  # fmt: skip
def test_a_whole_number_is_read_as_gos_parseint_reads_it(text: str, number: int | None) -> None:
    """Base 10, 64 bits, ASCII digits with a sign; 5,000 digits were int()'s ValueError."""
    assert whole_number(text) == number
