"""The Triton kernels compiled ahead of time for NVIDIA GPUs, sm_80 and sm_90, on this CPU
(``volsample.apps.triton_aot``: Triton's compiler, ptxas and cuobjdump; no GPU needed).

Every specialization the launchers ask for in a sweep must compile, keep no stack frame
or local memory (no spills), have no atomic where a reproducible call launched it, and
call no subroutine (a 64-bit division, a division's or fmod's slow path). CI compiles
the calls most prone to spills, which reach every kernel, in the modes of up to 2 taps
per axis (the cubic modes' are in the full sweep) (a few minutes cold on 2 busy
cores; Triton's cache keeps the results for later runs); the full sweep, every pair of
the launchers' factor values, is slow-marked (``python -m pytest -m slow
tests/test_triton_aot.py``, or the command in docs/testing.md).

The sweeps run in a child interpreter: the interpreted Triton tests set TRITON_INTERPRET
before they import the kernels, and compiling needs them undecorated by the interpreter.
"""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
# Not imported here: Triton read now, without TRITON_INTERPRET, would leave the
# interpreted tests collected after this module with kernels they cannot run.
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                 reason="needs triton"),
              pytest.mark.skipif(sys.platform != "linux",
                                 reason="Triton's NVIDIA compiler runs on Linux")]

KERNELS = {"grid_sample._forward_kernel", "grid_sample._backward_points_kernel",
           "grid_sample._gather_input_grad_kernel", "upsample._forward_kernel",
           "upsample._adjoint_pass_kernel"}


def _child_env():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    import volsample
    if os.path.dirname(os.path.dirname(os.path.abspath(volsample.__file__))) == src:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return env


def _sweep(tmp_path, strength, timeout):
    out = tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-m", "volsample.apps.triton_aot", "--strength",
                          str(strength), "--jobs", "2", "--json", str(out)],
                         capture_output=True, text=True, env=_child_env(), timeout=timeout)
    assert out.exists(), run.stdout[-4000:] + run.stderr[-4000:]
    return run, json.loads(out.read_text())


def _check(run, results):
    problems = [f"sm_{r['arch']} {r['kernel']} {r['constants']}: {p} (first launched by "
                f"{r['example']})" for r in results for p in r["problems"]]
    assert not problems, "\n".join(problems)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for arch in (80, 90):
        assert {r["kernel"] for r in results if r["arch"] == arch} == KERNELS
    # the sweep saw the scatter's atomics where they belong: the check can see them
    scatter = [r for r in results if r["constants"].get("SCATTER")]
    assert scatter and all(r["atomics"] > 0 and not r["reproducible"] for r in scatter)


def test_kernels_most_prone_to_spills_compile_clean(tmp_path):
    _check(*_sweep(tmp_path, 0, timeout=1800))


@pytest.mark.slow
def test_every_pair_of_launch_factors_compiles_clean(tmp_path):
    _check(*_sweep(tmp_path, 2, timeout=4 * 3600))


def test_every_kernel_is_swept():
    """KERNELS above lists every @triton.jit kernel of the package (a kernel added to a
    module must join the sweeps and this list)."""
    script = textwrap.dedent("""
        import importlib, json, pkgutil
        import triton
        import volsample._triton as vt
        found = set()
        for info in pkgutil.iter_modules(vt.__path__):
            module = importlib.import_module(f"volsample._triton.{info.name}")
            for name, value in vars(module).items():
                if isinstance(value, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
                    found.add(f"{info.name}.{name}")
        print(json.dumps(sorted(found)))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=_child_env(), timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert set(json.loads(run.stdout.strip().splitlines()[-1])) == KERNELS


_PROBES = textwrap.dedent("""
    import json
    import triton
    import triton.language as tl
    from volsample.apps import triton_aot as aot

    @triton.jit
    def divides(x, out, d, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK).to(tl.int64)
        tl.store(out + i, tl.load(x + i) // d)

    @triton.jit
    def adds(x, out, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.atomic_add(out + i, tl.load(x + i))

    @triton.jit
    def spills(x, out, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        v = tl.load(x + i)
        tl.store(out + i, v * tl.sum(v) + tl.flip(v, 0))

    def probe(fn, signature, constexprs, **options):
        options = dict(dict(num_warps=4, num_ctas=1, num_stages=1, enable_fp_fusion=False),
                       **options)
        spec = aot.Specialization(__name__, fn.__name__, signature, constexprs, {}, options,
                                  True, "probe")
        r = aot.compile_one(spec, 80)
        return dict(calls=r.calls, atomics=r.atomics, stack=r.stack, local=r.local,
                    error=r.error, problems=r.problems())

    print(json.dumps({
        "divides": probe(divides, {"x": "*i64", "out": "*i64", "d": "i64", "BLOCK": "constexpr"},
                         {(3,): 128}),
        "adds": probe(adds, {"x": "*fp32", "out": "*fp32", "BLOCK": "constexpr"}, {(2,): 128}),
        "spills": probe(spills, {"x": "*fp64", "out": "*fp64", "BLOCK": "constexpr"},
                        {(2,): 1024}, num_warps=1, maxnreg=32),  # 64 registers' worth
    }))
""")


def test_the_checks_see_divisions_atomics_and_spills(tmp_path):
    """What the sweeps must not find is found where it is: a 64-bit division per element
    (a subroutine call), an atomic, a block of values that outgrows a register cap."""
    probe = tmp_path / "probes.py"
    probe.write_text(_PROBES)
    env = _child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", "import probes"], capture_output=True,
                         text=True, env=env, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert not any(f["error"] for f in found.values()), found
    assert found["divides"]["calls"] > 0 and found["divides"]["problems"]
    assert found["adds"]["atomics"] > 0 and found["adds"]["problems"]
    assert found["spills"]["stack"] + found["spills"]["local"] > 0
    assert found["spills"]["problems"]


def test_a_sweep_of_some_modes_rewrites_its_own_section(tmp_path):
    """``--modes`` sweeps grid sampling in those modes alone; its table replaces its own
    section of the markdown file and keeps the rest. CI's sweep leaves the cubic modes
    out, every other sweep has them."""
    from volsample.apps import triton_aot as aot

    cubic = ("bicubic", "bspline")
    rows = aot.sweep(0, cubic)
    assert rows and {family for family, _ in rows} == {"grid_sample"}
    assert {row["mode"] for _, row in rows} == {2, 3}
    assert {row["mode"] for family, row in aot.sweep(0) if family == "grid_sample"} == {0, 1}
    assert {row["mode"] for family, row in aot.sweep(1) if family == "grid_sample"} == {0, 1, 2, 3}
    doc = tmp_path / "gpu.md"
    aot.write_markdown(str(doc), "# all modes\n")
    aot.write_markdown(str(doc), "## cubic, first\n", cubic)
    aot.write_markdown(str(doc), "## nearest\n", ("nearest",))
    aot.write_markdown(str(doc), "## cubic, second\n", cubic)
    text = doc.read_text()
    assert text.startswith("# all modes\n") and "first" not in text
    assert text.index("## cubic, second") < text.index("## nearest")
    aot.write_markdown(str(doc), "# all modes again\n")
    assert doc.read_text() == "# all modes again\n"
