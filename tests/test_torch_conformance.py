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

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal needs it

import torch.nn.functional as F  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import volsample.torch as vt  # noqa: E402


# ---------------------------------------------------------------------------------------
# Copy-on-write inputs
# ---------------------------------------------------------------------------------------

OPINFOS = [("nn.functional.grid_sample", "", "grid_sample"),
           ("nn.functional.interpolate", "trilinear", "upsample_trilinear")]


def _opinfo_samples(name, variant):
    """PyTorch's float32 OpInfo samples of ``name`` (``variant``) with a 5-D input."""
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
