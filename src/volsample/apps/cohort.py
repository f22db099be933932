"""``volsample register-cohort``: many moving volumes registered to one template.

Each subject (a MOVING file, and its label map if given) runs ``volsample register``'s own
work (``register.register_files``) into a folder of its own under ``--out``, named after
the file, and leaves there ``cohort.json``, its row of the table, written last: a subject
whose row says ``done`` is skipped by a rerun, a failed one is tried again. A subject that
fails (a corrupt file, anything raised) is recorded with its error and the others go on.
The rows of all subjects make ``cohort.csv``.

The subjects run one after another in this process by default, or as tasks of a
``dask.distributed`` cluster (optional extra ``cluster``): a running one (``--scheduler
ADDRESS``) or a local one started for the run (``--local-workers N``, one process per
worker). Every kernel gives the same bits for any thread count, so a subject's results are
the same bits wherever it runs. Command-line reference: docs/cli.md.
"""
from __future__ import annotations

from typing import Any

import argparse
import contextlib
import copy
import csv
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence

from .. import _backends
from .._checks import VolsampleError
from .._config import get_num_threads, set_num_threads
from .._progress import ProgressBar
from . import register
from .register import CommandError

TABLE = "cohort.csv"
ROW_FILE = "cohort.json"  # a subject's row, in its folder
COLUMNS = ("subject", "moving", "status", "seconds", "similarity_before", "similarity_after",
           "dice_before", "dice_after", "jacobian_min", "folded", "folded_fraction",
           "peak_memory_mb", "error")
_SUFFIXES = (".nii.gz", ".nii", ".npy")


@dataclasses.dataclass(frozen=True)
class Subject:
    """One moving volume of the cohort: its name (its folder's) and files."""

    name: str
    moving: str
    labels: str | None = None


# ---------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------


def add_register_cohort_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``volsample register-cohort``."""
    parser.add_argument("template", metavar="TEMPLATE",
                        help="the fixed volume of every subject: .nii, .nii.gz or .npy")
    parser.add_argument("moving", metavar="MOVING", nargs="+",
                        help="the moving volumes, one per subject (each subject's folder is "
                             "named after its file)")
    parser.add_argument("--out", metavar="DIR", required=True,
                        help="folder for the subjects' folders and the table cohort.csv")
    parser.add_argument("--template-labels", metavar="FILE",
                        help="TEMPLATE's label map (with --labels: Dice per subject)")
    parser.add_argument("--labels", nargs="+", metavar="MOVING_LABELS",
                        help="each MOVING's label map, in MOVING's order")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run the subjects on this dask.distributed scheduler "
                            "(tcp://host:8786); the files must be at the same paths there")
    where.add_argument("--local-workers", type=int, metavar="N",
                       help="run the subjects on a local dask.distributed cluster of N "
                            "worker processes")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="volsample threads per subject (default: this process's count "
                             "in one process, the cores over N with --local-workers, the "
                             "worker's count with --scheduler)")
    register.add_registration_options(parser)


def run_register_cohort(args: argparse.Namespace) -> int:
    """Register every MOVING to TEMPLATE; exit code 1 when a subject failed."""
    try:
        rows = _run(args)
    except (CommandError, VolsampleError) as error:
        print(f"volsample register-cohort: error: {error}", file=sys.stderr)
        return 2
    done = [row for row in rows if row["status"] == "done"]
    failed = [row for row in rows if row["status"] != "done"]
    print(f"{len(rows)} subject{'' if len(rows) == 1 else 's'}: {len(done)} done, "
          f"{len(failed)} failed; table: "
          f"{os.path.abspath(os.path.join(args.out, TABLE))}")
    for row in failed:
        print(f"failed: {row['subject']}: {row['error']}", file=sys.stderr)
    return 1 if failed else 0


def register_cohort(template: str, moving: Sequence[str], out: str, *,
                    labels: Sequence[str] | None = None, template_labels: str | None = None,
                    scheduler: str | None = None, local_workers: int | None = None,
                    threads: int | None = None, progress: bool = False,
                    **options: Any) -> list[dict]:
    """Register every file of ``moving`` to ``template``, each into its folder under
    ``out``, and write the table ``out/cohort.csv``; returns its rows (dicts of
    ``COLUMNS``).

    ``options`` are ``volsample register``'s, by their Python names (``loss="mi"``,
    ``levels=2``, ``iterations=[40, 20]``, ``smoothness=0.05``, ...). ``scheduler`` (an
    address) or ``local_workers`` (a count) run the subjects on a dask.distributed cluster;
    ``threads``, the volsample threads of each subject. A subject that fails is recorded in
    its row and the others go on; subjects done by an earlier run into ``out`` are skipped.
    """
    parser = argparse.ArgumentParser(prog="register_cohort")
    add_register_cohort_arguments(parser)
    args = parser.parse_args([os.fspath(template), *map(os.fspath, moving), "--out",
                              os.fspath(out)])
    own = dict(labels=labels, template_labels=template_labels, scheduler=scheduler,
               local_workers=local_workers, threads=threads, no_progress=not progress)
    for name, value in {**options, **own}.items():
        if name not in vars(args) or name in ("template", "moving", "out"):
            raise TypeError(f"register_cohort: unknown option {name!r}")
        setattr(args, name, value)
    return _run(args)


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> list[dict]:
    """Check the arguments, run the subjects not done yet, write the table; its rows."""
    subjects = _subjects(args)
    if args.local_workers is not None and args.local_workers < 1:
        raise CommandError(f"--local-workers: expected at least 1, got {args.local_workers}")
    if args.threads is not None and args.threads < 1:
        raise CommandError(f"--threads: expected at least 1, got {args.threads}")
    register._make_folder(args.out)
    rows: dict[str, dict] = {}
    for subject in subjects:
        row = _done_before(args.out, subject)
        if row is not None:
            rows[subject.name] = row
    todo = [subject for subject in subjects if subject.name not in rows]
    bar = ProgressBar(len(todo), enabled=not args.no_progress and sys.stderr.isatty())
    try:
        for row in _execute(todo, args):
            rows[row["subject"]] = row
            bar.step(f"{row['subject']} {row['status']}")
    finally:
        bar.close()
    table = [rows[subject.name] for subject in subjects]
    _write_table(os.path.join(args.out, TABLE), table)
    return table


def _subjects(args) -> list[Subject]:
    """The cohort's subjects, checked: files that exist, one label map per MOVING, names
    that differ."""
    for path, what in [(args.template, "TEMPLATE"), (args.template_labels, "--template-labels")]:
        if path is not None and not os.path.isfile(path):
            raise CommandError(f"{what}: no such file: {path!r}")
    if (args.labels is None) != (args.template_labels is None):
        raise CommandError("--labels and --template-labels: expected both or neither")
    labels = args.labels or [None] * len(args.moving)
    if len(labels) != len(args.moving):
        raise CommandError(f"--labels: expected one per MOVING ({len(args.moving)}), "
                           f"got {len(labels)}")
    subjects: dict[str, Subject] = {}
    for moving, label_map in zip(args.moving, labels):
        name = _stem(moving)
        if name in subjects:
            raise CommandError(f"MOVING: two files make the subject {name!r} "
                               f"({subjects[name].moving!r}, {moving!r}): rename one")
        subjects[name] = Subject(name, moving, label_map)
    return list(subjects.values())


def _stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in _SUFFIXES:
        if name.lower().endswith(suffix):
            return name[:-len(suffix)]
    return name


def _done_before(out: str, subject: Subject) -> dict | None:
    """The subject's row from an earlier run, if that run registered it."""
    try:
        with open(os.path.join(out, subject.name, ROW_FILE)) as file:
            row = json.load(file)
    except (OSError, ValueError):
        return None
    return row if row.get("status") == "done" and row.get("moving") == subject.moving else None


def _execute(subjects: list[Subject], args) -> Iterator[dict]:
    """The subjects' rows as they finish: here, or on the cluster."""
    if not subjects:
        return
    if args.scheduler is None and args.local_workers is None:
        for subject in subjects:
            yield register_subject(subject, args, args.threads)
        return
    distributed = _distributed()
    threads = args.threads
    with contextlib.ExitStack() as stack:
        if args.scheduler is not None:
            try:
                client = stack.enter_context(distributed.Client(args.scheduler, timeout="30s"))
            except (OSError, TimeoutError) as error:
                raise CommandError(f"--scheduler: cannot reach {args.scheduler!r}: {error}") \
                    from None
        else:
            threads = threads or max(1, (os.cpu_count() or 1) // args.local_workers)
            cluster = stack.enter_context(distributed.LocalCluster(
                n_workers=args.local_workers, threads_per_worker=1, processes=True,
                dashboard_address=None, silence_logs=logging.ERROR))
            client = stack.enter_context(distributed.Client(cluster))
        futures = {client.submit(register_subject, subject, args, threads, pure=False): subject
                   for subject in subjects}
        for future in distributed.as_completed(futures):
            try:
                yield future.result()
            except Exception as error:  # the worker itself was lost: the subject failed
                yield _row(futures[future], "failed", error=_message(error))


def _distributed():
    try:
        import distributed
    except ImportError:
        raise CommandError("--scheduler and --local-workers need dask.distributed: "
                           "pip install \"volsample[cluster]\"") from None
    return distributed


def register_subject(subject: Subject, args: argparse.Namespace,
                     threads: int | None = None) -> dict:
    """Register one subject with ``register``'s work, into ``args.out/<name>``, with
    ``threads`` volsample threads (default: the current count); its row, also written to
    its folder. Never raises: a failure is the row's ``error``."""
    start = time.perf_counter()
    job = copy.copy(args)
    job.fixed, job.moving = args.template, subject.moving
    job.out = os.path.join(args.out, subject.name)
    job.labels = None if subject.labels is None else [args.template_labels, subject.labels]
    job.no_progress = True
    previous = get_num_threads()
    try:
        if threads is not None:
            set_num_threads(min(threads, _backends.cpu_core().max_threads()))
        run = register.register_files(job)
        row = _row(subject, "done", similarity=run.similarity, dice=run.dice,
                   folds=run.folds.as_dict())
    except Exception as error:  # any failure is this subject's alone: recorded, not raised
        row = _row(subject, "failed", error=_message(error))
    finally:
        set_num_threads(previous)
    row["seconds"] = time.perf_counter() - start
    row["peak_memory_mb"] = _peak_memory_mb()
    with contextlib.suppress(OSError):  # an unwritable folder: the row still comes back
        os.makedirs(job.out, exist_ok=True)
        with open(os.path.join(job.out, ROW_FILE), "w") as file:
            json.dump(row, file, indent=2)
            file.write("\n")
    return row


def _row(subject: Subject, status: str, *, similarity=None, dice=None, folds=None,
         error: str = "") -> dict:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(subject=subject.name, moving=subject.moving, status=status, error=error)
    if similarity is not None:
        row["similarity_before"], row["similarity_after"] = similarity
    if dice is not None:
        row["dice_before"], row["dice_after"] = dice
    if folds is not None:
        row.update(jacobian_min=folds["minimum"], folded=folds["folded"],
                   folded_fraction=folds["folded_fraction"])
    return row


def _message(error: BaseException) -> str:
    """One line: bad input says what it is, anything else its type too."""
    text = str(error) if isinstance(error, (CommandError, VolsampleError)) \
        else f"{type(error).__name__}: {error}"
    return " ".join(text.split())


def _peak_memory_mb() -> float | None:
    """This process's peak resident set so far (a worker's, on a cluster), in MiB."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


def _write_table(path: str, rows: list[dict]) -> None:
    try:
        with open(path, "w", newline="") as file:
            writer = csv.DictWriter(file, COLUMNS)
            writer.writeheader()
            writer.writerows({k: "" if row.get(k) is None else row[k] for k in COLUMNS}
                             for row in rows)
    except OSError as error:
        raise CommandError(f"--out: cannot write {path!r}: {error}") from None
