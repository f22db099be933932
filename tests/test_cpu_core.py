"""The compiled CPU core's instruction-set choice: VOLSAMPLE_CPU_ISA, set_isa, and the
errors for a name that is unknown or that this CPU cannot run (that every ISA computes the
scalar path's bits is tested per operator in test_cpu_isa*.py); and the integer codes of
the modes it exposes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from volsample import _cpu, _tables


def _isa_in_child(value):
    env = dict(os.environ, VOLSAMPLE_CPU_ISA=value)
    return subprocess.run([sys.executable, "-c", "from volsample import _cpu; print(_cpu.isa())"],
                          capture_output=True, text=True, env=env, timeout=120)


def test_scalar_is_always_supported_and_the_best_is_chosen_by_default():
    supported = _cpu.supported_isas()
    assert supported[0] == "scalar"
    result = _isa_in_child("")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == supported[-1]


@pytest.mark.parametrize("name", _cpu.supported_isas())
def test_environment_variable_chooses_the_isa(name):
    result = _isa_in_child(name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == name


def test_unknown_isa_in_the_environment_fails_the_import_with_the_choices():
    result = _isa_in_child("neon9000")
    assert result.returncode != 0
    assert "VOLSAMPLE_CPU_ISA" in result.stderr and "scalar" in result.stderr


def test_set_isa_switches_and_rejects_unknown_names():
    before = _cpu.isa()
    try:
        _cpu.set_isa("scalar")
        assert _cpu.isa() == "scalar"
        with pytest.raises(ValueError, match="expected one of scalar"):
            _cpu.set_isa("sse9")
        assert _cpu.isa() == "scalar"
    finally:
        _cpu.set_isa(before)


def test_float32_calls_do_not_import_ml_dtypes():
    """Importing ml_dtypes takes most of a second: volsample imports it only for bfloat16
    (whose arrays come from ml_dtypes anyway)."""
    code = ("import sys, numpy as np, volsample\n"
            "x = np.ones((1, 1, 2, 2, 2), np.float32)\n"
            "volsample.grid_sample_3d(x, np.zeros((1, 1, 1, 1, 3), np.float32))\n"
            "volsample.upsample_trilinear_3d(x, (3, 3, 3))\n"
            "print('ml_dtypes' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False", run.stderr


def test_kernel_codes_of_modes_and_paddings_are_pythons():
    # The C++ enums (tensor.h) as the module exposes them are the tables' kernel integers,
    # entry for entry: a mode added on one side only fails here.
    assert _cpu.MODES == {c.name: c.code for c in _tables.MODES.choices}
    assert _cpu.PADDINGS == {c.name: c.code for c in _tables.PADDINGS.choices}


@pytest.mark.parametrize("kernel", ["grid_sample_forward", "grid_sample_backward"])
@pytest.mark.parametrize("mode,padding,what", [(4, 0, "interpolation mode"),
                                               (-1, 0, "interpolation mode"),
                                               (0, 3, "padding mode")])
def test_kernels_refuse_integers_of_no_mode(kernel, mode, padding, what):
    """An integer that names no mode or padding is an error in the C++ core itself, never
    some mode's kernel (the front doors check first; this is the core's own guard)."""
    x = np.ones((1, 1, 2, 2, 2), np.float32)
    grid = np.zeros((1, 1, 1, 1, 3), np.float32)
    out = np.empty((1, 1, 1, 1, 1), np.float32)
    arrays = (x, grid, out) if kernel == "grid_sample_forward" else (out, x, grid, x.copy(),
                                                                     grid.copy())
    with pytest.raises(ValueError, match=what):
        getattr(_cpu._kernels, kernel)(*arrays, mode, padding, False, 1)


# A child that loads volsample's kernels, then prints the environment's OMP_WAIT_POLICY and
# has libgomp display the settings it runs under (to stderr): how long a waiting thread
# spins, GOMP_SPINCOUNT, tells the policies apart (libgomp shows an unset policy as PASSIVE
# too, with 300,000 spins). The runtime is found where the process mapped it: a wheel
# carries its own copy under another name (volsample.libs/libgomp-<hash>.so.1.0.0).
_WAIT_POLICY_CHILD = """
import ctypes, os
import volsample._cpu
print(os.environ.get("OMP_WAIT_POLICY"))
with open("/proc/self/maps") as maps:
    runtimes = [line.split()[-1] for line in maps if "/libgomp" in line]
if not runtimes:
    raise SystemExit("the kernels did not load libgomp")
ctypes.CDLL(runtimes[0], mode=os.RTLD_NOLOAD).omp_display_env(1)
"""


def _wait_policy_in_child(**env_vars):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    result = subprocess.run([sys.executable, "-c", _WAIT_POLICY_CHILD], capture_output=True,
                            text=True, env={**env, **env_vars}, timeout=120)
    if result.returncode != 0 and ("libgomp" in result.stderr or "omp_display_env" in result.stderr):
        pytest.skip("the kernels' OpenMP runtime is not GCC's libgomp")
    assert result.returncode == 0, result.stderr
    spins = [line.split("=")[1].strip(" '") for line in result.stderr.splitlines()
             if "GOMP_SPINCOUNT" in line]
    return result.stdout.strip(), spins


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp: Linux builds")
def test_openmp_threads_wait_passively_unless_the_user_chose():
    """volsample loads its OpenMP runtime with the passive wait policy and takes the
    variable out of the environment again; a policy the user set is kept."""
    environ, spins = _wait_policy_in_child()
    assert (environ, spins) == ("None", ["0"])
    environ, spins = _wait_policy_in_child(OMP_WAIT_POLICY="active")
    assert environ == "active" and spins and int(spins[0]) > 300_000, spins
    environ, spins = _wait_policy_in_child(GOMP_SPINCOUNT="1000")
    assert (environ, spins) == ("None", ["1000"])


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2
                    or _cpu.max_threads() < 2, reason="needs Linux, OpenMP and two CPUs")
def test_a_region_spreads_its_threads_over_cpus_beside_a_busy_one():
    """With one CPU busy in another process, Linux tends to wake a region's second thread on
    the caller's CPU and leave it there; the kernels' regions move it to another CPU
    (team.h), so the two threads run on distinct CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    spin = (f"import os\nos.sched_setaffinity(0, {{{cpus[-1]}}})\nprint(flush=True)\n"
            "while True: pass")
    busy = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    try:
        busy.stdout.readline()  # pinned, and about to spin
        time.sleep(0.2)
        placed = [_cpu.team_cpus(2) for _ in range(100)]
    finally:
        busy.kill()
        busy.wait()
    assert all(len(p) == 2 and min(p) >= 0 for p in placed), placed[:5]
    apart = sum(p[0] != p[1] for p in placed)
    assert apart >= 90, placed[:10]
