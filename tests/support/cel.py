"""A CRD schema's CEL rules (`x-kubernetes-validations`), evaluated as the API server evaluates them.

What the real server does (k8s.io/apiextensions-apiserver, pkg/apiserver/schema/cel/validation.go
and the custom resource strategy), and so this does:
- a rule is evaluated where its schema node has a value, with `self` that value (at the root, the
  object with only `metadata.name` and `metadata.generateName` of its metadata); a node absent
  or null is not evaluated;
- a rule that names `oldSelf` (a transition rule) is evaluated only on an update, where the old
  object has a value at the same place: object fields by name, list items of `x-kubernetes-
  list-type: map` by their keys, and no other list items;
- a rule that is not `true` is a 422 cause `<path>: Invalid value: "<schema type>": <message>`
  (`messageExpression`'s text if it gives one, else `message`, else `failed rule: <rule>`), with
  the rule's `reason` (FieldValueInvalid by default) and its `fieldPath` below the path; at the
  root the path is `<nil>`;
- a rule that fails to evaluate is `Invalid value: "<type>": <error> evaluating rule: <rule>`
  (the error's words are the CEL library's here, Go's there);
- the rules are not run at all where the schema's own checks found a type, enum, required, length
  or count error: then one cause says `some validation rules were not checked`.

The Kubernetes CEL library functions Calico's rules call are given (`isIP`, `ip`, `isCIDR`,
`cidr`, and on their values `family`, `ip`, `masked`, `prefixLength`, `containsIP`,
`containsCIDR`), with Kubernetes' parsing: no IPv4-mapped IPv6 address, no zone, no leading zeros.
Not done (docs/development.md): ratcheting (a real server lets an update keep an unchanged value
that a rule refuses; here it is refused), the cost budget, and the rest of the library.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import celpy
from celpy import celtypes

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Interface | ipaddress.IPv6Interface
# Causes of the schema's own checks after which the server runs no rule (strategy.go, hasBlockingErr).
BLOCKING = (
    "FieldValueNotSupported",
    "FieldValueRequired",
    "FieldValueTooLong",
    "FieldValueTooMany",
    "FieldValueTypeInvalid",
)
NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)


def _address(text: str) -> Address:
    """An IP as Kubernetes' `ip()` parses one; ValueError for anything else."""
    if "%" in text:
        raise ValueError(f"IP address with zone value is not allowed: {text}")
    address = ipaddress.ip_address(text)  # refuses IPv4 with leading zeros, as Kubernetes does
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address is not allowed: {text}")
    return address


def _network(text: str) -> Network:
    address, slash, length = text.partition("/")
    if not slash or not length.isdigit():
        raise ValueError(f"network address parse error during conversion from string: {text}")
    return ipaddress.ip_interface(f"{_address(address)}/{int(length)}")


@dataclass(frozen=True)
class IP:
    """A value of Kubernetes' CEL `net.IP` type."""

    address: Address

    def __str__(self) -> str:
        return str(self.address)


@dataclass(frozen=True)
class CIDR:
    """A value of Kubernetes' CEL `net.CIDR` type: the address as written and the prefix length."""

    network: Network

    def __str__(self) -> str:
        return str(self.network)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"no such overload: {type(value).__name__}")
    return str(value)


def _is(parse: Callable[[str], object]) -> Callable[[Any], celtypes.BoolType]:
    def check(value: Any) -> celtypes.BoolType:
        try:
            parse(_text(value))
        except ValueError:
            return celtypes.BoolType(False)
        return celtypes.BoolType(True)

    return check


def _ip(value: Any) -> IP:
    """`ip(string)`, and `cidr.ip()`: the address."""
    if isinstance(value, CIDR):
        return IP(value.network.ip)
    return IP(_address(_text(value)))


def _cidr(value: Any) -> CIDR:
    return CIDR(_network(_text(value)))


def _family(value: Any) -> celtypes.IntType:
    found = value.address if isinstance(value, IP) else value.network if isinstance(value, CIDR) else None
    if found is None:
        raise TypeError("no such overload: family")
    return celtypes.IntType(found.version)


def _contains_ip(network: CIDR, value: Any) -> celtypes.BoolType:
    address = value.address if isinstance(value, IP) else _address(_text(value))
    return celtypes.BoolType(address in network.network.network)


def _contains_cidr(network: CIDR, value: Any) -> celtypes.BoolType:
    other = value if isinstance(value, CIDR) else _cidr(value)
    inner, outer = other.network.network, network.network.network
    return celtypes.BoolType(inner.version == outer.version and inner.subnet_of(outer))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "isIP": _is(_address),
    "isCIDR": _is(_network),
    "ip": _ip,
    "cidr": _cidr,
    "family": _family,
    "masked": lambda value: CIDR(ipaddress.ip_interface(value.network.network)),
    "prefixLength": lambda value: celtypes.IntType(value.network.network.prefixlen),
    "containsIP": _contains_ip,
    "containsCIDR": _contains_cidr,
}


@cache
def _program(expression: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression), functions=FUNCTIONS)


@dataclass
class Failure:
    """One rule that refused a value: the cause's reason, field and message, and the rule."""

    reason: str
    path: str
    message: str
    rule: str = ""


def has_rules(schema: Any) -> bool:
    """Whether a schema holds any rule: without one the server has no CEL validator to run."""
    if isinstance(schema, dict):
        return "x-kubernetes-validations" in schema or any(has_rules(v) for v in schema.values())
    return isinstance(schema, list) and any(has_rules(v) for v in schema)


def failures(schema: dict[str, Any], value: Any, old: Any) -> list[Failure]:
    """Every rule of `schema` (an openAPIV3Schema) that refuses the object `value`; `old` is the
    stored object on an update, else None."""
    return list(_walk(schema, _rooted(value), _rooted(old) if old is not None else None, "", True))


def _rooted(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as a root rule sees it: of its metadata, only the name and generateName."""
    metadata = obj.get("metadata") or {}
    return {**obj, "metadata": {k: metadata[k] for k in ("name", "generateName") if k in metadata}}


def _walk(schema: dict[str, Any], value: Any, old: Any, path: str, root: bool = False) -> Iterator[Failure]:
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations") or ():
        failure = _check(rule, schema, value, old, path, root)
        if failure is not None:
            yield failure
    for branch in schema.get("allOf") or ():
        yield from _walk(branch, value, old, path)
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                before = old.get(key) if isinstance(old, dict) else None
                yield from _walk(sub, item, before, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") or ()
        correlated = schema.get("x-kubernetes-list-type") == "map" and keys and isinstance(old, list)
        by_key = {tuple(i.get(k) for k in keys): i for i in old if isinstance(i, dict)} if correlated else {}
        for index, item in enumerate(value):
            before = by_key.get(tuple(item.get(k) for k in keys)) if correlated and isinstance(item, dict) else None
            yield from _walk(schema["items"], item, before, f"{path}[{index}]")


_REASONS = ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")


def _check(rule: dict[str, Any], schema: dict[str, Any], value: Any, old: Any, path: str, root: bool) -> Failure | None:
    expression = str(rule.get("rule") or "")
    if not expression:
        return None
    transition = "oldSelf" in expression
    if transition and old is None:
        return None  # evaluated only against a value the update replaces
    kind = "object" if root else str(schema.get("type") or "object")
    where = path if path else "<nil>"
    activation = {"self": celpy.json_to_cel(value)}
    if transition:
        activation["oldSelf"] = celpy.json_to_cel(old)
    try:
        result = _program(expression).evaluate(activation)
    except Exception as error:  # celpy raises what Go's CEL returns as an error value
        result = error
    if isinstance(result, (Exception, celpy.CELEvalError)):
        said = f'Invalid value: "{kind}": {result} evaluating rule: {expression}'
        return Failure("FieldValueInvalid", where, said, expression)
    if result is True or (isinstance(result, celtypes.BoolType) and bool(result)):
        return None
    message = _message(rule, activation) or rule.get("message") or f"failed rule: {expression}"
    field_path = str(rule.get("fieldPath") or "").lstrip(".")
    if field_path:
        where = f"{path}.{field_path}" if path else field_path
    reason = str(rule.get("reason") or "FieldValueInvalid")
    # As field.Forbidden, field.Required, field.Duplicate and field.Invalid word them (fieldErrorForReason).
    said = {
        "FieldValueForbidden": f"Forbidden: {message}",
        "FieldValueRequired": f"Required value: {message}",
        "FieldValueDuplicate": f'Duplicate value: "{kind}"',
    }.get(reason, f'Invalid value: "{kind}": {message}')
    return Failure(reason if reason in _REASONS else "FieldValueInvalid", where, said, expression)


def _message(rule: dict[str, Any], activation: dict[str, Any]) -> str | None:
    """`messageExpression`'s text; None where there is none or it fails (then `message` is said)."""
    expression = rule.get("messageExpression")
    if not expression:
        return None
    try:
        said = _program(str(expression)).evaluate(activation)
    except Exception:
        return None
    return str(said) if isinstance(said, str) and said.strip() else None
