"""What the real API server's typed decoder refuses in a built-in kind's body, before admission or
validation: a field whose JSON type is not its Go type, a time its layout does not parse, bytes
that are not base64. A 400 BadRequest (`transformDecodeError`,
`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go`):

    <Kind> in version "<version>" cannot be handled as a <Kind>: <the decoder's first error>

The decoder is Go's encoding/json as sigs.k8s.io/json forks it (case-sensitive): it goes through
the body in order, keeps the first type error and goes on, but stops at once where a type's own
UnmarshalJSON fails (a time, an int-or-string); a JSON null leaves any field unset. A key that
names no field is dropped, and said as `unknown field "<path>"` (list items indexed), a field
that comes twice as `duplicate field "<path>"`, in the order they come: a 400 under
`fieldValidation=Strict`, a warning otherwise (`strict_errors`). The fields and their types come
from the official client's models (generated from Kubernetes' OpenAPI), which keep neither an
integer's width (INT64 lists the int64 fields of the kinds checked; the rest are int32) nor
which times are MicroTime (MICRO_TIMES, from `k8s.io/api`'s types.go)."""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
import types
import typing
from typing import Any

from kubernetes.client.models.core_v1_event import CoreV1Event
from kubernetes.client.models.v1_config_map import V1ConfigMap
from kubernetes.client.models.v1_delete_options import V1DeleteOptions
from kubernetes.client.models.v1_lease import V1Lease
from kubernetes.client.models.v1_object_meta import V1ObjectMeta
from kubernetes.client.models.v1_secret import V1Secret
from kubernetes.client.models.v1_self_subject_access_review import V1SelfSubjectAccessReview
from pydantic import BaseModel

# The kinds whose bodies are decoded here: those the job writes (and a Secret, beside a ConfigMap).
MODELS: dict[str, type[BaseModel]] = {
    "events": CoreV1Event,
    "leases": V1Lease,
    "configmaps": V1ConfigMap,
    "secrets": V1Secret,
    "selfsubjectaccessreviews": V1SelfSubjectAccessReview,
}
INT64 = frozenset(
    {
        ("ObjectMeta", "generation"),
        ("ObjectMeta", "deletionGracePeriodSeconds"),
        ("DeleteOptions", "gracePeriodSeconds"),
    }
)
MICRO_TIMES = frozenset(
    {
        ("Event", "eventTime"),
        ("EventSeries", "lastObservedTime"),
        ("LeaseSpec", "acquireTime"),
        ("LeaseSpec", "renewTime"),
    }
)
# Fields of a named string type, which Go's errors name by it.
NAMED_STRINGS = {
    ("Preconditions", "uid"): "types.UID",
    ("DeleteOptions", "propagationPolicy"): "v1.DeletionPropagation",
}
_BITS = {"int32": 32, "int64": 64}
RFC3339 = "2006-01-02T15:04:05Z07:00"
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"


class DecodeError(Exception):
    """The decoder's error, in Go's words."""


def go_name(model: type[BaseModel]) -> str:
    """The Go struct a model is generated from: `CoreV1EventSeries` is `EventSeries`."""
    return re.sub(r"^(?:[A-Z][a-z]+)*?V\d+(?:(?:alpha|beta)\d+)?", "", model.__name__)


def go_kind(plural: str) -> str:
    """The Go type a resource's bodies are decoded into, or "" for one not decoded here."""
    return go_name(MODELS[plural]) if plural in MODELS else ""


def decode_problem(plural: str, body: dict[str, Any]) -> str | None:
    """The 400's message for `body` written to `plural`, or None when the decoder takes it."""
    model = MODELS.get(plural)
    if model is None:
        return None
    problem = _first_error(model, body)
    return None if problem is None else cannot_be_handled(body, go_name(model), problem)


def delete_options_problem(body: dict[str, Any]) -> str | None:
    """The decoder's error for a DELETE's body (DeleteOptions), or None when it takes it. The
    delete handler passes it on as it is (no transformDecodeError): a 500 of no reason."""
    return _first_error(V1DeleteOptions, body)


def _first_error(model: type[BaseModel], body: dict[str, Any]) -> str | None:
    """The error Go's decoder returns for `body` decoded into `model`'s struct, or None."""
    decoder = _Decoder()
    try:
        decoder.struct(model, body, (), "")
    except DecodeError as error:  # a type's own UnmarshalJSON failed: the decoder stops there
        return str(error)
    return None if decoder.saved is None else str(decoder.saved)


def cannot_be_handled(body: dict[str, Any], go_kind: str, error: str) -> str:
    """`transformDecodeError`'s message: the kind and version are the body's, else the path's."""
    kind, api_version = body.get("kind"), body.get("apiVersion")
    kind = kind if isinstance(kind, str) and kind else go_kind
    version = (api_version if isinstance(api_version, str) else "").rpartition("/")[2] or "v1"
    return f'{kind} in version "{version}" cannot be handled as a {go_kind}: {error}'


Repeats = dict[int, tuple[dict[str, Any], list[tuple[str, bool]]]]  # see parse


def parse(body: bytes) -> tuple[Any, Repeats]:
    """A request body as JSON, and where its objects repeat a key. Python's decoder keeps a
    repeated key once (its last value, at its first place); Go's decoders see each time it comes.
    So each object that repeats one is kept, by id, with its keys in the order they came, True
    for each repeat (the object is held, so its id stays its own)."""
    repeats: Repeats = {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        came: list[tuple[str, bool]] = []
        for key, value in items:
            came.append((key, key in obj))
            obj[key] = value  # the last value, at the first place, as json.loads keeps it
        if len(came) != len(obj):
            repeats[id(obj)] = (obj, came)
        return obj

    return json.loads(body, object_pairs_hook=pairs), repeats


def _keys(obj: dict[str, Any], repeats: Repeats) -> list[tuple[str, bool]]:
    """An object's keys as they came, True for a repeat."""
    return repeats[id(obj)][1] if id(obj) in repeats else [(key, False) for key in obj]


def repeated(value: Any, repeats: Repeats, at: str = "") -> list[str]:
    """The paths of every repeated key, in the order they come (keys by `.`, list items by
    `[i]`): `duplicate field "<path>"` each, as the unstructured decoder of a custom resource says
    them, before its unknown fields."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, again in _keys(value, repeats):
            where = f"{at}.{key}" if at else key
            found += [where] if again else repeated(value[key], repeats, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += repeated(item, repeats, f"{at}[{index}]")
    return found


def strict_errors(plural: str, body: dict[str, Any], repeats: Repeats) -> list[str]:
    """What the strict decoder says of a built-in kind's body, in the order it comes on them:
    `unknown field "<path>"` for a key that names no field (dropped from `body`, as the decoder
    drops it) and `duplicate field "<path>"` for a field repeated; a key both unknown and repeated
    is said once, unknown. Of a kind not decoded here (no model), its repeats alone. Call it on a
    body decode_problem takes."""
    model = MODELS.get(plural)
    if model is None:
        return [f'duplicate field "{path}"' for path in repeated(body, repeats)]
    return _dropped(model, body, "", repeats)


def unknown_metadata(body: dict[str, Any]) -> list[str]:
    """A custom resource's metadata keys that name no field of ObjectMeta, dropped (the server's
    ObjectMeta coercion, apiextensions' schemaobjectmeta), in the order they come, each as
    `unknown field "<path>"` (its repeats were said by the unstructured decoder before)."""
    metadata = body.get("metadata")
    return _dropped(V1ObjectMeta, metadata, "metadata", {}) if isinstance(metadata, dict) else []


def _dropped(model: type[BaseModel], body: dict[str, Any], at: str, repeats: Repeats) -> list[str]:
    """What the strict decoder says of `body` (under `at`), its unknown keys dropped where they are."""
    decoder = _Decoder(repeats)
    decoder.struct(model, body, (), at)
    for parent, key in decoder.unknown.values():
        parent.pop(key, None)
    return decoder.said


def strict_problem(body: dict[str, Any], go_kind: str, said: list[str]) -> str:
    """The 400 under `fieldValidation=Strict`: all the strict decoder said, as one error."""
    return cannot_be_handled(body, go_kind, f"strict decoding error: {', '.join(said)}")


def _json_type(value: Any) -> str:
    """How Go's decoder names a JSON value it cannot store."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, float):  # written with a point or an exponent: no Go integer reads it
        return f"number {value!r}"
    if isinstance(value, int):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), "value")


def _type_error(value: Any, struct: str, path: tuple[str, ...], go_type: str, shown: str = "") -> DecodeError:
    """Go's UnmarshalTypeError; `shown` names the value where the JSON type alone does not."""
    shown = shown or (_json_type(value) if go_type.startswith("int") else _json_type(value).split(" ")[0])
    field = ".".join(path)
    return DecodeError(f"json: cannot unmarshal {shown} into Go struct field {struct}.{field} of type {go_type}")


def _plain(annotation: Any) -> Any:
    """The type inside pydantic's Annotated[...] (StrictStr is Annotated[str, Strict()])."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _go_type(annotation: Any) -> str:
    """A Go type's name as reflect prints it, for an element of a list or map."""
    annotation = _plain(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"v1.{go_name(annotation)}"
    return {str: "string", int: "int32", bool: "bool", float: "float64"}.get(annotation, "interface {}")


class _Decoder:
    """Go's decoder over one body: a type error is kept (the first) and the decoding goes on; an
    error of a type's own UnmarshalJSON (a time, an int-or-string) is raised and ends it."""

    def __init__(self, repeats: Repeats | None = None) -> None:
        self.saved: DecodeError | None = None
        self.unknown: dict[str, tuple[dict[str, Any], str]] = {}  # its path: where the key is
        self.repeats = repeats or {}
        self.said: list[str] = []  # unknown and repeated fields, in the order they come

    def save(self, error: DecodeError) -> None:
        self.saved = self.saved or error

    def struct(self, model: type[BaseModel], body: dict[str, Any], path: tuple[str, ...], at: str) -> None:
        """Each field of `body` that `model` has, in the body's order. `path` is the field path Go
        names a type error by; `at` the strict decoder's, with list indexes."""
        fields = {(info.serialization_alias or name): info.annotation for name, info in model.model_fields.items()}
        for key, again in _keys(body, self.repeats):
            where, value = f"{at}.{key}" if at else key, body[key]
            if key not in fields:
                if not again:  # said once, as unknown, however often it comes
                    self.unknown[where] = (body, key)
                    self.said.append(f'unknown field "{where}"')
            elif again:
                self.said.append(f'duplicate field "{where}"')
            elif value is not None:  # null: left unset
                self.value(fields[key], value, go_name(model), (*path, key), where)

    def value(self, annotation: Any, value: Any, struct: str, path: tuple[str, ...], at: str) -> None:
        """`value` decoded into the Go type the model's `annotation` stands for."""
        annotation = _plain(annotation)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (typing.Union, types.UnionType):
            choices = [_plain(a) for a in args if a is not type(None)]
            if choices == [int, str]:  # IntOrString: a string, else an int32 (its UnmarshalJSON)
                if not isinstance(value, str) and (isinstance(value, bool) or not isinstance(value, int)):
                    raise _type_error(value, struct, path, "int32")
            else:  # bytes or a string (binaryData): bytes
                self.value(choices[0], value, struct, path, at)
        elif origin is list or origin is dict:
            if not isinstance(value, list if origin is list else dict):
                go_type = f"[]{_go_type(args[0])}" if origin is list else f"map[string]{_go_type(args[1])}"
                self.save(_type_error(value, struct, path, go_type))
                return
            if isinstance(value, dict):  # a map's repeated keys are said as a struct's are
                self.said += [f'duplicate field "{at}.{key}"' for key, again in _keys(value, self.repeats) if again]
            items = enumerate(value) if isinstance(value, list) else value.items()
            for index, item in items:
                if item is not None:
                    self.value(args[-1], item, struct, path, f"{at}[{index}]")
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if isinstance(value, dict):
                self.struct(annotation, value, path, at)
            else:
                self.save(_type_error(value, struct, path, f"v1.{go_name(annotation)}"))
        elif annotation is datetime.datetime:  # metav1.Time and MicroTime read a string, then parse it
            if not isinstance(value, str):
                raise _type_error(value, struct, path, "string")
            parse_time(value, RFC3339_MICRO if (struct, path[-1]) in MICRO_TIMES else RFC3339)
        elif annotation is bytes:
            if not isinstance(value, str):
                self.save(_type_error(value, struct, path, "[]uint8"))
            elif (at := _bad_base64_at(value)) is not None:
                self.save(DecodeError(f"illegal base64 data at input byte {at}"))
        elif annotation is int:
            go_type = "int64" if (struct, path[-1]) in INT64 else "int32"
            if isinstance(value, bool) or not isinstance(value, int):  # a float was written with a point
                self.save(_type_error(value, struct, path, go_type))
            elif not -(2 ** (_BITS[go_type] - 1)) <= value < 2 ** (_BITS[go_type] - 1):
                self.save(_type_error(value, struct, path, go_type, f"number {int(value)}"))
        elif annotation in (str, bool, float):
            wanted: Any = int | float if annotation is float else annotation
            if not isinstance(value, wanted) or (annotation is float and isinstance(value, bool)):
                go_type = NAMED_STRINGS.get((struct, path[-1]), _go_type(annotation))
                self.save(_type_error(value, struct, path, go_type))
        # Anything else (a RawExtension, `object`) takes any JSON.


def _bad_base64_at(text: str) -> int | None:
    """Where Go's StdEncoding finds `text` is not base64 (padded, newlines skipped), or None."""
    try:
        base64.b64decode(text.replace("\r", "").replace("\n", ""), validate=True)
        return None
    except binascii.Error:
        pass
    alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
    bad = next((i for i, char in enumerate(text) if char not in alphabet and char not in "\r\n"), None)
    return bad if bad is not None else len(text.rstrip("\r\n")) // 4 * 4


# Go's time.Parse, for the two layouts a Kubernetes time has: each element of the layout, the
# digits it takes (a fixed count, or one or two for the hour), and the range it must be in.
_ELEMENTS: tuple[tuple[str, str, tuple[int, int] | None, str], ...] = (
    ("2006", r"\d{4}", None, ""),
    ("-", "-", None, ""),
    ("01", r"\d{2}", (1, 12), "month"),
    ("-", "-", None, ""),
    ("02", r"\d{2}", None, ""),
    ("T", "T", None, ""),
    ("15", r"\d{1,2}", (0, 23), "hour"),
    (":", ":", None, ""),
    ("04", r"\d{2}", (0, 59), "minute"),
    (":", ":", None, ""),
    ("05", r"\d{2}", (0, 59), "second"),
)


_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def parse_time(text: str, layout: str) -> None:
    """Raise DecodeError as Go's time.Parse(layout, text) fails, in its words."""
    rest, numbers = text, []
    for element, pattern, bounds, name in _ELEMENTS:
        found = re.match(pattern, rest)
        if found is None:
            raise DecodeError(f'parsing time "{text}" as "{layout}": cannot parse "{rest}" as "{element}"')
        rest = rest[found.end() :]
        if pattern.startswith("\\d"):
            numbers.append(int(found.group()))
            if bounds is not None and not bounds[0] <= numbers[-1] <= bounds[1]:
                raise DecodeError(f'parsing time "{text}": {name} out of range')
    if layout == RFC3339_MICRO:
        if re.match(r"[.,]\d{6}", rest) is None:
            raise DecodeError(f'parsing time "{text}" as "{layout}": cannot parse "{rest}" as ".000000"')
        rest = rest[7:]
    elif (fraction := re.match(r"[.,]\d+", rest)) is not None:
        rest = rest[fraction.end() :]  # a fraction the layout does not name is taken
    zone = re.match(r"Z|[+-]\d{2}:\d{2}", rest)
    if zone is None:
        raise DecodeError(f'parsing time "{text}" as "{layout}": cannot parse "{rest}" as "Z07:00"')
    rest = rest[zone.end() :]
    if rest:
        raise DecodeError(f'parsing time "{text}": extra text: "{rest}"')
    year, month, day = numbers[0], numbers[1], numbers[2]
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not 1 <= day <= (29 if month == 2 and leap else _DAYS[month - 1]):
        raise DecodeError(f'parsing time "{text}": day out of range')
