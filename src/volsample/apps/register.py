"""``volsample register`` and ``volsample demo``: arguments, file I/O and the report.

The registration itself lives in ``volsample.registration``; this module reads the
volumes (NIfTI through nibabel, with their headers' voxel-to-world affines, or ``.npy``,
whose voxels are taken as millimetres), runs it with a progress bar, writes the warped
volume, the displacement field and the affine in the fixed volume's format and grid, and
the PNG report (matplotlib), and prints the similarity before (the headers' alignment)
and after. Bad input ends the command with one line on stderr and exit code 2. nibabel
and matplotlib are imported only when needed. Command-line reference: docs/cli.md.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import sys
from typing import Any

import numpy as np

from .. import _config, _dtypes
from .._checks import VolsampleError
from .._progress import ProgressBar
from . import folds as _folds
from . import registration, transforms
from .gzip_stream import ParallelGzip

_NIFTI_SUFFIXES = (".nii.gz", ".nii")
_DEMO_OUT = "volsample-demo"
# (shape, iterations per level, coarsest first) of the demo and of ``demo --quick``
_DEMO_SETTINGS = {False: ((64, 64, 64), (80, 40, 20)), True: ((32, 32, 32), (40, 20))}
# the demo's NCC smoothness weight: its phantom moves by a sixteenth of its side, more
# sharply than anatomy between scans (the default's regime): 0.3 leaves 0.37 of the error
# where the default, 1, leaves 0.52 (the Dice is the same); MSE takes its default
_DEMO_WEIGHTS = {"ncc": 0.3}
# --interp: the warp_3d mode of the warped image (label maps are always warped nearest);
# the registration samples the moving image in it too, bilinearly for "nearest"
_INTERPOLATIONS = {"linear": "bilinear", "nearest": "nearest", "bicubic": "bicubic",
                   "bspline": "bspline"}


class CommandError(Exception):
    """A problem with the command's input or output, reported as one line (exit code 2)."""


# ---------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------


def _add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loss", choices=tuple(registration.SIMILARITIES), default="ncc",
                        help="similarity: local normalised cross-correlation (default), mean "
                             "squared difference, or mutual information (images of different "
                             "contrasts)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (shown by default when stderr is a terminal)")


def add_register_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``volsample register``."""
    parser.add_argument("fixed", metavar="FIXED", help="fixed volume: .nii, .nii.gz or .npy")
    parser.add_argument("moving", metavar="MOVING",
                        help="moving volume: .nii, .nii.gz or .npy, any grid (NIfTI headers "
                             "place the two in the world; .npy voxels are millimetres)")
    parser.add_argument("--out", metavar="DIR", required=True,
                        help="folder for the warped volume, the displacement, affine.txt, "
                             "the same as ITK/ANTs transforms (NIfTI FIXED), report.png and "
                             "report.json, in FIXED's grid and format")
    parser.add_argument("--labels", nargs=2, metavar=("FIXED_LABELS", "MOVING_LABELS"),
                        help="label maps on the two volumes' grids: the moving one is warped "
                             "(nearest) and Dice reported")
    add_registration_options(parser)


def add_registration_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``volsample register`` that say how to register (those of
    ``register-cohort`` too)."""
    _add_common_arguments(parser)
    parser.add_argument("--levels", type=int, default=3,
                        help="resolution levels, each halving the previous (default 3)")
    parser.add_argument("--iterations", type=int, nargs="+", metavar="N",
                        help="deformable Adam steps per level, one number or one per level, "
                             "coarsest first (default 100, halved per finer level, at least 10; "
                             "--loss mi: 10 at the finest level)")
    parser.add_argument("--affine-iterations", type=int, nargs="+", metavar="N",
                        help="affine Adam steps per level, as --iterations (default: "
                             "--iterations at the coarsest level and at each finer one up to "
                             "the first of at least 32^3 voxels, 0 after it; 0 everywhere "
                             "keeps the headers' alignment)")
    parser.add_argument("--interp", choices=tuple(_INTERPOLATIONS), default="linear",
                        help="interpolation of the moving volume, in the registration and in "
                             "the warped volume written (default linear; nearest: written "
                             "only, the registration samples linearly; label maps are "
                             "warped nearest)")
    parser.add_argument("--jacobian", action="store_true",
                        help="also write the deformation's Jacobian determinant map "
                             "(jacobian, on FIXED's grid)")
    parser.add_argument("--initial-affine", metavar="FILE",
                        help="start the affine stage from this world affine, FIXED to MOVING: an "
                             "ITK or ANTs affine file (.tfm, .txt, .mat) or an affine.txt of "
                             "volsample register (default: the headers' alignment)")
    parser.add_argument("--model", choices=registration.MODELS, default=registration.DEFAULT_MODEL,
                        help="the deformation: diffeomorphic (a stationary velocity on the "
                             "control grid, integrated by scaling and squaring: invertible, "
                             "no folds; the inverse is written too) or free-form (the control "
                             "points' displacements; default "
                             f"{registration.DEFAULT_MODEL})")
    parser.add_argument("--grid-spacing", type=float, default=4.0, metavar="VOXELS",
                        help="control-point spacing at full resolution (default 4)")
    parser.add_argument("--smoothness", type=float, metavar="WEIGHT",
                        help="weight of the smoothness penalty (default "
                             + ", ".join(f"{k} {v}" for k, v in registration.DEFAULT_WEIGHTS.items())
                             + ")")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="a level stops early when its objective improves by less than "
                             "this over 10 steps (NCC units; 0: run every step; default 0.001)")
    parser.add_argument("--lr", type=float, default=0.25, metavar="VOXELS",
                        help="Adam step at full resolution in fixed voxels (the control points', "
                             "and the affine's translation), doubled per coarser level "
                             "(default 0.25)")


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``volsample demo``."""
    parser.add_argument("--out", metavar="DIR", default=_DEMO_OUT,
                        help=f"folder for the volumes and report.png (default {_DEMO_OUT}/)")
    parser.add_argument("--quick", action="store_true",
                        help="a small volume and few iterations (seconds)")
    _add_common_arguments(parser)


# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------


def run_register(args: argparse.Namespace) -> int:
    """Register MOVING to FIXED and write the results under ``--out``."""
    try:
        run = register_files(args)
    except (CommandError, VolsampleError) as error:
        return _fail("register", error)
    print(_wrote(args.out, run.files))
    if run.dice is not None:
        print(_change("dice", run.dice, ".4f"))
    print(run.folds.line())
    print(_change(f"similarity ({args.loss})", run.similarity))
    return 0


def register_files(args: argparse.Namespace) -> _Run:
    """``volsample register``'s work on its parsed arguments: read the files, register,
    write the results under ``args.out``; bad input raises CommandError or VolsampleError."""
    fixed, moving, *label_maps = _read_all(
        [(args.fixed, "FIXED"), (args.moving, "MOVING")]
        + list(zip(args.labels or (), ("FIXED_LABELS", "MOVING_LABELS"))))
    labels = None
    if label_maps:
        labels = tuple(_label_map(volume) for volume in label_maps)
        _same_grid(fixed, labels[0])
        _same_grid(moving, labels[1])
    iterations = _per_level(args.iterations, args.levels) if args.iterations else \
        registration.default_iterations(args.levels, args.loss)
    affine_iterations = _per_level(args.affine_iterations, args.levels) \
        if args.affine_iterations else \
        registration.default_affine_iterations(fixed.data.shape, iterations)
    settings = dict(levels=args.levels, iterations=iterations,
                    affine_iterations=affine_iterations, grid_spacing=args.grid_spacing,
                    weight=args.smoothness, lr=args.lr, tolerance=args.tolerance,
                    model=args.model)
    if args.initial_affine:
        try:
            settings["initial_affine"] = transforms.read_affine(args.initial_affine)
        except ValueError as error:
            raise CommandError(f"--initial-affine: {error}") from None
    return _register(fixed, moving, labels, args.loss, settings, args.out,
                     progress=not args.no_progress, interp=_INTERPOLATIONS[args.interp],
                     jacobian=args.jacobian)


def _per_level(iterations, levels):
    """--iterations (or --affine-iterations) as one number per level."""
    return iterations * levels if len(iterations) == 1 else iterations


def run_demo(args: argparse.Namespace) -> int:
    """Register the built-in synthetic pair and compare with the known deformation."""
    shape, iterations = _DEMO_SETTINGS[args.quick]
    pair = registration.synthetic_pair(shape)
    print(f"demo: a {'x'.join(map(str, shape))} phantom under a known deformation of up to "
          f"{np.abs(pair.displacement).max():.1f} voxels", flush=True)
    inputs = {"fixed": pair.fixed, "moving": pair.moving, "fixed_labels": pair.fixed_labels,
              "moving_labels": pair.moving_labels, "true_displacement": pair.displacement}
    try:
        files = _write_all(args.out, {name: _Volume(f"{name}.npy", v)
                                      for name, v in inputs.items()})
        run = _register(_Volume("fixed.npy", pair.fixed), _Volume("moving.npy", pair.moving),
                        (_Volume("fixed_labels.npy", pair.fixed_labels),
                         _Volume("moving_labels.npy", pair.moving_labels)),
                        args.loss, dict(levels=len(iterations), iterations=list(iterations),
                                        affine_iterations=[n // 2 for n in iterations],
                                        weight=_DEMO_WEIGHTS.get(args.loss)),
                        args.out, progress=not args.no_progress)
    except (CommandError, VolsampleError) as error:
        return _fail("demo", error)
    inside = pair.fixed_labels > 0
    index = np.stack(np.meshgrid(*(np.arange(n) for n in shape), indexing="ij"), -1)
    found = run.result.voxel_map() - index  # one grid: voxels along the array axes
    errors = tuple(registration.deformation_error(d, pair.displacement, inside)
                   for d in (np.zeros_like(pair.displacement), found))
    print(_wrote(args.out, files + run.files))
    print(_change("deformation error (voxels)", errors, ".3f"))
    print(_change("dice", run.dice, ".4f"))
    print(run.folds.line())
    print(_change(f"similarity ({args.loss})", run.similarity))
    return 0


def _change(name, values, spec=None):
    """``name: before -> after``, both to ``spec``; by default to the same number of
    decimals, four significant digits of the larger."""
    before, after = values
    if spec is None:
        largest = max(abs(before), abs(after))
        exponent = math.floor(math.log10(largest)) if math.isfinite(largest) and largest else 0
        spec = f".{max(0, 3 - exponent)}f"
    return f"{name}: {before:{spec}} -> {after:{spec}}"


def _wrote(out_dir, files):
    return f"wrote {', '.join(files)} to {os.path.abspath(out_dir)}{os.sep}"


def _fail(command, error):
    print(f"volsample {command}: error: {error}", file=sys.stderr)
    return 2


@dataclasses.dataclass
class _Run:
    result: registration.RegistrationResult
    similarity: tuple  # before, after
    dice: tuple | None  # before, after, with labels
    files: list[str]  # the names written in the output folder
    folds: _folds.Folds  # the Jacobian determinant in the fixed image's foreground


def _register(fixed, moving, labels, loss, settings, out_dir, progress,
              interp="bilinear", jacobian=False) -> _Run:
    """Register, write the outputs in FIXED's grid and format (NIfTI: ITK's transforms as
    well), the reports, and measure."""
    result, fixed_n, before, similarity = _registered(fixed, moving, loss, settings, progress,
                                                      interp)
    _make_folder(out_dir)
    # the folds are measured and the report drawn on a thread while the outputs are warped
    # and written (matplotlib is imported there too: imported during the registration, its
    # modules would add to the registration's peak memory); the outputs are made and
    # written a group at a time, each dropped once written, so that few are held at once
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        folds = pool.submit(_measure_folds, result, fixed, labels)
        report = pool.submit(lambda: _write_report(
            os.path.join(out_dir, "report.png"), fixed_n, before, result.warped,
            result.history, loss, similarity, folds.result()[0]))
        outputs = {"warped": result.warp(moving.data, interp)}
        dice = None
        if labels is not None:
            fixed_labels, moving_labels = (v.data for v in labels)
            outputs["warped_labels"] = result.warp(moving_labels, "nearest")  # exact copies
            unaligned = registration.resample(fixed_labels.shape, fixed.affine, moving_labels,
                                              moving.affine, "nearest")
            dice = (registration.dice(fixed_labels, unaligned),
                    registration.dice(fixed_labels, outputs["warped_labels"]))
        result.moved = None  # the warps are done: not held from here on
        files = _write_all(out_dir, {name: fixed.like(name, data)
                                     for name, data in outputs.items()})
        del outputs
        files += _write_displacement(out_dir, fixed, "displacement", result.displacement)
        if jacobian:
            files += _write_all(out_dir, {"jacobian": fixed.like("jacobian",
                                                                 folds.result()[1])})
        if result.inverse_control is not None:
            folds.result()  # done with the displacement, which is then not held
            result.displacement = None
            files += _write_displacement(out_dir, fixed, "inverse_displacement",
                                         result.inverse_displacement, scratch=True)
        files += _write_affines(out_dir, result.transform, itk=fixed.image is not None)
        if report.result():
            files.append("report.png")
        files.append("report.json")
        run = _Run(result, similarity, dice, files, folds.result()[0])
        _write_json(os.path.join(out_dir, "report.json"), run, loss)
    return run


def _write_displacement(out_dir, fixed, name, displacement, scratch=False) -> list[str]:
    """A displacement (mm, FIXED's world axes) as ``name``, and for a NIfTI FIXED as ITK's
    displacement field, ``name``_itk (made in ``displacement`` itself when it is
    ``scratch``); the names written."""
    files = _write_all(out_dir, {name: fixed.like(name, displacement)})
    if fixed.image is not None:  # ITK's displacement field needs the fixed grid's header
        itk = transforms.itk_displacement(displacement, out=displacement if scratch else None)
        files += _write_all(out_dir, {f"{name}_itk": dataclasses.replace(
            fixed.like(f"{name}_itk", itk), intent=transforms.NIFTI_INTENT_VECTOR)})
    return files


def _measure_folds(result, fixed, labels):
    """The folds in FIXED's foreground (``folds.foreground``), and the determinant map."""
    det = _folds.jacobian_mm(result.displacement, fixed.affine)
    mask, where = _folds.foreground(fixed.data, None if labels is None else labels[0].data)
    return _folds.folds(det, mask, where), det


def _registered(fixed, moving, loss, settings, progress, interp):
    """The registration of the normalised volumes, the normalised fixed one, the moving one
    resampled by the headers alone (where it starts), and the similarity before and after."""
    fixed_n, moving_n = (registration.normalise_intensity(v.data, name)
                         for v, name in ((fixed, "FIXED"), (moving, "MOVING")))
    sampling = "bilinear" if interp == "nearest" else interp  # nearest has no gradient
    total = sum(settings["iterations"]) + sum(settings["affine_iterations"])
    bar = ProgressBar(total, enabled=progress and sys.stderr.isatty())
    try:
        levels = settings["levels"]
        result = registration.register(
            fixed_n, moving_n, loss, fixed_affine=fixed.affine, moving_affine=moving.affine,
            **settings, interp=sampling, callback=lambda stage, level, it, value, sim: bar.step(
                f"{stage} level {level + 1}/{levels} similarity {sim:.4g}"))
    finally:
        bar.close()
    before = registration.resample(fixed_n.shape, fixed.affine, moving_n, moving.affine,
                                   sampling)
    return result, fixed_n, before, result.similarity


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Volume:
    """A volume read from (or bound for) ``name``; ``image`` is its NIfTI image, if any."""

    name: str
    data: np.ndarray
    image: Any = None
    intent: str | None = None  # NIfTI's intent, by nibabel's name ("vector")

    @property
    def affine(self) -> np.ndarray:
        """Voxel (i, j, k) to world (mm): the NIfTI header's, or the identity (.npy)."""
        return np.eye(4) if self.image is None else np.asarray(self.image.affine, np.float64)

    def like(self, stem, data):
        """A volume named ``stem`` in this one's format (NIfTI: this one's affine and header)."""
        if self.image is None:
            return _Volume(f"{stem}.npy", data)
        return _Volume(f"{stem}.nii.gz", data, self.image)


def _is_nifti(path):
    return path.lower().endswith(_NIFTI_SUFFIXES)


def _nibabel():
    try:
        import nibabel
    except ImportError:
        raise CommandError("reading and writing NIfTI files needs nibabel: pip install nibabel") \
            from None
    return nibabel


def _read(path, what) -> _Volume:
    """A 3-D volume from a .nii, .nii.gz or .npy file, checked to be real and finite."""
    nifti = _is_nifti(path)
    if not nifti and not path.lower().endswith(".npy"):
        raise CommandError(f"{what}: expected a .nii, .nii.gz or .npy file, got {path!r}")
    if not os.path.isfile(path):
        raise CommandError(f"{what}: no such file: {path!r}")
    nib = _nibabel() if nifti else None
    try:
        if nib is not None:
            image = nib.load(path)
            data = np.asarray(image.dataobj)
        else:
            image, data = None, np.load(path, allow_pickle=False)
    # Any failure to parse (truncated, corrupt, wrong format) is the file's fault: one line.
    except Exception as error:
        raise CommandError(f"{what}: cannot read {path!r}: {error}") from None
    while data.ndim > 3 and data.shape[-1] == 1:  # NIfTI keeps a trailing time axis of 1
        data = data[..., 0]
    if data.ndim != 3:
        raise CommandError(f"{what}: expected a 3-D volume, got shape {data.shape} in {path!r}")
    if data.dtype.kind not in "biuf":
        raise CommandError(f"{what}: expected real numbers, got dtype {data.dtype} in {path!r}")
    if data.dtype.kind == "f" and not np.isfinite(data).all():
        raise CommandError(f"{what}: expected finite values, got NaN or inf in {path!r}")
    return _Volume(os.path.basename(path), data, image)


def _read_all(files) -> list[_Volume]:
    """``_read`` of every (path, what) in ``files``, on threads (gzip inflates without the
    GIL); the first file's error, if any, is the one raised."""
    with concurrent.futures.ThreadPoolExecutor(min(len(files), _config.get_num_threads())) \
            as pool:
        reading = [pool.submit(_read, path, what) for path, what in files]
        return [read.result() for read in reading]


def _same_grid(volume, labels):
    """A label map on its volume's grid: its shape, and (NIfTI) its affine."""
    if labels.data.shape != volume.data.shape:
        raise CommandError(f"{labels.name}: expected the shape of {volume.name}, "
                           f"{volume.data.shape}, got {labels.data.shape}")
    if labels.image is not None and volume.image is not None and not np.allclose(
            labels.affine, volume.affine, atol=1e-3):
        raise CommandError(f"{labels.name}: expected the affine of {volume.name}, "
                           f"{volume.affine.tolist()}, got {labels.affine.tolist()}")


def _label_map(volume) -> _Volume:
    """The volume with integer labels (NIfTI often stores them as floats)."""
    data = volume.data
    if data.dtype.kind == "f":
        rounded = np.rint(data)
        if not np.array_equal(rounded, data):
            raise CommandError(f"{volume.name}: expected integer labels, got fractions")
        data = rounded.astype(np.int32)
    elif data.dtype.kind == "b":
        data = data.astype(np.int32)
    elif data.dtype.kind in "iu" and data.dtype not in _dtypes.LABELS:
        # Warped by nearest grid sampling, which takes uint8, int16 and int32.
        if data.size and (data.min() < np.iinfo(np.int32).min or data.max() > np.iinfo(np.int32).max):
            raise CommandError(f"{volume.name}: expected labels that fit in int32, got "
                               f"{data.min()}..{data.max()}")
        data = data.astype(np.int32)
    if not (data > 0).any():
        raise CommandError(f"{volume.name}: expected some label > 0, got none")
    return dataclasses.replace(volume, data=data)


def _make_folder(out_dir):
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise CommandError(f"--out: cannot write {out_dir!r}: {error}") from None


def _write_all(out_dir, volumes) -> list[str]:
    """Write ``volumes`` in ``out_dir``; their file names."""
    _make_folder(out_dir)
    try:
        for volume in volumes.values():
            path = os.path.join(out_dir, volume.name)
            if volume.image is None:
                np.save(path, volume.data)
            else:
                nib = _nibabel()
                header = volume.image.header.copy()
                header.set_data_dtype(volume.data.dtype)
                if volume.intent is not None:
                    header.set_intent(volume.intent)
                image = nib.Nifti1Image(volume.data, volume.image.affine, header)
                if path.lower().endswith(".gz"):
                    with open(path, "wb") as file, ParallelGzip(file) as stream:
                        image.to_stream(stream)
                else:
                    nib.save(image, path)
    except OSError as error:
        raise CommandError(f"--out: cannot write {out_dir!r}: {error}") from None
    return [volume.name for volume in volumes.values()]


def _write_affines(out_dir, transform, itk) -> list[str]:
    """T as affine.txt (4x4, NIfTI world), and with ``itk`` as ITK's affine_itk.tfm; the
    names written."""
    names = ["affine.txt"] + (["affine_itk.tfm"] if itk else [])
    path = os.path.join(out_dir, names[0])
    try:
        np.savetxt(path, transform, fmt="%.9g", header=(
            "volsample register: the world affine (mm, NIfTI world axes) taking a FIXED point x "
            "to MOVING's T(x + d(x)), d = displacement; 4x4, row-major"))
        if itk:
            path = os.path.join(out_dir, names[1])
            transforms.write_itk_affine(path, transform)
    except OSError as error:
        raise CommandError(f"--out: cannot write {path!r}: {error}") from None
    return names


def _write_json(path, run, loss):
    """The run's measures as JSON: the similarity and Dice before and after, the folds."""
    report = {"similarity": {"loss": loss, "before": run.similarity[0],
                             "after": run.similarity[1]},
              "dice": None if run.dice is None else dict(zip(("before", "after"), run.dice)),
              "jacobian": run.folds.as_dict(), "files": run.files}
    try:
        with open(path, "w") as file:
            json.dump(report, file, indent=2)
            file.write("\n")
    except OSError as error:
        raise CommandError(f"--out: cannot write {path!r}: {error}") from None


# ---------------------------------------------------------------------------------------
# Progress and report
# ---------------------------------------------------------------------------------------


def _checkerboard(a, b, tile):
    """``a`` and ``b`` (2-D) in alternating square tiles of ``tile`` pixels."""
    i, j = np.indices(a.shape)
    return np.where((i // tile + j // tile) % 2 == 0, a, b)


def _write_report(path, fixed, moving, warped, history, loss, similarity, folds):
    """Orthogonal central slices before and after, checkerboards of fixed against moving and
    warped, the loss curve and the folds, as a PNG; a warning instead if matplotlib is
    missing. Whether it wrote the PNG."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("warning: matplotlib is not installed, so no PNG report was written; install "
              "it with: pip install matplotlib (or the extra: pip install -e \".[demo]\")",
              file=sys.stderr)
        return False
    columns = {"fixed": None, "moving (before)": moving, "warped (after)": warped,
               "fixed | moving": moving, "fixed | warped": warped}
    fig = Figure(figsize=(13, 11))
    FigureCanvasAgg(fig)
    # fixed margins: a constrained layout would measure every axes, drawing the figure twice
    grid = fig.add_gridspec(3, len(columns), left=0.06, right=0.94, bottom=0.36, top=0.97,
                            wspace=0.04, hspace=0.2)
    tile = max(2, min(fixed.shape) // 8)
    # the central slices, as views (np.take would copy them through a gather)
    centre = [(slice(None),) * axis + (fixed.shape[axis] // 2,) for axis in range(3)]
    # grey levels from the fixed image's three slices, not its whole volume
    low, high = np.percentile(np.concatenate([fixed[c].ravel() for c in centre]), (0.5, 99.5))
    for row, axis in enumerate(range(3)):
        fixed_slice = fixed[centre[axis]]
        for col, (title, volume) in enumerate(columns.items()):
            image = fixed_slice if volume is None else volume[centre[axis]]
            if "|" in title:
                image = _checkerboard(fixed_slice, image, tile)
            ax = fig.add_subplot(grid[row, col])
            ax.imshow(image, cmap="gray", vmin=low, vmax=high, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(title)
            if col == 0:
                ax.set_ylabel(f"slice {fixed.shape[axis] // 2} of axis {axis}")
    ax = fig.add_subplot(fig.add_gridspec(1, 1, left=0.06, right=0.94, bottom=0.07,
                                          top=0.25)[0])
    fig.text(0.5, 0.01, folds.line(), ha="center", va="bottom",
             color="C3" if folds.folded else "black")
    stages, levels, objective, sim = ((np.array(v) for v in zip(*history)) if history
                                      else ([], [], [], []))
    ax.plot(objective, color="C0", label="objective (similarity loss + smoothness)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("objective", color="C0")
    twin = ax.twinx()
    twin.plot(sim, color="C1", label=f"similarity ({loss})")
    # each level is scored on its own, blurred, volumes: a coarse level's similarity is not
    # comparable with the full resolution's, so the curve says which level it is on, and the
    # full resolution's before and after are drawn apart
    twin.set_ylabel(f"similarity ({loss}) at the level's resolution", color="C1")
    if len(sim):
        twin.plot([0, len(sim) - 1], similarity, "o", color="C3")
    finest = max(levels, default=0)
    starts = np.flatnonzero((np.diff(levels) != 0) | (stages[1:] != stages[:-1])) + 1
    for start, end in zip(np.r_[0, starts], np.r_[starts, len(levels)]) if len(levels) else ():
        shrink = 2 ** int(finest - levels[start])
        ax.text((start + end - 1) / 2, 1.01, f"{stages[start]}\n"
                + ("full" if shrink == 1 else f"1/{shrink}"), transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize="x-small")
    for start in np.flatnonzero(np.diff(levels)) + 1:
        ax.axvline(start, color="grey", linestyle=":")
    for start in np.flatnonzero(stages[1:] != stages[:-1]) + 1:
        ax.axvline(start, color="black", linestyle="--")
    ax.set_title(f"{_change(f'similarity ({loss})', similarity)} at full resolution (red dots)\n"
                 "each level (its stage and resolution above it) scores its own blurred "
                 "volumes: a coarse level scores higher", fontsize="medium", pad=26)
    try:
        # zlib level 1: the PNG encodes faster, a little larger
        fig.savefig(path, dpi=80, pil_kwargs={"compress_level": 1})
    except OSError as error:
        raise CommandError(f"--out: cannot write {path!r}: {error}") from None
    return True
