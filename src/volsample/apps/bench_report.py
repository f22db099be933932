"""``volsample bench``'s results as people read them: the plain table the command prints,
the record (``write_json``, ``read_json``), and the markdown that README and the
performance page draw from the record, one table per operator family."""
from __future__ import annotations

import dataclasses
import datetime
import json

from .bench_peers import PEERS
from .bench_timing import MIN_SPREAD_ROUNDS, NOISY_BANDWIDTH, NOISY_SPREAD, Result, machine_info


def format_table(results) -> str:
    """Plain table: one row per workload, volsample's median and each peer's ratio."""
    by_workload: dict[str, dict[str, Result]] = {}
    for r in results:
        by_workload.setdefault(r.workload, {})[r.implementation] = r
    peers = [p for p in PEERS if any(p in row for row in by_workload.values())]
    header = ["workload", "volsample ms", "of copy bw", "first call ms"] + [f"vs {p} (IQR)"
                                                                           for p in peers]
    rows = []
    for name, row in by_workload.items():
        ours = row["volsample"]
        cells = [name, _figure(ours.median_s * 1e3), _bandwidth_cell(ours),
                 _figure(ours.first_call_s * 1e3)]
        cells += [_ratio_cell(row[p]) + " *" * _noisy(row[p]) if p in row else "-"
                  for p in peers]
        rows.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    notes = []
    if any(_noisy(r) for r in results):
        notes.append(f"*: noisy, the rounds' ratios spread more than {NOISY_SPREAD}x "
                     f"(interquartile range); rerun on a quiet machine")
    if any(r.bandwidth_fraction_after is not None for r in results):
        notes.append("of copy bw: noisy, the copy bandwidth moved by more than "
                     f"{NOISY_BANDWIDTH}x during the run (against the start's - the end's)")
    return "\n".join([line(header), line(["-" * w for w in widths])]
                     + [line(r) for r in rows] + notes)


def _noisy(result: Result) -> bool:
    return result.ratio_iqr is not None and \
        result.ratio_iqr[1] > NOISY_SPREAD * result.ratio_iqr[0]


def _bandwidth_cell(result: Result) -> str:
    if result.bandwidth_fraction_after is None:
        return f"{result.bandwidth_fraction:.0%}"
    return f"{result.bandwidth_fraction:.0%}-{result.bandwidth_fraction_after:.0%}"


# README's names of the peers, in the order of its columns
PEER_TITLES = {"volsample-grid": "volsample's grid sampler",
                "volsample-warp": "volsample.torch.warp + F.mse_loss",
                "volsample-trilinear": "volsample trilinear",
                "volsample-numpy": "volsample's NumPy API",
                "volsample-patch": "F.grid_sample under patch()", "pytorch": "PyTorch",
                "scipy": "SciPy", "torch-interpol": "torch-interpol",
                "volresample": "volresample", "simpleitk": "SimpleITK", "jax": "JAX",
                "jax-gather": "a jax.numpy gather", "volsample-vmap": "jax.vmap of volsample.jax",
                "affiners": "affiners"}


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{_figure(seconds * 1e3)} ms"


def recorded_line(meta: dict, results: list[Result]) -> str:
    """How a recorded run (``read_json``) was taken, as one sentence: the date, the command,
    the machine, the threads, every version, the load average."""
    m = meta["machine"]
    load = meta["load_average"]
    peers = [p for p in PEERS if any(r.implementation == p for r in results)]
    versions = ", ".join(f"{PEER_TITLES[p]} {m['peers'][p]}" for p in peers
                         if not p.startswith("volsample-"))  # volsample's own: one version
    return (f"Recorded {meta['recorded'][:10]} by `{meta['command']}`: volsample "
            f"{m['volsample']} on {m['cpu']} ({m['logical_cpus']} logical CPUs, {m['isa']} "
            f"kernels), {m['threads']} threads for every implementation, Python {m['python']}, "
            f"NumPy {m['numpy']}, {versions}. Load average (1 min) {_load(load['before'])} "
            f"before the run and {_load(load['after'])} after.")


def _rows_by_workload(results) -> dict[str, dict[str, Result]]:
    by_workload: dict[str, dict[str, Result]] = {}
    for r in results:
        by_workload.setdefault(r.workload, {})[r.implementation] = r
    return by_workload


def markdown_report(meta: dict, results) -> str:
    """A recorded run (``read_json``) in one table: how it was taken, then one row per
    workload (volsample's median time, its fraction of copy bandwidth, its first call, and
    each peer's time over volsample's with the IQR over the rounds)."""
    peers = [p for p in PEERS if any(r.implementation == p for r in results)]
    lines = [
        recorded_line(meta, results),
        "",
        "| workload | volsample | of copy bandwidth | first call | "
        + " | ".join(f"vs {PEER_TITLES[p]}" for p in peers) + " |",
        "|---|" + "---:|" * (3 + len(peers)),
    ]
    for name, row in _rows_by_workload(results).items():
        ours = row["volsample"]
        cells = [f"`{name}`", _duration(ours.median_s), f"{ours.bandwidth_fraction:.0%}",
                 _duration(ours.first_call_s)]
        cells += [_ratio_cell(row[p]) if p in row else "" for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


MAX_COLUMNS = 7  # a table of a family, readable at 1280 px


def markdown_families(results: list[Result], heading: str = "###") -> str:
    """A recorded run as one table per operator family (``FAMILIES``), each under a
    ``heading`` with what its rows time, each of at most ``MAX_COLUMNS`` columns: the
    workload, volsample's median time, each peer's time over volsample's (five peers at
    most per table: more go into a second table), then, while there is room, volsample's
    fraction of copy bandwidth and its first call."""
    by_workload = _rows_by_workload(results)
    notes = {key: note for key, _, note in FAMILIES}
    out = []
    for key, names in by_family(results).items():
        out += [f"{heading} {family_title(key)[0].upper()}{family_title(key)[1:]}", ""]
        if key in notes:
            out += [notes[key][0].upper() + notes[key][1:] + ".", ""]
        peers = [p for p in PEERS if any(p in by_workload[n] for n in names)]
        for first in range(0, max(len(peers), 1), MAX_COLUMNS - 2):
            chunk = peers[first:first + MAX_COLUMNS - 2]
            extras = [("of copy bandwidth", lambda r: f"{r.bandwidth_fraction:.0%}"),
                      ("first call", lambda r: _duration(r.first_call_s))]
            extras = extras[:MAX_COLUMNS - 2 - len(chunk)]
            out.append("| workload | volsample | " + " | ".join(
                [f"vs {PEER_TITLES[p]}" for p in chunk] + [title for title, _ in extras])
                + " |")
            out.append("|---|" + "---:|" * (1 + len(chunk) + len(extras)))
            for name in names:
                row = by_workload[name]
                ours = row["volsample"]
                cells = [f"`{name}`", _duration(ours.median_s)]
                cells += [_ratio_cell(row[p]) if p in row else "" for p in chunk]
                cells += [cell(ours) for _, cell in extras]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out).rstrip("\n")


def _load(value) -> str:
    return "unknown" if value is None else f"{value:.1f}"


def _ratio_cell(result: Result) -> str:
    """``7.02x (6.8-7.3)``: the median of the per-round ratios and their IQR; ``5.53x (1
    round)`` where too few rounds were paired for an IQR."""
    assert result.ratio is not None  # a peer's result
    if result.ratio_iqr is None:
        if result.rounds is not None and result.rounds < MIN_SPREAD_ROUNDS:
            return f"{_figure(result.ratio)}x ({result.rounds} round{'s' * (result.rounds > 1)})"
        return f"{_figure(result.ratio)}x"
    return f"{_figure(result.ratio)}x ({_spread(*result.ratio_iqr)})"


def _spread(low: float, high: float) -> str:
    """``6.8-7.3``: two significant digits, three where two would not tell them apart."""
    for digits in (2, 3):
        text = f"{_figure(low, digits)}-{_figure(high, digits)}"
        if _figure(low, digits) != _figure(high, digits):
            break
    return text


def short_ratio(ratio: float) -> str:
    """A ratio as the charts and summaries write it: ``5.8x``, ``17.2x``, ``130x``."""
    return f"{ratio:.1f}x" if ratio < 10 else f"{_figure(ratio)}x"


def _figure(x: float, digits: int = 3) -> str:
    """``digits`` significant digits, never in exponent form."""
    return f"{x:.{digits}g}" if x < 10 ** digits else f"{x:.0f}"


def write_json(path, results, threads, started=None, load=(None, None), quick=False,
               command=""):
    """The results and how they were taken: the machine, the command, when, the 1-minute
    load average before and after (another program's work slows every implementation)."""
    started = started or datetime.datetime.now(datetime.timezone.utc)
    payload = {"recorded": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "command": command,
               "quick": quick, "load_average": {"before": load[0], "after": load[1]},
               "machine": machine_info(threads),
               "results": [dataclasses.asdict(r) for r in results]}
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")


def read_json(path) -> tuple[dict, list[Result]]:
    """A file ``write_json`` wrote: (everything but the results, the ``Result`` list)."""
    with open(path) as f:
        payload = json.load(f)
    results = [Result(**{**r, "ratio_iqr": tuple(r["ratio_iqr"]) if r.get("ratio_iqr")
                         else None}) for r in payload.pop("results")]
    ours = {r.workload: r for r in results if r.implementation == "volsample"}
    for r in results:  # files written before ``rounds`` was kept: the shorter side's repeats
        if r.ratio is not None and r.rounds is None and r.workload in ours:
            r.rounds = min(r.repeats, ours[r.workload].repeats)
        if r.rounds is not None and r.rounds < MIN_SPREAD_ROUNDS:
            r.ratio_iqr = None
    return payload, results


# Operator families, in report order: (key, title, what the family's rows time). A
# workload's family is its name's first word, the cubic modes a family of their own; a
# workload of a new kind is a family of its own name.
FAMILIES = (
    ("grid.fwd", "grid sampling, forward", "`grid_sample_3d`, trilinear"),
    ("grid.bwd", "grid sampling, backward", "`grid_sample_3d_backward`, trilinear: both gradients"),
    ("up.fwd", "upsampling, forward", "`upsample_trilinear_3d`"),
    ("up.bwd", "upsampling, backward", "`upsample_trilinear_3d_backward`"),
    ("warp", "warps",
     "`warp_3d` at an affine map, and a registration step through `volsample.torch` "
     "(`warp_mse_loss`: the warp, the MSE and the gradients for theta and u), against "
     "samplers fed the grid `affine_grid(theta) + u`"),
    ("cubic", "cubic sampling",
     "bicubic and B-spline `grid_sample_3d` and its backward; \"volsample trilinear\" is "
     "volsample's own trilinear sampling of the same grid (below 1: the cubic mode takes "
     "longer)"),
    ("small.fwd", "small calls, forward",
     "`volsample.torch.grid_sample`, beside volsample's NumPy API and `F.grid_sample` "
     "under `patch()` on the same tensors"),
    ("small.fwd+bwd", "small calls, forward and backward",
     "the forward, then `.sum().backward()`, through `volsample.torch`; the NumPy API's "
     "forward and backward beside it"),
    ("jax.fwd", "JAX, forward",
     "`volsample.jax.grid_sample` inside `jax.jit`, trilinear, against `map_coordinates` "
     "(order 1, per channel) and a `jax.numpy` gather; vmap8: `jax.vmap` over 8 calls "
     "against one call with N = 8"),
    ("jax.fwd+grad", "JAX, forward and gradient",
     "`jax.grad` of the samples' sum for the volume and the grid, inside `jax.jit`"),
)


_FAMILY_TITLES = {key: title for key, title, _ in FAMILIES}


def family(workload: str) -> str:
    """The operator family of a workload's name (a key of ``FAMILIES``)."""
    if " bicubic " in workload or " bspline " in workload:
        return "cubic"
    first = workload.split()[0]
    return "warp" if first.startswith("warp.") else first


def family_title(key: str) -> str:
    return _FAMILY_TITLES.get(key, key)


def by_family(results: list[Result]) -> dict[str, list[str]]:
    """{family: its workloads in report order}, the families in ``FAMILIES``' order."""
    order = [key for key, _, _ in FAMILIES]
    grouped: dict[str, list[str]] = {}
    for r in results:
        names = grouped.setdefault(family(r.workload), [])
        if r.workload not in names:
            names.append(r.workload)
    return dict(sorted(grouped.items(),
                       key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
