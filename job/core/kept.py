"""Allocations that stay whatever their pod and their node say (pure; docs/calico-data.md,
"KubeVirt VM addresses").

- A KubeVirt VM's address belongs to the VM, not to the virt-launcher pod that holds it now: the
  VM's next pod reuses it on whatever node it lands. It stays while the VirtualMachine of its
  `vmi-name` exists, or a VirtualMachineInstance of that name that no VirtualMachine owns; and
  whenever calico-gc cannot tell (KubeVirt served but not listed, or a VM's handle without its
  attributes), as kube-controllers holds it valid then (`isVMAllocationValid`).
- During a live migration the allocation has two owners: the source pod (`secondary`) and the
  target pod (`alternateOwnerAttrs`). It stays while either owner's node is live.

Such an allocation is never released with its gone node (the block keeps it, without
affinity, as it keeps an address it lends) and is never a leaked pod IP.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

VM_NAME = "vmi-name"  # the owner attribute CNI writes for a virt-launcher pod's allocation
VM_HANDLE_MARK = ".vmi."  # CreateVMHandleID: <network>.vmi.<namespace>.<vm> (hashed past 128 characters)
ALTERNATE = "alternateOwnerAttrs"
# Why an allocation stays (the report's audit.vm_addresses.sample[].state, and a kept host's note).
VM_EXISTS = "vm_exists"
VM_UNKNOWN = "vm_unknown"  # calico-gc cannot tell: kept
VM_GONE = "vm_gone"  # neither the VM nor a standalone VMI: a leak after the leak grace period
ALTERNATE_LIVE = "alternate_owner_live"
ALTERNATE_GONE = "alternate_owner_gone"  # a migration's other pod is on a gone node: the active owner decides


@dataclass(frozen=True)
class KubeVirt:
    """What the cluster says of KubeVirt: whether it serves `kubevirt.io/v1`, and the VMs that
    hold their addresses (VirtualMachines, and VirtualMachineInstances no VirtualMachine owns),
    as (namespace, name). `vms` is None where calico-gc cannot tell, `why` says why."""

    served: bool = False
    vms: frozenset[tuple[str, str]] | None = frozenset()
    why: str | None = None


NO_KUBEVIRT = KubeVirt()  # KubeVirt not installed (or a test that has none)


def owner(attributes: Mapping[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    """(node, namespace, pod) an owner's attributes name, each None where not a string."""
    attributes = attributes if isinstance(attributes, dict) else {}
    found = (attributes.get("node"), attributes.get("namespace"), attributes.get("pod"))
    return tuple(v if isinstance(v, str) and v else None for v in found)  # type: ignore[return-value]


def vm_of(attribute: Mapping[str, Any]) -> tuple[str, str] | bool | None:
    """The (namespace, vm) an allocation belongs to; None: not a VM's; True: a VM's by its handle
    but without the attributes that name it (calico-gc cannot tell which)."""
    secondary = attribute.get("secondary")
    name = secondary.get(VM_NAME) if isinstance(secondary, dict) else None
    if isinstance(name, str) and name:
        namespace = secondary.get("namespace")  # type: ignore[union-attr]
        return (namespace if isinstance(namespace, str) else "", name)
    handle = attribute.get("handle_id")
    return True if isinstance(handle, str) and VM_HANDLE_MARK in handle else None


@dataclass(frozen=True)
class Keep:
    """The rule, for one run: the live Kubernetes Nodes and what KubeVirt says."""

    live_nodes: Set[str]
    kubevirt: KubeVirt = NO_KUBEVIRT

    def vm_state(self, vm: tuple[str, str] | bool) -> str:
        if vm is True or self.kubevirt.vms is None:
            return VM_UNKNOWN
        if not self.kubevirt.served:
            return VM_GONE  # KubeVirt is not installed: no VM holds an address
        return VM_EXISTS if vm in self.kubevirt.vms else VM_GONE

    def reason(self, attribute: Mapping[str, Any]) -> str | None:
        """Why this allocation stays whatever its pod and node say; None: it does not."""
        alternate = attribute.get(ALTERNATE)  # asked for every address a plan frees: rarely there
        if alternate is not None and owner(alternate)[0] in self.live_nodes:
            return ALTERNATE_LIVE
        vm = vm_of(attribute)
        if vm is None:
            return None
        state = self.vm_state(vm)
        return None if state == VM_GONE else state
