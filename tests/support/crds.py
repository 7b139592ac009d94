"""Calico's CustomResourceDefinitions, applied to a write as a real API server applies them.

The CRDs are Calico's own (`../shared/calico-crds`, beside the checkout; never copied into the
repository). For each create or update of a custom resource the real server, in this order
(k8s.io/apiextensions-apiserver: the custom resource strategy and structural schema packages):
1. prunes every field its structural schema does not name, unless the schema preserves unknown
   fields there (`x-kubernetes-preserve-unknown-fields`; `additionalProperties` names map keys);
2. drops a `null` that a non-nullable field holds (it is as if the field were not sent);
3. applies `default`s to absent fields;
4. validates: `type`, `required`, `enum`, `pattern`, `format` (only formats the server checks),
   lengths, bounds, item and property counts, `x-kubernetes-int-or-string`, `anyOf`/`allOf`,
   and uniqueness of `x-kubernetes-list-type: set|map` lists. Any failure is a 422 whose
   message and `details.causes` have the real server's shape.

5. evaluates the schema's CEL rules (`x-kubernetes-validations`, tests/support/cel.py), unless
   step 4 found an error that blocks them.

Not done here, and said in docs/development.md: ratcheting (an unchanged invalid field that an
update may keep).
"""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache, cmp_to_key
from pathlib import Path
from typing import Any

import yaml

from tests.support import cel

SHARED = Path(__file__).resolve().parents[3] / "shared" / "calico-crds"
V1_FILE, V3_FILE = "crd.projectcalico.org-v1.yaml", "projectcalico.org-v3.yaml"
V1_GROUP, V3_GROUP = "crd.projectcalico.org", "projectcalico.org"
# Formats the API server validates on custom resources (apiextensions' supported formats); any
# other (`int32`, `int64`) is dropped from the schema and never checked.
_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$", re.I)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _cidr(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return "/" in value


def _ip(version: int, value: str) -> bool:
    try:
        return ipaddress.ip_address(value).version == version
    except ValueError:
        return False


def _date_time(value: str) -> bool:
    if not _RFC3339.match(value):
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


FORMATS = {
    "cidr": _cidr,
    "ipv4": lambda v: _ip(4, v),
    "ipv6": lambda v: _ip(6, v),
    "date-time": _date_time,
    "datetime": _date_time,
    "uuid": lambda v: bool(_UUID.match(v)),
}
_GO_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


@dataclass(frozen=True)
class Crd:
    """One served version of one CRD: what routing, admission and discovery need of it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    schema: dict[str, Any] = field(repr=False, compare=False)
    # A version marked `deprecated`: the warning every request to it is answered with.
    deprecation: str | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


@dataclass
class Cause:
    """One field error, as the real server reports it in `details.causes`."""

    reason: str
    field: str
    message: str

    def text(self) -> str:
        return f"{self.field}: {self.message}"


def qualified(name: str, group: str) -> str:
    """A resource or kind with its group, as the server's messages name it (`GroupResource.String`):
    `ipamblocks.crd.projectcalico.org`, and the name alone in the core group."""
    return f"{name}.{group}" if group else name


class Invalid(Exception):
    """An object the server refuses (422), of `kind` in `group` ("" for the core group)."""

    def __init__(self, kind: str, group: str, name: str, causes: list[Cause]) -> None:
        self.kind, self.group, self.name, self.causes = kind, group, name, causes
        listed = "; ".join(c.text() for c in causes)  # never shown: `message` is
        super().__init__(listed)

    @property
    def message(self) -> str:
        texts = [c.text() for c in self.causes]
        said = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        return f'{qualified(self.kind, self.group)} "{self.name}" is invalid: {said}'

    def details(self) -> dict[str, Any]:
        return {
            **({"name": self.name} if self.name else {}),  # omitted when empty, as Go's omitempty does
            **({"group": self.group} if self.group else {}),
            "kind": self.kind,
            "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in self.causes],
        }


@cache
def load(path: Path) -> tuple[Crd, ...]:
    """Every served version of every CRD in a YAML stream of CRDs."""
    found = []
    for doc in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            found.append(
                Crd(
                    group=spec["group"],
                    version=version["name"],
                    plural=spec["names"]["plural"],
                    kind=spec["names"]["kind"],
                    namespaced=spec["scope"] == "Namespaced",
                    status_subresource="status" in (version.get("subresources") or {}),
                    schema=version["schema"]["openAPIV3Schema"],
                    deprecation=_deprecation(spec, version),
                )
            )
    return tuple(found)


def _deprecation(spec: dict[str, Any], version: dict[str, Any]) -> str | None:
    """A deprecated version's warning: its own `deprecationWarning`, else the server's default,
    which names the newest served version that is not deprecated and ranks above it, if any
    (`defaultDeprecationWarning`, customresource_handler.go)."""
    if not version.get("deprecated"):
        return None
    if said := version.get("deprecationWarning"):
        return str(said)
    group, kind, name = spec["group"], spec["names"]["kind"], version["name"]
    newer = [
        v["name"]
        for v in spec["versions"]
        if v.get("served") and not v.get("deprecated") and _compare_versions(name, v["name"]) < 0
    ]
    use = f"; use {group}/{max(newer, key=cmp_to_key(_compare_versions))} {kind}" if newer else ""
    return f"{group}/{name} {kind} is deprecated{use}"


def _compare_versions(a: str, b: str) -> int:
    """How Kubernetes orders versions (`CompareKubeAwareVersionStrings`), above zero where `a`
    ranks higher: GA, then beta, then alpha, each by major then minor number; any other name
    below them all, and of two such the lesser in text ranks higher."""
    found = [re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", v) for v in (a, b)]
    if found[0] is None or found[1] is None:
        if found[0] is found[1]:  # both None
            return (b > a) - (b < a)
        return -1 if found[0] is None else 1
    ranks = [({"alpha": 0, "beta": 1}.get(f[2] or "", 2), int(f[1]), int(f[3] or 0)) for f in found]
    return (ranks[0] > ranks[1]) - (ranks[0] < ranks[1])


def calico(*files: str, directory: Path = SHARED) -> tuple[Crd, ...]:
    """Calico's CRDs of the files named (V1_FILE, V3_FILE), or none where they are not at hand."""
    return tuple(crd for name in files if (directory / name).is_file() for crd in load(directory / name))


# KubeVirt's two kinds as KubeVirt serves them (kubevirt.io/v1, namespaced, with a status subresource);
# their schemas are not at hand, so these keep whatever is sent.
_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
KUBEVIRT = (
    Crd("kubevirt.io", "v1", "virtualmachines", "VirtualMachine", True, True, _OPEN),
    Crd("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True, True, _OPEN),
)


def available(directory: Path = SHARED) -> bool:
    return (directory / V1_FILE).is_file() and (directory / V3_FILE).is_file()


# Admission: prune, drop non-nullable nulls, default, validate.


def admit(crd: Crd, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The object as the server stores it; raises Invalid with every field error found. `old`:
    the stored object an update replaces (for CEL's transition rules)."""
    stored = copy.deepcopy(obj)
    name = str((stored.get("metadata") or {}).get("name") or "")
    check_kind(crd, stored, name)
    body = _prune(crd.schema, _body(stored))
    body = _default(crd.schema, body)
    head = {"apiVersion": stored.get("apiVersion") or crd.api_version, "kind": stored.get("kind") or crd.kind}
    admitted = {**head, "metadata": stored.get("metadata") or {}, **body}
    causes = list(name_causes(stored.get("metadata") or {}))
    causes += _validate(crd.schema, {**body, "metadata": stored.get("metadata") or {}}, "", top=True)
    if not _ruled(crd):
        pass  # no CEL validator: the server runs none, and says nothing of it
    elif any(c.reason in cel.BLOCKING for c in causes):
        causes.append(Cause("FieldValueInvalid", "<nil>", f"Invalid value: null: {cel.NOT_CHECKED}"))
    else:
        causes += [Cause(f.reason, f.path, f.message) for f in cel.failures(crd.schema, admitted, old)]
    if causes:
        raise Invalid(crd.kind, crd.group, name, causes)
    return admitted


def check_kind(crd: Crd, obj: dict[str, Any], name: str) -> None:
    """A body naming another kind than its CRD's is refused before its schema is looked at, in the
    body's own kind's name (`ValidateTypeMeta`, apiextensions' customresource validator; a write
    of `/status` too). Its apiVersion was checked before, by the handler (kubeapi.py)."""
    kind = obj.get("kind")
    if isinstance(kind, str) and kind and kind != crd.kind:
        cause = Cause("FieldValueInvalid", "kind", f"Invalid value: {json.dumps(kind)}: must be {crd.kind}")
        raise Invalid(kind, crd.group, name, [cause])


@cache
def _ruled(crd: Crd) -> bool:
    return cel.has_rules(crd.schema)


def name_causes(metadata: dict[str, Any]) -> Iterator[Cause]:
    """A name is a DNS subdomain: a custom resource's (apiextensions: NameIsDNSSubdomain), and
    a ConfigMap's, a Lease's, an Event's (ValidateObjectMeta, NameIsDNSSubdomain)."""
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        detail = (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character"
        )
        yield Cause("FieldValueInvalid", "metadata.name", f"Invalid value: {json.dumps(name)}: {detail}")


def _preserves(schema: dict[str, Any]) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def without_property(crd: Crd, name: str) -> Crd:
    """`crd` as an older release of it: its spec has no property `name`."""
    schema = copy.deepcopy(crd.schema)
    del schema["properties"]["spec"]["properties"][name]
    return replace(crd, schema=schema)


def pruned(crd: Crd, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as its kind's schema prunes it; its apiVersion, kind and metadata as they are."""
    return {**{k: v for k, v in obj.items() if k in _HEAD}, **_prune(crd.schema, _body(obj))}


def unknown_fields(crd: Crd, obj: dict[str, Any]) -> list[str]:
    """The paths pruning drops from `obj` (its metadata aside), sorted, as the strict decoder
    names them (`unknown field "<path>"`): keys joined by `.`, list items by `[i]`
    (`.../schema/pruning/algorithm.go`, PruneWithOptions)."""
    paths: list[str] = []
    _prune(crd.schema, _body(obj), "", paths)
    return sorted(paths)


_HEAD = ("apiVersion", "kind", "metadata")  # what a schema's pruning passes over at the root


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in _HEAD}


def _prune(schema: dict[str, Any], value: Any, at: str = "", pruned: list[str] | None = None) -> Any:
    """Unknown fields dropped, and nulls of non-nullable fields (apiextensions' pruning and
    PruneNonNullableNullsWithoutDefaults); the paths of the unknown ones go to `pruned`."""
    if isinstance(value, dict) and not schema.get("x-kubernetes-int-or-string"):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        kept: dict[str, Any] = {}
        for key, item in value.items():
            sub = properties.get(key) or (extra if isinstance(extra, dict) else None)
            where = f"{at}.{key}" if at else key
            if sub is None:
                if _preserves(schema):
                    kept[key] = item
                elif pruned is not None:
                    pruned.append(where)
                continue
            if item is None and not sub.get("nullable"):
                continue
            kept[key] = _prune(sub, item, where, pruned)
        return kept
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(schema["items"], item, f"{at}[{i}]", pruned) for i, item in enumerate(value)]
    return value


def _default(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for key, sub in properties.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = _default(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in list(value):
                if key not in properties:
                    value[key] = _default(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_default(schema["items"], item) for item in value]
    return value


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else f"{value}"


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    return _GO_TYPES.get(type(value), type(value).__name__)


def _is_type(value: Any, wanted: str) -> bool:
    if wanted == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if wanted == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return _type_of(value) == wanted


def _validate(schema: dict[str, Any], value: Any, path: str, top: bool = False) -> list[Cause]:
    where = path or "<root>"
    if value is None:
        if schema.get("nullable") or top:
            return []
        wanted = schema.get("type")
        if wanted:
            return [_type_cause(path, wanted, value)]
        return []
    if schema.get("x-kubernetes-int-or-string"):
        if not (_is_type(value, "integer") or isinstance(value, str)):
            return [
                Cause(
                    "FieldValueTypeInvalid",
                    path,
                    f'Invalid value: "{_type_of(value)}": {where} in body '
                    f'must be of type integer,string: "{_type_of(value)}"',
                )
            ]
    elif (wanted := schema.get("type")) and not _is_type(value, wanted):
        return [_type_cause(path, wanted, value)]
    causes: list[Cause] = []
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_shown(v) for v in schema["enum"])
        causes.append(
            Cause("FieldValueNotSupported", path, f"Unsupported value: {_shown(value)}: supported values: {supported}")
        )
    if isinstance(value, str):
        causes += _string_causes(schema, value, path, where)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        causes += _number_causes(schema, value, path, where)
    elif isinstance(value, list):
        causes += _list_causes(schema, value, path, where)
    elif isinstance(value, dict):
        causes += _object_causes(schema, value, path, where, top)
    for branch in schema.get("allOf") or ():
        causes += _validate({**branch, "nullable": True}, value, path)
    branches = schema.get("anyOf") or ()
    if branches and not any(not _validate({**b, "nullable": True}, value, path) for b in branches):
        causes.append(
            Cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {_shown(value)}: {where} in body must match at least one schema in anyOf",
            )
        )
    return causes


def _type_cause(path: str, wanted: str, value: Any) -> Cause:
    actual = _type_of(value)
    where = path or "<root>"
    return Cause(
        "FieldValueTypeInvalid",
        path,
        f'Invalid value: "{actual}": {where} in body must be of type {wanted}: "{actual}"',
    )


def _go_pattern(pattern: str) -> re.Pattern[str]:
    """RE2 as Go compiles it: a `(?i)` after the anchor applies from there (Python wants it first)."""
    flags = re.ASCII
    if "(?i)" in pattern:
        pattern, flags = pattern.replace("(?i)", ""), flags | re.IGNORECASE
    return re.compile(pattern, flags)


def _string_causes(schema: dict[str, Any], value: str, path: str, where: str) -> list[Cause]:
    causes = []
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        causes.append(Cause("FieldValueTooLong", path, f"Too long: may not be more than {schema['maxLength']} bytes"))
    if "minLength" in schema and len(value) < schema["minLength"]:
        causes.append(
            Cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {_shown(value)}: {where} in body should be at least {schema['minLength']} chars long",
            )
        )
    if "pattern" in schema and not _go_pattern(schema["pattern"]).search(value):
        causes.append(
            Cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {_shown(value)}: {where} in body should match '{schema['pattern']}'",
            )
        )
    check = FORMATS.get(schema.get("format", ""))
    if check is not None and not check(value):
        causes.append(
            Cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {_shown(value)}: {where} in body must be of type {schema['format']}: {_shown(value)}",
            )
        )
    return causes


def _number_causes(schema: dict[str, Any], value: float, path: str, where: str) -> list[Cause]:
    causes = []
    if "minimum" in schema and (
        value < schema["minimum"] or (schema.get("exclusiveMinimum") and value == schema["minimum"])
    ):
        causes.append(
            Cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {_shown(value)}: {where} in body should be "
                f"greater than or equal to {schema['minimum']}",
            )
        )
    if "maximum" in schema and (
        value > schema["maximum"] or (schema.get("exclusiveMaximum") and value == schema["maximum"])
    ):
        causes.append(
            Cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {_shown(value)}: {where} in body should be less than or equal to {schema['maximum']}",
            )
        )
    return causes


def _list_causes(schema: dict[str, Any], value: list[Any], path: str, where: str) -> list[Cause]:
    causes = []
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        causes.append(
            Cause("FieldValueTooMany", path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items")
        )
    if "minItems" in schema and len(value) < schema["minItems"]:
        causes.append(
            Cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {len(value)}: {where} in body should have at least {schema['minItems']} items",
            )
        )
    list_type = schema.get("x-kubernetes-list-type")
    if list_type in ("set", "map"):
        keys = schema.get("x-kubernetes-list-map-keys") or ()
        seen: set[str] = set()
        for index, item in enumerate(value):
            identity = json.dumps(
                {k: item.get(k) for k in keys} if list_type == "map" and isinstance(item, dict) else item,
                sort_keys=True,
            )
            if identity in seen:
                causes.append(Cause("FieldValueDuplicate", f"{path}[{index}]", f"Duplicate value: {identity}"))
            seen.add(identity)
    items = schema.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(value):
            causes += _validate(items, item, f"{path}[{index}]")
    return causes


def _object_causes(schema: dict[str, Any], value: dict[str, Any], path: str, where: str, top: bool) -> list[Cause]:
    causes = []
    for required in schema.get("required") or ():
        if required not in value:
            causes.append(Cause("FieldValueRequired", _join(path, required), "Required value"))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        causes.append(
            Cause(
                "FieldValueTooMany", path, f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"
            )
        )
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        causes.append(
            Cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {len(value)}: {where} in body should have at "
                f"least {schema['minProperties']} properties",
            )
        )
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if top and key == "metadata":
            continue
        sub = properties.get(key) or (extra if isinstance(extra, dict) else None)
        if sub is not None:
            causes += _validate(sub, item, _join(path, key))
    return causes


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# Objects with every property of a schema, for the tests that a read ignores what it does not read.


def filled(crd: Crd, obj: dict[str, Any], keep_absent: frozenset[str] = frozenset()) -> dict[str, Any]:
    """`obj` with every property its kind's schema has, statuses included, each absent one given a
    value the schema admits; what `obj` holds is kept as it is, and so is the absence of a field
    in `keep_absent` (paths such as `spec.attributes[].releasedAt`: absent means something)."""
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    whole = _fill(crd.schema, copy.deepcopy(body), "", keep_absent)
    head = {"apiVersion": obj.get("apiVersion", crd.api_version), "kind": obj.get("kind", crd.kind)}
    filled = {**head, "metadata": copy.deepcopy(obj.get("metadata") or {}), **whole}
    return _within_rules(crd, obj, filled)


_SELF_FIELD = re.compile(r"\bself((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _within_rules(crd: Crd, obj: dict[str, Any], whole: dict[str, Any]) -> dict[str, Any]:
    """`whole` without the added fields its CEL rules refuse ("a and b cannot both be set", a
    range of zeros): for each refusal, the outermost added field on the refused node's path, or
    else the last added field its rule names below the node, is left out again."""
    for _ in range(100):
        refused = cel.failures(crd.schema, whole, None)
        if not refused:
            return whole
        node = _parts("" if refused[0].path == "<nil>" else refused[0].path)
        named = [node + _parts(m.group(1).lstrip(".")) for m in _SELF_FIELD.finditer(refused[0].rule)]
        for path in (node, *reversed(named)):
            added = _outermost_added(obj, whole, path, 0 if path is node else len(node))
            if added is not None:
                _remove(whole, added)
                break
        else:
            raise AssertionError(f"{crd.kind}: no added field to leave out for {refused[0].message}")
    raise AssertionError(f"{crd.kind}: its CEL rules still refuse the filled object")


def _parts(path: str) -> list[str | int]:
    """`spec.items[0].name` as ["spec", "items", 0, "name"]."""
    parts: list[str | int] = []
    for name in filter(None, path.split(".")):
        key, _, rest = name.partition("[")
        parts.append(key)
        parts += [int(index) for index in rest.rstrip("]").split("][") if index] if rest else []
    return parts


def _at(value: Any, parts: list[str | int]) -> tuple[bool, Any]:
    for part in parts:
        listed = isinstance(part, int) and isinstance(value, list) and part < len(value)
        if not (listed or (isinstance(part, str) and isinstance(value, dict) and part in value)):
            return False, None
        value = value[part]
    return True, value


def _outermost_added(
    obj: dict[str, Any], whole: dict[str, Any], path: list[str | int], below: int
) -> list[str | int] | None:
    """The shortest prefix of `path`, longer than `below` parts, that `whole` holds and `obj` did not."""
    for length in range(below + 1, len(path) + 1):
        prefix = path[:length]
        if _at(whole, prefix)[0] and not _at(obj, prefix)[0]:
            return prefix
    return None


def _remove(whole: dict[str, Any], path: list[str | int]) -> None:
    parent = _at(whole, path[:-1])[1]
    del parent[path[-1]]


def _fill(schema: dict[str, Any], value: Any, path: str, keep_absent: frozenset[str]) -> Any:
    if value is None:
        value = example(schema, path)
    items = schema.get("items")
    if isinstance(value, dict) and not schema.get("x-kubernetes-int-or-string"):
        properties = schema.get("properties") or {}
        for key, sub in properties.items():
            inner = _join(path, key)
            if (not path and key in ("apiVersion", "kind", "metadata")) or (key not in value and inner in keep_absent):
                continue
            value[key] = _fill(sub, value.get(key), inner, keep_absent)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            if not value and not properties:
                value["example-key"] = None
            for key in [k for k in value if k not in properties]:
                value[key] = _fill(extra, value[key], _join(path, key), keep_absent)
    elif isinstance(value, list) and isinstance(items, dict):
        if not value and path + "[]" not in keep_absent:
            value = [None]
        nullable = bool(items.get("nullable")) and len(value) > 1
        value = [item if item is None and nullable else _fill(items, item, path + "[]", keep_absent) for item in value]
    return value


# Strings a pattern or format admits, for `example`: tried in order, the first the schema takes.
_CANDIDATES = (
    "",
    "Info",
    "1s",
    "10s",
    "100:200",
    "65000:100:200",
    "a",
    "A1",
    "eth0",
    "host:example-node",
    "1/second",
    "a=true",
    "a=b",
    "192.0.2.1",
    "Auto",
    "Drop",
    "Accept",
    "Disabled",
    "Legacy",
    "Tunnel",
    "Off",
    "Insert",
    "WorkloadIPs",
)


def example(schema: dict[str, Any], path: str = "") -> Any:
    """A value the schema admits, as plain as may be: its default, its first enum value, an empty
    or zero value, or a string its pattern or format takes."""
    for branch in schema.get("allOf") or ():  # the value must satisfy each: their enums, patterns, types
        schema = {**branch, **schema, "allOf": ()}
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    if schema.get("enum"):
        return copy.deepcopy(schema["enum"][0])
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return max(int(schema.get("minimum", 0)), 1)
    if kind == "object":
        return {}
    if kind == "array":
        return []
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return max(int(schema.get("minimum", 0)), 0) if "minimum" in schema else 0
    if kind == "string":
        formats = {
            "cidr": "192.0.2.0/24",
            "date-time": "2026-11-30T11:00:00Z",
            "ipv4": "192.0.2.1",
            "ipv6": "2001:db8::1",
            "uuid": "5f0c7e36-0000-4000-8000-000000000001",
        }
        if schema.get("format") in formats:
            return formats[schema["format"]]
        for candidate in _CANDIDATES:
            if not _validate(schema, candidate, path):
                return candidate
        raise ValueError(f"no example string for {path}: {schema.get('pattern')!r}")
    return None
