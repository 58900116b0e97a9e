"""System tools the deployment tests run (Debian packages .ci/run installs): absent locally they skip the test
with the package to install; absent in CI (`CI` set) the test fails, so a skip is never counted as a pass there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def needs(binary: str, package: str):
    return pytest.mark.skipif(
        shutil.which(binary) is None and not os.environ.get("CI"),
        reason=f"needs {binary} (Debian package {package}; .ci/run installs it, and in CI its absence fails)",
    )
