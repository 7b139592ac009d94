"""The report file (--report-file): written atomically, so that a reader sees the previous report
or this one, never half of one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from job.core.report import Befores, write


def write_file(report: Mapping[str, Any], path: Path, befores: Befores | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as file:
        write(report, file, befores)
    os.replace(temporary, path)
