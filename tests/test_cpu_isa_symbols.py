"""Everything the per-ISA kernel objects compile lands in the ISA's own namespace
(vs::scalar, vs::avx2, vs::avx512).

Why it matters: the kernel sources are compiled once per instruction set, with that
set's target flags. An inline function or a template instantiation outside those
namespaces (say vs::find_tap_runs<float>, from a shared header) is emitted by every ISA
object as a weak symbol, and the linker keeps one copy, whichever object comes first: the
scalar kernels may then run a copy compiled for AVX2 or AVX-512 and die of an illegal
instruction on a CPU without it, however the module picks its ISA. Link order hides it on
the machines we test on, so the test reads the symbol tables instead.

It reads the kernel objects of the Ninja build trees under build/ that ninja calls up to
date (the linked extension is stripped, and could not say which object a symbol came
from): a weak or unique symbol whose entity lies in namespace vs but in no ISA namespace fails it. Run
without such a tree (an installed wheel), it has nothing to read and skips.
"""
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ISAS = ("scalar", "avx2", "avx512")
# The entity a mangled name names (a function, a variable, a local static, a vtable, a
# guard variable): its nested name starts with namespace vs, then maybe an ISA namespace.
_ENTITY = re.compile(r"^_Z(?:Z|T[VIS]|GVZ?|TH|TW)?N[rVKRO]*2vs(?P<isa>6scalar|4avx2|6avx512)?")
_SHARED_KINDS = set("WwVvu")  # weak and unique: one copy kept for every object


def _kernel_objects():
    """{tree: {isa: [object files]}} of the Ninja build trees whose kernel objects ninja
    itself calls up to date (a stale tree says nothing of the sources)."""
    trees = {}
    for tree in sorted((ROOT / "build").glob("*")):
        objects = {isa: sorted((tree / "CMakeFiles" / f"vs_kernels_{isa}.dir").rglob("*.o"))
                   for isa in ISAS}
        found = [str(o.relative_to(tree)) for files in objects.values() for o in files]
        if found and _ninja_up_to_date(tree, found):
            trees[tree] = {isa: files for isa, files in objects.items() if files}
    return trees


def _ninja_up_to_date(tree, targets) -> bool:
    """Whether ninja has nothing to rebuild for ``targets`` in ``tree`` (a dry run)."""
    if shutil.which("ninja") is None or not (tree / "build.ninja").exists():
        return False
    run = subprocess.run(["ninja", "-n", "-C", str(tree), *targets], capture_output=True,
                         text=True)
    return run.returncode == 0 and "no work to do" in run.stdout


def stray_symbols(objects) -> list[str]:
    """Weak or unique symbols of namespace vs outside the ISA namespaces, defined by the
    given object files (mangled, each once)."""
    stray = set()
    for path in objects:
        listing = subprocess.run(["nm", "--defined-only", str(path)], capture_output=True,
                                 text=True, check=True).stdout
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) != 3 or parts[1] not in _SHARED_KINDS:
                continue
            entity = _ENTITY.match(parts[2])
            if entity and not entity.group("isa"):
                stray.add(parts[2])
    return sorted(stray)


def _demangled(names):
    if not names or shutil.which("c++filt") is None:
        return names
    return subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                          text=True, check=True).stdout.splitlines()


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_kernel_objects_keep_every_symbol_in_their_isa_namespace():
    trees = _kernel_objects()
    if not trees:
        pytest.skip("no up-to-date build tree under build/ (cmake --build build/dev)")
    for tree, objects in trees.items():
        assert "scalar" in objects, f"{tree}: no scalar kernel objects"
        for isa, files in objects.items():
            stray = stray_symbols(files)
            assert not stray, (f"{tree.name}, {isa} objects: {len(stray)} weak symbols "
                               f"outside namespace vs::{isa}: "
                               + "; ".join(_demangled(stray[:8])))


def test_the_check_sees_a_stray_symbol(tmp_path):
    """The check itself: an object with an inline function of namespace vs outside the
    ISA namespaces (the mistake) fails it; the same function inside vs::avx2 passes."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None or shutil.which("nm") is None:
        pytest.skip("needs a C++ compiler and nm")
    source = tmp_path / "kernel.cpp"
    results = {}
    for name, wrap in (("stray", "namespace vs {"), ("isa", "namespace vs { namespace avx2 {")):
        close = "}" * wrap.count("{")
        source.write_text(f"{wrap}\ntemplate <class T> inline T twice(T x) {{ return x + x; }}\n"
                          f"{close}\nfloat use(float x) {{ return vs::"
                          f"{'avx2::' if name == 'isa' else ''}twice(x); }}\n")
        obj = tmp_path / f"{name}.o"
        subprocess.run([compiler, "-O0", "-c", str(source), "-o", str(obj)], check=True)
        results[name] = stray_symbols([obj])
    assert results["stray"] == ["_ZN2vs5twiceIfEET_S1_"]
    assert results["isa"] == []
