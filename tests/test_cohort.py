"""``volsample register-cohort`` (``volsample.apps.cohort``): every subject registered into
its folder, the table, a failed subject recorded while the others go on, reruns that skip
what is done, and a 2-worker LocalCluster giving the one-process run's bits."""
from __future__ import annotations

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from volsample import registration
from volsample.apps import cohort
from volsample.cli import main

SHAPE = (24, 24, 24)
# small and quick: the same settings for every run compared
SETTINGS = dict(levels=2, iterations=[12, 6], affine_iterations=[6, 0])
FLAGS = ["--levels", "2", "--iterations", "12", "6", "--affine-iterations", "6", "0"]
OUTPUTS = ("warped.npy", "displacement.npy", "warped_labels.npy", "affine.txt")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A template with labels, three subjects (deformed phantoms) with theirs, and a corrupt
    subject whose file is not a volume."""
    folder = tmp_path_factory.mktemp("inputs")
    template = registration.synthetic_pair(SHAPE, seed=0)
    np.save(folder / "template.npy", template.moving)
    np.save(folder / "template_labels.npy", template.moving_labels)
    moving, labels = [], []
    for seed in (1, 2, 3):
        pair = registration.synthetic_pair(SHAPE, seed=seed)
        np.save(folder / f"sub{seed}.npy", pair.fixed)
        np.save(folder / f"sub{seed}_labels.npy", pair.fixed_labels)
        moving.append(str(folder / f"sub{seed}.npy"))
        labels.append(str(folder / f"sub{seed}_labels.npy"))
    (folder / "corrupt.npy").write_bytes(b"\x93NUMPY not really an array")
    np.save(folder / "corrupt_labels.npy", template.moving_labels)
    moving.insert(1, str(folder / "corrupt.npy"))
    labels.insert(1, str(folder / "corrupt_labels.npy"))
    return dict(template=str(folder / "template.npy"),
                template_labels=str(folder / "template_labels.npy"), moving=moving,
                labels=labels)


def _cohort(inputs, out, **options):
    return cohort.register_cohort(inputs["template"], inputs["moving"], out,
                                  labels=inputs["labels"],
                                  template_labels=inputs["template_labels"],
                                  **SETTINGS, **options)


def _table(out):
    with open(os.path.join(out, cohort.TABLE), newline="") as file:
        return list(csv.DictReader(file))


_RUN_COLUMNS = ("seconds", "peak_memory_mb")  # of the run, not of its result


def _results(rows):
    return [{k: v for k, v in row.items() if k not in _RUN_COLUMNS} for row in rows]


@pytest.fixture(scope="module")
def one_process(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    return out, _cohort(inputs, out, threads=2)


def test_every_subject_is_registered_and_the_corrupt_one_recorded(inputs, one_process):
    out, rows = one_process
    assert [row["subject"] for row in rows] == ["sub1", "corrupt", "sub2", "sub3"]
    assert [row["status"] for row in rows] == ["done", "failed", "done", "done"]
    failed = rows[1]
    assert "cannot read" in failed["error"] and "corrupt.npy" in failed["error"]
    for row in rows[:1] + rows[2:]:
        assert row["error"] == ""
        assert row["dice_after"] > row["dice_before"]
        assert row["similarity_after"] > row["similarity_before"]  # NCC: higher is better
        assert row["folded"] == 0 and row["jacobian_min"] > 0
        assert row["seconds"] > 0 and row["peak_memory_mb"] > 0
        for name in OUTPUTS + ("report.json", cohort.ROW_FILE):
            assert (out / row["subject"] / name).is_file(), name
    table = _table(out)
    assert list(table[0]) == list(cohort.COLUMNS)
    assert [row["status"] for row in table] == [row["status"] for row in rows]
    assert float(table[0]["dice_after"]) == rows[0]["dice_after"]  # written to the last bit


def test_a_rerun_skips_what_is_done_and_retries_what_failed(inputs, one_process, tmp_path,
                                                           monkeypatch):
    out, rows = one_process
    ran = []
    register_subject = cohort.register_subject

    def counting(subject, *args):
        ran.append(subject.name)
        return register_subject(subject, *args)

    monkeypatch.setattr(cohort, "register_subject", counting)
    again = _cohort(inputs, out)
    assert ran == ["corrupt"]
    assert again[0] == rows[0] and again[2:] == rows[2:]  # their rows, seconds and all


def test_a_local_cluster_gives_the_one_process_bits(inputs, one_process, tmp_path):
    pytest.importorskip("distributed")
    out, rows = one_process
    on_cluster = _cohort(inputs, tmp_path, local_workers=2)
    assert _results(on_cluster) == _results(rows)
    for row in rows:
        if row["status"] == "done":
            for name in OUTPUTS:
                assert (tmp_path / row["subject"] / name).read_bytes() \
                    == (out / row["subject"] / name).read_bytes(), (row["subject"], name)


def test_command_line_exit_codes_and_summary(inputs, tmp_path, capsys):
    good = [m for m in inputs["moving"] if "corrupt" not in m][:1]
    code = main(["register-cohort", inputs["template"], *good, "--out", str(tmp_path / "a"),
                 "--no-progress", *FLAGS])
    assert code == 0
    assert "1 subject: 1 done, 0 failed" in capsys.readouterr().out
    code = main(["register-cohort", inputs["template"], inputs["moving"][1], "--out",
                 str(tmp_path / "b"), "--no-progress", *FLAGS])
    captured = capsys.readouterr()
    assert code == 1
    assert "1 subject: 0 done, 1 failed" in captured.out
    assert "failed: corrupt: MOVING: cannot read" in captured.err


@pytest.mark.parametrize("argv,message", [
    (["missing.npy", "{m}"], "TEMPLATE: no such file"),
    (["{t}", "{m}", "--labels", "{m}"], "expected both or neither"),
    (["{t}", "{m}", "{m}"], "two files make the subject"),
    (["{t}", "{m}", "--template-labels", "{t}", "--labels", "{m}", "{m}"],
     "expected one per MOVING"),
    (["{t}", "{m}", "--local-workers", "0"], "--local-workers: expected at least 1"),
])
def test_bad_input_is_one_line_before_any_work(inputs, tmp_path, capsys, argv, message):
    fill = dict(t=inputs["template"], m=inputs["moving"][0])
    code = main(["register-cohort", *(a.format(**fill) for a in argv), "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "sub1").exists()


def test_unknown_python_option_is_refused(inputs, tmp_path):
    with pytest.raises(TypeError, match="unknown option 'iteration'"):
        cohort.register_cohort(inputs["template"], inputs["moving"][:1], tmp_path, iteration=3)


def test_importing_volsample_imports_no_dask():
    code = ("import sys, volsample, volsample.registration; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert run.stdout.strip() == "[]"
