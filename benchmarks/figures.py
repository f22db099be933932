"""Every figure the documents quote from the recorded benchmark runs, drawn from them.

    python benchmarks/figures.py --record   # run the full suite on 2 threads, record it in
                                            # benchmarks/results/cpu.json, redraw
    python benchmarks/figures.py            # redraw README's and docs/*.md's figures
    python benchmarks/figures.py --check    # exit 1 where a document's figures are not drawn
                                            # from the records
    python benchmarks/figures.py --charts DIR   # write the performance page's charts (PNG)

The recorded files are the one source of the figures: ``benchmarks/results/cpu.json``
(``volsample bench --json FILE``), ``benchmarks/results/sweep.json`` (the size sweep alone:
``volsample bench --filter sweep --threads 2 --json FILE``) and
``benchmarks/results/register.json`` (``volsample bench --register --json FILE``),
``benchmarks/results/cohort.json`` (``python benchmarks/cohort.py``) and
``benchmarks/results/account.json`` (``python benchmarks/backward_account.py``). Every table or sentence of README.md and docs/*.md that
quotes them sits between two markers,

    <!-- figures: NAME (drawn by benchmarks/figures.py) -->
    ...
    <!-- end of figures: NAME -->

and is drawn by ``BLOCKS[NAME]`` (the blocks of cohort.json and account.json:
``benchmarks/script_figures.py``); the documentation build draws the charts with
``write_charts`` (docs/conf.py), and the gallery's benchmark page plots the same file. A
new workload in ``volsample.apps.bench_workloads.suite()`` appears in all of them after ``--record``.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from volsample.apps import bench_plots, bench_register, bench_report

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # loaded by path (docs/conf.py, the tests) too
import script_figures  # noqa: E402
RESULTS = ROOT / "benchmarks" / "results"
RECORDED = RESULTS / "cpu.json"
REGISTER = RESULTS / "register.json"
CONTRAST = RESULTS / "register-contrast.json"  # volsample bench --register --register-contrast
JAX = RESULTS / "jax.json"  # volsample bench --filter jax
SWEEP = RESULTS / "sweep.json"
COHORT = RESULTS / "cohort.json"  # python benchmarks/cohort.py
ACCOUNT = RESULTS / "account.json"  # python benchmarks/backward_account.py
README = ROOT / "README.md"
BEGIN = "<!-- figures: {} (drawn by benchmarks/figures.py) -->"
END = "<!-- end of figures: {} -->"
_BLOCK = re.compile(r"<!-- figures: ([\w-]+) \(drawn by benchmarks/figures\.py\) -->\n"
                    r"(.*?)<!-- end of figures: \1 -->", re.S)


def documents() -> list[Path]:
    """The files whose figures are drawn: README.md and the documentation's pages."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


class Records:
    """The recorded runs: the bench harness's (``meta``, ``results``: ``bench_timing.Result``),
    the registration benchmark's (``register_meta``, ``register``: ``ToolResult``) and the
    size sweep's (``sweep_meta``, ``sweep``: ``bench_timing.Result``); the cohort's
    throughput and the backward's account as their files hold them (``cohort``,
    ``account``)."""

    def __init__(self, meta: dict, results: list, register_meta: dict, register: list,
                 sweep_meta: dict, sweep: list, contrast_meta: dict, contrast: list,
                 jax_meta: dict, jax: list, cohort: dict, account: dict):
        self.meta, self.results = meta, results
        self.register_meta, self.register = register_meta, register
        self.sweep_meta, self.sweep = sweep_meta, sweep
        self.contrast_meta, self.contrast = contrast_meta, contrast
        self.jax_meta, self.jax = jax_meta, jax
        self.cohort, self.account = cohort, account

    @classmethod
    def read(cls, cpu: Path = RECORDED, register: Path = REGISTER,
             sweep: Path = SWEEP, contrast: Path = CONTRAST, jax: Path = JAX,
             cohort: Path = COHORT, account: Path = ACCOUNT) -> Records:
        return cls(*bench_report.read_json(cpu), *bench_register.read_json(register),
                   *bench_report.read_json(sweep), *bench_register.read_json(contrast),
                   *bench_report.read_json(jax), json.loads(Path(cohort).read_text()),
                   json.loads(Path(account).read_text()))

    def sweep_ratio(self, direction: str, kind: str, D: int) -> float:
        """PyTorch's time over volsample's on a sweep row (the median of the rounds' ratios)."""
        name = f"grid.{direction} sweep {kind} N1 C1 {D}^3"
        return next(r.ratio for r in self.sweep
                    if r.workload == name and r.implementation == "pytorch")

    def per_point(self, direction: str, kind: str, implementation: str) -> dict[int, float]:
        """{D: nanoseconds per point} of the sweep's rows of one direction ("fwd", "bwd"),
        grid kind ("smooth", "random") and implementation."""
        found = {}
        for r in self.sweep:
            m = _SWEEP_ROW.fullmatch(r.workload)
            if m and m.groups()[:2] == (direction, kind) and r.implementation == implementation:
                D = int(m.group(3))
                found[D] = r.median_s * 1e9 / D**3
        return dict(sorted(found.items()))

    def result(self, workload: str, implementation: str = "volsample"):
        return next(r for r in self.results
                    if r.workload == workload and r.implementation == implementation)

    def ratio(self, workload: str, peer: str) -> float:
        """The peer's time over volsample's (the median of the rounds' ratios)."""
        return self.result(workload, peer).ratio

    def tool(self, name: str, contrast: bool = False):
        """The median of a registration tool's runs, as one ToolResult (``contrast``: on the
        contrast-remapped pair)."""
        runs = [r for r in (self.contrast if contrast else self.register) if r.tool == name]
        median = lambda values: float(np.median(values))
        calls = [r.registration_s for r in runs if r.registration_s is not None]
        return bench_register.ToolResult(
            name, median([r.wall_s for r in runs]), median([r.cpu_s for r in runs]),
            median(calls) if calls else None, median([r.peak_mb for r in runs]),
            {k: median([r.dice[k] for r in runs]) for k in runs[0].dice},
            median([r.error_mm for r in runs]))


_x = bench_report.short_ratio
_SWEEP_ROW = re.compile(r"grid\.(fwd|bwd) sweep (smooth|random) N1 C1 (\d+)\^3")


def _times(ratio: float) -> str:
    """A ratio below 1 as the time it takes ("3.5x the time")."""
    return f"{1 / ratio:.1f}x"


def _recorded(rec: Records) -> str:
    m = rec.meta["machine"]
    return f"{rec.meta['recorded'][:10]}, {m['cpu']}, {m['threads']} threads for every implementation"


def _mean_dice(tool) -> float:
    # rounded half up at the 3 digits shown (0.9295 -> 0.930), not by the float's binary value
    return float(np.mean(list(tool.dice.values()))) + 1e-9


# -- the blocks ------------------------------------------------------------------------


def summary(rec: Records) -> str:
    """README's headline: PyTorch's time over volsample's per operator family, and the
    registration against ANTs."""
    pytorch = [r for r in rec.results if r.implementation == "pytorch"]
    lines = [f"On the recorded run ({_recorded(rec)}; `benchmarks/results/cpu.json`), "
             "PyTorch's CPU kernels took this many times volsample's time:", "",
             "| operator family | workloads | PyTorch's time / volsample's: median (range) |",
             "|---|---:|---:|"]
    for key, names in bench_report.by_family(pytorch).items():
        ratios = [r.ratio for r in pytorch if r.workload in names]
        lines.append(f"| {bench_report.family_title(key)} | {len(ratios)} | {_x(np.median(ratios))} "
                     f"({_x(min(ratios))} to {_x(max(ratios))}) |")
    ours, greedy, ants = (rec.tool(name) for name in ("volsample", "greedy", "ants-syn"))
    lines += ["", f"`volsample register` aligned the MNI152 template to its known deformation "
              f"(1 mm, `benchmarks/results/register.json`) to a mean Dice of "
              f"{_mean_dice(ours):.3f} and an error of {ours.error_mm:.2f} mm in {ours.wall_s:.1f} s, "
              f"NIfTI files read and written; Greedy's registration calls alone took "
              f"{greedy.registration_s:.1f} s for {_mean_dice(greedy):.3f} and "
              f"{greedy.error_mm:.2f} mm, ANTs SyN's {ants.registration_s:.1f} s for "
              f"{_mean_dice(ants):.3f} and {ants.error_mm:.2f} mm."]
    return "\n".join(lines)


def tables(rec: Records) -> str:
    """The performance page's tables, one per operator family."""
    return bench_report.recorded_line(rec.meta, rec.results) + "\n\n" + bench_report.markdown_families(
        rec.results)


def register_table(rec: Records) -> str:
    """The registration benchmark's table and its ratios."""
    m = rec.register_meta
    before, ours, ants = rec.tool("before"), rec.tool("volsample"), rec.tool("ants-syn")
    dice = lambda t: " / ".join(f"{t.dice[k]:.3f}" for k in bench_register.LABELS)
    return "\n".join([
        f"Recorded {m['recorded'][:10]} by `{m['command']}`, {m['threads']} threads each: "
        f"{m['note']}.", "",
        "| 1 mm pair | wall (CPU) | peak memory | Dice grey / white (mean) | error in the brain |",
        "|---|---:|---:|---:|---:|",
        f"| before (the headers' alignment) | | | {dice(before)} ({_mean_dice(before):.3f}) | "
        f"{before.error_mm:.2f} mm |",
        f"| `volsample register` {m['versions']['volsample']} (defaults, NIfTI I/O included) | "
        f"**{ours.wall_s:.1f} s** ({ours.cpu_s:.1f} s) | **{ours.peak_mb:.0f} MB** | "
        f"{dice(ours)} (**{_mean_dice(ours):.3f}**) | **{ours.error_mm:.2f} mm** |",
        f"| ANTsPy {m['versions']['ants-syn']} `registration(type_of_transform=\"SyN\")` | "
        f"{ants.wall_s:.1f} s, its call {ants.registration_s:.1f} s ({ants.cpu_s:.1f} s) | "
        f"{ants.peak_mb:.0f} MB | {dice(ants)} ({_mean_dice(ants):.3f}) | "
        f"{ants.error_mm:.2f} mm |"] + [  # Greedy: in the records that ran it
        f"| Greedy {m['versions']['greedy']} (its tutorial's brain MRI run, single precision) | "
        f"{g.wall_s:.1f} s, its calls {g.registration_s:.1f} s ({g.cpu_s:.1f} s) | "
        f"{g.peak_mb:.0f} MB | {dice(g)} ({_mean_dice(g):.3f}) | {g.error_mm:.2f} mm |"
        for g in [rec.tool("greedy")]
    ] + ["", "`volsample register`, reading and writing its NIfTI files, took " + "; ".join(
        f"{t.registration_s / ours.wall_s:.1f}x less wall time than {name}'s registration "
        f"{calls} alone ({t.wall_s / ours.wall_s:.1f}x less than its whole run) and "
        f"{t.cpu_s / ours.cpu_s:.1f}x less CPU time"
        for name, calls, t in (("Greedy", "calls", rec.tool("greedy")),
                               ("ANTs", "call", ants))) + "."])


def contrast(rec: Records) -> str:
    """``--loss mi`` on the contrast-remapped pair, against Greedy's ``-m NMI``."""
    m = rec.contrast_meta
    ours, greedy = rec.tool("volsample", contrast=True), rec.tool("greedy", contrast=True)
    return (f"On the MNI152 pair of `volsample bench --register` (1 mm), with MOVING's "
            f"normalised intensities x remapped to sin(3x)^2 (a smooth curve that rises, then "
            f"falls: no linear map of a T1 gives that contrast; `--register-contrast`), "
            f"`--loss mi` reached a mean grey/white-matter Dice of {_mean_dice(ours):.3f} "
            f"(error {ours.error_mm:.2f} mm) in {ours.wall_s:.1f} s ({ours.cpu_s:.1f} s of CPU), "
            f"NIfTI files read and written, where Greedy's `-m NMI` (affine, then deformable, "
            f"100x50x10) reached {_mean_dice(greedy):.3f} ({greedy.error_mm:.2f} mm) in "
            f"{greedy.registration_s:.1f} s for its registration calls alone ({greedy.cpu_s:.1f} s "
            f"of CPU): {greedy.registration_s / ours.wall_s:.1f}x volsample's wall time "
            f"(recorded {m['recorded'][:10]}, {m['threads']} threads each, {m['note']}; "
            f"`benchmarks/results/register-contrast.json`).")


def cubic(rec: Records) -> str:
    name = "grid.{} {} oasis N1 C1 160x192x224"
    r = lambda d, mode, peer: rec.ratio(name.format(d, mode), peer)
    return (f"In the recorded run the bicubic and B-spline forwards took "
            f"{_times(r('fwd', 'bicubic', 'volsample-trilinear'))} and "
            f"{_times(r('fwd', 'bspline', 'volsample-trilinear'))} the trilinear kernel's time "
            f"and ran {_x(r('fwd', 'bicubic', 'scipy'))} and {_x(r('fwd', 'bspline', 'scipy'))} "
            f"as fast as SciPy's; the backwards took "
            f"{_times(r('bwd', 'bicubic', 'volsample-trilinear'))} and "
            f"{_times(r('bwd', 'bspline', 'volsample-trilinear'))} the trilinear backward's time.")


def labels(rec: Records) -> str:
    ours = rec.result("grid.fwd oasis labels N1 C36 160x192x224")
    return (f"The recorded run's median for this row is {bench_report._duration(ours.median_s)} "
            f"(its first call {bench_report._duration(ours.first_call_s)}): read it as the state of "
            f"the machine's memory as much as the kernel's.")


def warp(rec: Records) -> str:
    name = "warp.fwd affine oasis N1 C1 160x192x224"
    cell = lambda peer: bench_report._ratio_cell(rec.result(name, peer))
    return (f"In the recorded run the affine warp took "
            f"{bench_report._duration(rec.result(name).median_s)}; volsample's grid sampler on the "
            f"formed grid took {cell('volsample-grid')} its time, PyTorch {cell('pytorch')}, "
            f"affiners {cell('affiners')} (in brackets: the interquartile range over the "
            f"rounds).")


def warp_step(rec: Records) -> str:
    name = "warp.step oasis N1 C1 160x192x224"
    return (f"In the recorded run `warp` then `F.mse_loss` took "
            f"{bench_report._figure(rec.ratio(name, 'volsample-warp'))}x `warp_mse_loss`'s time "
            f"(`warp.step oasis`, {bench_report._duration(rec.result(name).median_s)}).")


def door(rec: Records) -> str:
    """What volsample.torch adds to the NumPy API on the small calls, and patch() to it."""
    small = [r.workload for r in rec.results
             if r.workload.startswith("small.") and r.implementation == "volsample-numpy"]
    us = lambda name, impl: rec.result(name, impl).median_s * 1e6
    gap = lambda names, a, b: [us(n, a) - us(n, b) for n in names]
    span = lambda values: f"{min(values):+.1f} to {max(values):+.1f} us"
    forwards = [n for n in small if n.startswith("small.fwd ")]
    steps = [n for n in small if n.startswith("small.fwd+bwd ")]
    return (f"In the recorded run the door (volsample.torch's time minus the NumPy API's on "
            f"the same call) was {span(gap(forwards, 'volsample', 'volsample-numpy'))} on the "
            f"forwards and {span(gap(steps, 'volsample', 'volsample-numpy'))} on the forward "
            f"and backward steps; `F.grid_sample` under `patch()` took "
            f"{span(gap(small, 'volsample-patch', 'volsample'))} beside volsample.torch's own "
            f"call.")


def _sweep_recorded(rec: Records) -> str:
    m = rec.sweep_meta
    load = m["load_average"]
    return (f"{m['recorded'][:10]}, {m['machine']['cpu']}, {m['machine']['threads']} threads "
            f"each, load average {load['before']:.1f} before and {load['after']:.1f} after; "
            f"`benchmarks/results/sweep.json`")


def sweep_plot(rec: Records) -> str:
    """README's plot of the backward's cost per point against the volume's size, volsample
    beside PyTorch (a Mermaid chart, which GitHub draws), and the ratios at either end."""
    ours, torch = (rec.per_point("bwd", "smooth", impl) for impl in ("volsample", "pytorch"))
    sizes = list(ours)
    top = 10 * np.ceil(max(torch.values()) / 10 * 1.05)
    ratio = lambda D: rec.sweep_ratio("bwd", "smooth", D)
    return "\n".join([
        "```mermaid",
        "xychart-beta",
        '    title "Grid sampling backward, ns per point: PyTorch (upper line), volsample (lower)"',
        f'    x-axis "D: a D^3 volume sampled at D^3 points (smooth grid, N1 C1)" '
        f"[{', '.join(map(str, sizes))}]",
        f'    y-axis "ns per point" 0 --> {top:.0f}',
        f"    line [{', '.join(f'{torch[D]:.1f}' for D in sizes)}]",
        f"    line [{', '.join(f'{ours[D]:.1f}' for D in sizes)}]",
        "```", "",
        f"The backward's time per point from {sizes[0]}^3 to {sizes[-1]}^3 ({_sweep_recorded(rec)}):"
        f" volsample {ours[sizes[0]]:.1f} to {ours[sizes[-1]]:.1f} ns, PyTorch "
        f"{torch[sizes[0]]:.1f} to {torch[sizes[-1]]:.1f} ns, {_x(ratio(sizes[0]))} and "
        f"{_x(ratio(sizes[-1]))} as fast."])


def sweep_table(rec: Records) -> str:
    """The performance page's table of the sweep: ns per point and PyTorch's time over
    volsample's, per size, direction and grid."""
    lines = [f"Recorded {_sweep_recorded(rec)}, by `{rec.sweep_meta['command']}`.", "",
             "| D^3 | grid | forward: volsample | PyTorch | ratio "
             "| backward: volsample | PyTorch | ratio |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for kind in ("smooth", "random"):
        cells = {(d, impl): rec.per_point(d, kind, impl)
                 for d in ("fwd", "bwd") for impl in ("volsample", "pytorch")}
        for D in cells["bwd", "volsample"]:
            row = [f"{D}^3", kind]
            for d in ("fwd", "bwd"):
                ours, torch = cells[d, "volsample"][D], cells[d, "pytorch"][D]
                row += [f"{ours:.1f} ns", f"{torch:.1f} ns", _x(rec.sweep_ratio(d, kind, D))]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def jax(rec: Records) -> str:
    """docs/jax.md's speed: the JAX family's tables, the door's fixed cost and vmap's."""
    ours = {r.workload: r for r in rec.jax if r.implementation == "volsample"}
    small = next(w for w in ours if w.startswith("jax.fwd 8^3"))
    numpy = next(r for r in rec.jax if r.workload == small and r.implementation == "volsample-numpy")
    vmap = [r for r in rec.jax if r.implementation == "volsample-vmap"][-1]  # the largest
    return "\n".join([
        bench_report.recorded_line(rec.jax_meta, rec.jax), "",
        bench_report.markdown_families(rec.jax, heading="###"), "",
        f"The door costs {(ours[small].median_s - numpy.median_s) * 1e6:.1f} us above the NumPy "
        f"API at 8^3 (the forward inside `jit`: {ours[small].median_s * 1e6:.1f} us against "
        f"{numpy.median_s * 1e6:.1f} us), and `jax.vmap` over 8 calls takes "
        f"{vmap.ratio:.2f}x the time of the one kernel call that N = 8 makes ("
        f"`{vmap.workload}`): it compiles to that call."])


BLOCKS: dict[str, Callable[[Records], str]] = {
    "summary": summary, "tables": tables, "register": register_table, "cubic": cubic,
    "contrast": contrast, "jax": jax,
    "labels": labels, "warp": warp, "warp-step": warp_step, "door": door,
    "sweep-plot": sweep_plot, "sweep-table": sweep_table,
    "cohort": script_figures.cohort_throughput, "account-bytes": script_figures.account_bytes,
    "account-times": script_figures.account_times,
    "account-bandwidth": script_figures.account_bandwidth}


def drawn(text: str, records: Records | None = None) -> str:
    """``text`` with every block between the markers drawn from ``records`` (by default
    the recorded files)."""
    records = records or Records.read()

    def draw(match: re.Match) -> str:
        name = match.group(1)
        if name not in BLOCKS:
            raise KeyError(f"no figures named {name!r}: one of {', '.join(BLOCKS)}")
        return f"{BEGIN.format(name)}\n{BLOCKS[name](records)}\n{END.format(name)}"

    return _BLOCK.sub(draw, text)


def blocks(text: str) -> list[str]:
    """The names of the blocks in ``text``, in order."""
    return [m.group(1) for m in _BLOCK.finditer(text)]


# -- the charts --------------------------------------------------------------------------

def plot_sweep(rec: Records):
    """Nanoseconds per point against the volume's size D (a D^3 volume sampled at D^3
    points), forward and backward, volsample and PyTorch, smooth (solid) and random
    (dotted) grids, on a log axis. The matplotlib figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(bench_plots.CHART_WIDTH, 4.8), layout="constrained")
    lines = (("bwd", "pytorch", "PyTorch, backward"), ("bwd", "volsample", "volsample, backward"),
             ("fwd", "pytorch", "PyTorch, forward"), ("fwd", "volsample", "volsample, forward"))
    for colour, (direction, impl, label) in zip(bench_plots.PALETTE, lines):
        for kind, style in (("smooth", "-"), ("random", ":")):
            cost = rec.per_point(direction, kind, impl)
            ax.plot(list(cost), list(cost.values()), style, color=colour, marker="o",
                    markersize=5, linewidth=2, label=f"{label}, {kind} grid")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    sizes = sorted({D for r in rec.sweep if (m := _SWEEP_ROW.fullmatch(r.workload))
                    for D in [int(m.group(3))]})
    ax.set_xticks(sizes, [f"{D}^3" for D in sizes])
    ax.set_xlabel("D: a D^3 volume sampled at D^3 points (N1 C1, float32)", fontsize=12)
    ax.set_ylabel("ns per point", fontsize=12)
    ax.grid(color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.legend(fontsize=9, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


CHARTS = {"against-pytorch.png": lambda rec: bench_plots.plot_against_pytorch(rec.results),
          "against-others.png": lambda rec: bench_plots.plot_against_others(rec.results),
          "registration.png": lambda rec: bench_register.plot(rec.register),
          "size-sweep.png": plot_sweep}


def write_charts(folder: Path, records: Records | None = None) -> list[Path]:
    """The performance page's charts, drawn from the records, as PNGs in ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = records or Records.read()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in CHARTS.items():
        fig = draw(records)
        fig.savefig(folder / name, dpi=100)
        plt.close(fig)
        written.append(folder / name)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true",
                        help="run the full suite first (2 threads; tens of minutes)")
    parser.add_argument("--check", action="store_true",
                        help="only check that the documents' figures are the records'")
    parser.add_argument("--charts", metavar="DIR", help="only write the charts into DIR")
    args = parser.parse_args()
    if args.charts:
        for path in write_charts(Path(args.charts)):
            print(path)
        return 0
    if args.record:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu.py"), "--threads", "2",
                        "--json", str(RECORDED.relative_to(ROOT))], check=True, cwd=ROOT)
    records = Records.read()
    stale = []
    for path in documents():
        text = path.read_text()
        if drawn(text, records) != text:
            stale.append(path)
            if not args.check:
                path.write_text(drawn(text, records))
    if args.check and stale:
        print("figures differ from benchmarks/results/ in "
              + ", ".join(str(p.relative_to(ROOT)) for p in stale)
              + ": run python benchmarks/figures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
