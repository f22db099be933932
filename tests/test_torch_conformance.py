"""What PyTorch's own test suites expect of the calls that ``volsample.torch.patch()`` takes
over, checked on volsample under ``patch()``.

- Copy-on-write inputs (PyTorch's test_ops.py ``test_cow_input``): an op that only reads
  a lazily copied tensor (``torch._lazy_clone``) must leave it lazy, forward and backward.
  The samples are PyTorch's own OpInfo samples of ``nn.functional.grid_sample`` and of
  the trilinear ``nn.functional.interpolate`` (their 5-D ones).
- Error messages: PyTorch's tests match its messages with regular expressions; under
  ``patch()``, and from ``vt.grid_sample`` / ``vt.upsample_trilinear``, the same mistake
  gives a message that starts with PyTorch's wording, of PyTorch's exception class.

Oracles: PyTorch 2.13 itself (every regex here is first matched against PyTorch's own
message, so a change of PyTorch's wording shows up), and volsample on plain (not lazily
copied) inputs for the results.
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import volsample  # noqa: E402
import volsample.torch as vt  # noqa: E402


# ---------------------------------------------------------------------------------------
# Copy-on-write inputs
# ---------------------------------------------------------------------------------------

OPINFOS = [("nn.functional.grid_sample", "", "grid_sample"),
           ("nn.functional.interpolate", "trilinear", "upsample_trilinear")]


def _opinfo_samples(name, variant):
    """PyTorch's float32 OpInfo samples of ``name`` (``variant``) with a 5-D input."""
    pytest.importorskip("expecttest")  # torch.testing._internal imports it
    from torch.testing._internal.common_methods_invocations import op_db
    (op,) = [o for o in op_db if o.name == name and o.variant_test_name == variant]
    return [s for s in op.sample_inputs("cpu", torch.float32, requires_grad=True)
            if s.input.dim() == 5]


def _lazy(value):
    return torch._lazy_clone(value) if isinstance(value, torch.Tensor) else value


def _run(fn, args, kwargs):
    """``fn(*args, **kwargs)`` and the gradients of its sum for every tensor that
    requires one, the output gradient itself a copy-on-write tensor."""
    out = fn(*args, **kwargs)
    leaves = [t for t in (*args, *kwargs.values())
              if isinstance(t, torch.Tensor) and t.requires_grad]
    grad_output = torch._lazy_clone(torch.ones_like(out))
    grads = torch.autograd.grad(out, leaves, grad_output)
    return out, grads, grad_output


@pytest.mark.parametrize("name,variant,entry", OPINFOS)
def test_copy_on_write_inputs_stay_lazy(monkeypatch, name, variant, entry):
    calls = []
    real = getattr(vt._patch, entry)
    monkeypatch.setattr(vt._patch, entry, lambda *a: calls.append(1) or real(*a))
    function = name.rsplit(".", 1)[1]
    samples = _opinfo_samples(name, variant)
    assert samples
    for i, sample in enumerate(samples):
        args, kwargs = [sample.input, *sample.args], dict(sample.kwargs)
        lazy_args = [_lazy(a) for a in args]
        lazy_kwargs = {k: _lazy(v) for k, v in kwargs.items()}
        with vt.patch():
            out, grads, grad_output = _run(getattr(F, function), lazy_args, lazy_kwargs)
            expected_out, expected_grads, _ = _run(getattr(F, function), args, kwargs)
        where = f"{name} sample {i} ({sample.kwargs})"
        operands = [*zip(range(len(args)), lazy_args, args), *zip(kwargs, lazy_kwargs.values(),
                                                                  kwargs.values())]
        for key, lazy, plain in operands:
            if isinstance(lazy, torch.Tensor):
                assert torch._C._is_cow_tensor(lazy), f"{where}: argument {key} was materialized"
                assert torch.equal(lazy, plain), f"{where}: argument {key} changed"
        assert torch._C._is_cow_tensor(grad_output), f"{where}: the output gradient was materialized"
        assert torch.equal(out, expected_out), f"{where}: result differs"
        for k, (g, e) in enumerate(zip(grads, expected_grads)):
            assert torch.equal(g, e), f"{where}: gradient {k} differs"
    assert calls, f"{name} was not routed to volsample"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_copy_on_write_channels_last_inputs_stay_lazy(dtype):
    # Beyond the OpInfo samples: a channels-last volume and a 16-bit one (read through its
    # int16 bits), both directions of both operators.
    gen = torch.Generator().manual_seed(40)
    volume = torch.randn(2, 3, 4, 5, 6, generator=gen).to(dtype).contiguous(
        memory_format=torch.channels_last_3d)
    grid = (torch.rand(2, 3, 2, 4, 3, generator=gen) * 2.4 - 1.2).to(dtype)
    for fn, operands in [(lambda x, g: vt.grid_sample(x, g, padding_mode="border"), (volume, grid)),
                         (lambda x: vt.upsample_trilinear(x, scale_factor=1.5), (volume,))]:
        lazy = [torch._lazy_clone(t.requires_grad_()) for t in operands]
        out, grads, grad_output = _run(fn, lazy, {})
        expected_out, expected_grads, _ = _run(fn, operands, {})
        assert all(torch._C._is_cow_tensor(t) for t in (*lazy, grad_output))
        assert torch.equal(out, expected_out)
        assert all(torch.equal(g, e) for g, e in zip(grads, expected_grads))


# ---------------------------------------------------------------------------------------
# Error messages in PyTorch's words
# ---------------------------------------------------------------------------------------

X = torch.randn(1, 2, 4, 4, 4)
GRID = torch.zeros(1, 2, 2, 2, 3)


def grid_sample(*args, **kwargs):
    return "grid_sample", args, {"align_corners": False, **kwargs}


def interpolate(*args, **kwargs):
    return "interpolate", args, kwargs


def _pytorch(function):
    """The F function (looked up when called, so that patch() applies)."""
    if function == "grid_sample":
        return lambda *args, **kwargs: F.grid_sample(*args, **kwargs)
    return lambda *args, **kwargs: F.interpolate(*args, mode="trilinear", **kwargs)


def _volsample(function):
    return vt.grid_sample if function == "grid_sample" else vt.upsample_trilinear


NO_VOXELS = r"Input and output sizes should be greater than 0"
OVERFLOW = r"value cannot be converted to type int64_t without overflow"
INVALID_ARGUMENTS = r"upsample_trilinear3d\(\) received an invalid combination of arguments"
NOT_IMPLEMENTED = r'"\w+" not implemented for \'Int\''

# (id, call, regex matched at the start of PyTorch's message and of volsample's, whether
# patch() routes the call to volsample (if not, PyTorch raises it there), the argument
# volsample's detail names). Rows marked "PyTorch's test" carry the regex of a PyTorch 2.13
# test (test_nn.py), anchored at PyTorch's words.
WORDING = [
    # PyTorch's test: test_interpolate (TypeError, "(expected size to be one of int or).*")
    ("size float", interpolate(X, size=(2.0,) * 3), r"(expected size to be one of int or).*",
     True, "size"),
    ("size float tensor", interpolate(X, size=(torch.tensor(2.0),) * 3),
     r"(expected size to be one of int or).*", True, "size"),
    ("size None", interpolate(X, size=(3, None, 3)),
     r"expected size to be one of int or .*NoneType", True, "size"),
    ("size one float", interpolate(X, size=2.5), INVALID_ARGUMENTS, True, "size"),
    ("size length", interpolate(X, size=(2, 2)),
     r"Input and output must have the same number of spatial dimensions", True, "size"),
    ("scale length", interpolate(X, scale_factor=(2.0, 2.0)),
     r"Input and scale_factor must have the same number of spatial dimensions", True,
     "scale_factor"),
    ("both", interpolate(X, size=2, scale_factor=2.0),
     r"only one of size or scale_factor should be defined", True, "size, scale_factor"),
    ("neither", interpolate(X), r"either size or scale_factor should be defined", True,
     "size, scale_factor"),
    ("size 0", interpolate(X, size=(3, 0, 3)), NO_VOXELS, True, "size"),
    ("size -1", interpolate(X, size=-1), NO_VOXELS, True, "size"),
    ("scale to 0 voxels", interpolate(X, scale_factor=0.1), NO_VOXELS, True, "scale_factor"),
    ("scale negative", interpolate(X, scale_factor=-2.0), NO_VOXELS, True, "scale_factor"),
    ("empty input", interpolate(X[:, :, :0], size=3), NO_VOXELS, True, "input"),
    ("scale nan", interpolate(X, scale_factor=float("nan")), OVERFLOW, True, "scale_factor"),
    ("scale huge", interpolate(X, scale_factor=1e20), OVERFLOW, True, "scale_factor"),
    ("scale str", interpolate(X, scale_factor="2"), INVALID_ARGUMENTS, True, "scale_factor"),
    ("scale str in list", interpolate(X, scale_factor=(2.0, "2", 2.0)),
     r"upsample_trilinear3d\(\): argument 'scale_factors' must be tuple of floats", True,
     "scale_factor"),
    ("upsample align_corners str", interpolate(X, size=3, align_corners="yes"),
     INVALID_ARGUMENTS, True, "align_corners"),
    ("upsample int input", interpolate(X.int(), size=3), NOT_IMPLEMENTED, False, "input"),
    ("upsample 4-D", interpolate(X[0], size=3), r"Got 4D input, but trilinear mode needs 5D input",
     False, "input"),
    ("upsample 6-D", interpolate(X[None], size=3),
     r"Input Error: Only 3D, 4D and 5D input Tensors supported \(got 6D\)", False, "input"),
    # PyTorch's test: test_grid_sample_error_checking ("expected grid and input to have same
    # batch size", "expected grid to have size 2 in last dimension" on 4-D, "expected input to
    # have non-empty spatial dimensions", "but got: 'garbage'"; its "bicubic interpolation
    # only supports 4D input" is volsample's 5-D bicubic, test_torch_cubic.py)
    ("batch", grid_sample(X, GRID.expand(2, -1, -1, -1, -1)),
     r"grid_sampler\(\): expected grid and input to have same batch size", True, "grid"),
    ("grid last dim", grid_sample(X, GRID[..., :2]),
     r"grid_sampler\(\): expected grid to have size 3 in last dimension", True, "grid"),
    ("grid_sample empty input", grid_sample(X[:, :, :0], GRID),
     r"grid_sampler\(\): expected input to have non-empty spatial dimensions", True, "input"),
    ("device", grid_sample(X, GRID.to("meta")),
     r"grid_sampler\(\): expected input and grid to be on same device", True, "grid"),
    ("grid float64", grid_sample(X, GRID.double()), r"expected scalar type Float but found Double",
     True, "grid"),
    ("grid int", grid_sample(X, GRID.int()), r"expected scalar type Float but found Int", True,
     "grid"),
    ("grid_sample align_corners str", grid_sample(X, GRID, align_corners="yes"),
     r"grid_sampler\(\): argument 'align_corners' \(position 5\) must be bool, not str", True,
     "align_corners"),
    ("mode", grid_sample(X, GRID, mode="garbage"),
     r"nn\.functional\.grid_sample\(\): expected mode to be .*, but got: 'garbage'", False,
     "mode"),
    ("padding_mode", grid_sample(X, GRID, padding_mode="garbage"),
     r"nn\.functional\.grid_sample\(\): expected padding_mode to be .*, but got: 'garbage'",
     False, "padding_mode"),
    # 5-D bicubic (volsample's under patch()): PyTorch's checks of the grid come first
    ("bicubic batch", grid_sample(X, GRID.expand(2, -1, -1, -1, -1), mode="bicubic"),
     r"grid_sampler\(\): expected grid and input to have same batch size", True, "grid"),
    ("bicubic grid last dim", grid_sample(X, GRID[..., :2], mode="bicubic"),
     r"grid_sampler\(\): expected grid to have size 3 in last dimension", True, "grid"),
    ("bicubic align_corners str", grid_sample(X, GRID, mode="bicubic", align_corners="yes"),
     r"grid_sampler\(\): argument 'align_corners' \(position 5\) must be bool, not str", True,
     "align_corners"),
    ("bicubic padding_mode", grid_sample(X, GRID, mode="bicubic", padding_mode="garbage"),
     r"nn\.functional\.grid_sample\(\): expected padding_mode to be .*, but got: 'garbage'",
     False, "padding_mode"),
    ("grid_sample int input", grid_sample(X.int(), GRID), NOT_IMPLEMENTED, False, "input"),
    ("grid 4-D", grid_sample(X, GRID[:, 0]),
     r"grid_sampler\(\): expected 5D input and grid with same number of dimensions", False,
     "grid"),
    ("input not a tensor", grid_sample(X.numpy(), GRID),
     r"grid_sampler\(\): argument 'input' \(position 1\) must be Tensor", False, "input"),
]


@pytest.mark.parametrize("call,regex,routed,argument", [row[1:] for row in WORDING],
                         ids=[row[0] for row in WORDING])
def test_mistakes_are_said_in_pytorchs_words(call, regex, routed, argument):
    function, args, kwargs = call
    with pytest.raises(Exception) as pytorch:
        _pytorch(function)(*args, **kwargs)
    assert re.match(regex, str(pytorch.value)), f"PyTorch's wording changed: {pytorch.value}"
    pytorch_class = type(pytorch.value)
    with vt.patch(), pytest.raises(pytorch_class) as patched:
        _pytorch(function)(*args, **kwargs)
    assert isinstance(patched.value, volsample.VolsampleError) == routed
    with pytest.raises(pytorch_class) as direct:
        _volsample(function)(*args, **kwargs)
    for error in (patched.value, direct.value) if routed else (direct.value,):
        assert re.match(regex, str(error)), str(error)
        assert f"({argument}: expected" in str(error), str(error)  # volsample's detail follows


ops = torch.ops.volsample
GO = torch.zeros(1, 2, 2, 2, 2)

# The ops called directly, beside PyTorch's aten ops: (id, PyTorch's call, volsample's, regex).
OP_WORDING = [
    ("output_size length", lambda: torch.ops.aten.upsample_trilinear3d(X, [3, 3], False),
     lambda: ops.upsample_trilinear3d(X, [3, 3], False, None),
     r"It is expected output_size equals to 3, but got size 2"),
    ("input_size length",
     lambda: torch.ops.aten.upsample_trilinear3d_backward(X, [3, 3, 3], [1, 2, 2, 2], False),
     lambda: ops.upsample_trilinear3d_backward(X, [1, 2, 2, 2], False, None),
     r"It is expected input_size equals to 5, but got size 4"),
    ("grad_output shape",
     lambda: torch.ops.aten.upsample_trilinear3d_backward(X, [4, 4, 4], [1, 3, 2, 2, 2], False),
     lambda: ops.upsample_trilinear3d_backward(X, [1, 3, 2, 2, 2], False, None),
     r"Expected grad_output to have the same shape as output"),
    ("grad_output dtype",
     lambda: torch.ops.aten.grid_sampler_3d_backward(GO.double(), X, GRID, 0, 0, False,
                                                     [True, True]),
     lambda: ops.grid_sampler_3d_backward(GO.double(), X, GRID, 0, 0, False, [True, True]),
     r"expected scalar type Float but found Double"),
]


@pytest.mark.parametrize("theirs,ours,regex", [row[1:] for row in OP_WORDING],
                         ids=[row[0] for row in OP_WORDING])
def test_op_mistakes_are_said_in_pytorchs_words(theirs, ours, regex):
    with pytest.raises(Exception) as pytorch:
        theirs()
    assert re.match(regex, str(pytorch.value)), f"PyTorch's wording changed: {pytorch.value}"
    with pytest.raises(type(pytorch.value), match=f"^{regex}") as error:
        ours()
    assert isinstance(error.value, volsample.VolsampleError)


def test_integer_tensor_sizes_are_sizes():
    # F.interpolate takes integer tensors as sizes (a float one is a mistake, above).
    size = (torch.tensor(3), torch.tensor(2), 5)
    with vt.patch():
        out = F.interpolate(X, size=size, mode="trilinear")
    assert out.shape == (1, 2, 3, 2, 5)
    assert torch.equal(out, vt.upsample_trilinear(X, size=(3, 2, 5)))
