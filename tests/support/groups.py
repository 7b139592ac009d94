"""Calico's two API groups, as the tests seed them: the way Calico's components write each."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support import crds


@dataclass(frozen=True)
class Group:
    """One of Calico's two API groups, as a test seeds it the way Calico's components write it."""

    api_version: str
    crd_file: str
    affinity_deleted: str | bool  # a BlockAffinity's spec.deleted: "false" in v1, false in v3
    ipam_configs: str  # IPAMConfig's resource: ipamconfigs in v1, ipamconfigurations in v3

    @property
    def path(self) -> str:
        return f"/apis/{self.api_version}"


V1 = Group("crd.projectcalico.org/v1", crds.V1_FILE, "false", "ipamconfigs")
V3 = Group("projectcalico.org/v3", crds.V3_FILE, False, "ipamconfigurations")
