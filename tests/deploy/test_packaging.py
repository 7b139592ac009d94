"""`pip install .` gives a `calico-gc` command, and every version source says the same."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from job import __version__
from tests.deploy.test_manifests import render

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_has_the_command_the_schema_and_the_one_version(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: a build leaves build/ and *.egg-info/ beside the sources
    shutil.copytree(ROOT / "job", source / "job", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    subprocess.run([*build, str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("calico_gc-*.whl")
    assert wheel.name.startswith(f"calico_gc-{__version__}-")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        shipped = {"job/report.schema.json", "job/restore.schema.json", "job/cli.py"}
        shipped |= {"job/adapters/datastores/etcd_http.py"}
        assert shipped <= names
        (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
        assert "calico-gc = job.cli:console" in archive.read(entry_points).decode()
        (metadata,) = [n for n in names if n.endswith("METADATA")]
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    pinned = [line.split("==")[0] for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line]
    assert sorted(r.split(": ")[1].split("==")[0] for r in requires) == sorted(pinned)


@pytest.mark.parametrize(
    ("overlay", "image"),
    [("cronjob", "calico-gc"), ("job", "calico-gc"), ("examples/apply", "registry.example.com/calico-gc")],
)
def test_the_manifests_deploy_the_image_of_this_version(overlay: str, image: str) -> None:
    workload = next(d for d in render(overlay) if d["kind"] in ("CronJob", "Job"))
    spec = workload["spec"]["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else workload["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == f"{image}:{__version__}"


def test_make_image_builds_the_tag_the_manifests_deploy() -> None:
    dry = subprocess.run(["make", "-n", "image"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"-t calico-gc:{__version__} ." in dry


def test_the_image_lock_pins_the_whole_closure_of_requirements_txt() -> None:
    """Every direct pin is in requirements.lock at the same version, every entry has a hash, and
    the image installs only from the lock (test_image.py builds it, which checks the hashes)."""
    lock: dict[str, str] = {}
    entries = (ROOT / "requirements.lock").read_text().replace("\\\n", " ").splitlines()
    for line in (e for e in entries if e and not e.startswith("#")):
        pin, _, hashes = line.partition(" ")
        name, _, version = pin.partition("==")
        assert hashes.strip().startswith("--hash=sha256:") and version, line
        lock[name.lower().replace("_", "-")] = version
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if "==" in line:
            name, _, version = line.partition("==")
            assert lock.get(name.lower().replace("_", "-")) == version.strip(), f"{name} differs in requirements.lock"
    assert "--require-hashes --no-deps -r requirements.lock" in (ROOT / "Dockerfile").read_text()
