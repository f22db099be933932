"""How volsample is installed and built: the extras' version ranges (pyproject.toml) and the
development build's message when nanobind is missing (CMakeLists.txt). Both read the
source tree, and skip where the tests run without it."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _extras():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    if not (ROOT / "pyproject.toml").exists():
        pytest.skip("no source tree")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _requirement(extras, extra, package):
    (spec,) = [r for r in extras[extra] if re.match(rf"{package}\b", r)]
    return spec


@pytest.mark.parametrize(("extra", "package"),
                         [("torch", "torch"), ("gpu", "torch"), ("gpu", "triton")])
def test_user_extras_take_a_range_from_the_tested_version(extra, package):
    # The user extras never pin (a pin would replace the torch a user has): their lowest
    # version is the one the test extra pins, so CI runs the tests on it.
    extras = _extras()
    user = _requirement(extras, extra, package)
    tested = _requirement(extras, "test", package)
    lowest = re.match(rf"{package}>=([\d.]+)", user)
    pinned = re.match(rf"{package}==([\d.]+)", tested)
    assert lowest and pinned, (user, tested)
    assert "<" not in user.split(";")[0] and "==" not in user.split(";")[0]
    assert pinned.group(1).split(".")[:len(lowest.group(1).split("."))] == \
        lowest.group(1).split(".")
    assert user.partition(";")[2].strip() == tested.partition(";")[2].strip()  # same markers


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for Python")
def test_cmake_says_to_install_nanobind_when_it_is_missing(tmp_path):
    if not (ROOT / "CMakeLists.txt").exists() or shutil.which("cmake") is None:
        pytest.skip("no source tree or no cmake")
    # This Python without its site-packages: nanobind is not importable by it.
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    result = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"),
                             f"-DPython_EXECUTABLE={python}"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert "nanobind is not installed for" in message and "pip install nanobind" in message


def test_dev_extra_installs_what_every_other_extra_does():
    # README's one install for developers: dev holds every extra's packages (by name), but
    # register-bench's (antspyx pins an older NumPy and SciPy: installed apart).
    extras = _extras()
    (dev,) = extras["dev"]
    included = re.fullmatch(r"volsample\[([\w,-]+)\]", dev.replace(" ", ""))
    assert included, dev
    included = included.group(1).split(",")

    def name(requirement):
        return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()

    developer = {name(r) for extra in included for r in extras[extra]}
    for extra, requirements in extras.items():
        if extra in ("dev", "register-bench"):
            continue
        missing = {name(r) for r in requirements} - developer
        assert not missing, f"the dev extra lacks {extra}'s {sorted(missing)}"
