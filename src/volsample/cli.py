"""The ``volsample`` command line: demo, register, register-cohort, bench and info.

Each subcommand's options and work live in its own module of the applications' wing
(``volsample.apps.register``, ``volsample.apps.cohort``, ``volsample.apps.bench``), as a pair
``add_<name>_arguments(parser)`` / ``run_<name>(args) -> exit code``; this module only
wires them into one parser.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
_SUBCOMMANDS = {
    "demo": ("volsample.apps.register", "register a built-in synthetic pair and report the result"),
    "register": ("volsample.apps.register", "register a moving volume to a fixed one"),
    "register-cohort": ("volsample.apps.cohort",
                        "register many moving volumes to one template, here or on a Dask "
                        "cluster"),
    "bench": ("volsample.apps.bench", "benchmark volsample against the peers installed"),
    "info": ("volsample.cli", "version, threads, backends and devices found"),
}


def add_info_arguments(parser: argparse.ArgumentParser) -> None:
    """``info`` takes no options."""


def run_info(args: argparse.Namespace) -> int:
    import numpy as np

    import volsample
    from volsample import _backends

    cpu = _backends.cpu_core()

    print(f"volsample {volsample.__version__}")
    print(f"numpy {np.__version__}")
    print(f"CPU threads: {volsample.get_num_threads()} (of {cpu.max_threads()})")
    print(f"CPU kernels: {cpu.isa()} (this CPU runs: {', '.join(cpu.supported_isas())})")
    print(f"deterministic GPU reductions: {volsample.get_deterministic()}")
    try:
        import torch
    except ImportError:
        print("torch: not installed (volsample.torch unavailable)")
    else:
        cuda = torch.cuda.is_available()
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
        print(f"torch {torch.__version__}; CUDA devices: {', '.join(devices) or 'none'}")
    try:
        import triton
    except ImportError:
        print("triton: not installed (no GPU backend)")
    else:
        print(f"triton {triton.__version__}")
    return 0


# --help's description: plain text (the module docstring is reStructuredText)
_DESCRIPTION = "volsample's command line: demo, register, register-cohort, bench and info."


def build_parser() -> argparse.ArgumentParser:
    from volsample import __version__

    parser = argparse.ArgumentParser(prog="volsample", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"volsample {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in _SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        function = name.replace("-", "_")
        getattr(module, f"add_{function}_arguments")(sub)
        sub.set_defaults(run=getattr(module, f"run_{function}"))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
