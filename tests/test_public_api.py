"""The public API as users and type checkers see it: every public function, and every
public method of a public class, annotated in full (its parameters and its return), and
the package marked as typed (PEP 561). "Public" is ``volsample._public``'s rule, the one
the documentation's API pages follow."""
from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from importlib import resources

import pytest

from volsample import _public


def _functions(module):
    """(qualified name, function) of what ``module`` offers, methods of classes included."""
    documented, _ = _public.names(module)
    for name in documented:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if inspect.isfunction(member) and (attr == "__init__" or not attr.startswith("_")):
                    yield f"{module.__name__}.{name}.{attr}", member
        elif inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj


def _unannotated(function) -> list[str]:
    signature = inspect.signature(function)
    missing = [name for name, p in signature.parameters.items()
               if p.annotation is inspect.Parameter.empty and name not in ("self", "cls")]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


@pytest.mark.parametrize("module_name", _public.module_names())
def test_public_functions_are_annotated(module_name):
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:  # an optional dependency (torch, dask, jax) is missing
        pytest.skip(str(error))
    gaps = {name: missing for name, f in _functions(module) if (missing := _unannotated(f))}
    assert not gaps, f"public functions without full annotations: {gaps}"


def test_the_rule_finds_the_front_doors():
    """The rule sees the functions users call, so an empty answer cannot pass for a clean
    one."""
    import volsample

    found = {name for name, _ in _functions(volsample)}
    assert {"volsample.grid_sample_3d", "volsample.upsample_trilinear_3d_backward"} <= found
    assert "volsample.registration" in _public.module_names()
    assert "volsample.cli" not in _public.module_names()


def test_package_is_marked_typed():
    assert resources.files("volsample").joinpath("py.typed").is_file()


def _run_python(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registration_keeps_its_public_name():
    """``volsample.registration`` is the applications' registration module itself, not a
    copy (what is set on one name, the other reads), in either import order, and it is
    documented once, under that name."""
    _run_python("from volsample import registration\n"
                "import volsample.apps.registration as home\n"
                "assert registration is home, registration")
    _run_python("import volsample.apps.registration as home, volsample.registration\n"
                "assert volsample.registration is home, volsample.registration")
    assert "volsample.apps.registration" not in _public.module_names()


def test_the_library_imports_no_application():
    """The applications' wing stands above the library: importing the front doors loads
    none of its modules."""
    _run_python("import importlib, sys\n"
                "for name in ('volsample', 'volsample.aclnn', 'volsample.dask', 'volsample.jax', 'volsample.torch'):\n"
                "    try:\n"
                "        importlib.import_module(name)\n"
                "    except ImportError:  # an optional dependency (torch, dask, jax) is missing\n"
                "        pass\n"
                "apps = [m for m in sys.modules if m.startswith('volsample.apps')]\n"
                "assert not apps, apps")


def test_readme_names_every_error_volsample_raises():
    # README's paragraph on bad input names each public error class with its builtin base
    import pathlib
    import re

    import volsample

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    paragraph = " ".join(readme[readme.index("Bad input raises"):].split("\n\n")[0].split())
    errors = {name: getattr(volsample, name) for name in volsample.__all__
              if inspect.isclass(getattr(volsample, name))
              and issubclass(getattr(volsample, name), volsample.VolsampleError)
              and getattr(volsample, name) is not volsample.VolsampleError}
    assert len(errors) >= 3
    for name, error in errors.items():
        base = next(b for b in error.__mro__[1:] if b.__module__ == "builtins")
        assert re.search(rf"`volsample\.{name}` \(an? `{base.__name__}`\)", paragraph), name
