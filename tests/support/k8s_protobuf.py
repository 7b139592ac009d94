"""Kubernetes' protobuf encoding of the built-in kinds the tests store (Pods, Nodes, Status), for
the API test server: every field of a stored object is encoded by its number, and a field this
schema has no number for is refused (Unencodable), never dropped, so that the server cannot
silently send less than the real one would.

The numbers are copied by hand from Kubernetes' `generated.proto` files (k8s.io/api core/v1,
k8s.io/apimachinery meta/v1, runtime, util/intstr, api/resource), separately from the job's own
schema (job/adapters/kube_protobuf.py), which a test checks against this one.

What the encoding follows of Go's (gogo-protobuf) marshalling:
- a JSON `null` or an absent field is not sent, but a non-pointer `metav1.Time` (marked `T`) is
  always sent, holding Go's zero time when unset;
- map entries are sent sorted by key, as messages of key 1 and value 2;
- a struct Go embeds inline in JSON (`LocalObjectReference` in a ConfigMap volume, a volume's
  `VolumeSource`, a probe's `ProbeHandler`) is its own message field on the wire (marked `@`),
  always sent;
- an answer is `k8s\\x00` then a runtime.Unknown holding the object's TypeMeta and bytes.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

MAGIC = b"k8s\x00"
GO_ZERO_TIME = -62135596800  # seconds of Go's zero time.Time

# message: "json=number:type ..."; a type is s (string), b (bool), i (any varint integer),
# y (bytes), t/T (metav1.Time, T non-pointer), q (Quantity), io (IntOrString), f (FieldsV1),
# ms (map string->string), mq (map string->Quantity), or a message; `*` repeated; `@` inline.
_SPEC = {
    # k8s.io/apimachinery
    "ObjectMeta": "name=1:s generateName=2:s namespace=3:s selfLink=4:s uid=5:s resourceVersion=6:s "
    "generation=7:i creationTimestamp=8:T deletionTimestamp=9:t deletionGracePeriodSeconds=10:i labels=11:ms "
    "annotations=12:ms ownerReferences=13:OwnerReference* finalizers=14:s* managedFields=17:ManagedFieldsEntry*",
    "OwnerReference": "apiVersion=5:s kind=1:s name=3:s uid=4:s controller=6:b blockOwnerDeletion=7:b",
    "ManagedFieldsEntry": "manager=1:s operation=2:s apiVersion=3:s time=4:t fieldsType=6:s fieldsV1=7:f "
    "subresource=8:s",
    "ListMeta": "selfLink=1:s resourceVersion=2:s continue=3:s remainingItemCount=4:i",
    "Status": "metadata=1:ListMeta status=2:s message=3:s reason=4:s details=5:StatusDetails code=6:i",
    "StatusDetails": "name=1:s group=2:s kind=3:s uid=6:s causes=4:StatusCause* retryAfterSeconds=5:i",
    "StatusCause": "reason=1:s message=2:s field=3:s",
    "Time": "seconds=1:i nanos=2:i",  # how t and T are sent
    "TypeMeta": "apiVersion=1:s kind=2:s",  # runtime.TypeMeta (meta/v1's numbers the two the other way)
    "Unknown": "typeMeta=1:TypeMeta raw=2:y contentEncoding=3:s contentType=4:s",
    # k8s.io/api core/v1: lists and Pods
    "PodList": "metadata=1:ListMeta items=2:Pod*",
    "NodeList": "metadata=1:ListMeta items=2:Node*",
    "Pod": "metadata=1:ObjectMeta spec=2:PodSpec status=3:PodStatus",
    "PodSpec": "volumes=1:Volume* initContainers=20:Container* containers=2:Container* "
    "ephemeralContainers=34:EphemeralContainer* restartPolicy=3:s terminationGracePeriodSeconds=4:i "
    "activeDeadlineSeconds=5:i dnsPolicy=6:s nodeSelector=7:ms serviceAccountName=8:s serviceAccount=9:s "
    "automountServiceAccountToken=21:b nodeName=10:s hostNetwork=11:b hostPID=12:b hostIPC=13:b "
    "shareProcessNamespace=27:b securityContext=14:PodSecurityContext imagePullSecrets=15:LocalObjectReference* "
    "hostname=16:s subdomain=17:s affinity=18:Affinity schedulerName=19:s tolerations=22:Toleration* "
    "priorityClassName=24:s priority=25:i readinessGates=28:PodReadinessGate* runtimeClassName=29:s "
    "enableServiceLinks=30:b preemptionPolicy=31:s overhead=32:mq setHostnameAsFQDN=35:b os=36:PodOS "
    "hostUsers=37:b schedulingGates=38:PodSchedulingGate* resourceClaims=39:PodResourceClaim* "
    "resources=40:ResourceRequirements hostnameOverride=41:s",
    "Container": "name=1:s image=2:s command=3:s* args=4:s* workingDir=5:s ports=6:ContainerPort* env=7:EnvVar* "
    "resources=8:ResourceRequirements restartPolicy=24:s volumeMounts=9:VolumeMount* livenessProbe=10:Probe "
    "readinessProbe=11:Probe startupProbe=22:Probe terminationMessagePath=13:s terminationMessagePolicy=20:s "
    "imagePullPolicy=14:s securityContext=15:SecurityContext stdin=16:b stdinOnce=17:b tty=18:b",
    "EphemeralContainer": "ephemeralContainerCommon=1:@Container targetContainerName=2:s",
    "ContainerPort": "name=1:s hostPort=2:i containerPort=3:i protocol=4:s hostIP=5:s",
    "EnvVar": "name=1:s value=2:s valueFrom=3:EnvVarSource",
    "EnvVarSource": "fieldRef=1:ObjectFieldSelector resourceFieldRef=2:ResourceFieldSelector",
    "ObjectFieldSelector": "apiVersion=1:s fieldPath=2:s",
    "ResourceFieldSelector": "containerName=1:s resource=2:s divisor=3:q",
    "ResourceRequirements": "limits=1:mq requests=2:mq claims=3:ResourceClaim*",
    "ResourceClaim": "name=1:s request=2:s",
    "Probe": "handler=1:@ProbeHandler initialDelaySeconds=2:i timeoutSeconds=3:i periodSeconds=4:i "
    "successThreshold=5:i failureThreshold=6:i terminationGracePeriodSeconds=7:i",
    "ProbeHandler": "exec=1:ExecAction httpGet=2:HTTPGetAction tcpSocket=3:TCPSocketAction",
    "ExecAction": "command=1:s*",
    "HTTPGetAction": "path=1:s port=2:io host=3:s scheme=4:s",
    "TCPSocketAction": "port=1:io host=2:s",
    "VolumeMount": "name=1:s readOnly=2:b recursiveReadOnly=7:s mountPath=3:s subPath=4:s mountPropagation=5:s "
    "subPathExpr=6:s",
    "SecurityContext": "privileged=2:b runAsUser=4:i runAsGroup=8:i runAsNonRoot=5:b readOnlyRootFilesystem=6:b "
    "allowPrivilegeEscalation=7:b procMount=9:s seccompProfile=11:SeccompProfile",
    "PodSecurityContext": "runAsUser=2:i runAsGroup=6:i runAsNonRoot=3:b supplementalGroups=4:i* fsGroup=5:i "
    "fsGroupChangePolicy=9:s seccompProfile=10:SeccompProfile",
    "SeccompProfile": "type=1:s localhostProfile=2:s",
    "Toleration": "key=1:s operator=2:s value=3:s effect=4:s tolerationSeconds=5:i",
    "Affinity": "podAntiAffinity=3:PodAntiAffinity",
    "PodAntiAffinity": "preferredDuringSchedulingIgnoredDuringExecution=2:WeightedPodAffinityTerm*",
    "WeightedPodAffinityTerm": "weight=1:i",
    "PodReadinessGate": "conditionType=1:s",
    "PodOS": "name=1:s",
    "PodSchedulingGate": "name=1:s",
    "PodResourceClaim": "name=1:s resourceClaimName=3:s resourceClaimTemplateName=4:s",
    "LocalObjectReference": "name=1:s",
    "Volume": "name=1:s volumeSource=2:@VolumeSource",
    "VolumeSource": "hostPath=1:HostPathVolumeSource emptyDir=2:EmptyDirVolumeSource downwardAPI=16:"
    "DownwardAPIVolumeSource configMap=19:ConfigMapVolumeSource projected=26:ProjectedVolumeSource",
    "HostPathVolumeSource": "path=1:s type=2:s",
    "EmptyDirVolumeSource": "medium=1:s sizeLimit=2:q",
    "ConfigMapVolumeSource": "localObjectReference=1:@LocalObjectReference items=2:KeyToPath* defaultMode=3:i "
    "optional=4:b",
    "KeyToPath": "key=1:s path=2:s mode=3:i",
    "ProjectedVolumeSource": "sources=1:VolumeProjection* defaultMode=2:i",
    "VolumeProjection": "downwardAPI=2:DownwardAPIProjection configMap=3:ConfigMapProjection "
    "serviceAccountToken=4:ServiceAccountTokenProjection",
    "ConfigMapProjection": "localObjectReference=1:@LocalObjectReference items=2:KeyToPath* optional=4:b",
    "DownwardAPIProjection": "items=1:DownwardAPIVolumeFile*",
    "DownwardAPIVolumeSource": "items=1:DownwardAPIVolumeFile* defaultMode=2:i",
    "DownwardAPIVolumeFile": "path=1:s fieldRef=2:ObjectFieldSelector resourceFieldRef=3:ResourceFieldSelector "
    "mode=4:i",
    "ServiceAccountTokenProjection": "audience=1:s expirationSeconds=2:i path=3:s",
    "PodStatus": "observedGeneration=17:i phase=1:s conditions=2:PodCondition* message=3:s reason=4:s "
    "nominatedNodeName=11:s hostIP=5:s hostIPs=16:HostIP* podIP=6:s podIPs=12:PodIP* startTime=7:t "
    "initContainerStatuses=10:ContainerStatus* containerStatuses=8:ContainerStatus* qosClass=9:s "
    "ephemeralContainerStatuses=13:ContainerStatus* resize=14:s resourceClaimStatuses=15:PodResourceClaimStatus* "
    "extendedResourceClaimStatus=18:PodExtendedResourceClaimStatus allocatedResources=19:mq "
    "resources=20:ResourceRequirements",
    "PodCondition": "type=1:s observedGeneration=7:i status=2:s lastProbeTime=3:T lastTransitionTime=4:T "
    "reason=5:s message=6:s",
    "HostIP": "ip=1:s",
    "PodIP": "ip=1:s",
    "PodResourceClaimStatus": "name=1:s resourceClaimName=2:s",
    "PodExtendedResourceClaimStatus": "resourceClaimName=2:s",
    "ContainerStatus": "name=1:s state=2:ContainerState lastState=3:ContainerState ready=4:b restartCount=5:i "
    "image=6:s imageID=7:s containerID=8:s started=9:b allocatedResources=10:mq resources=11:ResourceRequirements "
    "stopSignal=15:s",
    "ContainerState": "waiting=1:ContainerStateWaiting running=2:ContainerStateRunning "
    "terminated=3:ContainerStateTerminated",
    "ContainerStateWaiting": "reason=1:s message=2:s",
    "ContainerStateRunning": "startedAt=1:T",
    "ContainerStateTerminated": "exitCode=1:i signal=2:i reason=3:s message=4:s startedAt=5:T finishedAt=6:T "
    "containerID=7:s",
    # k8s.io/api core/v1: Nodes
    "Node": "metadata=1:ObjectMeta spec=2:NodeSpec status=3:NodeStatus",
    "NodeSpec": "podCIDR=1:s podCIDRs=7:s* providerID=3:s unschedulable=4:b taints=5:Taint* "
    "configSource=6:NodeConfigSource externalID=2:s",
    "Taint": "key=1:s value=2:s effect=3:s timeAdded=4:t",
    "NodeStatus": "capacity=1:mq allocatable=2:mq phase=3:s conditions=4:NodeCondition* addresses=5:NodeAddress* "
    "daemonEndpoints=6:NodeDaemonEndpoints nodeInfo=7:NodeSystemInfo images=8:ContainerImage* volumesInUse=9:s* "
    "volumesAttached=10:AttachedVolume* config=11:NodeConfigStatus runtimeHandlers=12:NodeRuntimeHandler* "
    "features=13:NodeFeatures declaredFeatures=14:s*",
    "NodeCondition": "type=1:s status=2:s lastHeartbeatTime=3:T lastTransitionTime=4:T reason=5:s message=6:s",
    "NodeAddress": "type=1:s address=2:s",
    "NodeDaemonEndpoints": "kubeletEndpoint=1:DaemonEndpoint",
    "DaemonEndpoint": "Port=1:i",
    "NodeSystemInfo": "machineID=1:s systemUUID=2:s bootID=3:s kernelVersion=4:s osImage=5:s "
    "containerRuntimeVersion=6:s kubeletVersion=7:s kubeProxyVersion=8:s operatingSystem=9:s architecture=10:s",
    "ContainerImage": "names=1:s* sizeBytes=2:i",
    "AttachedVolume": "name=1:s devicePath=2:s",
    "NodeConfigSource": "configMap=2:ConfigMapNodeConfigSource",
    "ConfigMapNodeConfigSource": "namespace=1:s name=2:s uid=3:s resourceVersion=4:s kubeletConfigKey=5:s",
    "NodeConfigStatus": "assigned=1:NodeConfigSource active=2:NodeConfigSource lastKnownGood=3:NodeConfigSource "
    "error=4:s",
    "NodeRuntimeHandler": "name=1:s features=2:NodeRuntimeHandlerFeatures",
    "NodeRuntimeHandlerFeatures": "recursiveReadOnlyMounts=1:b userNamespaces=2:b",
    "NodeFeatures": "supplementalGroupsPolicy=1:b containerUlimits=2:b",
}


def _parse(spec: str) -> dict[str, tuple[int, str, bool]]:
    fields = {}
    for entry in spec.split():
        name, _, rest = entry.partition("=")
        number, _, kind = rest.partition(":")
        fields[name] = (int(number), kind.rstrip("*"), kind.endswith("*"))
    return fields


SCHEMA: dict[str, dict[str, tuple[int, str, bool]]] = {name: _parse(spec) for name, spec in _SPEC.items()}
KINDS = {"Pod", "Node", "PodList", "NodeList", "Status"}  # what an answer may be


class Unencodable(ValueError):
    """An object holds a field this schema has no number (or another shape) for."""


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative integer is sent as its 64-bit two's complement
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _key(number, 2) + _varint(len(data)) + data


def _time(value: str | None) -> bytes:
    if value is None:
        return message("Time", {"seconds": GO_ZERO_TIME, "nanos": 0})
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return message("Time", {"seconds": int(moment.timestamp()), "nanos": moment.microsecond * 1000})


def _one(number: int, kind: str, value: Any, at: str) -> bytes:
    if kind == "s":
        if not isinstance(value, str):
            raise Unencodable(f"{at}: {value!r} is not a string")
        return _bytes_field(number, value.encode())
    if kind == "b":
        if not isinstance(value, bool):
            raise Unencodable(f"{at}: {value!r} is not a boolean")
        return _key(number, 0) + _varint(int(value))
    if kind == "i":
        if isinstance(value, bool) or not isinstance(value, int):
            raise Unencodable(f"{at}: {value!r} is not an integer")
        return _key(number, 0) + _varint(value)
    if kind == "y":
        return _bytes_field(number, value)
    if kind in ("t", "T"):
        return _bytes_field(number, _time(value))
    if kind == "q":
        return _bytes_field(number, _bytes_field(1, str(value).encode()))
    if kind == "io":
        inner = (
            _key(1, 0) + _varint(1) + _key(2, 0) + _varint(0) + _bytes_field(3, value.encode())
            if isinstance(value, str)
            else _key(1, 0) + _varint(0) + _key(2, 0) + _varint(value) + _bytes_field(3, b"")
        )
        return _bytes_field(number, inner)
    if kind == "f":
        return _bytes_field(number, _bytes_field(1, json.dumps(value, separators=(",", ":")).encode()))
    if kind in ("ms", "mq"):
        if not isinstance(value, dict):
            raise Unencodable(f"{at}: {value!r} is not a map")
        entry = "s" if kind == "ms" else "q"
        return b"".join(
            _bytes_field(number, _one(1, "s", k, at) + _one(2, entry, value[k], f"{at}[{k}]")) for k in sorted(value)
        )
    return _bytes_field(number, message(kind, value, at))


def message(name: str, obj: Any, at: str = "") -> bytes:
    """`obj` (its JSON form) as the message `name`; Unencodable names the first field it cannot."""
    if not isinstance(obj, dict):
        raise Unencodable(f"{at or name}: {obj!r} is not an object")
    fields = SCHEMA[name]
    inline = {kind[1:]: (number, field) for field, (number, kind, _) in fields.items() if kind.startswith("@")}
    taken: dict[str, dict[str, Any]] = {kind: {} for kind in inline}
    out = bytearray()
    for key, value in obj.items():
        if key in ("apiVersion", "kind") and name in KINDS:
            continue  # the envelope's TypeMeta carries them
        place = fields.get(key)
        if place is None:
            home = next((kind for kind in inline if key in SCHEMA[kind]), None)
            if home is None:
                raise Unencodable(f"{at or name}: no protobuf number for {name}.{key}")
            taken[home][key] = value
            continue
        if value is None:
            continue
        number, kind, repeated = place
        where = f"{at}.{key}" if at else key
        if repeated:
            if not isinstance(value, list):
                raise Unencodable(f"{where}: {value!r} is not a list")
            out += b"".join(_one(number, kind, item, f"{where}[{i}]") for i, item in enumerate(value))
        else:
            out += _one(number, kind, value, where)
    for key, (number, kind, repeated) in fields.items():
        if kind == "T" and not repeated and obj.get(key) is None:
            out += _one(number, kind, None, key)  # a non-pointer Time: Go always sends it
    for kind, (number, _) in inline.items():  # an embedded struct is a value in Go: always sent
        out += _bytes_field(number, message(kind, taken[kind], at))
    return bytes(out)


def envelope(kind: str, api_version: str, raw: bytes, content_encoding: str = "") -> bytes:
    """An answer: `k8s\\x00` and a runtime.Unknown holding the object `raw` of `kind` (the real
    server never sets a content encoding; tests do, to see it refused)."""
    type_meta = _bytes_field(1, api_version.encode()) + _bytes_field(2, kind.encode())
    unknown = _bytes_field(1, type_meta) + _bytes_field(2, raw)
    unknown += _bytes_field(3, content_encoding.encode()) + _bytes_field(4, b"")
    return MAGIC + unknown


def answer(obj: dict[str, Any]) -> bytes:
    """A whole object (Pod, Node, Status) as the server answers it."""
    kind = obj.get("kind") or ""
    if kind not in KINDS:
        raise Unencodable(f"the API test server cannot encode a {kind or 'nameless object'} as protobuf")
    return envelope(kind, obj.get("apiVersion") or "v1", message(kind, obj))


def listing(kind: str, metadata: dict[str, Any], items: list[bytes]) -> bytes:
    """A list answer of already encoded items (each a `message` of the list's item kind)."""
    body = _bytes_field(1, message("ListMeta", metadata)) + b"".join(_bytes_field(2, item) for item in items)
    return envelope(kind, "v1", body)
