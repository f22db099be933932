"""The ISA variants of the kernels share no code, and the extension exports only its init.

Why it matters: the kernel sources are compiled once per instruction set (vs::scalar,
vs::avx2, vs::avx512), with that set's target flags. An inline function or a template
instantiation they share (say vs::find_tap_runs<float> from a shared header, or the C++
library's std::vector<long>::_M_default_append) is emitted by every ISA object as a weak
symbol, and the linker keeps one copy, whichever object comes first: the scalar kernels
may then run a copy compiled for AVX2 or AVX-512 and die of an illegal instruction on a
CPU without it, however the module picks its ISA. Link order hides it on the machines we
test on, so the tests read the symbol tables instead:

- the kernel objects of each Ninja build tree under build/ that ninja calls up to date
  keep whatever they define of namespace vs in their ISA's namespace (the sources'
  discipline; off ELF, all that keeps the kernels' own code apart);
- on Linux, the objects the extension links (CMakeLists.txt links each ISA's objects into
  one whose symbols are local but those of its namespace) define no weak or unique symbol
  that another ISA's objects, or the module's own, define too;
- on Linux, the extension Python imports (a build's or an installed wheel's) exports
  PyInit__kernels and nothing else.

The linked extension is stripped, and could not say which object a symbol came from: the
first two read the build trees, and skip without one (an installed wheel).
"""
import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys

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


def _extension_link(tree) -> dict[str, list[pathlib.Path]]:
    """{isa or "module": [object files]} that the extension's link reads in ``tree`` (ninja
    says which), when ninja has nothing to rebuild for it; {} otherwise."""
    if not _ninja_up_to_date(tree, ["_kernels"]):
        return {}
    library = _ninja_inputs(tree, "_kernels")[0]
    link = {}
    for path in _ninja_inputs(tree, library):
        if path.endswith(".o"):
            isa = re.search(r"vs_kernels_([a-z0-9]+)", path)
            link.setdefault(isa.group(1) if isa else "module", []).append(tree / path)
    return link


def _ninja_inputs(tree, target) -> list[str]:
    """The explicit inputs of ``target``'s build statement in ``tree``."""
    query = subprocess.run(["ninja", "-C", str(tree), "-t", "query", target],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    inputs = []
    for line in query[2:]:  # after "target:" and "  input: rule"
        if not line.startswith("    ") or line.lstrip().startswith("|"):
            break
        inputs.append(line.strip())
    return inputs


def _shared_symbols(objects) -> set[str]:
    """The weak and unique symbols the given object files define (mangled)."""
    names = set()
    for path in objects:
        listing = subprocess.run(["nm", "--defined-only", str(path)], capture_output=True,
                                 text=True, check=True).stdout
        names.update(parts[2] for parts in map(str.split, listing.splitlines())
                     if len(parts) == 3 and parts[1] in _SHARED_KINDS)
    return names


def symbols_in_common(groups) -> dict[str, list[str]]:
    """{mangled name: [groups]} of the weak or unique symbols that the object files of
    more than one group ({name: [object files]}) define."""
    defined_by = {}
    for group, objects in groups.items():
        for name in _shared_symbols(objects):
            defined_by.setdefault(name, []).append(group)
    return {name: by for name, by in sorted(defined_by.items()) if len(by) > 1}


def stray_symbols(objects) -> list[str]:
    """Weak or unique symbols of namespace vs outside the ISA namespaces, defined by the
    given object files (mangled, each once)."""
    return sorted(name for name in _shared_symbols(objects)
                  if (entity := _ENTITY.match(name)) and not entity.group("isa"))


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


_ELF_ONLY = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("nm") is None,
    reason="Linux: CMakeLists.txt keeps the ISAs' copies apart on ELF; binutils' nm")


@_ELF_ONLY
def test_each_isa_links_its_own_copies_of_shared_code():
    links = {tree: link for tree in sorted((ROOT / "build").glob("*"))
             if (link := _extension_link(tree))}
    if not links:
        pytest.skip("no up-to-date build tree under build/ (cmake --build build/dev)")
    for tree, link in links.items():
        assert "scalar" in link, f"{tree}: no scalar kernel objects in the extension's link"
        common = list(symbols_in_common(link).items())
        assert not common, (f"{tree.name}: {len(common)} weak symbols defined by the objects "
                            "of two ISAs (or an ISA's and the module's): " + "; ".join(
                                f"{name} ({', '.join(by)})" for name, (_, by) in
                                zip(_demangled([n for n, _ in common[:8]]), common[:8])))


@_ELF_ONLY
def test_the_extension_exports_only_its_init():
    library = importlib.util.find_spec("volsample._cpu._kernels").origin
    listing = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True,
                             text=True, check=True).stdout
    exported = [line.split()[-1] for line in listing.splitlines() if line.strip()]
    assert exported == ["PyInit__kernels"], (f"{library} exports {len(exported)} symbols: "
                                             + "; ".join(_demangled(exported[:8])))


@_ELF_ONLY
def test_the_check_sees_a_template_two_isas_share(tmp_path):
    """The check itself: the objects of two ISAs that grow a std::vector<long> both define
    its growth (libstdc++'s name for it); an object that uses no template shares nothing."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("needs a C++ compiler")
    grow = ("#include <vector>\nlong {}(long n) {{ std::vector<long> v; v.resize(n); "
            "return long(v.size()); }}\n")
    sources = {"scalar": grow.format("grow"), "avx2": grow.format("grow2"),
               "avx512": "long plain(long n) { return n + 1; }\n"}
    objects = {}
    for isa, text in sources.items():
        source = tmp_path / f"{isa}.cpp"
        source.write_text(text)
        objects[isa] = [tmp_path / f"{isa}.o"]
        subprocess.run([compiler, "-O0", "-c", str(source), "-o", str(objects[isa][0])],
                       check=True)
    common = symbols_in_common(objects)
    assert common["_ZNSt6vectorIlSaIlEE17_M_default_appendEm"] == ["scalar", "avx2"]
    assert not any("avx512" in by for by in common.values())
