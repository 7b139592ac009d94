"""Values of another shape than a field holds, put in place of one value drawn at random: what
the value-of-any-shape tests store, as a script, an old Calico or a hand edit may leave them."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from typing import Any

# Values of every JSON type, and strings of the kinds the job parses (addresses, networks, times,
# numbers), none of them what the field holds.
ODD_VALUES: tuple[Any, ...] = (
    None, True, 0, -1, 2**70, 1.5, "", "x", "10.0.0.0/33", "::", "fd00::1%eth0", "2026-13-01T00:00:00Z", "1e3",
    "\u0000", [], [None], {}, {"x": 1},
    # Digits and forms Python's int() and float() read where Go and ipaddress do not, and sizes at the edges.
    "10.0.0.1/\u00b2", "\u0663", "1_0", " 10.0.0.1", -(2**63), 1e300, "x" * 300,
)  # fmt: skip

Path = list[str | int]


def leaves(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """The path of every value under `value`, containers included."""
    if path:
        yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))


def replace_one(value: Any, rng: random.Random) -> tuple[Path, Any] | None:
    """Replace one value under `value`, its path drawn first, then one of ODD_VALUES: the path and
    the value put there, for the test's message; None where `value` holds nothing (no draw). A
    copy is put there: a later replacement inside it must change neither ODD_VALUES nor another
    place it was put (it once made a document that refers to itself)."""
    paths = list(leaves(value))
    if not paths:
        return None
    *parents, last = rng.choice(paths)
    holder = value
    for step in parents:
        holder = holder[step]
    holder[last] = odd = copy.deepcopy(rng.choice(ODD_VALUES))
    return [*parents, last], odd
