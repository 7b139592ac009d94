"""The layers hold (docs/design.md, "Layers"): no module of job imports itself back, through any
chain, `if TYPE_CHECKING:` imports included; import-linter's contracts (pyproject.toml, run by
`make lint`) keep the arrows pointing down and the core free of client libraries and I/O."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def test_no_import_cycle_in_job() -> None:
    graph = grimp.build_graph("job")  # counts imports under `if TYPE_CHECKING:` too
    cycles = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )
    assert cycles == []


def test_the_import_contracts_are_kept() -> None:
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and "2 kept, 0 broken" in done.stdout, done.stdout[-2000:]


def test_at_most_twelve_modules_sit_directly_in_job() -> None:
    assert len(list((ROOT / "job").glob("*.py"))) <= 12
