"""Pods and Nodes as the API server encodes them in protobuf, read by field number.

A core kind's list costs the API server less to encode as protobuf (generated code, not
reflection) than as JSON, in fewer bytes (a pod with its managedFields: 0.62 of its JSON). This
module is the wire format only: the schema below names just the fields calico-gc reads, so protobuf's C parser
skips everything else (managedFields, most of a pod) without building it. `kube.py` and
`health.py` turn the messages into the same records their JSON reading gives.

The numbers are Kubernetes' own (k8s.io/api `core/v1/generated.proto`, k8s.io/apimachinery
`apis/meta/v1` and `runtime` `generated.proto`); docs/kubernetes-wire.md lists each one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
# What a list of Pods or Nodes asks for: protobuf, or JSON from a server (or proxy) without it.
ACCEPT = f"{MEDIA_TYPE}, application/json"
MAGIC = b"k8s\x00"  # every protobuf answer starts with it, then a runtime.Unknown
GO_ZERO_TIME = -62135596800  # Go's zero time.Time, which a non-pointer metav1.Time sends when unset

_PACKAGE = "calico_gc.kube"
# message: (field, number, type); a type is a scalar, `map` (string to string) or a message of
# this schema, `*` repeated. A field's name is the JSON one (but `next`); the wire knows only its
# number. A kind may have more than one message here (Pod, HealthPod): one per reading of it, so
# that the large read builds only what it uses.
SCHEMA: dict[str, tuple[tuple[str, int, str], ...]] = {
    "TypeMeta": (("apiVersion", 1, "string"), ("kind", 2, "string")),  # runtime.TypeMeta
    "Unknown": (
        ("typeMeta", 1, "TypeMeta"),
        ("raw", 2, "bytes"),
        ("contentEncoding", 3, "string"),
        ("contentType", 4, "string"),
    ),
    "ListMeta": (("next", 3, "string"),),  # `continue`
    "ObjectMeta": (("name", 1, "string"), ("namespace", 3, "string")),
    "Time": (("seconds", 1, "int64"),),
    "Status": (("message", 3, "string"), ("reason", 4, "string"), ("code", 6, "int32")),
    "PodList": (("metadata", 1, "ListMeta"), ("items", 2, "Pod*")),
    "Pod": (("metadata", 1, "ObjectMeta"), ("spec", 2, "PodSpec"), ("status", 3, "PodStatus")),
    "PodSpec": (("nodeName", 10, "string"),),
    "PodStatus": (("podIP", 6, "string"), ("podIPs", 12, "PodIP*")),
    "PodIP": (("ip", 1, "string"),),
    "NodeList": (("metadata", 1, "ListMeta"), ("items", 2, "Node*")),
    "Node": (("metadata", 1, "NodeMeta"), ("spec", 2, "NodeSpec"), ("status", 3, "NodeStatus")),
    "NodeMeta": (("name", 1, "string"), ("creationTimestamp", 8, "Time")),  # not decoded for 100,000 pods
    "NodeSpec": (("taints", 5, "Taint*"),),
    "Taint": (("key", 1, "string"), ("timeAdded", 4, "Time")),
    "NodeStatus": (("conditions", 4, "NodeCondition*"), ("addresses", 5, "NodeAddress*")),
    "NodeCondition": (
        ("type", 1, "string"),
        ("status", 2, "string"),
        ("lastTransitionTime", 4, "Time"),
        ("reason", 5, "string"),
        ("message", 6, "string"),
    ),
    "NodeAddress": (("type", 1, "string"), ("address", 2, "string")),
    # The calico-node pods, as the health diagnosis reads them (adapters/health.py).
    "HealthPodList": (("metadata", 1, "ListMeta"), ("items", 2, "HealthPod*")),
    "HealthPod": (("metadata", 1, "LabelledMeta"), ("spec", 2, "PodSpec"), ("status", 3, "HealthPodStatus")),
    "LabelledMeta": (("name", 1, "string"), ("namespace", 3, "string"), ("labels", 11, "map")),
    "HealthPodStatus": (
        ("phase", 1, "string"),
        ("conditions", 2, "PodCondition*"),
        ("containerStatuses", 8, "ContainerStatus*"),
    ),
    "PodCondition": (("type", 1, "string"), ("status", 2, "string")),
    "ContainerStatus": (
        ("name", 1, "string"),
        ("state", 2, "ContainerState"),
        ("lastState", 3, "ContainerState"),
        ("restartCount", 5, "int32"),
    ),
    "ContainerState": (("waiting", 1, "ContainerStateWaiting"), ("terminated", 3, "ContainerStateTerminated")),
    "ContainerStateWaiting": (("reason", 1, "string"),),
    "ContainerStateTerminated": (("exitCode", 1, "int32"), ("reason", 3, "string"), ("finishedAt", 6, "Time")),
}
_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
}


def _classes() -> dict[str, type[Message]]:
    """SCHEMA as proto2 message classes (Kubernetes' files are proto2), built once at import."""
    kinds = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="calico_gc/kube.proto", package=_PACKAGE, syntax="proto2")
    for name, fields in SCHEMA.items():
        message = file.message_type.add(name=name)
        for field, number, kind in fields:
            bare = kind.rstrip("*")
            entry = message.field.add(name=field, number=number, json_name=field)
            entry.label = kinds.LABEL_REPEATED if kind.endswith("*") or bare == "map" else kinds.LABEL_OPTIONAL
            if bare in _SCALARS:
                entry.type = _SCALARS[bare]
            elif bare == "map":  # a map is a repeated entry message of key 1 and value 2
                pair = message.nested_type.add(name=f"{field[0].upper()}{field[1:]}Entry")
                pair.options.map_entry = True
                for side, side_number in (("key", 1), ("value", 2)):
                    pair.field.add(name=side, number=side_number, type=_SCALARS["string"], label=kinds.LABEL_OPTIONAL)
                entry.type, entry.type_name = kinds.TYPE_MESSAGE, f".{_PACKAGE}.{name}.{pair.name}"
            else:
                entry.type, entry.type_name = kinds.TYPE_MESSAGE, f".{_PACKAGE}.{bare}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name in SCHEMA}


MESSAGES = _classes()


def _unwrap(raw: bytes, kind: str) -> bytes:
    """The object inside the `k8s\\x00` envelope (a runtime.Unknown), checked to be a `kind`."""
    try:
        unknown: Any = MESSAGES["Unknown"].FromString(raw[len(MAGIC) :])
    except DecodeError as error:
        raise ValueError(f"protobuf that does not decode: {error}") from None
    if unknown.contentEncoding or unknown.contentType not in ("", MEDIA_TYPE):
        raise ValueError(f"protobuf holding {unknown.contentType or 'raw'} {unknown.contentEncoding}".strip())
    if unknown.typeMeta.kind != kind:
        raise ValueError(f"protobuf holding a {unknown.typeMeta.kind or 'nameless object'}, not a {kind}")
    return bytes(unknown.raw)


def decode_list(raw: bytes, kind: str, message: str | None = None) -> tuple[Sequence[Any], str | None]:
    """A protobuf list page of `kind` (`PodList`, `NodeList`) read as `message` (default: the
    kind): its items and its continue token. A ValueError says why it is not one."""
    try:
        listed: Any = MESSAGES[message or kind].FromString(_unwrap(raw, kind))
    except DecodeError as error:
        raise ValueError(f"a {kind} that does not decode: {error}") from None
    return listed.items, listed.metadata.next or None


def status_json(raw: bytes) -> str | None:
    """A protobuf Status (an error answer to a protobuf request) as the JSON Status the rest of the
    client reads; None when `raw` is not one."""
    if not raw.startswith(MAGIC):
        return None
    try:
        status: Any = MESSAGES["Status"].FromString(_unwrap(raw, "Status"))
    except (ValueError, DecodeError):
        return None
    return json.dumps({"kind": "Status", "message": status.message, "reason": status.reason, "code": status.code})


def when(parent: Any, field: str) -> str | None:
    """A metav1.Time field as the API's JSON writes it (RFC 3339, seconds); None when unset."""
    if not parent.HasField(field):
        return None
    seconds = getattr(parent, field).seconds
    if seconds == GO_ZERO_TIME:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"{field} is {seconds} s from 1970, a time no API server holds") from None
