"""What volsample offers its users: the public modules and their public names.

One rule, read by the documentation build (docs/conf.py writes an API page per module)
and by the tests (every public function is fully annotated): a module is public when no
part of its name starts with an underscore, the command-line modules aside; its public
names are its ``__all__``, or else the functions and classes it defines (not those it
imports) and its upper-case constants.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

# Command-line modules: documented by their --help (volsample bench's parts too).
COMMAND_LINE = frozenset({"volsample.cli", "volsample.apps.register", "volsample.apps.bench",
                          *(f"volsample.apps.bench_{part}"
                            for part in ("workloads", "peers", "timing", "report", "plots", "jax")),
                          "volsample.apps.triton_aot", "volsample.__main__"})
# Modules documented under another name, which is the same module: the applications'
# registration is volsample.registration.
ALIASED = frozenset({"volsample.apps.registration"})


def module_names() -> list[str]:
    """``volsample`` and its public submodules, package by package.

    Private packages are not entered: walking into one imports it, and importing
    ``volsample._triton`` decorates its kernels, which must wait until a test has chosen
    Triton's interpreter."""
    import volsample

    names, packages = ["volsample"], [volsample]
    while packages:
        package = packages.pop(0)
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if (info.name.rpartition(".")[2].startswith("_") or info.name in COMMAND_LINE
                    or info.name in ALIASED):
                continue
            names.append(info.name)
            if info.ispkg:
                packages.append(importlib.import_module(info.name))
    return names


def names(module: ModuleType) -> tuple[list[str], list[str]]:
    """(functions and classes, constants) that ``module`` offers."""
    listed = getattr(module, "__all__", None)
    candidates = list(listed) if listed is not None else [
        n for n in vars(module) if not n.startswith("_")]
    documented, constants = [], []
    for name in candidates:
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            continue
        if callable(obj):
            home = getattr(obj, "__module__", "") or ""
            if listed is not None or home.startswith(module.__name__):
                documented.append(name)
        elif name.isupper():
            constants.append(name)
    return documented, constants


def modules() -> list[ModuleType]:
    """The public modules, imported."""
    return [importlib.import_module(name) for name in module_names()]
