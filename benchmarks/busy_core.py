"""volsample beside a busy core: each workload's median time at 1 and 2 threads while another
process keeps one core busy (a pure-Python loop pinned to it), so that one of volsample's
two threads shares its core.

    python benchmarks/busy_core.py [--filter PATTERN ...] [--wait-policy default passive ...]
                                   [--no-busy] [--busy-cpu 1]

Each (wait policy, thread count) runs in a child process of its own, since OpenMP reads
OMP_WAIT_POLICY when it starts; "default" leaves the environment as volsample finds it,
"spin=N" sets GOMP_SPINCOUNT=N (libgomp: spin N rounds, then sleep).
Prints how often an empty 2-thread region's threads ran on distinct CPUs, then one line per
workload: the medians at 1 and 2 threads and their ratio (2 threads no slower than 1 is at
most 1.00).
"""
import argparse
import json
import os
import subprocess
import sys

WORKLOADS = ["grid.bwd smooth N1 C1 96x112x96", "grid.fwd smooth N1 C8 96x112x96",
             "up.bwd unet N2 C16 40^3 x2", "up.fwd unet N2 C16 40^3 x2",
             "warp.fwd affine oasis N1 C1 160x192x224"]


def child(names, threads):
    import volsample
    from volsample import _cpu
    from volsample.apps import bench_timing, bench_workloads

    volsample.set_num_threads(threads)
    chosen = [w for w in bench_workloads.suite() if w.name in names]
    medians = {}
    for w in chosen:
        fn = w.build()["volsample"]
        medians[w.name] = bench_timing.time_call(fn, min_repeats=7, min_seconds=0.5)[1]
    # How often an (empty) region's threads settle on distinct CPUs (src/cpp/team.h).
    placed = [_cpu.team_cpus(threads) for _ in range(100)]
    medians["apart"] = sum(len(set(p)) == len(p) for p in placed) / len(placed)
    print(json.dumps(medians))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", nargs="*", default=WORKLOADS, metavar="NAME")
    parser.add_argument("--wait-policy", nargs="*", default=["default"],
                        help="OMP_WAIT_POLICY values, or spin=N for GOMP_SPINCOUNT=N, to run under "
                             "(default: as found)")
    parser.add_argument("--no-busy", action="store_true", help="no busy process beside")
    parser.add_argument("--busy-cpu", type=int, default=1)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.filter, args.child)
    busy = None
    if not args.no_busy:
        busy = subprocess.Popen(["taskset", "-c", str(args.busy_cpu), sys.executable, "-c",
                                 "while 1: pass"])
    try:
        for policy in args.wait_policy:
            env = dict(os.environ)
            if policy.startswith("spin="):
                env["GOMP_SPINCOUNT"] = policy.removeprefix("spin=")
            elif policy != "default":
                env["OMP_WAIT_POLICY"] = policy
            runs = {}
            for threads in (1, 2):
                out = subprocess.run([sys.executable, __file__, "--child", str(threads),
                                      "--filter", *args.filter], env=env, check=True,
                                     capture_output=True, text=True).stdout
                runs[threads] = json.loads(out.splitlines()[-1])
            print(f"{policy:8s} a 2-thread region's threads on distinct CPUs: "
                  f"{runs[2]['apart']:.0%} of 100", flush=True)
            for name in args.filter:
                one, two = runs[1][name], runs[2][name]
                print(f"{policy:8s} {name:45s} 1 thread {one * 1e3:8.2f} ms  "
                      f"2 threads {two * 1e3:8.2f} ms  2/1 {two / one:5.2f}", flush=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    sys.exit(main())
