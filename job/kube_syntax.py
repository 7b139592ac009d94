"""What the API server takes as an object's name, and as a list's label selector (`k8s-app=calico-node`,
`tier in (a,b)`, `!legacy`), read as it reads them (apimachinery's validation and labels.Parse;
docs/kubernetes-wire.md).

The job sends names and a selector of the operator's own (--namespace, --calico-node-namespaces,
--state-configmap, --lock-name, --report-configmaps, --calico-node-selector): one the server
would refuse is refused when the job starts, with the server's reason, rather than found out as a
write refused or a health check skipped at every run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The operators a requirement may have after its key, in the server's words for an error.
BINARY_OPERATORS = ("in", "notin", "=", "==", "!=", "gt", "lt")
_SYMBOLS = {">": "gt", "<": "lt"}
_SPECIAL = frozenset("=!(),<>")
_SPACE = " \t\r\n"
_KEYWORDS = ("in", "notin")
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAME_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)


class SelectorError(ValueError):
    """A selector the API server refuses, in its words."""


@dataclass(frozen=True)
class Requirement:
    """One term of a selector. `operator`: `exists`, `!` (does not exist), or a BINARY_OPERATORS."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of `text`, all of which a label set must meet; SelectorError as the server
    words it (`unable to parse requirement: ...`). The empty selector selects everything."""
    return _Parser(text).selector()


def _tokens(text: str) -> list[tuple[str, str]]:
    """(kind, literal) pairs: a kind is the symbol itself, `id` for a word, `end` last. A word is
    anything up to a symbol or a space; of the symbols only `!=` and `==` are two characters."""
    found: list[tuple[str, str]] = []
    at = 0
    while True:
        while at < len(text) and text[at] in _SPACE:
            at += 1
        if at == len(text):
            return [*found, ("end", "")]
        if text[at] in _SPECIAL:
            symbol = text[at : at + 2] if text[at : at + 2] in ("!=", "==") else text[at]
            found.append((symbol, symbol))
            at += len(symbol)
            continue
        start = at
        while at < len(text) and text[at] not in _SPECIAL and text[at] not in _SPACE:
            at += 1
        word = text[start:at]
        found.append((word if word in _KEYWORDS else "id", word))


class _Parser:
    """Recursive descent over the tokens, as labels.Parse reads them: where a value may stand, the
    words `in` and `notin` are values."""

    def __init__(self, text: str) -> None:
        self._tokens = _tokens(text)
        self._at = 0

    def _look(self, values: bool = True) -> tuple[str, str]:
        kind, literal = self._tokens[self._at]
        return ("id" if values and kind in _KEYWORDS else kind), literal

    def _take(self, values: bool = True) -> tuple[str, str]:
        token = self._look(values)
        self._at += 1
        return token

    def selector(self) -> tuple[Requirement, ...]:
        requirements: list[Requirement] = []
        while True:
            kind, literal = self._look()
            if kind == "end":
                return tuple(requirements)
            if kind not in ("id", "!"):
                raise SelectorError(f"found '{literal}', expected: !, identifier, or 'end of string'")
            try:
                requirements.append(self._requirement())
            except SelectorError as error:
                raise SelectorError(f"unable to parse requirement: {error}") from None
            kind, literal = self._take()
            if kind == "end":
                return tuple(requirements)
            if kind != ",":
                raise SelectorError(f"found '{literal}', expected: ',' or 'end of string'")
            kind, literal = self._look()
            if kind not in ("id", "!"):
                raise SelectorError(f"found '{literal}', expected: identifier after ','")

    def _requirement(self) -> Requirement:
        kind, key = self._take()
        absent = kind == "!"
        if absent:
            kind, key = self._take()
        if kind != "id":
            raise SelectorError(f"found '{key}', expected: identifier")
        _check_key(key)
        if absent:  # `!key` takes no operator: what follows must end the requirement
            return Requirement(key, "!")
        if self._look()[0] in ("end", ","):
            return Requirement(key, "exists")
        kind, literal = self._take(values=False)
        operator = _SYMBOLS.get(kind, kind)
        if operator not in BINARY_OPERATORS:
            raise SelectorError(f"found '{literal}', expected: {', '.join(BINARY_OPERATORS)}")
        values = self._set() if operator in _KEYWORDS else self._value()
        for value in sorted(values):
            _check_value(key, value)
        if operator in ("gt", "lt") and not all(whole_number(v) is not None for v in values):
            (value,) = values
            raise SelectorError(
                f"values[0]: Invalid value: \"{value}\": for 'Gt', 'Lt' operators, the value must be an integer"
            )
        return Requirement(key, operator, values)

    def _value(self) -> frozenset[str]:
        """The one value of `=`, `==`, `!=`, `>` or `<`; none is the empty value."""
        if self._look()[0] in ("end", ","):
            return frozenset({""})
        kind, literal = self._take()
        if kind != "id":
            raise SelectorError(f"found '{literal}', expected: identifier")
        return frozenset({literal})

    def _set(self) -> frozenset[str]:
        """`(a,b)` after `in` or `notin`; an empty place in it (`()`, `(a,)`) is the empty value."""
        kind, literal = self._take()
        if kind != "(":
            raise SelectorError(f"found '{literal}' expected: '('")
        values: set[str] = set()
        kind, literal = self._look()
        if kind == ")":
            self._take()
            return frozenset({""})
        if kind not in ("id", ","):
            raise SelectorError(f"found '{literal}', expected: ',', ')' or identifier")
        while True:
            kind, literal = self._take()
            if kind == "id":
                values.add(literal)
            elif kind == ",":
                if not values or self._look()[0] in (")", ","):
                    values.add("")
            else:
                raise SelectorError(f"found '{literal}', expected: ',', or identifier")
            following = self._look()[0]
            if following == ")":
                self._take()
                return frozenset(values)
            if kind == "id" and following != ",":
                raise SelectorError(f"found '{self._look()[1]}', expected: ',' or ')'")


def is_dns_subdomain(text: str, longest: int = 253) -> bool:
    """A name most kinds take (a ConfigMap's, a Lease's): lowercase RFC 1123 labels joined by dots."""
    return len(text) <= longest and _SUBDOMAIN.fullmatch(text) is not None


def is_dns_label(text: str) -> bool:
    """A namespace's name: one lowercase RFC 1123 label, at most 63 characters."""
    return len(text) <= 63 and _LABEL.fullmatch(text) is not None


def whole_number(text: str) -> int | None:
    """`text` as Go's ParseInt reads it (base 10, 64 bits): a selector's `gt` and `lt`, a query's
    typed parameter. Leading zeros go before int(), which refuses more than 4,300 digits."""
    digits = text.lstrip("+-").lstrip("0")
    if _INTEGER.fullmatch(text) is None or len(digits) > 19:
        return None
    number = -int(digits or "0") if text.startswith("-") else int(digits or "0")
    return number if -(1 << 63) <= number < 1 << 63 else None


def _check_key(key: str) -> None:
    """A label key: a name of at most 63 characters, after an optional DNS subdomain and `/`."""
    problems = qualified_name_problems(key)
    if problems:
        raise SelectorError(f'<nil>: Invalid value: "{key}": {"; ".join(problems)}')


def qualified_name_problems(key: str) -> list[str]:
    """What makes `key` no qualified name (a label key's form), in apimachinery's words."""
    prefix, slash, name = key.rpartition("/")
    problems = []
    if key.count("/") > 1:
        problems.append(
            f"a qualified name {_NAME_RULE} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        )
    else:
        if slash and not prefix:
            problems.append("prefix part must be non-empty")
        elif slash and len(prefix) > 253:
            problems.append("prefix part must be no more than 253 characters")
        elif slash and not is_dns_subdomain(prefix):
            problems.append(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                "'-' or '.', and must start and end with an alphanumeric character"
            )
        if not name:
            problems.append("name part must be non-empty")
        elif len(name) > 63:
            problems.append("name part must be no more than 63 characters")
        elif not _NAME.fullmatch(name):
            problems.append(f"name part {_NAME_RULE}")
    return problems


def _check_value(key: str, value: str) -> None:
    """A label value: empty, or a name of at most 63 characters."""
    if len(value) > 63:
        problem = "must be no more than 63 characters"
    elif value and not _NAME.fullmatch(value):
        problem = f"a valid label must be an empty string or {_NAME_RULE.removeprefix('must ')}"
    else:
        return
    raise SelectorError(f'values[0][{key}]: Invalid value: "{value}": {problem}')
