"""``volsample bench``: the command that runs the workloads of ``bench_workloads`` through
``bench_timing`` against the peers of ``bench_peers`` (``--register``: ``bench_register``)
and prints ``bench_report``'s table, writes its record and ``bench_plots``' charts."""
from __future__ import annotations

import argparse
import datetime
import fnmatch
import sys

import volsample

from . import bench_register
from .bench_peers import peer_versions
from .bench_plots import write_plot
from .bench_report import format_table, write_json
from .bench_timing import LIMITS, QUICK_LIMITS, cpu_model, load_average, run
from .bench_workloads import suite


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny workloads only (seconds)")
    parser.add_argument("--filter", metavar="PATTERN",
                        help="only workloads whose name matches this glob or contains it")
    parser.add_argument("--threads", type=int, help="threads for every implementation "
                        "(default: volsample's current count)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write a bar chart of the ratios")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (shown by default when stderr is a terminal)")
    parser.add_argument("--register", action="store_true",
                        help="the registration benchmark instead: volsample register against "
                             "ANTsPy SyN on the MNI152 template under a known map (needs "
                             "nilearn and nibabel; minutes)")
    parser.add_argument("--register-scale", type=int, choices=(1, 2), default=1, metavar="MM",
                        help="with --register: the fixed template's voxel size, 1 mm (default) "
                             "or 2 mm (a quick run)")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="with --register: rounds of runs (medians reported)")
    parser.add_argument("--register-contrast", action="store_true",
                        help="with --register: the moving image's contrast remapped by a smooth "
                             "non-monotonic curve, and volsample registers with --loss mi")


def select(workloads, quick=False, pattern=None):
    chosen = [w for w in workloads if w.quick] if quick else [w for w in workloads if not w.quick]
    if pattern:
        chosen = [w for w in chosen if pattern in w.name or fnmatch.fnmatch(w.name, pattern)]
    return chosen


def run_bench(args: argparse.Namespace) -> int:
    if args.register:
        threads = args.threads or volsample.get_num_threads()
        return bench_register.main(args.register_scale, threads, args.repeats, args.json,
                                   contrast=args.register_contrast)
    workloads = select(suite(), args.quick, args.filter)
    if not workloads:
        print(f"volsample bench: error: --filter: no workload{' of --quick' if args.quick else ''} "
              f"matches {args.filter!r}", file=sys.stderr)
        return 2
    threads = args.threads or volsample.get_num_threads()
    started, load = datetime.datetime.now(datetime.timezone.utc), load_average()
    results = run(workloads, threads, progress=not args.no_progress and sys.stderr.isatty(),
                  limits=QUICK_LIMITS if args.quick else LIMITS)
    print(f"volsample {volsample.__version__}, {threads} threads, {cpu_model()}; times are "
          f"medians of repeats, warm-up excluded; ratios are peer time / volsample time "
          f"(above 1: volsample is faster), each round timing all implementations back to "
          f"back: the median over the rounds, in brackets the interquartile range")
    if args.quick:
        print("--quick: tiny volumes, whose time is mostly each call's fixed cost (argument "
              "checks, dispatch, thread start-up), not the kernels': the full suite measures "
              "those")
    print("peers: " + ", ".join(f"{peer} {version or '(not installed)'}"
                                for peer, version in peer_versions().items()))
    print(format_table(results))
    if args.json:
        command = " ".join(["volsample bench", *(["--quick"] if args.quick else []),
                            *(["--filter", repr(args.filter)] if args.filter else []),
                            f"--threads {threads} --json {args.json}"])
        write_json(args.json, results, threads, started, (load, load_average()), args.quick,
                   command)
    if args.plot:
        write_plot(args.plot, results)
    return 0
