"""How ``volsample bench`` times: a workload's implementations in rounds, back to back
(warm-up excluded, the same thread count for all), the ratio of each peer's time to
volsample's per round (the median and the interquartile range over the rounds), the first
call's time, and the bytes moved as a fraction of this machine's copy bandwidth; and the
machine a run was taken on."""
from __future__ import annotations

import dataclasses
import math
import os
import platform
import random
import time
from collections.abc import Callable

import numpy as np

import volsample

from .._progress import ProgressBar
from .bench_peers import PEERS, have, peer_versions


@dataclasses.dataclass
class Workload:
    """One benchmark: ``build()`` makes the inputs and returns {implementation: callable}."""

    name: str
    build: Callable[[], dict]
    nbytes: int  # bytes a perfect implementation reads and writes once
    quick: bool = False  # part of the --quick suite


@dataclasses.dataclass
class Result:
    workload: str
    implementation: str
    median_s: float
    first_call_s: float
    repeats: int
    bandwidth_fraction: float
    ratio: float | None = None  # the median over the rounds of this peer's time / volsample's
    # The interquartile range of the ratio over the rounds (each round times volsample and
    # this peer once, back to back): how far a ratio can be trusted on this machine; None
    # where fewer than MIN_SPREAD_ROUNDS rounds were paired (quartiles of one or two values
    # say nothing).
    ratio_iqr: tuple[float, float] | None = None
    rounds: int | None = None  # the rounds the ratio pairs (a peer's result)
    # bandwidth_fraction against the copy bandwidth measured after the run (the one above:
    # before it), where the two differ by more than NOISY_BANDWIDTH: the machine's memory
    # system did not hold still
    bandwidth_fraction_after: float | None = None


# Timing limits of a full run and of --quick: the quick workloads take microseconds, so
# each of their samples times a batch of calls (at least ``min_sample_seconds``) and more
# rounds are taken, for a median that holds from one run to the next.
LIMITS = dict(min_repeats=5, min_seconds=0.3, max_repeats=50, max_seconds=10.0)


QUICK_LIMITS = dict(min_repeats=25, min_seconds=0.2, max_repeats=200, max_seconds=2.0,
                    min_sample_seconds=2e-3)


# The fewest paired rounds whose interquartile range is reported: a slow workload (seconds
# a call) stops after ``max_seconds``, sometimes after one round.
MIN_SPREAD_ROUNDS = 4


# A ratio whose rounds spread wider than this (the interquartile range's high over its
# low) is marked noisy in the plain table, as is a copy bandwidth that moved by more than
# NOISY_BANDWIDTH between the start and the end of a run: a figure the machine did not
# hold still for (another program's work, a peer's own thread pool), to rerun quietly.
NOISY_SPREAD = 1.5


NOISY_BANDWIDTH = 1.25


def time_calls(fns, min_repeats=5, min_seconds=0.3, max_repeats=50, max_seconds=10.0):
    """{name: (first call seconds, median seconds of the later calls, repeats)} for the
    callables ``fns`` (a dict), timed in rounds (``time_rounds``)."""
    timed = time_rounds(fns, min_repeats, min_seconds, max_repeats, max_seconds)
    return {name: (first, float(np.median(times)), len(times))
            for name, (first, times) in timed.items()}


def time_rounds(fns, min_repeats=5, min_seconds=0.3, max_repeats=50, max_seconds=10.0,
                min_sample_seconds=0.0):
    """{name: (first call seconds, [seconds per call of each later round])} for the
    callables ``fns`` (a dict), timed in rounds: each round calls every one still short of
    its repeats once, so a machine that drifts (a shared VM) moves all of them alike and
    their ratios hold. After the first round, in ``fns``' order, each round takes them in
    an order of its own (shuffled, with a fixed seed): a call pays for what the call before
    it left in the caches (PyTorch's small backward leaves the next call about 100 us
    slower at 32^3 C16), and a fixed order, or a rotation of it, would make one of them
    always pay for the same other one.

    Repeats are adaptive, per callable: at least ``min_repeats`` and ``min_seconds`` of
    its own time, but a slow call (the big shapes: seconds each) stops after
    ``max_seconds`` of repeats, at least one. A call faster than ``min_sample_seconds``
    (timed three times after the first) is repeated in each round as many times as take that
    long, the sample its mean: a timer's resolution and one-off stalls then weigh less."""
    first, times, spent = {}, {name: [] for name in fns}, dict.fromkeys(fns, 0.0)
    batch = dict.fromkeys(fns, 1)
    for name, fn in fns.items():
        start = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - start
        if min_sample_seconds:  # sized by the slowest of three warm calls: never too long
            warm = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                warm.append(time.perf_counter() - start)
            slowest = max(max(warm), 1e-7)
            batch[name] = max(1, min(10_000, math.ceil(min_sample_seconds / slowest)))

    def wanted(name):
        n = len(times[name])
        if n >= max_repeats or (n and spent[name] >= max_seconds):
            return False
        return n < min_repeats or spent[name] < min_seconds

    order, shuffle = list(fns), random.Random(0).shuffle
    while any(wanted(name) for name in order):
        for name in order:
            if wanted(name):
                start = time.perf_counter()
                for _ in range(batch[name]):
                    fns[name]()
                elapsed = time.perf_counter() - start
                times[name].append(elapsed / batch[name])
                spent[name] += elapsed
        shuffle(order)
    return {name: (first[name], times[name]) for name in fns}


def time_call(fn, **limits):
    """(first call seconds, median seconds of the later calls, repeats) of ``fn`` alone
    (``time_calls``' limits)."""
    return time_calls({"": fn}, **limits)[""]


def copy_bandwidth(nbytes=1 << 27):
    """Bytes per second this machine copies (read + write), median of a few copies."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    _, median, _ = time_call(lambda: np.copyto(dst, src), min_repeats=5, min_seconds=0.1)
    return 2 * nbytes / median


def run(workloads, threads=None, peers=PEERS, progress=True, limits=None):
    """Time every workload's implementations (``time_rounds`` with ``limits``, by default
    ``LIMITS``); return the list of ``Result``."""
    threads = threads or volsample.get_num_threads()
    volsample.set_num_threads(threads)
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # affiners' pool, made by its first call
    if have("torch"):
        import torch

        torch.set_num_threads(threads)
    if have("volresample"):
        import volresample

        volresample.set_num_threads(threads)
    bandwidth = copy_bandwidth()
    results: list[Result] = []
    bar = ProgressBar(len(workloads), progress)
    for workload in workloads:
        impls = {name: fn for name, fn in workload.build().items()
                 if name == "volsample" or name in peers}
        timed = time_rounds(impls, **(limits or LIMITS))
        ours = timed.get("volsample")
        for name, (first, times) in timed.items():
            median = float(np.median(times))
            result = Result(workload.name, name, median, first, len(times),
                            workload.nbytes / median / bandwidth)
            if name != "volsample" and ours is not None:
                # paired by round (timed back to back), over the rounds both ran: a
                # machine that slows down mid-run moves both sides of each ratio alike
                rounds = min(len(times), len(ours[1]))
                ratios = np.divide(times[:rounds], ours[1][:rounds])
                low, result.ratio, high = (float(q) for q in np.percentile(ratios, [25, 50, 75]))
                result.rounds = rounds
                result.ratio_iqr = (low, high) if rounds >= MIN_SPREAD_ROUNDS else None
            results.append(result)
        bar.step(workload.name)
    bar.close()
    after = copy_bandwidth()
    if max(bandwidth, after) > NOISY_BANDWIDTH * min(bandwidth, after):
        for result in results:
            result.bandwidth_fraction_after = result.bandwidth_fraction * bandwidth / after
    return results


def cpu_model() -> str:
    """The CPU's marketing name where the OS tells it (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine_info(threads):
    from .. import _backends

    return {"python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor(), "cpu": cpu_model(),
            "logical_cpus": os.cpu_count(), "isa": _backends.cpu_core().isa(), "threads": threads,
            "volsample": volsample.__version__, "numpy": np.__version__,
            "peers": peer_versions()}


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None
