"""The registration benchmark (``volsample bench --register``): real anatomy, a known map.

The pair is built from the MNI152 2009 template that ships inside the nilearn wheel (T1 at
1 mm, 197x233x189, and its grey- and white-matter probability maps). The fixed image is
the template; the moving image is the template seen through a known map

    phi(y) = A y + b + u(y)      (moving world point y -> template world point, mm)

(a rotation, scaling and shift, plus a smooth field ``u`` of sines) on a grid of 1.5x
coarser voxels, with a smooth multiplicative bias field and Gaussian noise. Labels (1 grey
matter, 2 white matter: where that map is above one half) go through the same map
(nearest).

Each registration tool runs in a child process of its own (its wall time and its peak
resident set are that process's), on the NIfTI files of the pair, with the same thread
count: ``volsample register`` as a user runs it (reading and writing NIfTI included), and,
where installed, the peers of ``bench_register_peers``: Greedy as its tutorial registers
brain MRI (affine, then deformable) and ANTsPy's ``registration(type_of_transform="SyN")``
(their registration calls timed alone as well). Each tool's result is read back as the moving world point psi(x) it assigns to every fixed
voxel x, and scored by

- Dice per label of the fixed labels against the moving labels warped (nearest);
- the error against the known map inside the brain: ``|phi(psi(x)) - x|`` in mm, over the
  fixed voxels whose grey + white matter probability is above one half (phi is known in
  closed form, so no inverse is needed).

``scale=2`` builds the same pair at 2 mm (moving 3 mm) for quick runs. ``contrast=True``
remaps the moving image's normalised intensities x to ``remap_contrast(x) = sin(3 x)^2``, a
smooth curve that rises, then falls (grey matter turns brightest, white matter darker,
background stays dark: a contrast no linear map of a T1 gives), and volsample registers it
with ``--loss mi``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import registration
from .bench_register_peers import PEAK, PEERS, VOLSAMPLE

TOOLS = ("volsample", *PEERS)
_TOOL_MODULES = {"volsample": "nibabel", **{tool: peer.module for tool, peer in PEERS.items()}}
LABELS = {1: "grey matter", 2: "white matter"}
_TEMPLATE = "mni_icbm152_{}_tal_nlin_sym_09a_converted.nii.gz"

# The known map: rotations (rad, about x, y, z), scalings, shift (mm), and the smooth field's
# peak (mm) and wavelengths (mm); the bias field's peak (relative) and the noise's standard
# deviation (of the image's 99.5th percentile).
_ROTATION = (0.06, -0.05, 0.08)
_SCALING = (1.04, 0.97, 1.02)
_SHIFT = (4.0, -6.0, 3.0)
_FIELD_PEAK_MM = 4.0
_BIAS = 0.15
_NOISE = 0.02


def rotation(angles: Sequence[float] | np.ndarray) -> np.ndarray:
    """The 3x3 rotation by angles (a, b, c) radians about x, then y, then z."""
    a, b, c = angles
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return rz @ ry @ rx


def _have(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def available_tools() -> dict[str, bool]:
    """{tool: whether its package is installed}."""
    return {tool: _have(module) for tool, module in _TOOL_MODULES.items()}


# ---------------------------------------------------------------------------------------
# The pair
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KnownMap:
    """phi(y) = linear (y - centre) + centre + shift + u(y), world mm to world mm; u is a sum
    over channels of products of sines (wavelengths about 100-200 mm), peak ``peak`` mm."""

    linear: np.ndarray
    centre: np.ndarray
    shift: np.ndarray
    frequency: np.ndarray  # (3 channels, 3 axes), radians per mm
    phase: np.ndarray      # (3, 3)
    peak: float

    @classmethod
    def default(cls, centre) -> KnownMap:
        rng = np.random.default_rng(35)
        return cls(rotation(_ROTATION) @ np.diag(_SCALING), np.asarray(centre, float),
                   np.array(_SHIFT), rng.uniform(2 * np.pi / 200, 2 * np.pi / 100, (3, 3)),
                   rng.uniform(0, 2 * np.pi, (3, 3)), _FIELD_PEAK_MM)

    def __call__(self, y: np.ndarray) -> np.ndarray:
        """phi of world points ``y`` (..., 3)."""
        out = (y - self.centre) @ self.linear.T + self.centre + self.shift
        for channel in range(3):
            out[..., channel] += self.peak * np.prod(
                np.sin(y * self.frequency[channel] + self.phase[channel]), axis=-1)
        return out


@dataclasses.dataclass
class TemplatePair:
    fixed: np.ndarray
    fixed_affine: np.ndarray
    fixed_labels: np.ndarray
    brain: np.ndarray  # the fixed voxels where the error is measured
    moving: np.ndarray
    moving_affine: np.ndarray
    moving_labels: np.ndarray
    known: KnownMap


def template_files() -> dict[str, str]:
    """Paths of the MNI152 2009 T1, grey- and white-matter maps inside nilearn's wheel."""
    import importlib.util

    spec = importlib.util.find_spec("nilearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the registration benchmark needs nilearn's MNI152 template: "
                          "pip install nilearn")
    data = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data")
    return {kind: os.path.join(data, _TEMPLATE.format(kind)) for kind in ("t1", "gm", "wm")}


def _world(shape, affine):
    """World coordinates (D, H, W, 3) of every voxel of a grid."""
    index = np.stack(np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape),
                                 indexing="ij"), -1)
    return index @ affine[:3, :3].T + affine[:3, 3]


def _sample(volume, affine, points, order):
    """``volume`` (with its affine) at world ``points`` (..., 3): SciPy, 0 outside."""
    from scipy import ndimage

    index = (points - affine[:3, 3]) @ np.linalg.inv(affine[:3, :3]).T
    return ndimage.map_coordinates(volume, np.moveaxis(index, -1, 0), order=order,
                                   mode="constant", cval=0.0)


def _coarsen(volume, affine, factor):
    """The volume blurred and subsampled by an integer ``factor`` (voxel centres kept on
    the template's lattice), with its affine."""
    from scipy import ndimage

    if factor == 1:
        return volume, affine
    smooth = ndimage.uniform_filter(volume, factor, mode="nearest")
    out = affine.copy()
    out[:3, :3] = affine[:3, :3] * factor
    return smooth[::factor, ::factor, ::factor], out


def remap_contrast(volume: np.ndarray) -> np.ndarray:
    """The contrast pair's intensities: sin(3 x)^2 of the normalised ones x (cut at 1.2)."""
    x = registration.normalise_intensity(volume)
    return (np.sin(3 * np.clip(x, 0, 1.2)) ** 2).astype(np.float32)


def template_pair(scale: int = 1, contrast: bool = False) -> TemplatePair:
    """The fixed template at ``scale`` mm and the moving one at 1.5 ``scale`` mm, moved by
    the known map, with bias and noise (deterministic); with ``contrast``, the moving
    intensities through ``remap_contrast``."""
    import nibabel as nib
    from scipy import ndimage

    files = template_files()
    images: dict[str, Any] = {kind: nib.load(path) for kind, path in files.items()}
    affine = np.asarray(images["t1"].affine, np.float64)
    t1, gm, wm = (np.asarray(images[k].get_fdata(), np.float32) for k in ("t1", "gm", "wm"))
    labels = np.where((gm > 0.5) & (gm >= wm), 1, np.where(wm > 0.5, 2, 0)).astype(np.int16)
    fixed, fixed_affine = _coarsen(t1, affine, scale)
    brain_prob, _ = _coarsen(gm + wm, affine, scale)
    fixed_labels = labels[::scale, ::scale, ::scale] if scale > 1 else labels
    # the moving grid: 1.5x the voxel size, over the same field of view
    spacing = 1.5 * scale
    extent = (np.array(t1.shape) - 1) * np.abs(np.diag(affine[:3, :3]))
    moving_shape = tuple(int(n) for n in np.floor(extent / spacing) + 1)
    moving_affine = np.diag([spacing, spacing, spacing, 1.0]) * np.sign(
        np.append(np.diag(affine[:3, :3]), 1))
    moving_affine[:3, 3] = affine[:3, 3]
    centre = affine[:3, :3] @ ((np.array(t1.shape) - 1) / 2) + affine[:3, 3]
    known = KnownMap.default(centre)
    points = known(_world(moving_shape, moving_affine))
    blurred = ndimage.gaussian_filter(t1, 0.4 * 1.5) if spacing > 1 else t1
    moving = _sample(blurred, affine, points, 1)
    moving_labels = _sample(labels, affine, points, 0).astype(np.int16)
    rng = np.random.default_rng(1)
    unit = (_world(moving_shape, moving_affine) - centre) / extent.max()
    bias = np.exp(_BIAS * np.sin(2.0 * unit[..., 0] + 0.5) * np.cos(1.5 * unit[..., 1])
                  + _BIAS * unit[..., 2])
    level = np.percentile(moving, 99.5)
    moving = (moving * bias + rng.normal(0, _NOISE * level, moving_shape)).astype(np.float32)
    if contrast:
        moving = remap_contrast(moving)
    return TemplatePair(fixed.astype(np.float32), fixed_affine, fixed_labels,
                        brain_prob > 0.5, moving, moving_affine, moving_labels, known)


def write_pair(pair: TemplatePair, folder: str) -> dict[str, str]:
    """The pair as NIfTI files under ``folder``: {fixed, moving, fixed_labels, moving_labels}."""
    import nibabel as nib

    paths = {}
    for name, data, affine in (("fixed", pair.fixed, pair.fixed_affine),
                               ("moving", pair.moving, pair.moving_affine),
                               ("fixed_labels", pair.fixed_labels, pair.fixed_affine),
                               ("moving_labels", pair.moving_labels, pair.moving_affine)):
        paths[name] = os.path.join(folder, f"{name}.nii.gz")
        nib.save(nib.Nifti1Image(data, affine), paths[name])
    return paths


# ---------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------


def dice_per_label(fixed_labels: np.ndarray, warped_labels: np.ndarray) -> dict[int, float]:
    """{label: Dice} for the labels of ``LABELS``."""
    return {k: float(2 * np.sum((fixed_labels == k) & (warped_labels == k))
                     / (np.sum(fixed_labels == k) + np.sum(warped_labels == k)))
            for k in LABELS}


def map_error(pair: TemplatePair, psi: np.ndarray) -> float:
    """Mean ``|phi(psi(x)) - x|`` (mm) over the brain's fixed voxels, psi (D, H, W, 3) the
    moving world point a tool assigns to every fixed voxel."""
    x = _world(pair.fixed.shape, pair.fixed_affine)[pair.brain]
    return float(np.mean(np.linalg.norm(pair.known(psi[pair.brain]) - x, axis=-1)))


# ---------------------------------------------------------------------------------------
# The tools, each in a child process
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class ToolResult:
    tool: str
    wall_s: float  # the child process, start to end (volsample: the command as a user runs it)
    cpu_s: float  # its user + system time, all threads: on a shared machine, the steadier
    registration_s: float | None  # the registration call alone, where the tool reports it
    peak_mb: float  # the child's peak resident set
    dice: dict[int, float]
    error_mm: float


def _measure_child(argv, env, folder):
    """Run a child to its end: (stdout, wall seconds, CPU seconds (user + system, all its
    threads), its peak resident set in MB); its output goes through files, so that no pipe
    fills."""
    with open(os.path.join(folder, "stdout.txt"), "w+") as out, \
            open(os.path.join(folder, "stderr.txt"), "w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        errors = err.read()
        if proc.returncode:
            raise RuntimeError(f"{' '.join(argv[:4])} failed:\n{errors[-3000:]}")
        return (out.read(), wall, usage.ru_utime + usage.ru_stime,
                int(errors.split()[-1]) / 1024)


def _child_env(threads):
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS", "MKL_NUM_THREADS",
                 "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _volsample_psi(out):
    """psi of ``volsample register``'s files: T(x + d(x)), d in fixed world mm."""
    import nibabel as nib

    image: Any = nib.load(os.path.join(out, "displacement.nii.gz"))
    d = np.asarray(image.dataobj, np.float64)
    transform = np.loadtxt(os.path.join(out, "affine.txt"))
    x = _world(d.shape[:3], np.asarray(image.affine)) + d
    return x @ transform[:3, :3].T + transform[:3, 3]


def run_tool(tool: str, pair: TemplatePair, paths: dict[str, str], folder: str,
             threads: int, register_args: Sequence[str] = ()) -> ToolResult:
    """Run ``tool`` on the pair's files in a child process and score it."""
    import nibabel as nib

    out = os.path.join(folder, tool)
    os.makedirs(out, exist_ok=True)
    env = _child_env(threads)
    if tool == "volsample":
        argv = [sys.executable, "-c", PEAK + VOLSAMPLE, "register", paths["fixed"],
                paths["moving"],
                "--out", out, "--labels", paths["fixed_labels"], paths["moving_labels"],
                "--no-progress", *register_args]
    elif tool in PEERS:
        argv = [sys.executable, "-c", PEAK + PEERS[tool].script, json.dumps(paths), out,
                str(threads)]
    else:
        raise ValueError(f"tool: expected one of {TOOLS}, got {tool!r}")
    stdout, wall, cpu, peak = _measure_child(argv, env, out)
    if tool == "volsample":
        registration_s = None
        labels: Any = nib.load(os.path.join(out, "warped_labels.nii.gz"))
        warped = np.asarray(labels.dataobj)
        psi = _volsample_psi(out)
    else:
        registration_s = json.loads(stdout.strip().splitlines()[-1])["registration_s"]
        warped = np.load(os.path.join(out, "warped_labels.npy"))
        psi = np.load(os.path.join(out, "psi.npy"))
    return ToolResult(tool, wall, cpu, registration_s, peak,
                      dice_per_label(pair.fixed_labels, warped), map_error(pair, psi))


def unregistered(pair: TemplatePair) -> ToolResult:
    """The scores of the headers' alignment alone (psi(x) = x)."""
    x = _world(pair.fixed.shape, pair.fixed_affine)
    warped = registration.resample(pair.fixed.shape, pair.fixed_affine, pair.moving_labels,
                                   pair.moving_affine, "nearest")
    return ToolResult("before", 0.0, 0.0, None, 0.0, dice_per_label(pair.fixed_labels, warped),
                      map_error(pair, x))


def run(tools: Sequence[str], scale: int = 1, threads: int = 2, repeats: int = 1,
        register_args: Sequence[str] = (), folder: str | None = None,
        log: Callable[[str], None] = print, contrast: bool = False) -> list[ToolResult]:
    """Build the pair and run every tool in ``tools`` ``repeats`` times, interleaved (tool
    after tool, round after round, so that a shared machine's drift moves all alike); on
    the contrast pair (``contrast``) volsample registers with ``--loss mi`` and Greedy with
    ``-m NMI``."""
    if contrast:
        register_args = ["--loss", "mi", *register_args]
    with tempfile.TemporaryDirectory(prefix="volsample-register-bench-") as scratch:
        folder = folder or scratch
        os.makedirs(folder, exist_ok=True)
        pair = template_pair(scale, contrast)
        paths = write_pair(pair, folder)
        if contrast:  # the peers' measures for images of different contrasts
            paths["greedy_metric"] = "NMI"
        results = [unregistered(pair)]
        log(format_row(results[0]))
        for _ in range(repeats):
            for tool in tools:
                results.append(run_tool(tool, pair, paths, folder, threads, register_args))
                log(format_row(results[-1]))
        return results


def format_row(r: ToolResult) -> str:
    dice = ", ".join(f"{LABELS[k]} {v:.4f}" for k, v in r.dice.items())
    if r.tool == "before":
        return f"before (headers' alignment): Dice {dice}; mean {np.mean(list(r.dice.values())):.4f}; " \
               f"error {r.error_mm:.2f} mm"
    registration_s = f" (registration call {r.registration_s:.1f} s)" if r.registration_s else ""
    return (f"{r.tool}: {r.wall_s:.1f} s{registration_s}, CPU {r.cpu_s:.1f} s, peak {r.peak_mb:.0f} MB; Dice {dice}; "
            f"mean {np.mean(list(r.dice.values())):.4f}; error {r.error_mm:.2f} mm")


def tool_versions() -> dict[str, str | None]:
    """{tool: its package's version, or None when it is not installed}."""
    import importlib.metadata

    from .. import __version__

    versions: dict[str, str | None] = {"volsample": __version__}
    for tool, peer in PEERS.items():
        try:
            versions[tool] = importlib.metadata.version(peer.package) if _have(
                _TOOL_MODULES[tool]) else None
        except importlib.metadata.PackageNotFoundError:
            versions[tool] = None
    return versions


def format_table(results: Sequence[ToolResult]) -> str:
    """One row per tool, the medians of its runs: wall time, registration call, peak
    memory, Dice per label and their mean, error; and the speed-up of volsample's wall time
    over each peer's registration call (its wall time where it reports none)."""
    rows: dict[str, list[ToolResult]] = {}
    for r in results:
        rows.setdefault(r.tool, []).append(r)
    ours = np.median([r.wall_s for r in rows.get("volsample", [])]) if "volsample" in rows \
        else None
    header = ["tool", "runs", "wall s", "registration s", "CPU s", "peak MB"] + \
        [f"Dice {name}" for name in LABELS.values()] + ["mean Dice", "error mm", "volsample faster"]
    lines = []
    for tool, runs in rows.items():
        median = lambda values: float(np.median(values))
        dice = [median([r.dice[k] for r in runs]) for k in LABELS]
        registration_s = [r.registration_s for r in runs if r.registration_s is not None]
        peer_s = median(registration_s) if registration_s else median([r.wall_s for r in runs])
        faster = "" if tool in ("before", "volsample") or ours is None else f"{peer_s / ours:.2f}x"
        lines.append([tool, str(len(runs)) if tool != "before" else "",
                      f"{median([r.wall_s for r in runs]):.1f}" if tool != "before" else "",
                      f"{median(registration_s):.1f}" if registration_s else "",
                      f"{median([r.cpu_s for r in runs]):.1f}" if tool != "before" else "",
                      f"{median([r.peak_mb for r in runs]):.0f}" if tool != "before" else ""]
                     + [f"{d:.4f}" for d in dice]
                     + [f"{np.mean(dice):.4f}", f"{median([r.error_mm for r in runs]):.2f}", faster])
    widths = [max(len(c) for c in column) for column in zip(header, *lines)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(c) for c in lines])


def main(scale: int, threads: int, repeats: int = 1, json_path: str | None = None,
         tools: Sequence[str] = TOOLS, contrast: bool = False) -> int:
    """``volsample bench --register``: run, print each run as it ends and the table."""
    installed = available_tools()
    versions = tool_versions()
    missing = [t for t in tools if not installed[t]]
    chosen = [t for t in tools if installed[t]]
    print(f"registration benchmark: MNI152 2009 template at {scale} mm (fixed) against its copy "
          f"under a known map at {1.5 * scale:g} mm (moving"
          + (", its contrast remapped by sin(3x)^2; volsample --loss mi, Greedy -m NMI"
             if contrast else "")
          + f"); {threads} threads each, tools run one after another, {repeats} round(s)")
    print("tools: " + ", ".join(f"{t} {versions[t]}" for t in chosen)
          + "".join(f"; {t} skipped (not installed)" for t in missing))
    try:
        results = run(chosen, scale, threads, repeats, log=lambda row: print(row, flush=True),
                      contrast=contrast)
    except ImportError as error:  # no nilearn or nibabel: the pair cannot be built
        print(f"volsample bench: error: {error}", file=sys.stderr)
        return 2
    print(format_table(results))
    if json_path:
        write_json(json_path, results, scale, threads, versions,
                   f"volsample bench --register --register-scale {scale} --threads {threads} "
                   f"--repeats {repeats}{' --register-contrast' if contrast else ''} "
                   f"--json {json_path}")
    return 0


def write_json(path: str | os.PathLike, results: Sequence[ToolResult], scale: int, threads: int,
               versions: dict, command: str, load_before: float | None = None) -> None:
    """The runs and how they were taken (the date, the command, the pair's scale, the
    threads, the tools' versions, the 1-minute load average at the end)."""
    import datetime

    payload = {"recorded": datetime.datetime.now(datetime.timezone.utc).strftime(
                   "%Y-%m-%dT%H:%M:%SZ"), "command": command, "scale_mm": scale,
               "threads": threads, "versions": versions,
               "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
               "results": [dataclasses.asdict(r) for r in results]}
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")


def read_json(path: str | os.PathLike) -> tuple[dict, list[ToolResult]]:
    """A file ``write_json`` wrote: (everything but the runs, the ``ToolResult`` list)."""
    with open(path) as f:
        payload = json.load(f)
    results = [ToolResult(**{**r, "dice": {int(k): v for k, v in r["dice"].items()}})
               for r in payload.pop("results")]
    return payload, results


TOOL_TITLES = {"volsample": "volsample register", "before": "the headers' alignment",
               **{tool: peer.title for tool, peer in PEERS.items()}}


def plot(results: Sequence[ToolResult]) -> Any:
    """Mean Dice and the error in the brain against wall time (log axis), a point per tool
    (the medians of its runs; a peer's registration call alone as an open marker beside its
    whole run), the headers' alignment as a dashed line. The matplotlib figure."""
    import matplotlib.pyplot as plt

    from .bench_plots import CHART_WIDTH, PALETTE

    rows: dict[str, list[ToolResult]] = {}
    for r in results:
        rows.setdefault(r.tool, []).append(r)
    median = lambda values: float(np.median(values))
    fig, axes = plt.subplots(1, 2, figsize=(CHART_WIDTH, 5.0), layout="constrained")
    for ax, (what, score) in zip(axes, (
            ("mean Dice, grey and white matter (higher is better)",
             lambda r: float(np.mean(list(r.dice.values())))),
            ("error in the brain, mm (lower is better)", lambda r: r.error_mm))):
        for k, (tool, runs) in enumerate(rows.items()):
            y = median([score(r) for r in runs])
            if tool == "before":
                ax.axhline(y, color="0.4", linestyle="--", linewidth=1)
                ax.annotate(TOOL_TITLES["before"], (0.02, y), xycoords=("axes fraction", "data"),
                            xytext=(0, 4), textcoords="offset points", fontsize=11, color="0.3")
                continue
            colour = PALETTE[(k - 1) % len(PALETTE)]
            wall = median([r.wall_s for r in runs])
            calls = [r.registration_s for r in runs if r.registration_s is not None]
            # labelled in one legend below the charts: labels beside points that lie close
            # together (the peers take about the same time) would overprint each other
            title = TOOL_TITLES.get(tool, tool)
            ax.scatter([wall], [y], s=80, color=colour, edgecolor="black", zorder=3,
                       label=f"{title}, {wall:.1f} s")
            if calls:
                ax.scatter([median(calls)], [y], s=80, facecolor="white", edgecolor=colour,
                           linewidth=2, zorder=3,
                           label=f"{title}: its registration alone, {median(calls):.1f} s")
                ax.plot([median(calls), wall], [y, y], color=colour, linewidth=1.5)
        ax.set_xscale("log")
        walls = [r.wall_s for r in results if r.tool != "before"]
        ax.set_xlim(min(walls) / 2.5, max(walls) * 2.5)
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:g} s"))
        ax.set_xlabel("wall time (log; lower is better)", fontsize=12)
        ax.set_title(what, fontsize=11)
        ax.tick_params(labelsize=11)
        ax.grid(color="0.9", linewidth=0.8)
        ax.margins(y=0.25)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2,
               fontsize=10, frameon=False)
    return fig
