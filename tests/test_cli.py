"""The command line: ``volsample bench`` and ``volsample info`` (demo and register are in
test_register.py). Timings are not tested, only what the commands produce."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from volsample import bench, cli

torch = pytest.importorskip("torch")


def test_bench_quick_writes_table_json_and_plot(tmp_path, capsys):
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    assert cli.main(["bench", "--quick", "--no-progress", "--json", str(json_path),
                     "--plot", str(png_path)]) == 0
    out = capsys.readouterr().out
    quick = [w.name for w in bench.suite() if w.quick]
    assert quick and all(name in out for name in quick)
    assert "vs pytorch" in out
    payload = json.loads(json_path.read_text())
    assert set(payload) == {"machine", "results"}
    assert payload["machine"]["threads"] >= 1
    versions = payload["machine"]["peers"]
    assert set(versions) == set(bench.PEERS)
    assert versions["pytorch"] == torch.__version__
    implementations = {r["implementation"] for r in payload["results"]}
    assert all(versions[p] for p in implementations - {"volsample"})  # a peer run has a version
    assert f"pytorch {torch.__version__}" in out
    rows = payload["results"]
    assert {r["workload"] for r in rows} == set(quick)
    for r in rows:
        assert set(r) == {"workload", "implementation", "median_s", "first_call_s", "repeats",
                          "bandwidth_fraction", "ratio"}
        assert r["median_s"] > 0 and r["repeats"] >= 5
        assert (r["ratio"] is None) == (r["implementation"] == "volsample")
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_filter_and_no_match(capsys):
    assert cli.main(["bench", "--quick", "--no-progress", "--filter", "up.fwd*"]) == 0
    out = capsys.readouterr().out
    assert "up.fwd tiny" in out and "grid.fwd tiny" not in out
    assert cli.main(["bench", "--quick", "--no-progress", "--filter", "no-such-workload"]) == 2
    assert "no workload matches" in capsys.readouterr().err


def test_full_suite_names_are_unique_and_quick_is_small():
    names = [w.name for w in bench.suite()]
    assert len(names) == len(set(names))
    assert all(w.nbytes > 0 for w in bench.suite())
    assert len(bench.select(bench.suite(), quick=True)) < len(bench.select(bench.suite()))


def test_time_call_reports_first_call_apart():
    calls = []
    first, median, repeats = bench.time_call(lambda: calls.append(1), min_repeats=5,
                                             min_seconds=0.0)
    assert repeats == 5 and len(calls) == 6 and first >= 0 and median >= 0


def test_info_and_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "volsample", "info"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("volsample ") and "CPU threads:" in result.stdout


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit) as excinfo:
        cli.main(["frobnicate"])
    assert excinfo.value.code == 2


def test_standard_shapes_are_selected_by_name():
    # oasis: 4 grid sampling, 1 upsampling, the affine warp, the registration step and
    # 4 cubic (bicubic, bspline; forward, backward)
    for pattern, expected in (("oasis", 12), ("feature", 4), ("gib", 1)):
        chosen = bench.select(bench.suite(), pattern=pattern)
        assert len(chosen) == expected and all(pattern in w.name for w in chosen)
    oasis = [w.name for w in bench.select(bench.suite(), pattern="oasis")]
    assert all(any(f"C{c} 160x192x224" in n for n in oasis) for c in (1, 3, 36))
    assert not any("gib" in w.name for w in bench.select(bench.suite(), quick=True))


def test_gib_workload_reads_at_least_a_gibibyte():
    (gib,) = bench.select(bench.suite(), pattern="gib")
    assert gib.nbytes >= 1 << 30  # its volume alone is 512 * 512 * 1024 * 4 bytes


def test_standard_shapes_and_every_peer_run_shrunk(capsys):
    # Every new workload, with every installed peer, at 1/16 of its size.
    workloads = [w for w in bench.suite(shrink=16)
                 if any(k in w.name for k in ("oasis", "feature", "gib"))]
    results = bench.run(workloads, threads=1, progress=False)
    ran = {(r.workload, r.implementation) for r in results}
    assert {w.name for w in workloads} == {name for name, _ in ran}
    installed = {p for p, v in bench.peer_versions().items() if v}
    assert {"pytorch", "scipy"} <= installed
    assert {impl for _, impl in ran} == {"volsample"} | installed
    assert all(r.ratio is not None for r in results if r.implementation != "volsample")


def test_simpleitk_peer_computes_what_volsample_does():
    # ITK is timed on the same work: its warp equals the align_corners=True grid sample
    # away from the faces (ITK's linear interpolator clamps within half a voxel of them).
    sitk = pytest.importorskip("SimpleITK")
    (workload,) = [w for w in bench.suite(shrink=8) if w.name.startswith("grid.fwd oasis field")]
    impls = workload.build()
    ours = impls["volsample"]()
    theirs = np.moveaxis(sitk.GetArrayFromImage(impls["simpleitk"]()), -1, 0)[None]
    inner = (slice(None), slice(None)) + (slice(3, -3),) * 3
    np.testing.assert_allclose(theirs[inner], ours[inner], rtol=1e-5, atol=1e-5)


def test_volresample_peer_is_the_align_corners_false_grid_sample():
    volresample = pytest.importorskip("volresample")
    import volsample

    x = np.random.default_rng(0).standard_normal((1, 3, 9, 10, 11)).astype(np.float32)
    grid = bench.smooth_grid(1, 7, 8, 9)
    np.testing.assert_allclose(volresample.grid_sample(x, grid, "linear", "zeros"),
                               volsample.grid_sample_3d(x, grid, align_corners=False),
                               rtol=1e-5, atol=1e-5)


def test_time_calls_interleaves_rounds_until_each_has_its_repeats():
    calls = []
    timed = bench.time_calls({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             min_repeats=3, min_seconds=0.0)
    assert calls == ["a", "b"] * 4  # the first calls, then three rounds
    assert [timed[name][2] for name in "ab"] == [3, 3]
    slow_apart = bench.time_calls({"a": lambda: calls.append("a"), "b": lambda: None},
                                  min_repeats=2, min_seconds=0.0, max_seconds=0.0)
    assert [slow_apart[name][2] for name in "ab"] == [1, 1]


def test_time_call_stops_slow_calls_after_max_seconds():
    calls = []
    first, median, repeats = bench.time_call(lambda: calls.append(1), min_repeats=5,
                                             min_seconds=0.0, max_seconds=0.0)
    assert repeats == 1 and len(calls) == 2


