import copy
import json

from tests.adapters.test_kdd import kdd, seed_kdd
from tests.conftest import Harness
from tests.support.groups import V1


def test_probe(harness: Harness) -> None:
    harness.kubeapi.crds = __import__("tests.support.crds", fromlist=["x"]).calico(V1.crd_file)
    seed_kdd(harness.kubeapi, V1)
    block = copy.deepcopy(harness.kubeapi.get(f"{V1.path}/ipamblocks", "100-96-1-0-26"))
    spec = block["spec"]
    spec["attributes"].append({"releasedAt": "2026-11-30T11:58:00Z"})
    for o in (30, 31):
        spec["allocations"][o] = len(spec["attributes"]) - 1
        spec["unallocated"].remove(o)
    harness.kubeapi.put(f"{V1.path}/ipamblocks", block)
    report, code = harness.run(kdd(harness, release_leaked_ips=True, apply=True))
    a = report["audit"]
    print(
        json.dumps(
            {k: a[k] for k in ("allocated", "dangling_allocations", "leaked_ips", "stale_handles", "nodes")}, indent=1
        )
    )
    print(code, report["errors"], [(h["name"], h["action"]) for h in report["hosts"]])
    after = harness.kubeapi.get(f"{V1.path}/ipamblocks", "100-96-1-0-26")["spec"]
    print(after["allocations"][28:34], after["attributes"][-2:])
