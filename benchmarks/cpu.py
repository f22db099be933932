"""CPU benchmarks of the four NumPy operators beside PyTorch, SciPy, volresample, SimpleITK
and JAX (each where installed), in one process, through the shared harness
(``volsample.apps.bench``, also ``volsample bench``).

    python benchmarks/cpu.py [--threads 2] [--filter PATTERN] [--json FILE]

Prints medians (warm-up excluded), the first call's time on its own column, and the ratio
peer time / volsample time for every workload of the suite.
"""
import argparse
import sys

from volsample.apps import bench

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_bench_arguments(parser)
    args = parser.parse_args()
    if args.threads is None:
        args.threads = 2  # the reference machine of the recorded run (benchmarks/results/cpu.json)
    sys.exit(bench.run_bench(args))
