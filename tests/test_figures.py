"""One source of figures: every figure README and docs/*.md quote from the recorded runs
(benchmarks/results/cpu.json, register.json) is drawn from them by benchmarks/figures.py,
as are the performance page's charts and the gallery's benchmark page; the gallery's
examples run what exists and hide no error. These read the source tree and skip without
it."""
from __future__ import annotations

import importlib.util
import json
import re
import runpy
from pathlib import Path

import pytest

from volsample.apps import bench, bench_peers, bench_plots, bench_report, bench_timing, bench_workloads
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


def test_documents_figures_are_the_records():
    # README's and the pages' tables and sentences that quote the records are drawn from
    # them (python benchmarks/figures.py), and every block has a drawing
    figures = _figures()
    records = figures.Records.read()
    names = []
    for path in figures.documents():
        text = path.read_text()
        starts = re.findall(r"^<!-- figures: ", text, re.M)
        ends = re.findall(r"^<!-- end of figures: ", text, re.M)
        assert len(starts) == len(ends) == len(figures.blocks(text)), \
            f"{path.name}: unpaired markers"
        names += figures.blocks(text)
        assert figures.drawn(text, records) == text, f"{path.name}: run python benchmarks/figures.py"
    assert sorted(names) == sorted(figures.BLOCKS)  # each block once, none unused
    assert "summary" in figures.blocks((ROOT / "README.md").read_text())
    assert "tables" in figures.blocks((ROOT / "docs" / "performance.md").read_text())


def test_a_changed_number_in_a_document_fails_the_check():
    # The check can fail: any digit changed inside any drawn block is found.
    figures = _figures()
    records = figures.Records.read()
    for path in figures.documents():
        text = path.read_text()
        for match in figures._BLOCK.finditer(text):
            digit = re.search(r"\d", match.group(2))
            assert digit, f"{path.name}: block {match.group(1)} quotes no figure"
            at = match.start(2) + digit.start()
            changed = text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:]
            assert figures.drawn(changed, records) != changed, (path.name, match.group(1))


def test_a_changed_recording_changes_the_documents(tmp_path):
    # A recorded run with another time, or a registration with another Dice, draws other
    # figures.
    figures = _figures()
    payload = json.loads(RECORDED.read_text())
    payload["results"][0]["median_s"] *= 2
    payload["results"][1]["ratio"] *= 2  # the first workload's PyTorch ratio: the summary
    (tmp_path / "cpu.json").write_text(json.dumps(payload))
    register = json.loads(figures.REGISTER.read_text())
    register["results"][1]["dice"]["1"] -= 0.1
    (tmp_path / "register.json").write_text(json.dumps(register))
    changed = figures.Records.read(tmp_path / "cpu.json", tmp_path / "register.json")
    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "docs" / "performance.md").read_text()
    assert figures.drawn(readme, changed) != readme
    assert figures.drawn(page, changed) != page
    for name in ("summary", "tables", "register"):
        assert figures.BLOCKS[name](changed) != figures.BLOCKS[name](figures.Records.read())


def test_a_changed_cohort_or_account_changes_the_documents(tmp_path):
    # docs/cli.md's throughput and docs/performance.md's account of the backward are drawn
    # from benchmarks/results/cohort.json and account.json: other figures there, others here
    figures = _figures()
    cohort = json.loads(figures.COHORT.read_text())
    cohort["runs"][1]["pairs_per_minute"] *= 2
    cohort["same_files"] = False
    account = json.loads(figures.ACCOUNT.read_text())
    largest = max(r["D"] for r in account["backward"])
    for r in account["backward"]:
        if (r["D"], r["phase"], r["outputs"]) == (largest, "both", "new"):
            r["cpu_ns_per_point"] += 5
    for r in account["bandwidth"]:
        r["gb_per_s"] *= 2
    account["machine"]["caches"]["L3"] = 1 << 40  # every operand fits
    (tmp_path / "cohort.json").write_text(json.dumps(cohort))
    (tmp_path / "account.json").write_text(json.dumps(account))
    records = figures.Records.read()
    changed = figures.Records.read(cohort=tmp_path / "cohort.json",
                                   account=tmp_path / "account.json")
    for name in ("cohort", "account-bytes", "account-times", "account-bandwidth"):
        assert figures.BLOCKS[name](changed) != figures.BLOCKS[name](records), name
    assert "NOT the same bits" in figures.BLOCKS["cohort"](changed)
    assert f"(the operands, {36 * largest**3 / 1e6:.0f} MB, fit L3)" in \
        figures.BLOCKS["account-bytes"](changed)
    for page, names in (("cli.md", {"cohort"}),
                        ("performance.md", {"account-bytes", "account-times", "account-bandwidth"})):
        text = (ROOT / "docs" / page).read_text()
        assert names <= set(figures.blocks(text)), page
        assert figures.drawn(text, changed) != text


@pytest.mark.parametrize("name", ["cohort.json", "account.json"])
def test_cohort_and_account_records_say_how_they_were_taken(name):
    record = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
    assert record["recorded"] and record["command"].startswith("python benchmarks/")
    assert not record["quick"]  # the documents quote a full run, not a quick check
    assert set(record["load_average"]) == {"before", "after"}
    assert record["machine"]["cpu"] and record["machine"]["logical_cpus"] >= 1
    if name == "cohort.json":
        assert [run["workers"] for run in record["runs"]][0] is None  # one process, then a cluster
        assert record["same_rows"] and record["same_files"]  # what docs/cli.md says of the bits
        assert all(run["pairs_per_minute"] > 0 and run["peak_memory_mb"] > 0
                   for run in record["runs"])
    else:  # every cell of the account's tables
        sizes = {r["D"] for r in record["backward"]}
        cells = {(r["D"], r["phase"], r["outputs"]) for r in record["backward"]}
        assert len(sizes) >= 2 and cells == {(D, phase, outputs) for D in sizes for phase, outputs
                                             in [("plan", None)] + [
                                                 (p, o) for p in ("both", "grad_input", "grad_grid")
                                                 for o in ("new", "reused")]}
        assert {(r["operation"], r["threads"]) for r in record["bandwidth"]} == {
            (op, t) for op in ("write", "first_touch", "read", "copy")
            for t in {1, record["threads"]}}
        assert all(r["cpu_ns_per_point"] > 0 for r in record["backward"])


def test_family_tables_fit_the_page():
    # At most seven columns a table, every workload in one family's table
    meta, results = bench_report.read_json(RECORDED)
    tables = bench_report.markdown_families(results)
    headers = [line for line in tables.splitlines() if line.startswith("| workload")]
    assert headers and all(line.count("|") - 1 <= bench_report.MAX_COLUMNS for line in headers)
    for r in results:
        assert f"| `{r.workload}` |" in tables
    assert sum(f"| `{r.workload}` |" in line for line in tables.splitlines()
               for r in results if r.implementation == "volsample") == len(
        {r.workload for r in results})


def test_no_spread_from_fewer_than_four_rounds():
    # An interquartile range of one, two or three rounds is not printed: the rounds are
    meta, results = bench_report.read_json(RECORDED)
    few = [r for r in results if r.ratio is not None and r.rounds < bench_timing.MIN_SPREAD_ROUNDS]
    assert few  # the recorded run has such ratios (the slowest peers of the largest workloads)
    for r in few:
        assert r.ratio_iqr is None
        assert bench_report._ratio_cell(r).endswith(f"({r.rounds} round{'s' * (r.rounds > 1)})")
    single = next(r for r in few if r.rounds == 1)
    tables = bench_report.markdown_families(results)
    assert f"{bench_report._ratio_cell(single)} |" in tables and "(5.53-5.53)" not in tables


def test_test_counts_and_run_times_are_stated_loosely():
    # A count of tests or a suite's minutes goes stale with every test added: the documents
    # say "several thousand tests", "about ten minutes", never "3,200 tests" or "5 minutes"
    stated = re.compile(r"\b\d[\d,]* (?:tests|passed)\b"
                        r"|\b(?:suite|tests)\b[^.;]{0,60}?\b\d+(?:\.\d+)? min", re.I)
    assert stated.search("about 3,200 tests, about 5 minutes") and stated.search(
        "The whole suite (`pytest -n 2`) takes 8 minutes")
    for path in _figures().documents():
        for paragraph in path.read_text().split("\n\n"):
            found = stated.search(" ".join(paragraph.split()))
            assert not found, f"{path.name}: {found.group(0)!r}"


def test_every_peer_has_a_title_in_the_drawn_table():
    assert set(bench_report.PEER_TITLES) == set(bench_peers.PEERS)


def test_charts_are_drawn_from_the_records(tmp_path):
    import matplotlib.image

    figures = _figures()
    written = figures.write_charts(tmp_path)
    assert [p.name for p in written] == list(figures.CHARTS)
    for path in written:  # the column's width at 1280 px: drawn at its size, not shrunk
        height, width = matplotlib.image.imread(path).shape[:2]
        assert width == 100 * bench_plots.CHART_WIDTH <= 900 and height < 900, (path.name, width, height)
    meta, results = bench_report.read_json(RECORDED)
    fig = bench_plots.plot_against_pytorch(results)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    families = [t.get_text() for t in ax.get_yticklabels()]
    assert families == [bench_report.family_title(k) for k in bench_report.by_family(
        [r for r in results if r.implementation == "pytorch"])]
    colours = [c.get_facecolor()[0][:3] for c in ax.collections]
    assert len({tuple(c) for c in colours}) == len(colours)  # one colour a family


def test_recorded_run_says_how_it_was_taken():
    meta, results = bench_report.read_json(RECORDED)
    machine = meta["machine"]
    assert meta["recorded"] and not meta["quick"] and meta["command"]
    assert machine["cpu"] and machine["threads"] >= 1 and machine["isa"]
    assert machine["peers"]["pytorch"] and machine["volsample"]
    assert set(meta["load_average"]) == {"before", "after"}
    # workloads of the full suite (a renamed one must be re-recorded; a new one appears
    # when the file is), each with volsample and its ratios' spread
    names = {w.name for w in bench.select(bench_workloads.suite())}
    assert {r.workload for r in results} <= names
    assert {r.workload for r in results if r.implementation == "volsample"} == \
        {r.workload for r in results}
    for r in results:
        assert r.median_s > 0
        if r.implementation != "volsample" and r.ratio_iqr is not None:
            low, high = r.ratio_iqr
            assert 0 < low <= r.ratio <= high  # the median of the rounds' ratios, in their IQR


def test_gallery_benchmark_plots_the_recorded_run(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(ROOT / "docs" / "examples")  # where the documentation build runs it
    example = runpy.run_path(str(ROOT / "docs" / "examples" / "plot_benchmark.py"))
    assert Path(example["recorded"]) == RECORDED
    assert example["results"] == bench_report.read_json(RECORDED)[1]
    axes = example["fig"].axes
    assert len(axes) == 2 and all(ax.get_xscale() == "log" for ax in axes)
    assert "bench_timing.run(" not in (ROOT / "docs" / "examples" / "plot_benchmark.py").read_text()


def test_gallery_modes_example_shows_every_mode_and_hides_no_error(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    path = ROOT / "docs" / "examples" / "plot_interpolation_modes.py"
    assert "except" not in path.read_text()
    example = runpy.run_path(str(path))
    assert list(example["results"]) == list(MODES.names())
    assert set(example["DESCRIPTIONS"]) >= set(MODES.names())
