"""
Benchmark against PyTorch and SciPy
===================================

``volsample bench`` times volsample's operators against their peers on the same inputs.
This page runs a handful of its workloads, at half size, on the machine that built the
documentation (so the numbers are that machine's, and noisy); the full tables are on the
:doc:`performance page <../performance>`.
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

import volsample
from volsample import bench

# %%
# Run the workloads
# -----------------
# ``bench.suite(shrink=2)`` halves every spatial size; the names keep the full sizes.
wanted = (
    "grid.fwd smooth N1 C1",
    "grid.bwd smooth N1 C1",
    "grid.fwd random",
    "up.fwd unet N2 C16",
    "up.bwd unet N2 C16",
    "up.fwd field",
)
workloads = [w for w in bench.suite(shrink=2) if w.name.startswith(wanted)]
results = bench.run(
    workloads,
    threads=volsample.get_num_threads(),
    peers=("pytorch", "scipy"),
    progress=False,
)
print(bench.format_table(results))

# %%
# volsample's speed-up
# --------------------
# ``volsample bench --plot FILE.png`` draws this chart (``bench.write_plot``): peer time
# over volsample time, so above 1 volsample is faster.
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "bench.png"
    bench.write_plot(path, results)
    image = plt.imread(path)
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100))
ax = fig.add_axes((0, 0, 1, 1))
ax.imshow(image)
ax.axis("off")
