"""Build the container image and run it the way the CronJob runs it, with buildah and podman.

No Docker daemon runs here and no registry is reached, so the base image `python:3.11-slim`
can be replaced by a stand-in made from Debian packages (mmdebstrap), imported under the name
the `FROM` line resolves to and labelled as a stand-in. A real build uses the real base.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from job import __version__

ROOT = Path(__file__).resolve().parents[2]
BASE = "docker.io/library/python:3.11-slim"
IMAGE = f"localhost/calico-gc:{__version__}"
STAND_IN = "STAND-IN for python:3.11-slim built from Debian bookworm packages, for tests only"
TOOLS = ("buildah", "podman", "runc", "mmdebstrap")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# crun refuses these hosts' hybrid cgroups; the default ulimits cannot be set here.
RUN = ("podman", "--runtime", "runc", "run", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def _run(*argv: str, timeout: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def ensure_base() -> str:
    """The base image: the real one if present, else the stand-in, made once."""
    if subprocess.run(["podman", "image", "exists", BASE]).returncode == 0:
        return BASE
    with tempfile.TemporaryDirectory() as work:
        tar = Path(work) / "base.tar"
        _run(
            "mmdebstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,python-is-python3,ca-certificates,netbase,tzdata,passwd",
            "bookworm",
            str(tar),
        )
        _run("podman", "import", "--change", f'LABEL org.opencontainers.image.description="{STAND_IN}"', str(tar), BASE)
    return BASE


def build() -> str:
    """`buildah bud` of the repository's Dockerfile, trusting the host's CA bundle for the build
    only (mounted read-only over the image's own)."""
    ensure_base()
    _run(
        "buildah",
        "bud",
        "--isolation",
        "chroot",
        "--runtime",
        "runc",
        "--volume",
        f"{HOST_CA}:/etc/ssl/certs/ca-certificates.crt:ro",
        "--tag",
        IMAGE,
        str(ROOT),
    )
    _run("podman", "image", "prune", "--force")  # the previous build's image, now untagged (~300 MB)
    return IMAGE


def image_size() -> int:
    return int(json.loads(_run("podman", "image", "inspect", IMAGE))[0]["Size"])


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str


def cronjob_argv(
    args: Sequence[str], env: dict[str, str], mounts: Sequence[tuple[Path, str]] = (), name: str | None = None
) -> list[str]:
    """podman's command line to run the image as the CronJob's pod: user 10001, read-only root,
    all capabilities dropped, no-new-privileges, /tmp a tmpfs; host networking (the manifests'
    choice) reaches loopback."""
    argv = [
        *RUN,
        "--rm",
        "--network",
        "host",
        "--user",
        "10001:10001",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--tmpfs",
        "/tmp:rw,size=64m",
    ]
    if name:
        argv += ["--name", name]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    for source, target in mounts:
        argv += ["--volume", f"{source}:{target}:ro"]
    return [*argv, IMAGE, *args]


def run_as_cronjob(
    args: Sequence[str],
    env: dict[str, str],
    mounts: Sequence[tuple[Path, str]] = (),
    name: str | None = None,
    timeout: float = 300,
) -> Ran:
    """The image run to its end as the CronJob runs it (cronjob_argv)."""
    done = subprocess.run(cronjob_argv(args, env, mounts, name), capture_output=True, text=True, timeout=timeout)
    return Ran(done.returncode, done.stdout, done.stderr)
