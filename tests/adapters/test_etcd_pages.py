"""The paged etcd v3 read asks etcd for windows of keys, not the rest of the prefix (etcd counts
every key up to a range's end on every page). Whatever the keys look like, the windows meet end
to end: the read returns exactly the keys one unpaged range returns, each once, in order."""

from __future__ import annotations

import base64
import random
import sys
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from job.adapters.datastores import etcdv3
from job.adapters.datastores.base import DatastoreError
from job.adapters.datastores.etcdv3 import (
    BLOCKS,
    HANDLES,
    NAMESPACE_PROFILES,
    READ_SWITCH_INTERVAL,
    WORKLOAD_ENDPOINTS,
    EtcdV3Datastore,
    NamespaceStarts,
    Window,
    prefix_end,
)
from job.adapters.retry import RetryPolicy
from job.config import Config, EtcdEndpoint
from job.core import scan
from job.core.inventory import Inventory
from tests.support import calico
from tests.support.etcd_server import EtcdServer

PREFIX = b"/calico/ipam/v2/handle/"
OUTSIDE = [b"/calico/ipam/v2/handlf", b"/calico/ipam/v2/handle", b"/calico/ipam/v2/hand"]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _put(etcd: EtcdServer, keys: list[bytes]) -> None:
    calico.wipe(etcd.url)
    for start in range(0, len(keys), 128):
        puts = [
            {"request_put": {"key": _b64(k), "value": _b64(b"v" * (len(k) % 7))}} for k in keys[start : start + 128]
        ]
        requests.post(f"{etcd.url}/v3/kv/txn", json={"success": puts}, timeout=30).raise_for_status()


def _read(
    etcd: EtcdServer, page_size: int, bounds: etcdv3.Bounds | None = None, prefix: bytes = PREFIX
) -> tuple[list[bytes], int, int]:
    """Every key under `prefix` as the job's scan pages them, how many ranges it asked for, and
    how many keys etcd counted for them (as the report says them: `datastore.ranges`)."""
    store = EtcdV3Datastore(
        Config(etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", etcd.client_port),), page_size=page_size),
        RetryPolicy(),
    )
    try:
        keys = [kv.key for kvs, _ in store.scan(prefix.decode(), bounds=bounds or []) for kv in kvs]
        ranges = store.describe()["ranges"]
    finally:
        store.close()
    assert isinstance(ranges, dict) and ranges["keys"] == len(keys)
    return keys, ranges["requests"], ranges["keys_counted"]


def fleet(hosts: int) -> list[bytes]:
    """Calico's own shapes: random container ids, then tunnel handles of hosts in a few groups."""
    chance = random.Random(hosts)
    keys = [PREFIX + b"k8s-pod-network." + chance.randbytes(32).hex().encode() for _ in range(hosts * 5)]
    keys += [PREFIX + f"ipip-tunnel-addr-team-{h % 3}-ip-10-{h}".encode() for h in range(hosts)]
    return keys


CASES = {
    "empty": [],
    "one key": [PREFIX + b"a"],
    "the prefix and keys that are prefixes of others": [PREFIX, PREFIX + b"a", PREFIX + b"a\x00", PREFIX + b"ab"],
    "bytes that are not UTF-8": [PREFIX + bytes([b, 0xFF, 0xC3]) for b in range(0x61, 0x61 + 40)],
    "dense then sparse": [PREFIX + b"a" * 30 + bytes([i]) for i in range(1, 60)] + [PREFIX + b"z", PREFIX + b"\xff"],
    "a calico fleet": fleet(60),
}


@pytest.mark.parametrize("page_size", [1, 2, 7, 50])
@pytest.mark.parametrize("case", list(CASES))
def test_the_windowed_read_returns_every_key_once_in_order(etcd: EtcdServer, case: str, page_size: int) -> None:
    keys = CASES[case]
    _put(etcd, keys + OUTSIDE)
    read, _, _ = _read(etcd, page_size)
    assert read == sorted(set(keys))


def test_windows_spare_etcd_the_count_of_the_rest_of_the_prefix(etcd: EtcdServer) -> None:
    """Random container ids: after the first page, each window is sized to about four pages and
    ends where the keys say, so pages stay full and few extra ranges are asked for."""
    keys = fleet(200)
    _put(etcd, keys)
    read, asked, counted = _read(etcd, 50)
    assert read == sorted(keys)
    pages = len(keys) / 50
    assert counted < 8 * len(keys), f"a plain paged read makes etcd count ~{len(keys) * pages / 2:.0f}"
    assert asked <= 1.5 * pages, "windows that miss cost extra ranges"


def test_a_first_page_is_bounded_by_keys_and_the_others_by_bytes(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before a prefix's keys are seen their size is not known: the first page asks for at most
    FIRST_PAGE_KEYS however large --page-size is, and the later pages for about PAGE_BYTES."""
    monkeypatch.setattr(etcdv3, "FIRST_PAGE_KEYS", 10)
    monkeypatch.setattr(etcdv3, "PAGE_BYTES", 25 * 200)
    keys = {f"{PREFIX.decode()}{n:04}": "v" * 200 for n in range(120)}
    calico.wipe(etcd.url)
    calico.load(etcd.url, keys)
    store = EtcdV3Datastore(
        Config(etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", etcd.client_port),), page_size=1000), RetryPolicy()
    )
    try:
        pages = [[kv.key.decode() for kv in kvs] for kvs, _ in store.scan(PREFIX.decode())]
    finally:
        store.close()
    assert [key for page in pages for key in page] == sorted(keys)
    assert len(pages[0]) == 10, "the first page asked for --page-size keys"
    assert all(len(page) <= 25 for page in pages[1:]) and len(pages) >= 1 + 110 // 25


def test_an_answers_size_is_what_protobuf_counts_for_it(etcd: EtcdServer) -> None:
    """The pages are sized by each answer's length as it came (etcd_grpc._sized_range), which must
    be what the message's ByteSize() would walk every key-value to count."""
    calico.wipe(etcd.url)
    calico.load(etcd.url, {f"{PREFIX.decode()}{n:04}": "v" * n for n in range(300)})
    store = EtcdV3Datastore(
        Config(etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", etcd.client_port),)), RetryPolicy()
    )
    try:
        for limit in (1, 7, 300):
            answer, size = store.range(PREFIX, prefix_end(PREFIX.decode()), None, limit)
            assert len(answer.kvs) == limit and size == answer.ByteSize() > 0
    finally:
        store.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tails=st.lists(st.binary(min_size=0, max_size=12), max_size=40, unique=True),
    page_size=st.integers(min_value=1, max_value=6),
    hints=st.lists(st.binary(max_size=12), max_size=6),
)
def test_any_keys_at_any_page_size(etcd: EtcdServer, tails: list[bytes], page_size: int, hints: list[bytes]) -> None:
    """Bounds anywhere, on keys or between them, before or after all: still every key once."""
    keys = [PREFIX + tail for tail in tails]
    _put(etcd, keys + OUTSIDE)
    read, _, _ = _read(etcd, page_size, sorted(PREFIX + hint for hint in hints))
    assert read == sorted(keys)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tails=st.lists(st.binary(min_size=0, max_size=12), max_size=40, unique=True),
    page_size=st.integers(min_value=1, max_value=6),
    hosts=st.lists(st.text("ab-", max_size=3), max_size=4),
)
def test_endpoints_found_bounds_and_gap_ranges_still_read_every_key(
    etcd: EtcdServer, tails: list[bytes], page_size: int, hosts: list[str]
) -> None:
    """The endpoints' bounds as a keyspace without profiles or the blocks' namespaces makes them:
    learnt from the pages themselves, with the ranges past a gap ending where a name goes up by
    one (NamespaceStarts.gap_ends). Any keys, any page size: still every key once, in order."""
    prefix = WORKLOAD_ENDPOINTS.encode()
    keys = [prefix + tail for tail in tails]
    _put(etcd, [*keys, prefix[:-1], prefix_end(WORKLOAD_ENDPOINTS)])
    read, _, _ = _read(etcd, page_size, NamespaceStarts(hosts=hosts), prefix)
    assert read == sorted(keys)


def test_past_a_namespaces_end_the_ranges_end_where_its_name_goes_up_by_one() -> None:
    """From a namespace's end, or from within it: each end past the last, the first at its end."""
    prefix = WORKLOAD_ENDPOINTS.encode()
    starts = NamespaceStarts(["team-1"])
    assert not starts.gap_ends(prefix + b"team-1/ip--10--7-k8s-app")  # every namespace is named
    starts.seen([SimpleNamespace(key=prefix + b"kube-system/ip--10--7-k8s-app")])  # one that nothing named
    assert starts.gap_ends(prefix + b"team-1/ip--10--7-k8s-app") == [
        prefix + end
        for end in (b"team-10", b"team-11", b"team-20", b"team.10", b"tean-10", b"tebm-10", b"tfam-10", b"ueam-10")
    ]
    assert starts.gap_ends(prefix + b"kube-system0")[:3] == [
        prefix + b"kube-system1",
        prefix + b"kube-systen0",
        prefix + b"kube-systfm0",
    ]
    assert starts.gap_ends(prefix + b"a\xff") == [prefix + b"b\xff"]
    assert not starts.gap_ends(prefix)


def test_namespace_bounds_spare_etcd_the_count_across_namespaces(etcd: EtcdServer) -> None:
    """Endpoints of 30 namespaces of very different sizes: where windows guess across a
    namespace's end, etcd counts far past it; bounded at each namespace's start, each range
    counts little more than it returns. A namespace without a bound (one Kubernetes no longer
    has) is read all the same."""
    chance = random.Random(7)
    keys = sorted(
        {
            PREFIX + f"team-{ns}/ip--10--{chance.randrange(20)}--{chance.randrange(250)}--10-app--{i}-eth0".encode()
            for ns in range(30)
            for i in range(chance.choice([2, 10, 40, 150, 400]))
        }
    )
    _put(etcd, keys)
    plain, _, guessed = _read(etcd, 50)
    starts = sorted({PREFIX + key[len(PREFIX) :].split(b"/")[0] + b"/" for key in keys})
    read, asked, counted = _read(etcd, 50, [b for b in starts if b != PREFIX + b"team-7/"])
    assert read == plain == keys
    assert counted < 2.5 * len(keys) and 4 * counted < guessed, (counted, guessed, len(keys))
    assert asked < len(keys) / 50 + len(starts) + 10


def test_a_range_spans_many_small_namespaces(etcd: EtcdServer) -> None:
    """Hundreds of namespaces of a few endpoints each: a range per namespace would cost etcd and
    the job a round trip for each (10,000 namespaces took 10,064 ranges and 6x `etcdctl`'s time).
    The ranges cross as many namespace starts as the last ones say should fill a page, so
    they are few; a large namespace among them still ends the span early (counted stays low)."""
    chance = random.Random(11)
    sizes = [chance.choice([1, 2, 3, 5]) for _ in range(400)]
    sizes[150] = sizes[300] = 500
    keys = sorted(PREFIX + f"ns-{ns:04}/ep-{i:04}".encode() for ns, size in enumerate(sizes) for i in range(size))
    starts = sorted({PREFIX + key[len(PREFIX) :].split(b"/")[0] + b"/" for key in keys})
    _put(etcd, keys)
    read, asked, counted = _read(etcd, 50, starts)
    assert read == keys
    assert asked < len(keys) / 25 + 30 < len(starts) / 3, (asked, len(starts))
    assert counted < 2.5 * len(keys), (counted, len(keys))


@given(first=st.binary(min_size=1, max_size=20), gap=st.binary(min_size=1, max_size=20), keys=st.integers(2, 5000))
def test_a_window_ends_past_the_last_key_read_and_the_next_past_it(first: bytes, gap: bytes, keys: int) -> None:
    last, limit = first + gap, b"\xff" * 48
    window = Window.after(first, last, keys, 1)
    if window is None:
        return
    end = window.end(limit)
    if end is not None:
        assert end > last + b"\x00"
        after = window.wider(2).end(limit)
        assert after is None or after > end


def test_the_read_passes_the_interpreter_lock_more_often_only_while_it_runs(etcd: EtcdServer) -> None:
    """_items shortens Python's switch interval for its workers, a process-wide setting, and
    gives the old one back when it ends, also when its reader stops early."""
    _put(etcd, [PREFIX + b"%03d" % n for n in range(50)])
    store = EtcdV3Datastore(
        Config(etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", etcd.client_port),), page_size=7), RetryPolicy()
    )
    before = sys.getswitchinterval()
    assert before != READ_SWITCH_INTERVAL
    try:
        revision = store.range(PREFIX.decode(), None, None)[0].header.revision
        with store._items(revision, ((PREFIX.decode(),),)) as items:
            during = [sys.getswitchinterval() for _, kvs in items for _ in kvs]
        assert len(during) == 50 and set(during) == {READ_SWITCH_INTERVAL}
        assert sys.getswitchinterval() == before
        with store._items(revision, ((PREFIX.decode(),),)) as items:
            next(items)
        assert sys.getswitchinterval() == before
    finally:
        store.close()


def test_the_ipam_pages_are_asked_for_while_the_kubernetes_names_are_awaited(etcd: EtcdServer) -> None:
    """The read's slowest wait, for the Kubernetes Node list, overlaps etcd serving the first
    IPAM pages: the names are asked for only once a block page has been."""
    seed = calico.CalicoSeed()
    seed.node("a")
    seed.block("10.9.0.0/26", "a")
    calico.load(etcd.url, seed.keys)
    store = EtcdV3Datastore(
        Config(etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", etcd.client_port),)), RetryPolicy()
    )
    asked = threading.Event()
    ranged = store.range

    def watched(start: str | bytes, *args: object, **kwargs: object) -> object:
        if (start if isinstance(start, bytes) else start.encode()).startswith(BLOCKS.encode()):
            asked.set()
        return ranged(start, *args, **kwargs)  # type: ignore[arg-type]

    def names() -> set[str]:
        assert asked.wait(timeout=30), "no block page was asked for while the names were awaited"
        return {"a"}

    store.range = watched  # type: ignore[method-assign]
    try:
        inventory = store.read(names)
    finally:
        store.close()
    assert [h.name for h in inventory.hosts] == ["a"] and [b.cidr for b in inventory.blocks] == ["10.9.0.0/26"]


def test_exact_keys_are_read_in_transactions_side_by_side_each_once(etcd: EtcdServer) -> None:
    """`current` reads 128 keys a transaction, several transactions in flight: every key present
    comes back once with its value, an absent one is left out, and a failed transaction fails
    the read (never a partial answer)."""
    keys = [PREFIX + b"%04d" % n for n in range(300)]
    _put(etcd, keys)
    store = EtcdV3Datastore(
        Config(etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", etcd.client_port),)), RetryPolicy()
    )
    try:
        wanted = [key.decode() for key in reversed(keys)] + [PREFIX.decode() + "absent"]
        found = store.current(wanted)
        assert sorted(found) == sorted(key.decode() for key in keys)
        assert all(item.value == "v" * (len(item.key) % 7) for item in found.values())
        get = store._etcd.get

        def second_fails(chunk: list[bytes], revision: int) -> list[object]:
            if chunk[0] == keys[128]:
                raise DatastoreError("etcd went away", "unavailable")
            return get(chunk, revision)

        store._etcd.get = second_fails  # type: ignore[method-assign]
        with pytest.raises(DatastoreError, match="etcd went away"):
            store.current([key.decode() for key in keys])
    finally:
        store.close()


def _fleet_of_namespaces(profiles: bool) -> tuple[dict[str, str], set[str]]:
    """12 hosts with pods in 30 namespaces of very different sizes (2 to 120 pods), each namespace's
    profile where kube-controllers keeps one: the keys, and the live hosts' names."""
    seed, chance = calico.CalicoSeed(), random.Random(11)
    seed.cluster_information()
    hosts = [f"ip-10-0-{n}-10" for n in range(12)]
    for number, host in enumerate(hosts):
        seed.block(f"100.64.{number}.0/24", host)
        seed.node(host, ipv4=f"10.0.{number}.10")
    used = [0] * len(hosts)
    for ns in range(30):
        if profiles:
            seed.namespace_profile(f"team-{ns:02d}")
        for pod in range(chance.choice([2, 10, 40, 120])):
            number = chance.randrange(12)
            used[number] += 1
            seed.pod(hosts[number], f"team-{ns:02d}", f"app-{pod}", f"100.64.{number}.{used[number]}")
    return seed.keys, set(hosts)


def _read_counting(
    etcd: EtcdServer, live: set[str], page_size: int, prefix: str = "/", counts: list[int] | None = None
) -> tuple[int, Inventory]:
    """A read of what etcd holds, told these live hosts: the keys etcd counted past those it
    returned in the ranges under `prefix`, and what the read found. `counts` gets what etcd
    counted in each of those ranges."""
    endpoint = EtcdEndpoint("http", "127.0.0.1", etcd.client_port)
    store = EtcdV3Datastore(Config(etcd_endpoints=(endpoint,), page_size=page_size), RetryPolicy())
    counted, ranges = 0, store.range

    def watched(start: str | bytes, *args: Any) -> tuple[Any, int]:
        nonlocal counted
        answer, size = ranges(start, *args)
        if (start.encode() if isinstance(start, str) else start).startswith(prefix.encode()):
            counted += answer.count - len(answer.kvs)
            if counts is not None:
                counts.append(answer.count)
        return answer, size

    store.range = watched  # type: ignore[method-assign]
    try:
        inventory = store.read(lambda: live)
    finally:
        store.close()
    return counted, inventory


BENCH_HOSTS = 1000


def _bench_fleet(
    etcd: EtcdServer,
    pods_per_host: int,
    names: str = "aws",
    profiles: bool = True,
    through: Callable[[Iterator[tuple[str, str]]], Iterator[tuple[str, str]]] = iter,
    **layout: Any,
) -> set[str]:
    """bench.generate's `namespaces` layout of BENCH_HOSTS hosts, a tenth gone, loaded into etcd
    (without its namespace profiles, as where kube-controllers keeps none, unless `profiles`;
    each key through `through`): the live hosts' names."""
    from bench.generate import datastore, host_name, orphan_indexes

    orphans = BENCH_HOSTS // 10
    keys = through(datastore(BENCH_HOSTS, orphans, pods_per_host, shape="namespaces", names=names, **layout))
    calico.load(etcd.url, {key: value for key, value in keys if profiles or not key.startswith(NAMESPACE_PROFILES)})
    gone = orphan_indexes(BENCH_HOSTS, orphans, "namespaces")
    return {host_name(index, names) for index in range(BENCH_HOSTS) if index not in gone}


def _endpoints(inventory: Inventory) -> list[str]:
    """The workload endpoints a read filed (a lean read's: the gone hosts')."""
    return sorted(e.item.key for h in inventory.hosts for e in h.workload_endpoints)


def _counted_with_and_without(
    etcd: EtcdServer, live: set[str], page_size: int, remove: Callable[[], None], prefix: str = "/"
) -> tuple[int, int]:
    """What etcd counted past what it returned under `prefix` in a read, then in one after
    `remove` took a guard away; both read the same endpoints, and some."""
    counted, endpoints = [], []
    for guarded in (True, False):
        if not guarded:
            remove()
        keys_counted, inventory = _read_counting(etcd, live, page_size, prefix)
        counted.append(keys_counted)
        endpoints.append(_endpoints(inventory))
    assert endpoints[0] == endpoints[1] and endpoints[0]
    return counted[0], counted[1]


@pytest.mark.parametrize("learnt", [True, False])
def test_without_namespace_profiles_the_blocks_pod_allocations_say_where_namespaces_start(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch, learnt: bool
) -> None:
    """Where kube-controllers keeps no namespace profiles, the namespaces that the blocks' pod
    allocations name (filed beside the endpoints) bound the endpoints' pages nearly as the profiles
    do; without them, etcd counts far more. Either way the read files every endpoint."""
    counted, endpoints = {}, {}
    for profiles in (True, False):
        keys, hosts = _fleet_of_namespaces(profiles)
        calico.wipe(etcd.url)
        calico.load(etcd.url, keys)
        if not (learnt or profiles):  # the profiles' starts as ever, and nothing learnt from the blocks
            monkeypatch.setattr(NamespaceStarts, "learn_sizes", lambda self, sizes, share: None)
            _nothing_found_in_the_pages(monkeypatch)
        counted[profiles], inventory = _read_counting(etcd, hosts - {"ip-10-0-3-10"}, 20)  # one host gone
        endpoints[profiles] = _endpoints(inventory)
    assert endpoints[True] == endpoints[False] and endpoints[True]
    if learnt:
        assert counted[False] <= 1.5 * counted[True], counted
    else:
        assert counted[False] > 1.8 * counted[True], counted


def _nothing_found_in_the_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """NamespaceStarts learns nothing from the endpoints' pages, and a gap's range is the rest."""
    monkeypatch.setattr(NamespaceStarts, "seen", lambda self, keys: None)
    monkeypatch.setattr(NamespaceStarts, "gap_ends", lambda self, start: ())


def test_where_nothing_names_the_namespaces_the_endpoints_pages_find_them(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten namespaces, and nothing but the endpoints' own keys to name them. A page names the
    namespace it ends in: the sampled hosts' starts in it bound the next pages, and past its end
    the ranges end where its name goes up by one, not at the prefix's end. Without that, windows
    guessed from host names overshot and each namespace's end made etcd count every endpoint
    after it (at 5,000 hosts: 8.4 times the endpoints it returned, 2.8 with it). Either way
    every endpoint is read."""
    from bench.generate import unattributed

    live = _bench_fleet(etcd, 4, profiles=False, namespaces=10, through=unattributed)
    found, not_found = _counted_with_and_without(
        etcd, live, 100, lambda: _nothing_found_in_the_pages(monkeypatch), WORKLOAD_ENDPOINTS
    )
    assert 2 * found < not_found, (found, not_found)


def test_the_handles_pages_stop_at_handles_the_blocks_name(etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A handle id is a random container id (then tunnel handles by node): a page says nothing of
    where the next one ends, and windows guessed from it made etcd count 4.45 times the handles
    at 5,000 hosts. Ids sampled from the blocks (BlockScan.handle_samples) bound the pages: etcd
    counts far fewer, and the read files the same."""
    seed = calico.CalicoSeed()
    seed.cluster_information()
    hosts = [f"ip-10-0-{n}-10" for n in range(40)]
    for number, host in enumerate(hosts):
        seed.block(f"100.64.{number}.0/24", host)
        seed.node(host, ipv4=f"10.0.{number}.10")
        for pod in range(50):
            seed.pod(host, "team", f"app-{pod}", f"100.64.{number}.{pod + 1}")
    calico.wipe(etcd.url)
    calico.load(etcd.url, seed.keys)
    counted, handles = {}, {}
    for sampled in (True, False):
        if not sampled:
            monkeypatch.setattr(scan, "HANDLE_SAMPLE_EVERY", 1 << 30)  # the first block's only
        counted[sampled], inventory = _read_counting(etcd, set(hosts) - {"ip-10-0-3-10"}, 100, HANDLES)  # one gone
        handles[sampled] = sorted(inventory.handles)
    assert handles[True] == handles[False] and len(handles[True]) >= 50
    assert 2 * counted[True] < counted[False], counted


def test_in_one_namespace_the_endpoints_pages_stop_where_sampled_hosts_start(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pod in one namespace: no namespace start bounds the endpoints' pages, and a window
    guessed from a page's keys read as numbers overshoots on host names. Bounds where sampled
    hosts' endpoints start keep etcd's count near what it returns; without them it counts more
    than twice as many keys past those it returns (the blocks' and handles' pages are the same in
    both reads). Either way every endpoint is read."""
    live = _bench_fleet(etcd, 4, namespaces=1)
    sampled, unsampled = _counted_with_and_without(etcd, live, 200, lambda: _no_host_bounds(monkeypatch))
    assert unsampled > 2 * sampled, (sampled, unsampled)


def _no_host_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """NamespaceStarts bounds no namespace where its hosts' endpoints start."""
    monkeypatch.setattr(etcdv3, "ENDPOINTS_PER_BOUND", 1 << 30)
    monkeypatch.setattr(etcdv3, "FEW_NAMESPACES", 0)


def test_among_many_namespaces_a_large_ones_pages_stop_where_its_hosts_start(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hundred namespaces of skewed sizes (the largest holds ~700 endpoints), and no profiles:
    more than FEW_NAMESPACES, so only the blocks' pod allocations say which are large, and each
    gets a host bound for every ENDPOINTS_PER_BOUND of its pods (the endpoints' first page waits
    for the first page of blocks). Without them, a large namespace's pages each counted to its
    end; with them etcd counts a fraction of that. Either way every endpoint is read."""
    live = _bench_fleet(etcd, 8, names="gke", profiles=False, namespaces=100)
    sampled, unsampled = _counted_with_and_without(
        etcd, live, 50, lambda: _no_host_bounds(monkeypatch), WORKLOAD_ENDPOINTS
    )
    assert unsampled > 2 * sampled, (sampled, unsampled)


def test_without_namespace_profiles_no_endpoints_range_counts_the_whole_prefix(etcd: EtcdServer) -> None:
    """Without profiles nothing bounds the endpoints' first page but what the blocks say: it waits
    for the first page of blocks, where it once asked for the whole prefix and etcd counted every
    endpoint in the cluster. Every endpoint is still read."""
    keys, hosts = _fleet_of_namespaces(profiles=False)
    calico.wipe(etcd.url)
    calico.load(etcd.url, keys)
    counts: list[int] = []
    _, inventory = _read_counting(etcd, hosts - {"ip-10-0-3-10"}, 20, WORKLOAD_ENDPOINTS, counts)  # one host gone
    total = sum(1 for key in keys if key.startswith(WORKLOAD_ENDPOINTS))
    gone = sorted(key for key in keys if key.startswith(WORKLOAD_ENDPOINTS) and "/ip--10--0--3--10-k8s-" in key)
    assert _endpoints(inventory) == gone and gone and total > 400
    assert max(counts) < total / 2, (max(counts), total)


def test_the_blocks_pages_stop_where_sampled_affine_blocks_start(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block's key is its CIDR as text (`100.64.9.0-26`, `fd00:96::1:3c40-122`), whose digits
    read as numbers guess wrong where a page's range should end: etcd counted 12.4 times the
    dual-stack blocks it returned at 5,000 hosts. Bounds where every BLOCKS_PER_BOUND-th block an
    affinity names starts keep its count near what it returns; without them it counts several
    times as many past those. Either way the read files every block."""
    live = _bench_fleet(etcd, 2, names="gke", families="dual")
    counted, blocks = {}, {}
    for bounded in (True, False):
        if not bounded:
            monkeypatch.setattr(etcdv3, "block_starts", lambda affinities: ())
        counted[bounded], inventory = _read_counting(etcd, live, 200, BLOCKS)
        blocks[bounded] = sorted(b.cidr for b in inventory.blocks)
    assert blocks[True] == blocks[False] and len(blocks[True]) == 2 * BENCH_HOSTS
    assert counted[False] > 4 * counted[True], counted
