"""The Triton backend's prepared calls (``prepare_forward`` / ``prepare_backward``), run on
the CPU by Triton's interpreter: the backends keep one contract, a prepared call run on new
operands of its key gives what a fresh call gives, and the torch ops' CUDA kernels prepare
a key's call once (through ``_prepared``, as their CPU kernels do) and agree with the CPU
kernels, the C++ core's.

Oracles: the unprepared launchers (the same kernels: the same bits) and the C++ backend,
within the tolerances of tests/test_triton.py (float64: 1e-12; float32: a few ulps of
float32 either side).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, at import

import inspect  # noqa: E402

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import volsample  # noqa: E402
import volsample.torch  # noqa: E402, F401  (defines the ops)
from volsample import _backends, _calls, _prepared  # noqa: E402
from volsample._triton import grid_sample as tgs  # noqa: E402
from volsample._triton import upsample as tup  # noqa: E402
from volsample._triton import warp as twarp  # noqa: E402
from volsample.torch import _grid_sample, _operands, _upsample, _warp  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, on NaN lanes

FAMILIES = ("grid_sample", "upsample", "warp")
# What the doors call on a backend's family, and on the calls it prepares.
CONTRACT = ("forward", "backward", "workspace_nbytes", "preparable", "prepare_forward",
            "prepare_backward")
TOLERANCE = {torch.float64: (1e-12, 1e-12), torch.float32: (3e-5, 3e-5)}
ops = torch.ops.volsample


def _operand_names(fn) -> list[str] | None:
    """The parameters without a default, in order (the operands and results; the
    backends' own settings come after them, with defaults); None for a function of
    ``*args``."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return [p.name for p in params if p.default is p.empty]


@pytest.mark.parametrize("family", FAMILIES)
def test_both_backends_keep_one_contract(family):
    """Each family of the C++ and the Triton backends has every function of the contract,
    taking the same operands in the same order."""
    cpu, gpu = _backends.cpu(family), _backends.gpu(family)
    assert [n for n in CONTRACT if callable(getattr(cpu, n, None))] == list(CONTRACT)
    assert [n for n in CONTRACT if callable(getattr(gpu, n, None))] == list(CONTRACT)
    for name in CONTRACT:
        theirs, ours = _operand_names(getattr(cpu, name)), _operand_names(getattr(gpu, name))
        if theirs is not None and ours is not None:
            assert theirs == ours, f"{family}.{name}"


def test_prepared_calls_of_both_backends_run_on_new_operands():
    """The objects both backends prepare run with ``forward_on`` / ``backward_on``."""
    x, grid, go = _problem(torch.float32)
    call = _calls.grid_sample(_operands.operand("input", x), _operands.operand("grid", grid),
                              0, 0, False, shape_order="NCDHW")
    views = volsample.torch._memory.read_only_array
    for backend, read in ((_backends.cpu("grid_sample"), views),
                          (_backends.gpu("grid_sample"), lambda t: t)):
        out = torch.empty(call.output_shape)
        prepared = backend.prepare_forward(call, read(x), read(grid),
                                           volsample.torch._memory.writable_array(out)
                                           if read is views else out)
        assert callable(prepared.forward_on) and callable(prepared.backward_on)


def _problem(dtype, seed=0, C=2, kind="ncdhw"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, C, 3, 4, 5, generator=gen, dtype=torch.float64).to(dtype)
    grid = ((torch.rand(1, 2, 3, 2, 3, generator=gen, dtype=torch.float64) * 2 - 1) * 1.2
            ).to(dtype)
    go = torch.randn(1, C, 2, 3, 2, generator=gen, dtype=torch.float64).to(dtype)
    if kind == "channels_last":
        x, go = (t.contiguous(memory_format=torch.channels_last_3d) for t in (x, go))
    return x, grid, go


def _assert_close(name, actual, expected):
    rtol, atol = TOLERANCE[expected.dtype]
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
    assert actual.stride() == expected.stride(), name
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=name)


def _assert_bits(name, a, b):
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), name


def _spy(monkeypatch, module, *names) -> dict:
    """Count the calls of ``module``'s functions ``names`` (the doors look them up at
    each use)."""
    counts = dict.fromkeys(names, 0)

    def counted(name, fn):
        def run(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return run

    for name in names:
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    return counts


def test_a_prepared_grid_sample_takes_new_operands_and_results_of_any_strides():
    """A call prepared on one set of operands and a result whose points do not lie at one
    stride (computed into a dense copy) gives, on other values and another such result,
    the bits of a fresh call."""
    x, grid, go = _problem(torch.float32)
    call = _calls.grid_sample(_operands.operand("input", x), _operands.operand("grid", grid),
                              0, 2, True, shape_order="NCDHW")
    backward = _calls.grid_sample_backward(
        _operands.operand("grad_output", go), _operands.operand("input", x),
        _operands.operand("grid", grid), 0, 2, True, (True, True), shape_order="NCDHW")

    def strided_result():  # every other W element of a wider tensor
        return torch.full(call.output_shape[:4] + (2 * call.output_shape[4],), 7.0)[..., ::2]

    prepared = tgs.prepare_forward(call, x, grid, strided_result())
    gradients = torch.empty_like(x), torch.empty_like(grid)
    prepared_backward = tgs.prepare_backward(backward, go, x, grid, *gradients)
    for seed in (1, 2):
        x, grid, go = _problem(torch.float32, seed)
        out, fresh = strided_result(), strided_result()
        prepared.forward_on(x, grid, out)
        tgs.forward(call, x, grid, fresh)
        _assert_bits("output", out, fresh)
        ours, theirs = (torch.empty_like(x), torch.empty_like(grid)), (
            torch.empty_like(x), torch.empty_like(grid))
        prepared_backward.backward_on(go, x, grid, *ours)
        tgs.backward(backward, go, x, grid, *theirs)
        for name, a, b in zip(("grad_input", "grad_grid"), ours, theirs):
            _assert_bits(name, a, b)


@pytest.mark.parametrize("dtype,kind", [(torch.float64, "ncdhw"),
                                        (torch.float32, "channels_last")])
def test_grid_sampler_cuda_kernels_prepare_once_and_match_the_cpu_kernels(monkeypatch, dtype,
                                                                         kind):
    """The ops' CUDA kernels on the Triton backend (here CPU tensors, interpreted): a key's
    first call prepares, its second (other values) runs the prepared call, and both give
    the CPU kernels' results (the C++ core) within the tolerance, and a fresh call's bits."""
    monkeypatch.setattr(volsample._config, "_deterministic", True)
    counts = _spy(monkeypatch, tgs, "prepare_forward", "prepare_backward")
    _prepared.forget_prepared_calls()
    modes = (0, 1, False)  # bilinear, border
    runs = []
    for seed in (0, 1):
        x, grid, go = _problem(dtype, seed, kind=kind)
        out = _grid_sample._grid_sampler_3d_cuda(x, grid, *modes)
        gi, gg = _grid_sample._grid_sampler_3d_backward_cuda(go, x, grid, *modes, [True, True])
        assert counts == {"prepare_forward": 1, "prepare_backward": 1}
        _assert_close("output", out, ops.grid_sampler_3d(x, grid, *modes))
        for name, ours, theirs in zip(("grad_input", "grad_grid"), (gi, gg),
                                      ops.grid_sampler_3d_backward(go, x, grid, *modes,
                                                                   [True, True])):
            _assert_close(name, ours, theirs)
        runs.append((x, grid, out))
    for x, grid, out in runs:  # (a fresh call prepares a call of its own)
        fresh = torch.empty_like(out)
        tgs.forward(_grid_sample._grid_call.describe(x, grid, *modes), x, grid, fresh)
        _assert_bits("output", out, fresh)
    _prepared.forget_prepared_calls()


def test_upsample_cuda_kernels_prepare_once_and_match_the_cpu_kernels(monkeypatch):
    counts = _spy(monkeypatch, tup, "prepare_forward", "prepare_backward")
    _prepared.forget_prepared_calls()
    for seed in (0, 1):
        x, _, _ = _problem(torch.float64, seed, C=3)
        size, scales = [5, 7, 9], [5 / 3, 7 / 4, 1.8]
        out = _upsample._upsample_trilinear3d_cuda(x, size, False, scales)
        go = torch.randn_like(out)
        gi = _upsample._upsample_trilinear3d_backward_cuda(go, list(x.shape), False, scales)
        assert counts == {"prepare_forward": 1, "prepare_backward": 1}
        _assert_close("output", out, ops.upsample_trilinear3d(x, size, False, scales))
        _assert_close("grad_input", gi, ops.upsample_trilinear3d_backward(
            go, list(x.shape), False, scales))
    _prepared.forget_prepared_calls()


def test_warp_cuda_kernels_prepare_once_and_match_the_cpu_kernels(monkeypatch):
    monkeypatch.setattr(volsample._config, "_deterministic", True)
    counts = _spy(monkeypatch, twarp, "prepare_forward", "prepare_backward")
    _prepared.forget_prepared_calls()
    args = ([2, 3, 2], 0, 0, True, 1)  # size, bilinear, zeros, align_corners, voxels
    for seed in (0, 1):
        x, grid, go = _problem(torch.float64, seed)
        theta = torch.eye(3, 4, dtype=torch.float64)[None] + 0.1 * torch.randn(
            1, 3, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        u = 0.5 * grid
        for t in (theta, None):  # a theta, and the identity the backend prepares
            out = _warp._warp_3d_cuda(x, t, u, *args)
            grads = _warp._warp_3d_backward_cuda(go, x, t, u, *args[1:], [True, True, True])
            _assert_close("output", out, ops.warp_3d(x, t, u, *args))
            expected = ops.warp_3d_backward(go, x, t, u, *args[1:], [True, True, True])
            for name, ours, theirs in zip(("grad_input", "grad_theta", "grad_displacement"),
                                          grads, expected):
                _assert_close(name, ours, theirs)
    assert counts == {"prepare_forward": 2, "prepare_backward": 2}  # two keys: theta or not
    _prepared.forget_prepared_calls()
