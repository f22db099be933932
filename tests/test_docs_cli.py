"""docs/cli.md's worked example, run as the page gives it (its code block, through bash),
checked against what the page says it prints and writes."""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from helpers import BASH, shell_environment

CLI_MD = pathlib.Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _nibabel_example() -> tuple[str, str]:
    """The example's prose (whitespace collapsed) and its code block, from docs/cli.md."""
    text = CLI_MD.read_text(encoding="utf-8")
    start = text.index("**An example with data you have.**")
    section = text[start:text.index("\n## ", start)]
    block = re.search(r"\n```bash\n(.*?)\n```\n", section, re.S)
    assert block, "docs/cli.md: the nibabel example has no code block"
    return " ".join(section.split()), block.group(1)


def _stated(pattern: str, prose: str) -> tuple[str, ...]:
    match = re.search(pattern, prose)
    assert match, f"docs/cli.md's nibabel example no longer states {pattern!r}"
    return match.groups()


def test_cli_md_nibabel_example_prints_and_writes_what_the_page_says(tmp_path):
    nib = pytest.importorskip("nibabel")
    from nibabel.affines import from_matvec
    from nibabel.eulerangles import euler2mat

    bash = BASH
    if bash is None:
        pytest.skip("the example is a POSIX shell block")
    data = pathlib.Path(nib.__file__).parent / "tests" / "data"
    if not (data / "anatomical.nii").exists():
        pytest.skip("nibabel's test data are not installed")
    prose, block = _nibabel_example()
    run = subprocess.run([bash, "-e", "-c", block], cwd=tmp_path,
                         env=shell_environment(tmp_path / "bin"), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # no warning, no progress bar (stderr is no terminal)

    # the inputs as the page describes them
    described = re.findall(r"`(\w+\.nii)` \((\d+x\d+x\d+) voxels of (\d+) mm", prose)
    assert len(described) == 2
    for name, shape, voxel in described:
        image = nib.load(data / name)
        assert "x".join(map(str, image.shape[:3])) == shape, name
        assert np.allclose(image.header.get_zooms()[:3], float(voxel)), name

    (printed,) = _stated(r"prints `(similarity \(ncc\): [\d.]+ -> [\d.]+)`", prose)
    assert run.stdout.strip().splitlines()[-1] == printed

    # affine.txt against the known affine, as nibabel's make_moved_anat.py builds it
    *angles, x, y, z = (float(v) for v in _stated(
        r"rotations of ([\d.]+), ([\d.]+) and ([\d.]+) rad and a shift of "
        r"\(([-\d.]+), ([-\d.]+), ([-\d.]+)\) mm", prose))
    known = from_matvec(euler2mat(*angles), [x, y, z])
    (affine_txt,) = _stated(r"`(\S+/affine\.txt)`", prose)
    (bound,) = (float(v) for v in _stated(r"within ([\d.]+) mm at the corners", prose))
    found = np.loadtxt(tmp_path / affine_txt)
    fixed = nib.load(data / "anatomical.nii")
    D, H, W = fixed.shape[:3]
    corners = np.array([(i, j, k, 1) for i in (0, D - 1) for j in (0, H - 1)
                        for k in (0, W - 1)]) @ fixed.affine.T

    def corner_error(transform):
        return np.linalg.norm((corners @ transform.T - corners @ known.T)[:, :3], axis=1).max()

    assert corner_error(np.eye(4)) > 4 * bound  # the headers alone are far off
    assert corner_error(found) < bound
