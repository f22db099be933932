"""The compiled CPU core's instruction-set choice: VOLSAMPLE_CPU_ISA, set_isa, and the
errors for a name that is unknown or that this CPU cannot run (that every ISA computes the
scalar path's bits is tested per operator in test_cpu_isa*.py); and the integer codes of
the modes it exposes."""
from __future__ import annotations

import os
import subprocess
import sys

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
