"""Every code block of README.md and docs/*.md runs as written, as a reader runs it: a
page's blocks in order, in one folder, each Python block in a fresh interpreter and each
shell block through bash, with nothing on stderr (no warning, no leak report at exit).
Where a block states its output (``print(...)  # prints <text>``) or the page states
what a block's result is, that is checked too. Oracles: the pages themselves, verbatim,
and what they say."""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from helpers import BASH, shell_environment

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```$", re.S | re.M)
RUN = {"python", "bash"}
SHOWN = {"text", "mermaid"}  # synopses, formulas, diagrams (mermaid: a chart GitHub draws): read, not run

# Shell lines this test leaves to CI: `.ci/run` installs the package from a fresh clone and
# runs README's test command itself.
CI_RUNS = ("pip install", "python -m pytest")
# Blocks another test runs as written and checks against everything its page states.
RUN_ELSEWHERE = {("docs/cli.md", "DATA="): "tests/test_docs_cli.py"}
SHELL_WORDS = {"cd", "export", "python", "volsample"}  # builtins, and the shims of PATH


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int
    lang: str
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks(path: pathlib.Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [Block(str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m.group(1),
                  m.group(2)) for m in FENCE.finditer(text)]


BLOCKS = [block for page in PAGES for block in _blocks(page)]
RUNNABLE = [b for b in BLOCKS if b.lang in RUN and not any(
    b.page == page and b.code.startswith(start) for page, start in RUN_ELSEWHERE)]


def _commands(block: Block) -> list[str]:
    """A shell block's commands (continued lines joined), less those CI runs."""
    joined = block.code.replace("\\\n", " ")
    lines = [line.split("  #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith(CI_RUNS)]


def _programs(block: Block) -> set[str]:
    if block.lang != "bash":
        return set()
    words = (shlex.split(command)[0] for command in _commands(block))
    return {w for w in words if "=" not in w and w not in SHELL_WORDS}


def _missing(block: Block) -> list[str]:
    return sorted(p for p in _programs(block) if shutil.which(p) is None)


# What the reader has before a page's first block: docs/cli.md registers "fixed.nii.gz"
# and "moving.nii.gz", and a cohort of "images/sub-*.nii.gz" to "template.nii.gz" with
# label maps (here nibabel's example pair of one head, 2 mm and 4 mm voxels, and their
# bright voxels as labels).
def _cli_md_inputs(folder: pathlib.Path) -> None:
    nib = pytest.importorskip("nibabel")
    import numpy as np

    data = pathlib.Path(nib.__file__).parent / "tests" / "data"
    fixed, moving = (nib.load(data / name) for name in ("anatomical.nii",
                                                        "reoriented_anat_moved.nii"))
    (folder / "images").mkdir()
    (folder / "labels").mkdir()
    for image, paths in ((fixed, ["fixed", "template"]),
                         (moving, ["moving", "images/sub-01", "images/sub-02"])):
        values = np.asarray(image.dataobj)
        labels = nib.Nifti1Image((values > np.median(values)).astype(np.uint8), image.affine)
        for path in paths:
            nib.save(image, folder / f"{path}.nii.gz")
            nib.save(labels, folder / (f"{path}_labels.nii.gz" if "/" not in path
                                       else f"labels/{path.split('/')[1]}.nii.gz"))


SETUP = {"docs/cli.md": _cli_md_inputs}

# What a page says of a block's result, appended to the block and run with it.
CHECKS = {
    # "Resampled linearly this way, MOVING is volsample's own `warped` (linear --interp) to
    # float32 round-off inside MOVING's field of view"
    ("docs/cli.md", "import SimpleITK as sitk"): """
import nibabel as nib, numpy as np
ours = np.asarray(nib.load("result/warped.nii.gz").dataobj, np.float64)
theirs = sitk.GetArrayViewFromImage(warped).T
ones = sitk.Resample(moving * 0 + 1, fixed, sitk.CompositeTransform([affine, field]),
                     sitk.sitkLinear, 0.0)
inside = sitk.GetArrayViewFromImage(ones).T > 1 - 1e-6
assert inside.mean() > 0.3, inside.mean()
worst = np.abs(ours - theirs)[inside].max()
assert worst <= 1e-5 * np.ptp(ours[inside]), worst
""",
}


def _prints(code: str) -> list[str]:
    return re.findall(r"^print\(.*\)  # prints (.*)$", code, re.M)


def _run(block: Block, folder: pathlib.Path, env: dict[str, str]) -> None:
    if block.lang == "python":
        check = next((c for (page, start), c in CHECKS.items()
                      if block.page == page and block.code.startswith(start)), "")
        argv = [sys.executable, "-c", block.code + check]
    elif not _commands(block):  # only what CI runs itself
        return
    else:
        argv = [BASH, "-e", "-c", "\n".join(_commands(block))]
    run = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, f"{block}:\n{run.stderr}"
    assert run.stderr == "", f"{block}:\n{run.stderr}"
    for stated in _prints(block.code):
        assert stated in run.stdout.splitlines(), f"{block}: printed {run.stdout!r}"


def test_every_block_says_whether_it_runs():
    unlabelled = [str(b) for b in BLOCKS
                  if b.lang not in RUN | SHOWN and not b.lang.startswith("{")]
    assert not unlabelled, f"label these blocks python, bash or text: {unlabelled}"
    assert len(RUNNABLE) >= 8


def test_stated_outputs_and_checks_name_blocks_that_exist():
    assert any(_prints(b.code) for b in RUNNABLE)
    for page, start in [*CHECKS, *RUN_ELSEWHERE]:
        assert any(b.page == page and b.code.startswith(start) for b in BLOCKS), (page, start)


@pytest.mark.parametrize("page", sorted({b.page for b in RUNNABLE}))
def test_page_runs_as_written(page, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("dask")
    if BASH is None and any(b.page == page and b.lang == "bash" for b in RUNNABLE):
        pytest.skip("no POSIX shell (bash) to run the page's commands")
    SETUP.get(page, lambda folder: None)(tmp_path)
    env = shell_environment(tmp_path / ".bin")
    for block in RUNNABLE:
        if block.page == page and not _missing(block):
            _run(block, tmp_path, env)


@pytest.mark.parametrize("block", [b for b in RUNNABLE if _programs(b)], ids=str)
def test_documented_programs_are_installed(block):
    missing = _missing(block)
    if missing:  # test_page_runs_as_written ran the page's other blocks
        pytest.skip(f"{block} not run: {', '.join(missing)} not installed")
