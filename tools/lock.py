"""`make lock`: pin requirements.txt's whole dependency closure, with hashes, for the image.

pip resolves requirements.txt against PyPI alone (`--isolated`: no local mirror or config) as
each image platform sees it (CPython 3.11 on linux x86_64 and on linux arm64), and reports the
exact file of each package with its sha256. A package with one wheel per platform gets both
hashes, so `pip install --require-hashes` accepts either; the two resolutions must pin the same
versions. requirements.txt stays the readable list of direct pins.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = """\
# The image's whole dependency set, with hashes: `make lock` writes it from requirements.txt
# (PyPI only, for CPython 3.11 on linux x86_64 and arm64, the image's platforms). Do not edit by hand.
"""
PLATFORMS = ("manylinux2014_x86_64", "manylinux2014_aarch64")


def resolve(platform: str, work: Path) -> dict[str, tuple[str, str]]:
    """name -> (version, sha256) of every package pip picks for `platform`."""
    report = work / f"{platform}.json"
    pip = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check"]
    target = ["--only-binary=:all:", f"--platform={platform}", "--python-version=3.11", "--implementation=cp"]
    resolve = ["install", "--dry-run", "--ignore-installed", "--quiet", *target]
    output = ["--target", str(work / "target"), "--report", str(report)]
    trust = ["--cert", "/etc/ssl/certs/ca-certificates.crt"]
    subprocess.run([*pip, *resolve, *output, *trust, "-r", str(ROOT / "requirements.txt")], check=True)
    picked = json.loads(report.read_text())["install"]
    return {
        item["metadata"]["name"]: (
            item["metadata"]["version"],
            item["download_info"]["archive_info"]["hashes"]["sha256"],
        )
        for item in picked
    }


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        resolved = [resolve(platform, Path(work)) for platform in PLATFORMS]
    names = sorted(set().union(*resolved), key=str.lower)
    lines = [HEADER]
    for name in names:
        versions = {found[name][0] for found in resolved if name in found}
        if len(versions) != 1 or not all(name in found for found in resolved):
            print(f"{name}: the platforms resolve to different sets ({sorted(versions)})", file=sys.stderr)
            return 1
        hashes = sorted({found[name][1] for found in resolved})
        pins = " \\\n".join(f"    --hash=sha256:{digest}" for digest in hashes)
        lines.append(f"{name}=={versions.pop()} \\\n{pins}\n")
    (ROOT / "requirements.lock").write_text("".join(lines))
    print(f"requirements.lock: {len(names)} packages for {', '.join(PLATFORMS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
