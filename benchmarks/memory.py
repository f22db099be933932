"""Peak extra memory of each operator, as ``tests/test_memory.py`` measures and bounds it.

For every operator and dtype, on one large-ish case (a 64^3 volume of 4 channels for grid
sampling, 48^3 <-> 96^3 for upsampling), it prints

* results: the bytes of the arrays the call returns;
* workspace: the documented scratch bytes (``backward_workspace_nbytes`` /
  ``forward_workspace_nbytes``; grid sampling's forward has none);
* traced: peak bytes NumPy allocated during the call (tracemalloc) minus the results;
* rss: peak resident-set growth of a child process during the call (VmHWM after
  clearing it; sees the C++ kernels' allocations too) minus the results.

Each call is made once before it is measured (compilation is not counted), with the
default thread count. Run: ``python benchmarks/memory.py [--threads N]``.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from test_memory import make_case, rss_growth, traced_peak  # noqa: E402

import volsample  # noqa: E402

CASES = [
    ("grid_sample_3d", (64, 64, 64), (64, 64, 64)),
    ("grid_sample_3d_backward", (64, 64, 64), (64, 64, 64)),
    ("upsample_trilinear_3d", (48, 48, 48), (96, 96, 96)),
    ("upsample_trilinear_3d_backward", (48, 48, 48), (96, 96, 96)),
]
DTYPES = ["float16", "bfloat16", "float32", "float64"]
MB = 1 << 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="volsample threads (default: all)")
    args = parser.parse_args()
    if args.threads:
        volsample.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the child processes' default too
    print(f"threads: {volsample.get_num_threads()}; N=1, C=4, NCDHW; MiB")
    header = f"{'operator':32s} {'dtype':9s} {'shape':>20s} {'results':>8s} {'workspace':>9s} " \
             f"{'traced':>8s} {'rss':>8s}"
    print(header)
    print("-" * len(header))
    for op, in_dhw, out_dhw in CASES:
        for dtype in DTYPES:
            case = dict(op=op, dtype=dtype, in_dhw=in_dhw, out_dhw=out_dhw)
            call, workspace = make_case(**case)
            peak, results = traced_peak(call)
            del call
            rss = rss_growth(**case)
            shape = f"{'x'.join(map(str, in_dhw))}->{'x'.join(map(str, out_dhw))}"
            print(f"{op:32s} {dtype:9s} {shape:>20s} {results / MB:8.2f} {workspace / MB:9.2f} "
                  f"{(peak - results) / MB:8.2f} {(rss['grown'] - rss['results']) / MB:8.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
