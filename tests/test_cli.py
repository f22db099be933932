"""The command line: ``volsample bench`` and ``volsample info`` (demo and register are in
test_register.py). Timings are not tested, only what the commands produce."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from volsample import cli
from volsample.apps import bench, bench_jax, bench_peers, bench_plots, bench_report, bench_timing, bench_workloads

torch = pytest.importorskip("torch")


def test_bench_quick_writes_table_json_and_plot(tmp_path, capsys, monkeypatch):
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    # A loaded machine can spend a workload's max_seconds before its min_repeats (the cap
    # is by design); lifted here, so every row must show the quick run's repeats.
    monkeypatch.setitem(bench_timing.QUICK_LIMITS, "max_seconds", 120.0)
    assert cli.main(["bench", "--quick", "--no-progress", "--json", str(json_path),
                     "--plot", str(png_path)]) == 0
    out = capsys.readouterr().out
    quick = [w.name for w in bench_workloads.suite() if w.quick]
    assert quick and all(name in out for name in quick)
    ours = {r["workload"]: r for r in json.loads(json_path.read_text())["results"]
            if r["implementation"] == "volsample"}
    for name in quick:  # times of microseconds keep three digits (not "0.02", "0")
        median_ms, _, first_ms = next(line for line in out.splitlines()
                                      if line.startswith(name))[len(name):].split()[:3]
        assert float(median_ms) == pytest.approx(ours[name]["median_s"] * 1e3, rel=0.01)
        assert float(first_ms) == pytest.approx(ours[name]["first_call_s"] * 1e3, rel=0.01)
    assert "vs pytorch" in out
    payload = json.loads(json_path.read_text())
    assert set(payload) == {"recorded", "command", "quick", "load_average", "machine",
                            "results"}
    assert payload["quick"] is True and payload["command"].startswith("volsample bench --quick")
    assert payload["machine"]["threads"] >= 1
    assert payload["machine"]["cpu"] == bench_timing.cpu_model() and payload["machine"]["isa"]
    versions = payload["machine"]["peers"]
    # the other packages: volsample's own variants are volsample's version, not peers
    own = {p for p in bench_peers.PEERS if p.startswith("volsample-")}
    assert own and set(versions) == set(bench_peers.PEERS) - own
    assert versions["pytorch"] == torch.__version__
    implementations = {r["implementation"] for r in payload["results"]}
    assert implementations & own
    assert all(versions[p] for p in implementations - {"volsample"} - own)  # a peer run has one
    (peers_line,) = [line for line in out.splitlines() if line.startswith("peers: ")]
    assert f"pytorch {torch.__version__}" in peers_line and "volsample" not in peers_line
    rows = payload["results"]
    assert {r["workload"] for r in rows} == set(quick)
    for r in rows:
        assert set(r) == {"workload", "implementation", "median_s", "first_call_s", "repeats",
                          "bandwidth_fraction", "ratio", "ratio_iqr", "rounds",
                          "bandwidth_fraction_after"}
        assert r["median_s"] > 0
        if r["implementation"] in ("volsample", "pytorch"):  # a peer's erratic call may
            assert r["repeats"] >= bench_timing.QUICK_LIMITS["min_repeats"]  # reach max_seconds
        assert (r["ratio"] is None) == (r["implementation"] == "volsample")
        assert (r["rounds"] is None) == (r["implementation"] == "volsample")
        assert (r["ratio_iqr"] is None) == (r["implementation"] == "volsample"
                                            or r["rounds"] < bench_timing.MIN_SPREAD_ROUNDS)
        if r["ratio_iqr"]:
            assert 0 < r["ratio_iqr"][0] <= r["ratio_iqr"][1]
    # the spread is shown beside each ratio: "1.35x (1.2-1.5)"
    assert "vs pytorch (IQR)" in out
    import re

    quick_rows = [line for line in out.splitlines() if line.startswith(tuple(quick))]
    assert len(quick_rows) == len(quick)
    assert all(re.search(r"\d\.?\d*x \([\d.]+-[\d.]+\)", line) for line in quick_rows)
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_filter_and_no_match(capsys):
    assert cli.main(["bench", "--quick", "--no-progress", "--filter", "up.fwd*"]) == 0
    out = capsys.readouterr().out
    assert "up.fwd tiny" in out and "grid.fwd tiny" not in out
    assert cli.main(["bench", "--quick", "--no-progress", "--filter", "no-such-workload"]) == 2
    err = capsys.readouterr().err  # one line, as docs/cli.md promises of bad input
    assert err == ("volsample bench: error: --filter: no workload of --quick matches "
                   "'no-such-workload'\n")
    assert cli.main(["bench", "--no-progress", "--filter", "nosuch"]) == 2
    assert capsys.readouterr().err == ("volsample bench: error: --filter: no workload matches "
                                       "'nosuch'\n")


def test_table_marks_noisy_ratios_and_a_moving_copy_bandwidth():
    def results(iqr, after):
        return [bench_timing.Result("w", "volsample", 1e-3, 1e-3, 9, 0.4, bandwidth_fraction_after=after),
                bench_timing.Result("w", "simpleitk", 9e-2, 1e-1, 9, 0.1, 90.0, iqr, 9)]

    quiet = bench_report.format_table(results((80.0, 100.0), None))
    assert "*" not in quiet and "noisy" not in quiet and " 40% " in quiet
    noisy = bench_report.format_table(results((80.0, 1000.0), 0.8)).splitlines()
    assert noisy[2].endswith("90x (80-1000) *") and " 40%-80% " in noisy[2]
    assert noisy[3].startswith("*: noisy") and noisy[4].startswith("of copy bw: noisy")


def test_run_reports_no_spread_from_fewer_than_four_rounds():
    # a slow peer stopped after one round: its ratio, and the rounds instead of an IQR
    slow = bench_timing.Workload("slow", lambda: {"volsample": lambda: None, "pytorch": lambda: None}, 1)
    (ours, theirs) = bench_timing.run([slow], threads=1, progress=False,
                               limits=dict(min_repeats=1, min_seconds=0.0, max_repeats=1))
    assert theirs.rounds == 1 and theirs.ratio is not None and theirs.ratio_iqr is None
    assert bench_report._ratio_cell(theirs) == f"{bench_report._figure(theirs.ratio)}x (1 round)"
    assert "(1 round)" in bench_report.markdown_report(
        {"recorded": "2026-01-01T00:00:00Z", "command": "volsample bench",
         "load_average": {"before": None, "after": None},
         "machine": {"volsample": "0", "cpu": "cpu", "logical_cpus": 2, "isa": "scalar",
                     "threads": 1, "python": "3", "numpy": "2",
                     "peers": {"pytorch": torch.__version__}}}, [ours, theirs])


def test_plot_draws_any_subset_of_families(tmp_path):
    results = [bench_timing.Result(name, impl, 1e-3, 1e-3, 5, 0.5, ratio, (ratio, ratio) if ratio else None, 5 if ratio else None)
               for name in ("grid.fwd tiny N1 C2 12^3", "warp.fwd affine tiny N1 C2 12^3")
               for impl, ratio in (("volsample", None), ("pytorch", 3.0))]
    bench_plots.write_plot(tmp_path / "one.png", results)  # no other library: one chart
    assert (tmp_path / "one.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = bench_plots.plot(results + [bench_timing.Result("grid.fwd tiny N1 C2 12^3", "scipy", 1e-3, 1e-3, 5, 0.5,
                                             20.0, (19.0, 21.0), 5)])
    assert [len(ax.get_yticks()) for ax in fig.axes] == [2, 1]  # two families; SciPy


def test_full_suite_names_are_unique_and_quick_is_small():
    names = [w.name for w in bench_workloads.suite()]
    assert len(names) == len(set(names))
    assert all(w.nbytes > 0 for w in bench_workloads.suite())
    assert len(bench.select(bench_workloads.suite(), quick=True)) < len(bench.select(bench_workloads.suite()))


def test_time_call_reports_first_call_apart():
    calls = []
    first, median, repeats = bench_timing.time_call(lambda: calls.append(1), min_repeats=5,
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
    # 4 cubic (bicubic, bspline; forward, backward), and where volsample.jax runs, JAX's
    # forward and forward + grad; sweep: 6 sizes, 2 grids, 2 directions
    jax = 2 if bench_jax.workloads(bench_workloads.smooth_grid) else 0
    for pattern, expected in (("oasis", 12 + jax), ("feature", 4), ("gib", 1), ("sweep", 24)):
        chosen = bench.select(bench_workloads.suite(), pattern=pattern)
        assert len(chosen) == expected and all(pattern in w.name for w in chosen)
    oasis = [w.name for w in bench.select(bench_workloads.suite(), pattern="oasis")]
    assert all(any(f"C{c} 160x192x224" in n for n in oasis) for c in (1, 3, 36))
    assert not any("gib" in w.name for w in bench.select(bench_workloads.suite(), quick=True))


def test_size_sweep_times_pytorch_alone():
    # the other libraries' forwards would take most of the sweep's time at 256^3; the rest of
    # the suite's forwards keep them (shrunk: sizes of 4 to 16)
    for w in bench.select(bench_workloads.suite(shrink=16), pattern="grid.fwd *64^3"):
        peers = set(w.build()) - {"volsample"}
        if "sweep" in w.name:
            assert peers == {"pytorch"}, w.name
        else:
            assert "scipy" in peers, w.name


def test_gib_workload_reads_at_least_a_gibibyte():
    (gib,) = bench.select(bench_workloads.suite(), pattern="gib")
    assert gib.nbytes >= 1 << 30  # its volume alone is 512 * 512 * 1024 * 4 bytes


def test_standard_shapes_and_every_peer_run_shrunk(capsys):
    # Every new workload, with every installed peer, at 1/16 of its size (the small-size
    # family's peers: its keypoint workloads).
    workloads = [w for w in bench_workloads.suite(shrink=16)
                 if any(k in w.name for k in ("oasis", "feature", "gib", "keypoints"))]
    results = bench_timing.run(workloads, threads=1, progress=False)
    ran = {(r.workload, r.implementation) for r in results}
    assert {w.name for w in workloads} == {name for name, _ in ran}
    installed = {p for p, v in bench_peers.peer_versions().items() if v}
    assert {"pytorch", "scipy"} <= installed
    own = {p for p in bench_peers.PEERS if p.startswith("volsample-")}  # volsample's own variants
    assert {impl for _, impl in ran} - own == {"volsample"} | installed
    assert {impl for _, impl in ran} & own
    assert all(r.ratio is not None for r in results if r.implementation != "volsample")


def test_simpleitk_peer_computes_what_volsample_does():
    # ITK is timed on the same work: its warp equals the align_corners=True grid sample
    # away from the faces (ITK's linear interpolator clamps within half a voxel of them).
    sitk = pytest.importorskip("SimpleITK")
    (workload,) = [w for w in bench_workloads.suite(shrink=8) if w.name.startswith("grid.fwd oasis field")]
    impls = workload.build()
    ours = impls["volsample"]()
    theirs = np.moveaxis(sitk.GetArrayFromImage(impls["simpleitk"]()), -1, 0)[None]
    inner = (slice(None), slice(None)) + (slice(3, -3),) * 3
    np.testing.assert_allclose(theirs[inner], ours[inner], rtol=1e-5, atol=1e-5)


def test_affiners_peer_computes_what_volsample_does():
    # affiners is timed on the same work: its transform equals warp_3d's (align_corners=False)
    # away from the faces (it reads 0 beyond the input's outer voxel centres, not between).
    pytest.importorskip("affiners")
    (workload,) = [w for w in bench_workloads.suite(shrink=8) if w.name.startswith("warp.fwd affine oasis")]
    impls = workload.build()
    ours = impls["volsample"]()
    (theirs,) = impls["affiners"]()
    inner = (slice(3, -3),) * 3
    assert np.abs(ours[0, 0][inner]).max() > 0.1
    np.testing.assert_allclose(theirs[inner], ours[0, 0][inner], rtol=1e-4, atol=1e-4)


def test_registration_step_variants_and_losses_give_the_same_gradients():
    # the step the warp's memory and time figures measure: the three variants, each loss
    pytest.importorskip("torch")
    operands = bench_workloads.step_operands(1, 1, (6, 7, 8))
    reference = bench_workloads.registration_step("pytorch", *operands, loss="square")
    for variant in ("volsample", "volsample-warp", "volsample-grid", "pytorch"):
        for loss in ("mse_loss", "square"):
            grads = bench_workloads.registration_step(variant, *operands, loss=loss)
            for ours, theirs in zip(grads, reference):
                assert float(theirs.abs().max()) > 1e-4
                np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="loss must be"):
        bench_workloads.registration_step("volsample", *operands, loss="l1")


def test_volresample_peer_is_the_align_corners_false_grid_sample():
    volresample = pytest.importorskip("volresample")
    import volsample

    x = np.random.default_rng(0).standard_normal((1, 3, 9, 10, 11)).astype(np.float32)
    grid = bench_workloads.smooth_grid(1, 7, 8, 9)
    np.testing.assert_allclose(volresample.grid_sample(x, grid, "linear", "zeros"),
                               volsample.grid_sample_3d(x, grid, align_corners=False),
                               rtol=1e-5, atol=1e-5)


def test_time_calls_interleaves_rounds_until_each_has_its_repeats():
    calls = []
    timed = bench_timing.time_calls({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             min_repeats=3, min_seconds=0.0)
    assert calls[:4] == list("abab") and sorted(calls[4:]) == list("aabb")  # first calls, rounds
    assert [timed[name][2] for name in "ab"] == [3, 3]
    slow_apart = bench_timing.time_calls({"a": lambda: calls.append("a"), "b": lambda: None},
                                  min_repeats=2, min_seconds=0.0, max_seconds=0.0)
    assert [slow_apart[name][2] for name in "ab"] == [1, 1]


def test_time_call_stops_slow_calls_after_max_seconds():
    calls = []
    first, median, repeats = bench_timing.time_call(lambda: calls.append(1), min_repeats=5,
                                             min_seconds=0.0, max_seconds=0.0)
    assert repeats == 1 and len(calls) == 2




def test_version_and_plain_help(capsys):
    import volsample

    with pytest.raises(SystemExit) as excinfo:
        cli.main(["--version"])
    assert excinfo.value.code == 0
    assert capsys.readouterr().out.strip() == f"volsample {volsample.__version__}"
    for command in [[], *([name] for name in cli._SUBCOMMANDS)]:
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        text = capsys.readouterr().out
        assert text.startswith("usage: volsample")
        assert "``" not in text and ":func:" not in text and ":doc:" not in text


def test_demo_says_where_it_wrote_its_files(tmp_path, capsys):
    out = tmp_path / "demo out"
    assert cli.main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    (last,) = [line for line in lines if line.startswith("wrote ")]
    assert lines[-1].startswith("similarity (ncc): ")  # last, as docs/cli.md says
    written = sorted(p.name for p in out.iterdir())
    assert last.startswith("wrote ") and last.endswith(f" to {out}{os.sep}")
    assert sorted(last[len("wrote "):last.rindex(" to ")].split(", ")) == written
    assert {"fixed.npy", "moving.npy", "warped.npy", "displacement.npy", "affine.txt"} <= set(written)


@pytest.mark.parametrize(("values", "expected"), [
    ((0.3252, 0.38861), "0.3252 -> 0.3886"),      # the same decimals before and after
    ((0.05, 0.91234), "0.0500 -> 0.9123"),         # .4g printed "0.05 -> 0.9123"
    ((-0.0012345, -0.00042), "-0.001234 -> -0.000420"),
    ((1234.56, 12.3), "1235 -> 12"),
    ((0.0, 0.0), "0.000 -> 0.000"),
])
def test_similarity_before_and_after_share_their_precision(values, expected):
    from volsample.apps import register

    assert register._change("similarity (ncc)", values) == f"similarity (ncc): {expected}"


def test_time_rounds_batches_fast_calls_into_samples():
    calls = []
    timed = bench_timing.time_rounds({"a": lambda: calls.append(1)}, min_repeats=3, min_seconds=0.0,
                              max_repeats=3, min_sample_seconds=1e-3)
    first, times = timed["a"]
    batch = (len(calls) - 4) // 3  # the first call, three calibrating ones, three rounds
    assert len(times) == 3 and batch > 1 and len(calls) == 4 + 3 * batch
    # without a sample length each round calls once
    calls.clear()
    bench_timing.time_rounds({"a": lambda: calls.append(1)}, min_repeats=3, min_seconds=0.0,
                      max_repeats=3)
    assert len(calls) == 4


def test_time_rounds_takes_each_round_in_an_order_of_its_own():
    calls = []
    bench_timing.time_rounds({name: (lambda n=name: calls.append(n)) for name in "abcd"},
                      min_repeats=12, min_seconds=0.0, max_repeats=12)
    assert calls[:4] == list("abcd")  # the first calls, in order
    rounds = ["".join(calls[k:k + 4]) for k in range(4, len(calls), 4)]
    assert len(rounds) == 12 and all(sorted(r) == list("abcd") for r in rounds)
    assert rounds[0] == "abcd"  # the first round in the given order, the others shuffled
    followers = {r[i + 1] for r in rounds for i in range(3) if r[i] == "b"}
    assert len(followers) > 1  # "b" is not always followed by the same one
    again = []
    bench_timing.time_rounds({name: (lambda n=name: again.append(n)) for name in "abcd"},
                      min_repeats=12, min_seconds=0.0, max_repeats=12)
    assert again == calls  # the same orders every run (a fixed seed)


def test_run_reports_the_spread_of_the_per_round_ratios():
    import time as _time

    steady = bench_timing.Workload("steady", lambda: {"volsample": lambda: _time.sleep(0.002),
                                               "pytorch": lambda: _time.sleep(0.004)}, 1)
    (ours, theirs) = bench_timing.run([steady], threads=1, progress=False,
                               limits=dict(min_repeats=7, min_seconds=0.0, max_repeats=7))
    assert ours.ratio is None and ours.ratio_iqr is None and theirs.repeats == 7
    assert theirs.rounds == 7
    low, high = theirs.ratio_iqr
    assert 1 < low <= high  # about 2, more where a busy machine wakes the sleeps late
    assert bench_report._ratio_cell(theirs) == f"{bench_report._figure(theirs.ratio)}x ({bench_report._spread(low, high)})"
    assert bench_report._spread(6.81, 7.34) == "6.8-7.3" and bench_report._spread(15.66, 15.82) == "15.7-15.8"
