"""One source of figures: README's benchmark table and the gallery's benchmark page are
drawn from the recorded run (benchmarks/results/cpu.json); the gallery's examples run
what exists and hide no error. These read the source tree and skip without it."""
from __future__ import annotations

import importlib.util
import json
import runpy
from pathlib import Path

import pytest

from volsample.apps import bench
from volsample._tables import MODES

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "benchmarks" / "results" / "cpu.json"
if not RECORDED.exists():
    pytest.skip("no source tree", allow_module_level=True)
pytest.importorskip("matplotlib")


def _figures():
    spec = importlib.util.spec_from_file_location("figures", ROOT / "benchmarks" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_the_recorded_run():
    figures = _figures()
    readme = (ROOT / "README.md").read_text()
    assert readme.count(figures.BEGIN) == 1 and readme.count(figures.END) == 1
    assert figures.drawn(readme) == readme, "run: python benchmarks/figures.py"


def test_every_peer_has_a_title_in_the_drawn_table():
    assert set(bench._PEER_TITLES) == set(bench.PEERS)


def test_a_changed_recording_changes_readme(tmp_path):
    # The check can fail: a recorded run with another time draws another table.
    figures = _figures()
    payload = json.loads(RECORDED.read_text())
    payload["results"][0]["median_s"] *= 2
    changed = tmp_path / "cpu.json"
    changed.write_text(json.dumps(payload))
    readme = (ROOT / "README.md").read_text()
    assert figures.drawn(readme, changed) != readme


def test_recorded_run_says_how_it_was_taken():
    meta, results = bench.read_json(RECORDED)
    machine = meta["machine"]
    assert meta["recorded"] and not meta["quick"] and meta["command"]
    assert machine["cpu"] and machine["threads"] >= 1 and machine["isa"]
    assert machine["peers"]["pytorch"] and machine["volsample"]
    assert set(meta["load_average"]) == {"before", "after"}
    # workloads of the full suite (a renamed one must be re-recorded; a new one appears
    # when the file is), each with volsample and its ratios' spread
    names = {w.name for w in bench.select(bench.suite())}
    assert {r.workload for r in results} <= names
    assert {r.workload for r in results if r.implementation == "volsample"} == \
        {r.workload for r in results}
    for r in results:
        assert r.median_s > 0
        if r.implementation != "volsample":
            low, high = r.ratio_iqr
            assert 0 < low <= r.ratio <= high  # the median of the rounds' ratios, in their IQR


def test_gallery_benchmark_plots_the_recorded_run(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(ROOT / "docs" / "examples")  # where the documentation build runs it
    example = runpy.run_path(str(ROOT / "docs" / "examples" / "plot_benchmark.py"))
    assert Path(example["recorded"]) == RECORDED
    assert example["results"] == bench.read_json(RECORDED)[1]
    (ax,) = example["fig"].axes
    assert ax.get_xscale() == "log"
    assert "bench.run(" not in (ROOT / "docs" / "examples" / "plot_benchmark.py").read_text()


def test_gallery_modes_example_shows_every_mode_and_hides_no_error(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    path = ROOT / "docs" / "examples" / "plot_interpolation_modes.py"
    assert "except" not in path.read_text()
    example = runpy.run_path(str(path))
    assert list(example["results"]) == list(MODES.names())
    assert set(example["DESCRIPTIONS"]) >= set(MODES.names())
