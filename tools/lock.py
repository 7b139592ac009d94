"""`make lock`: pin requirements.txt's whole dependency closure, with hashes, for the image.

pip resolves requirements.txt against PyPI alone (`--isolated`: no local mirror or config) as
the image's platform sees it, linux x86_64 CPython 3.11, and reports the exact file of each
package with its sha256. requirements.txt stays the readable list of direct pins.
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
# (PyPI only, for linux x86_64 CPython 3.11, the image's platform). Do not edit by hand.
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.json"
        pip = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check"]
        platform = ["--only-binary=:all:", "--platform=manylinux2014_x86_64", "--python-version=3.11"]
        resolve = ["install", "--dry-run", "--ignore-installed", "--quiet", "--implementation=cp", *platform]
        output = ["--target", str(Path(work) / "target"), "--report", str(report)]
        trust = ["--cert", "/etc/ssl/certs/ca-certificates.crt"]
        subprocess.run([*pip, *resolve, *output, *trust, "-r", str(ROOT / "requirements.txt")], check=True)
        resolved = json.loads(report.read_text())["install"]
    lines = [HEADER]
    for item in sorted(resolved, key=lambda i: i["metadata"]["name"].lower()):
        digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
        lines.append(f"{item['metadata']['name']}=={item['metadata']['version']} \\\n    --hash=sha256:{digest}\n")
    (ROOT / "requirements.lock").write_text("".join(lines))
    print(f"requirements.lock: {len(resolved)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
