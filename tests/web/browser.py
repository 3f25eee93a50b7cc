"""Debian's chromium for the browser tests: found, or installed with apt-get when root.

Playwright drives it through `executable_path`; no browser is ever downloaded. Under CI=true a
missing browser fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

CANDIDATES = ("chromium", "chromium-browser")
# Chromium's own background traffic is refused by a closed network; keep it quiet and local.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def find() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure() -> str | None:
    """The browser's path, installing Debian's chromium when missing and running as root."""
    path = find()
    if path or os.geteuid() != 0 or not shutil.which("apt-get"):
        return path
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=False, env=env)
    return find()


if __name__ == "__main__":
    found = ensure()
    print(found or "chromium: not found (install Debian's chromium package)")
    sys.exit(0 if found else 1)
