"""Objects as a real cluster holds them: a Node as the kubelet and calico-node leave it, a Pod as
the kubelet reports it, a CalicoNodeStatus as calico-node fills it. The job reads a few fields of
each; the rest is here so that a read is tested against everything a real server sends."""

from __future__ import annotations

import json
import zlib
from typing import Any

SINCE = "2026-11-30T09:00:00Z"
KUBELET = "v1.36.2"


def node(name: str, internal_ip: str | None = None) -> dict[str, Any]:
    """A Ready worker: the kubelet's conditions and inventory, and calico-node's
    NetworkUnavailable=False (CalicoIsUp) and address annotations."""
    addresses = [{"type": "InternalIP", "address": internal_ip}] if internal_ip else []

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": "2026-11-30T11:59:30Z",
            "lastTransitionTime": SINCE,
        }

    calico_up = condition("NetworkUnavailable", "False", "CalicoIsUp", "Calico is running on this node")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m6i.large",
                "topology.kubernetes.io/zone": "eu-west-1a",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                **({"projectcalico.org/IPv4Address": f"{internal_ip}/20"} if internal_ip else {}),
                "projectcalico.org/IPv4IPIPTunnelAddr": "100.96.0.1",
            },
        },
        "spec": {"podCIDR": "100.96.0.0/24", "providerID": f"aws:///eu-west-1a/i-{zlib.crc32(name.encode()):017x}"},
        "status": {
            "addresses": [*addresses, {"type": "Hostname", "address": name}],
            "allocatable": {"cpu": "1930m", "ephemeral-storage": "47233297124", "memory": "7291632Ki", "pods": "110"},
            "capacity": {"cpu": "2", "ephemeral-storage": "50620216Ki", "memory": "7934704Ki", "pods": "110"},
            "conditions": [
                calico_up,
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": [
                {"names": ["quay.io/calico/node@sha256:" + "1" * 64, "quay.io/calico/node:v3.32.0"], "sizeBytes": 1234},
                {"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "4c1e4f0a-8f3b-4b6e-9a57-0d5b6f0c2a11",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kernelVersion": "6.12.0",
                "kubeProxyVersion": KUBELET,
                "kubeletVersion": KUBELET,
                "machineID": "ec2" + "0" * 29,
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 13 (trixie)",
                "systemUUID": "ec2" + "0" * 29,
            },
        },
    }


def pod(namespace: str, name: str, node_name: str | None, ips: tuple[str, ...] = ()) -> dict[str, Any]:
    """A Deployment's pod as the kubelet reports it: Running with its IPs, or Pending without."""
    running = bool(ips)
    container = {
        "name": "app",
        "image": "registry.example/app:1.0",
        "imageID": "registry.example/app@sha256:" + "2" * 64,
        "containerID": "containerd://" + "3" * 64,
        "ready": running,
        "restartCount": 0,
        "started": running,
        "state": {"running": {"startedAt": SINCE}} if running else {"waiting": {"reason": "ContainerCreating"}},
    }
    status: dict[str, Any] = {
        "phase": "Running" if running else "Pending",
        "qosClass": "Burstable",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": SINCE},
            {"type": "Ready", "status": str(running), "lastProbeTime": None, "lastTransitionTime": SINCE},
        ],
        "containerStatuses": [container],
    }
    if running:
        status.update(
            hostIP="10.0.3.10",
            hostIPs=[{"ip": "10.0.3.10"}],
            podIP=ips[0],
            podIPs=[{"ip": ip} for ip in ips],
            startTime=SINCE,
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "generateName": name.rsplit("-", 1)[0] + "-",
            "labels": {"app": name.rsplit("-", 1)[0], "pod-template-hash": "7d9f8c6b5"},
            "annotations": {"cni.projectcalico.org/containerID": "3" * 64, "cni.projectcalico.org/podIP": ""},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": name.rsplit("-", 1)[0] + "-7d9f8c6b5",
                    "uid": "0b6f3a52-5c1d-4b8e-9f0a-2d7c1e4b3a69",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            **({"nodeName": node_name} if node_name else {}),
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1.0",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
        "status": status,
    }


def calico_node_pod(name: str, node_name: str, ready: bool, restarts: int, waiting: str | None) -> dict[str, Any]:
    """A calico-node DaemonSet pod (host network) on a node: running, or waiting (CrashLoopBackOff)
    after `restarts` restarts, the last of which ended in an error."""
    container: dict[str, Any] = {
        "name": "calico-node",
        "image": "quay.io/calico/node:v3.32.0",
        "imageID": "quay.io/calico/node@sha256:" + "1" * 64,
        "containerID": "containerd://" + "4" * 64,
        "ready": ready,
        "started": waiting is None,
        "restartCount": restarts,
        "state": {"waiting": {"reason": waiting, "message": "back-off 5m0s restarting failed container"}}
        if waiting
        else {"running": {"startedAt": SINCE}},
    }
    if restarts:
        container["lastState"] = {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "startedAt": "2026-11-30T11:57:40Z",
                "finishedAt": "2026-11-30T11:58:02Z",
                "containerID": "containerd://" + "5" * 64,
            }
        }
    body = pod("kube-system", name, node_name, ("10.0.3.10",))
    body["metadata"].update(
        labels={"k8s-app": "calico-node", "controller-revision-hash": "6b8f7d9c4"},
        ownerReferences=[{**body["metadata"]["ownerReferences"][0], "kind": "DaemonSet", "name": "calico-node"}],
    )
    body["spec"].update(hostNetwork=True, priorityClassName="system-node-critical", serviceAccountName="calico-node")
    body["spec"]["containers"][0].update(name="calico-node", image=container["image"])
    body["status"].update(
        conditions=[
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": SINCE},
            {"type": "Ready", "status": str(ready), "lastProbeTime": None, "lastTransitionTime": SINCE},
        ],
        containerStatuses=[container],
        qosClass="Burstable",
    )
    return body


def calico_node_status(
    name: str, node_name: str, peer_ips: tuple[str, ...] = (), api_version: str = "crd.projectcalico.org/v1"
) -> dict[str, Any]:
    """A CalicoNodeStatus a user created for a node, with the status calico-node writes to it."""
    peers = [{"peerIP": ip, "since": "09:00:12", "state": "Established", "type": "NodeMesh"} for ip in peer_ips]
    return {
        "apiVersion": api_version,
        "kind": "CalicoNodeStatus",
        "metadata": {"name": name},
        "spec": {"node": node_name, "classes": ["Agent", "BGP", "Routes"], "updatePeriodSeconds": 10},
        "status": {
            "lastUpdated": "2026-11-30T11:59:50Z",
            "agent": {
                "birdV4": {
                    "state": "Ready",
                    "version": "v0.3.3+birdv1.6.8",
                    "routerID": "10.0.3.10",
                    "lastBootTime": "2026-11-30 09:00:03",
                    "lastReconfigurationTime": "2026-11-30 09:00:03",
                },
                "birdV6": {"state": "NotReady"},
            },
            "bgp": {
                "numberEstablishedV4": len(peers),
                "numberEstablishedV6": 0,
                "numberNotEstablishedV4": 0,
                "numberNotEstablishedV6": 0,
                "peersV4": peers,
            },
            "routes": {
                "routesV4": [
                    {
                        "type": "FIB",
                        "destination": "100.96.2.0/26",
                        "gateway": peer_ips[0] if peer_ips else "10.0.3.11",
                        "interface": "tunl0",
                        "learnedFrom": {"sourceType": "NodeMesh", "peerIP": peer_ips[0] if peer_ips else "10.0.3.11"},
                    }
                ]
            },
        },
    }


def with_every_field(obj: dict[str, Any]) -> dict[str, Any]:
    """A Node or Pod with the fields of k8s.io/api's types the builders above leave out, each as a
    real cluster may hold it (a fixture of this project's: no schema of the built-in kinds is at
    hand). None of them is one the job reads."""
    whole = json.loads(json.dumps(obj))
    metadata = whole["metadata"]
    metadata.update(
        finalizers=metadata.get("finalizers") or [],
        deletionGracePeriodSeconds=None,
        selfLink="",
        annotations={**(metadata.get("annotations") or {}), "example.com/json": '{"a": [1, 2]}'},
    )
    spec, status = whole.setdefault("spec", {}), whole.setdefault("status", {})
    if whole.get("kind") == "Node":
        spec.update(
            podCIDRs=["100.96.0.0/24", "fd00:96::/64"],
            unschedulable=False,
            taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
            configSource=None,
        )
        status.update(
            phase="",
            volumesAttached=[{"name": "kubernetes.io/csi/ebs.csi.aws.com^vol-0abc", "devicePath": ""}],
            volumesInUse=["kubernetes.io/csi/ebs.csi.aws.com^vol-0abc"],
            config={"active": {"configMap": None}, "assigned": None, "error": ""},
            runtimeHandlers=[{"name": "runc", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}}],
            features={"supplementalGroupsPolicy": True},
            declaredFeatures=["InPlacePodVerticalScaling"],
        )
        return whole
    spec.update(
        initContainers=[{"name": "init", "image": "busybox:1.37", "restartPolicy": "Always"}],
        ephemeralContainers=[],
        volumes=[{"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
        affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        overhead={"cpu": "10m"},
        readinessGates=[{"conditionType": "example.com/ready"}],
        resourceClaims=[],
        schedulingGates=[],
        os={"name": "linux"},
        priority=0,
        preemptionPolicy="PreemptLowerPriority",
        enableServiceLinks=True,
        hostUsers=True,
        resources={"limits": {"cpu": "1"}},
    )
    status.update(
        initContainerStatuses=[
            {
                "name": "init",
                "ready": True,
                "restartCount": 0,
                "image": "busybox:1.37",
                "imageID": "",
                "state": {"running": {"startedAt": SINCE}},
            }
        ],
        ephemeralContainerStatuses=[],
        nominatedNodeName="",
        message="",
        reason="",
        resize="",
        resourceClaimStatuses=[],
        observedGeneration=1,
        extendedResourceClaimStatus=None,
    )
    return whole
