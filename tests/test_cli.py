"""The command line: ``volsample bench`` and ``volsample info`` (demo and register are in
test_register.py). Timings are not tested, only what the commands produce."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from volsample import bench, cli


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
