"""
Benchmark against PyTorch, SciPy, volresample and SimpleITK
===========================================================

``volsample bench`` times volsample's operators against their peers on the same inputs.
This page plots the recorded run, ``benchmarks/results/cpu.json``, the same file
README's and the :doc:`performance page <../performance>`'s figures are drawn from:
nothing is timed while this site is built, so the figures here are that run's, on the
machine and at the date it names. The performance page has a table per operator family.
"""

from pathlib import Path

import matplotlib.pyplot as plt

from volsample.apps import bench_plots, bench_report

# %%
# The recorded run
# ----------------
# ``bench_report.read_json`` reads what ``volsample bench --json FILE`` wrote: how the run was
# taken (machine, date, threads, versions, load) and one result per workload and
# implementation.
# The file is in the repository: look for it from the current folder up (the docs
# build runs this page in docs/examples/).
here = Path.cwd().resolve()
recorded = next(
    folder / "benchmarks" / "results" / "cpu.json"
    for folder in (here, *here.parents)
    if (folder / "benchmarks" / "results" / "cpu.json").exists()
)
meta, results = bench_report.read_json(recorded)
machine = meta["machine"]
print(
    f"recorded {meta['recorded']} on {machine['cpu']}, "
    f"{machine['threads']} threads, {machine['isa']} kernels; "
    f"load average {meta['load_average']['before']:.1f} before, "
    f"{meta['load_average']['after']:.1f} after"
)
print(bench_report.format_table(results))

# %%
# volsample's speed-up
# --------------------
# Each other implementation's time over volsample's, on log axes (the ratios run from
# about 1 to hundreds): above 1, volsample is faster. On top, PyTorch per operator
# family; below, each other library; a dot per workload, a bar to the median.
# ``volsample bench --plot FILE.png`` draws the same charts for a run of your own.
fig = bench_plots.plot(results)
plt.show()
