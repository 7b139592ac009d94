"""One consistent read of a Calico datastore, as every adapter hands it to the planner."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from job.core.model import CalicoHost, ClusterInfo, DataProblem, IpamBlock, IpamHandle
from job.core.scan import BlockScan


@dataclass(frozen=True)
class Inventory:
    """One consistent read of a Calico datastore."""

    hosts: tuple[CalicoHost, ...]
    blocks: tuple[IpamBlock, ...] = ()
    handles: Mapping[str, IpamHandle] = field(default_factory=dict)
    malformed_blocks: tuple[str, ...] = ()
    cluster: ClusterInfo = field(default_factory=ClusterInfo)
    problems: tuple[DataProblem, ...] = ()
    revision: int = 0
    # False where hosts are only inferred from the data that names them (Kubernetes datastore):
    # a node without such data is then no sign of another cluster's datastore.
    hosts_registered: bool = True
    pools: tuple[str, ...] = ()  # IP pool CIDRs, for the IPAM check
    kube_controllers: Mapping[str, object] | None = None  # Kubernetes datastore: who else cleans
    # The pass over every block, when the read made it on the way (etcd v3 given the Kubernetes
    # Node names). Such a read keeps of live hosts only what this scan counted: their workload
    # endpoints, affinities and owned keys are not in `hosts`; `handles` holds only those a plan
    # may write (stale ones, tunnel handles, those of allocations no live host owns, those of
    # leaked IPs); and a block no plan edits or counts in has no value (`item.value` None).
    scan: BlockScan | None = None
    # The Kubernetes datastore: the workload endpoints are the pods themselves, so the leak check
    # clears the scan's bits with the listed pods' IPs before it names what is left.
    pods_are_endpoints: bool = False
    # IPAMConfig's ipCooldownSeconds (0 when unset); None where the read could not tell (docs/calico-data.md).
    ip_cooldown: int | None = None
    # Gone hosts read without what removing them takes (their endpoints, handles and blocks' values),
    # as plan.read_first chose: a plan defers them (Plan.unread when it would have taken one).
    partial: frozenset[str] = frozenset()
