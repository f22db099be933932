"""The package's import graph, read from its sources: imports run down the layers that
docs/architecture.md draws (command line > applications > front doors > op layer > the
backends' seam > backends > the shared rules), no front door imports another, the doors
and the op layer reach the backends only through the seam (``_backends``), and no two
modules import each other, however indirectly. And the GPU backend stands without the
C++ one: ``volsample._triton`` (and volsample itself) imports where the extension is
missing."""
from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys
import textwrap

import pytest

import volsample

ROOT = pathlib.Path(volsample.__file__).parent

# Top to bottom; a module's layer is the first whose names or prefixes hold it.
LAYERS = [
    ("command line", {"volsample.cli", "volsample.__main__", "volsample._public"}, ()),
    ("applications", {"volsample.registration"}, ("volsample.apps",)),
    ("front doors", {"volsample", "volsample.grid_sample", "volsample.upsample",
                     "volsample.warp", "volsample.spline", "volsample.fields", "volsample.dask"},
     ("volsample.torch", "volsample.aclnn", "volsample.jax")),
    ("op layer", {"volsample._calls", "volsample._prepared", "volsample._config",
                  "volsample._fields", "volsample._prefilter", "volsample._progress",
                  "volsample._reference"}, ()),
    ("seam", {"volsample._backends"}, ()),
    ("backends", set(), ("volsample._cpu", "volsample._triton")),
    ("shared rules", {"volsample._tables", "volsample._dtypes", "volsample._layout",
                      "volsample._checks", "volsample._errors", "volsample._coords",
                      "volsample._weights", "volsample._torch_formats",
                      "volsample._upsample_maps", "volsample._result_cache"}, ()),
]
# Each front door on its own: the NumPy API (the package's functions), dask, torch, aclnn.
DOORS = {"numpy": {"volsample", "volsample.grid_sample", "volsample.upsample", "volsample.warp",
                   "volsample.spline", "volsample.fields"}}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    """Each module's imports of volsample modules (a name imported from a package is its
    module where it is one), at any depth of its code."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    found.add(full if full in modules else base)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _layer(name: str) -> int:
    for rank, (_, names, prefixes) in enumerate(LAYERS):
        if name in names or any(name == p or name.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{name} is in no layer: add it to LAYERS (and the architecture)")


def _door(name: str) -> str | None:
    if name in DOORS["numpy"]:
        return "numpy"
    for door in ("volsample.dask", "volsample.torch", "volsample.aclnn", "volsample.jax"):
        if name == door or name.startswith(door + "."):
            return door
    return None


def test_the_graph_is_read():
    graph = _graph()
    assert "volsample._backends" in graph["volsample.grid_sample"]
    assert "volsample._cpu" in graph["volsample._backends"]
    assert "volsample._triton.grid_coords" in graph["volsample._triton.grid_sample"]


def test_imports_run_down_the_layers():
    upward = [f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
              for a, targets in _graph().items() for b in targets if _layer(b) < _layer(a)]
    assert not upward, "\n".join(upward)


def test_no_front_door_imports_another():
    crossing = [f"{a} imports {b}" for a, targets in _graph().items() for b in targets
                if _door(a) and _door(b) and _door(a) != _door(b)]
    assert not crossing, "\n".join(crossing)


def test_doors_and_op_layer_reach_the_backends_through_the_seam():
    backends = LAYERS.index(next(layer for layer in LAYERS if layer[0] == "backends"))
    doors = LAYERS.index(next(layer for layer in LAYERS if layer[0] == "front doors"))
    direct = [f"{a} imports {b}" for a, targets in _graph().items() for b in targets
              if doors <= _layer(a) < backends - 1 and _layer(b) == backends]
    assert not direct, "\n".join(direct)


def test_no_import_circle():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name, path):
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                raise AssertionError(" -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


_WITHOUT_EXTENSION = textwrap.dedent("""
    import importlib.abc, sys

    class Unbuilt(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "volsample._cpu._kernels":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Unbuilt())
    import volsample._triton.grid_sample, volsample._triton.upsample, volsample._triton.warp
    import numpy as np
    import volsample, volsample.torch
    assert not [m for m in sys.modules if m.startswith("volsample._cpu")]
    try:
        volsample.grid_sample_3d(np.zeros((1, 1, 2, 2, 2)), np.zeros((1, 1, 1, 1, 3)))
    except RuntimeError as error:
        assert "C++ CPU backend" in str(error), error
    else:
        raise AssertionError("a CPU call without the C++ core ran")
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None
                    or importlib.util.find_spec("torch") is None, reason="needs triton, torch")
def test_the_gpu_backend_imports_without_the_cpp_extension():
    """A GPU-only install: the Triton backend, the package and the torch door import with
    the C++ extension missing, and a CPU call says what is missing."""
    env_path = str(ROOT.parent)
    run = subprocess.run([sys.executable, "-c", _WITHOUT_EXTENSION], capture_output=True,
                         text=True, timeout=600,
                         env={**__import__("os").environ, "PYTHONPATH": env_path})
    assert run.returncode == 0, run.stderr[-4000:]
