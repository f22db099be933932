"""The figure blocks of the records that the benchmarks' own scripts write:
``benchmarks/results/cohort.json`` (``python benchmarks/cohort.py``: docs/cli.md's
throughput of ``register-cohort``) and ``benchmarks/results/account.json`` (``python
benchmarks/backward_account.py``: docs/performance.md's account of the backward at scale).
Each block takes ``figures.Records`` (``cohort``, ``account``: the files as they hold
them) and is listed in ``figures.BLOCKS``.
"""
from __future__ import annotations


def _backward(rec, D: int, phase: str, outputs: str | None) -> dict:
    """The account's row of one size, phase and outputs ("new", "reused"; the plan's None)."""
    return next(r for r in rec.account["backward"]
                if (r["D"], r["phase"], r["outputs"]) == (D, phase, outputs))


def _bandwidth(rec, operation: str, threads: int) -> dict:
    return next(r for r in rec.account["bandwidth"]
                if (r["operation"], r["threads"]) == (operation, threads))


def _taken(record: dict, name: str, machine: str = "") -> str:
    """When, how and where a record of its own was taken (cohort.json, account.json)."""
    m, load = record["machine"], record["load_average"]
    return (f"recorded {record['recorded'][:10]} by `{record['command']}` on {m['cpu']} "
            f"({m['logical_cpus']} logical CPUs{machine}) at a load average of "
            f"{load['before']:.1f} before and {load['after']:.1f} after, "
            f"`benchmarks/results/{name}`")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def cohort_throughput(rec) -> str:
    """docs/cli.md's throughput of ``register-cohort``: one process against the cluster."""
    c = rec.cohort
    alone, cluster = c["runs"]
    same = "the same bits" if c["same_rows"] and c["same_files"] else "NOT the same bits"
    return (f"The run {_taken(c, 'cohort.json')}: {c['subjects']} subjects of "
            f"{c['size']}^3 voxels, {alone['pairs_per_minute']:.1f} pairs per minute in one "
            f"process ({_plural(alone['threads'], 'thread')}), "
            f"{cluster['pairs_per_minute']:.1f} on a LocalCluster of {cluster['workers']} "
            f"workers ({_plural(cluster['threads'], 'thread')} each, its start included), "
            f"{same}; the workers' resident memory peaked at {cluster['peak_memory_mb']:.0f} MB "
            f"at most (the one process: {alone['peak_memory_mb']:.0f} MB).")


_MB = lambda nbytes: f"{nbytes / 1e6:.0f} MB"
# The backward's memory traffic a point (float32, C1): (phase, bytes a point, where the
# bytes come from when the operands fit the last-level cache, and when they do not)
_TRAFFIC = (("the plan: each output row's planes (one parallel read of the grid)", "12", "L3",
             "memory"),
            ("the grid, read again by the slabs (a row fetched while the one before is worked)",
             "12", "L3", "memory"),
            ("grad_output", "4", "L3", "memory"),
            ("grad_grid, written past the caches (32 MiB and more: no line read first)", "12",
             "L3", "memory"),
            ("input: 8 corners a point (32 bytes of loads)", "4 beyond L2", "L2, L3",
             "memory once, then L3 a plane later"),
            ("grad_input: zeroed, then 8 corners added a point", "4 + 8 beyond L2", "L2, L3",
             "memory once, then L2, L3"))


def _sizes(rec) -> list[int]:
    return sorted({r["D"] for r in rec.account["backward"]})


def account_bytes(rec) -> str:
    """The machine and the case of the backward's account, and its table of bytes."""
    a, m = rec.account, rec.account["machine"]
    sizes, l3 = _sizes(rec), m["caches"].get("L3", 0)
    fits = {D: 36 * D**3 <= l3 for D in sizes}  # input, grad_output, grad_input 4; grid 2 x 12
    pages = {D: _backward(rec, D, "both", "new")["minor_faults"] for D in sizes}
    caches = f"; {m['isa']}, {m['caches'].get('L2', 0) >> 10} KiB of L2 a core, {l3 >> 20} MiB of L3"
    lines = [f"The account was {_taken(a, 'account.json', caches)}. {a['threads']} threads "
             "split grad_input into " + " or ".join(f"{a['slabs'][str(D)]} ({D}^3)" for D in sizes)
             + " slabs of input planes.", "",
             "| phase | bytes a point | " + " | ".join(
                 f"{D}^3 (the operands, {_MB(36 * D**3)}{', fit L3' if fits[D] else ''})"
                 for D in sizes) + " |", "|---|---:|" + "---|" * len(sizes)]
    lines += [f"| {phase} | {nbytes} | " + " | ".join(near if fits[D] else far for D in sizes)
              + " |" for phase, nbytes, near, far in _TRAFFIC]
    lines.append("| new pages for the two results, zeroed by the operating system | 16 | "
                 + " | ".join(f"{_MB(16 * D**3)} a call ({pages[D]:.0f} faults)" if pages[D]
                              else "none" for D in sizes) + " |")
    return "\n".join(lines)


def account_times(rec) -> str:
    """The CPU time a point of each phase, new outputs against reused, and the faults."""
    a, sizes = rec.account, _sizes(rec)
    ns = lambda D, phase, outputs: _backward(rec, D, phase, outputs)["cpu_ns_per_point"]
    lines = [f"Median of {a['repeats']} calls (`benchmarks/results/account.json`):", "",
             f"| {a['threads']} threads, CPU time a point (ns) | " + " | ".join(
                 f"{D}^3 new outputs | {D}^3 outputs reused" for D in sizes) + " |",
             "|---|" + "---:|" * 2 * len(sizes)]
    for phase, title in (("both", "both gradients"), ("grad_input", "grad_input only"),
                         ("grad_grid", "grad_grid only")):
        lines.append(f"| {title} | " + " | ".join(
            f"{ns(D, phase, 'new'):.1f} | {ns(D, phase, 'reused'):.1f}" for D in sizes) + " |")
    lines.append("| the plan alone | "
                 + " | ".join(f"{ns(D, 'plan', None):.1f} | " for D in sizes) + " |")
    big = sizes[-1]
    extra = ns(big, "both", "new") - ns(big, "both", "reused")
    faults = _backward(rec, big, "both", "new")["minor_faults"]
    zeroing = (f"{_MB(16 * big**3)} of new pages a call: {16 / extra:.1f} GB zeroed a second "
               f"of that CPU time" if extra > 0 else "within the noise")
    return "\n".join(lines + [
        "", f"At {big}^3 new outputs cost {extra:.1f} ns of CPU a point more than reused ones "
        f"({zeroing}), grad_grid's {_MB(12 * big**3)} alone "
        f"{ns(big, 'grad_grid', 'new') - ns(big, 'grad_grid', 'reused'):.1f} ns; a call took "
        f"{faults:.0f} minor page faults ({faults / big**3 * 1e5:.1f} in 100,000 points), "
        f"where 4 KiB pages would take {16 * big**3 / 4096:,.0f}."])


def account_bandwidth(rec) -> str:
    """The machine's bandwidth, and the memory's floor under the backward at scale."""
    a = rec.account
    counts = sorted({r["threads"] for r in a["bandwidth"]})
    gb = lambda op, t: _bandwidth(rec, op, t)["gb_per_s"]
    mib, touch = a["bandwidth_bytes"] >> 20, _bandwidth(rec, "first_touch", 1)["minor_faults"]
    lines = [f"Bandwidth in the same run ({mib} MiB a pass, median of "
             f"{_bandwidth(rec, 'write', 1)['passes']} passes):", "",
             "| | " + " | ".join(_plural(t, "thread") for t in counts) + " |",
             "|---|" + "---:|" * len(counts)]
    for op, title in (("write", "write, memory already mapped"),
                      ("first_touch", "first touch (zeroed by the operating system, then written)"),
                      ("read", "read"), ("copy", "copy (bytes read and written)")):
        lines.append(f"| {title} | " + " | ".join(f"{gb(op, t):.1f} GB/s" for t in counts) + " |")
    big, t = _sizes(rec)[-1], a["threads"]
    work = _backward(rec, big, "both", "reused")["cpu_ns_per_point"] / t
    floor = lambda n: (52 / gb("copy", n), 16 / gb("first_touch", n))
    return "\n".join(lines + [
        "", f"A first touch of {mib} MiB took {touch:.0f} minor page faults (one per "
        f"{mib * 1024 / max(touch, 1):,.0f} KiB).", "",
        f"The floor. At {big}^3 the backward must move about 52 bytes a point to and from "
        f"memory (12 + 12 + 4 + 12 + 4 + 8) and have 16 zeroed: at the copy and first-touch "
        f"bandwidths above, " + ", ".join(
            f"{floor(n)[0]:.1f} + {floor(n)[1]:.1f} ns a point on {_plural(n, 'thread')}"
            for n in counts)
        + f", against {work:.1f} ns a point of the kernels' work with reused outputs "
        f"({work * t:.1f} ns of CPU over {t} threads): {work / sum(floor(t)):.1f}x the "
        f"memory's floor."])
