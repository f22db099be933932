"""README's Python code blocks run as written, each in a fresh interpreter, and print
nothing on stderr (no warning, no leak report at exit). Oracle: the blocks themselves,
verbatim from README.md, and a clean exit."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("dask")

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("code", BLOCKS, ids=lambda code: code.splitlines()[0][:40])
def test_readme_block_runs_as_written(code, tmp_path):
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr == "", run.stderr
