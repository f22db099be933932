"""volsample.jax.grid_sample: the NumPy API's bits (forward and both gradients), the JAX
transformations (jit, grad, vjp, jvp, jacfwd/jacrev, vmap) against finite differences and
one call with N folded, and the errors."""
import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="volsample.jax needs JAX (pip install 'volsample[jax]')")
jax.config.update("jax_enable_x64", True)  # float64 volumes and grids

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

import volsample  # noqa: E402
import volsample.jax as vj  # noqa: E402

MODES = ["bilinear", "nearest", "bicubic", "bspline"]
PADDINGS = ["zeros", "border", "reflection"]
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


def _case(seed, dtype=np.float32, grid_dtype=None, layout="NCDHW", N=2, C=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, 5, 6, 7)).astype(dtype)
    if layout == "NDHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    grid = rng.uniform(-1.2, 1.2, (N, 4, 3, 5, 3)).astype(grid_dtype or dtype)
    return x, grid


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("mode", MODES)
def test_forward_and_gradients_bits_equal_numpy(mode, layout):
    x, grid = _case(0, layout=layout)
    for padding, align in itertools.product(PADDINGS, (False, True)):
        args = (mode, padding, align)
        expected = volsample.grid_sample_3d(x, grid, *args, layout=layout)
        f = jax.jit(lambda a, g, args=args: vj.grid_sample(a, g, *args, layout=layout))
        out, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(grid))
        np.testing.assert_array_equal(_bits(out), _bits(expected), err_msg=str(args))
        gout = np.random.default_rng(1).standard_normal(expected.shape).astype(x.dtype)
        gi, gg = vjp(jnp.asarray(gout))
        ei, eg = volsample.grid_sample_3d_backward(gout, x, grid, *args, layout=layout)
        np.testing.assert_array_equal(_bits(gi), _bits(ei), err_msg=str(args))
        np.testing.assert_array_equal(_bits(gg), _bits(eg), err_msg=str(args))


@pytest.mark.parametrize("dtype, grid_dtype", [(d, None) for d in DTYPES] +
                         [(np.float16, np.float32), (ml_dtypes.bfloat16, np.float64)])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_dtypes_bits_equal_numpy(dtype, grid_dtype, layout):
    x, grid = _case(2, dtype, grid_dtype, layout)
    args = ("bicubic", "border", False)
    expected = volsample.grid_sample_3d(x, grid, *args, layout=layout)
    out, vjp = jax.vjp(lambda a, g: vj.grid_sample(a, g, *args, layout=layout),
                       jnp.asarray(x), jnp.asarray(grid))
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(_bits(out), _bits(expected))
    gout = np.random.default_rng(3).standard_normal(expected.shape).astype(dtype)
    gi, gg = vjp(jnp.asarray(gout))
    ei, eg = volsample.grid_sample_3d_backward(gout, x, grid, *args, layout=layout)
    assert gi.dtype == ei.dtype and gg.dtype == eg.dtype
    np.testing.assert_array_equal(_bits(gi), _bits(ei))
    np.testing.assert_array_equal(_bits(gg), _bits(eg))


def _loss(mode, padding, align, layout="NCDHW"):
    def loss(x, grid):
        return jnp.sum(jnp.sin(vj.grid_sample(x, grid, mode, padding, align, layout=layout)))
    return loss


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "bspline"])
def test_grad_matches_finite_differences(mode):
    x, grid = _case(4, np.float64, N=1, C=2)
    grid = grid * 0.9  # away from the padding's kinks
    loss = _loss(mode, "border", True)
    gx, gg = jax.grad(loss, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(grid))
    rng = np.random.default_rng(5)
    for arg, g in ((0, gx), (1, gg)):
        direction = rng.standard_normal(g.shape)
        h = 1e-6
        args = [jnp.asarray(x), jnp.asarray(grid)]
        plus, minus = list(args), list(args)
        plus[arg] = plus[arg] + h * direction
        minus[arg] = minus[arg] - h * direction
        fd = (loss(*plus) - loss(*minus)) / (2 * h)
        np.testing.assert_allclose(np.sum(np.asarray(g) * direction), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("mode", MODES)
def test_jvp_matches_finite_differences_and_vjp(mode, layout):
    x, grid = _case(6, np.float64, layout=layout, N=2, C=2)
    grid = grid * 0.9
    f = jax.jit(lambda a, g: vj.grid_sample(a, g, mode, "reflection", False, layout=layout))
    rng = np.random.default_rng(7)
    tx, tg = rng.standard_normal(x.shape), rng.standard_normal(grid.shape)
    out, tangent = jax.jvp(f, (jnp.asarray(x), jnp.asarray(grid)),
                           (jnp.asarray(tx), jnp.asarray(tg)))
    h = 1e-6
    fd = (f(x + h * tx, grid + h * tg) - f(x - h * tx, grid - h * tg)) / (2 * h)
    np.testing.assert_allclose(tangent, fd, rtol=1e-5, atol=1e-7)
    # <vjp(c), t> == <c, jvp(t)>: the two modes agree
    c = rng.standard_normal(out.shape)
    _, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(grid))
    gx, gg = vjp(jnp.asarray(c))
    np.testing.assert_allclose(np.sum(gx * tx) + np.sum(gg * tg), np.sum(c * tangent),
                               rtol=1e-10)


def _relative_error(got, expected) -> float:
    got, expected = np.asarray(got), np.asarray(expected)
    return float(np.max(np.abs(got - expected)) / max(np.max(np.abs(expected)), 1e-12))


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("mode, padding", [
    ("bilinear", "zeros"), ("bilinear", "reflection"), ("nearest", "border"),
    ("bicubic", "zeros"), ("bicubic", "border"), ("bspline", "reflection")])
def test_second_derivatives_match_finite_differences_of_grad(mode, padding, layout):
    """Forward over reverse (jvp of grad) against central differences of the gradient (the
    kernels'), reverse over reverse against forward over reverse; nearest's grid terms
    are 0, as its first ones are."""
    x, grid = _case(15, np.float64, layout=layout, N=1, C=2)
    x, grid = jnp.asarray(x), jnp.asarray(grid * 0.8)
    gradient = jax.jit(jax.grad(_loss(mode, padding, False, layout), argnums=(0, 1)))
    rng = np.random.default_rng(16)
    tangents = (jnp.asarray(rng.standard_normal(x.shape)),
                jnp.asarray(rng.standard_normal(grid.shape)))
    _, second = jax.jvp(gradient, (x, grid), tangents)
    h = 1e-5
    plus = gradient(x + h * tangents[0], grid + h * tangents[1])
    minus = gradient(x - h * tangents[0], grid - h * tangents[1])
    for got, p, m in zip(second, plus, minus):
        assert _relative_error(got, (p - m) / (2 * h)) < 1e-6
    reverse = jax.grad(lambda a, g: sum(jnp.sum(d * t) for d, t in zip(gradient(a, g), tangents)),
                       argnums=(0, 1))(x, grid)
    for got, expected in zip(reverse, second):
        assert _relative_error(got, expected) < 1e-12


def test_hessian_in_the_grid_is_symmetric_and_jacfwd_of_jacrev():
    x, grid = _case(17, np.float64, N=1, C=2)
    x, grid = jnp.asarray(x), jnp.asarray(grid[:, :2, :1, :2] * 0.8)
    loss = lambda g: jnp.sum(jnp.sin(vj.grid_sample(x, g, "bspline", "border")))  # noqa: E731
    hessian = jax.hessian(loss)(grid).reshape(grid.size, grid.size)
    np.testing.assert_allclose(hessian, hessian.T, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(jax.jacrev(jax.jacrev(loss))(grid).reshape(hessian.shape),
                               hessian, rtol=1e-12, atol=1e-14)


def test_jacfwd_equals_jacrev():
    x, grid = _case(8, np.float64, N=1, C=1)
    x, grid = x[:, :, :3, :3, :3], grid[:, :2, :1, :2]
    f = lambda g: vj.grid_sample(jnp.asarray(x), g, "bicubic", "zeros", False)  # noqa: E731
    np.testing.assert_allclose(jax.jacfwd(f)(jnp.asarray(grid)),
                               jax.jacrev(f)(jnp.asarray(grid)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_vmap_equals_one_call_with_n_folded(layout):
    B = 3
    x, grid = _case(9, layout=layout, N=B * 2)
    xb = x.reshape((B, 2) + x.shape[1:])
    gb = grid.reshape((B, 2) + grid.shape[1:])
    f = lambda a, g: vj.grid_sample(a, g, "bicubic", "zeros", True, layout=layout)  # noqa: E731
    batched = jax.jit(jax.vmap(f))(jnp.asarray(xb), jnp.asarray(gb))
    whole = volsample.grid_sample_3d(x, grid, "bicubic", "zeros", True, layout=layout)
    np.testing.assert_array_equal(_bits(batched.reshape(whole.shape)), _bits(whole))
    # a batch axis elsewhere, only on the grid (the input broadcast), and gradients
    moved = jax.vmap(f, in_axes=(None, 3))(jnp.asarray(x[:2]), jnp.moveaxis(gb, 0, 3))
    for b in range(B):
        np.testing.assert_array_equal(
            _bits(moved[b]),
            _bits(volsample.grid_sample_3d(x[:2], gb[b], "bicubic", "zeros", True,
                                           layout=layout)))
    grads = jax.vmap(jax.grad(lambda a, g: jnp.sum(f(a, g) ** 2), argnums=(0, 1)))(
        jnp.asarray(xb), jnp.asarray(gb))
    for b in range(B):
        go = 2 * volsample.grid_sample_3d(xb[b], gb[b], "bicubic", "zeros", True, layout=layout)
        ei, eg = volsample.grid_sample_3d_backward(go, xb[b], gb[b], "bicubic", "zeros", True,
                                                   layout=layout)
        np.testing.assert_array_equal(_bits(grads[0][b]), _bits(ei))
        np.testing.assert_array_equal(_bits(grads[1][b]), _bits(eg))


def _batched(a, axis):
    """``a``'s batch (its first axis) at ``axis``, or its first member (None: unmapped)."""
    return a[0] if axis is None else np.moveaxis(a, 0, axis)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("N", [1, 2])
@pytest.mark.parametrize("in_axes", [(0, 0), (2, None), (0, None), (None, 0), (None, 3),
                                     (2, 3)])
def test_vmap_over_any_operands_bits_equal_numpy(in_axes, N, layout):
    B, args = 3, ("bicubic", "zeros", False)
    rng = np.random.default_rng(13)
    x, grid = _case(13, layout=layout, N=B * N)
    x, grid = x.reshape((B, N) + x.shape[1:]), grid.reshape((B, N) + grid.shape[1:])
    f = lambda a, g: vj.grid_sample(a, g, *args, layout=layout)  # noqa: E731
    operands = [jnp.asarray(_batched(a, axis)) for a, axis in zip((x, grid), in_axes)]
    members = [(x[0 if in_axes[0] is None else b], grid[0 if in_axes[1] is None else b])
               for b in range(B)]
    out = jax.jit(jax.vmap(f, in_axes=in_axes))(*operands)
    for b, (xb, gb) in enumerate(members):
        np.testing.assert_array_equal(
            _bits(out[b]), _bits(volsample.grid_sample_3d(xb, gb, *args, layout=layout)))
    cotangent = rng.standard_normal(out.shape).astype(np.float32)
    for wanted in ((0, 1), (0,), (1,)):  # the gradients of these operands alone
        def vjp(a, g, c, wanted=wanted):
            def of_wanted(*chosen):
                full = [a, g]
                for k, v in zip(wanted, chosen):
                    full[k] = v
                return f(*full)
            return jax.vjp(of_wanted, *([a, g][k] for k in wanted))[1](c)
        grads = jax.jit(jax.vmap(vjp, in_axes=in_axes + (0,)))(*operands, cotangent)
        for b, (xb, gb) in enumerate(members):
            expected = volsample.grid_sample_3d_backward(cotangent[b], xb, gb, *args,
                                                         layout=layout)
            for got, k in zip(grads, wanted):
                np.testing.assert_array_equal(_bits(got[b]), _bits(expected[k]),
                                              err_msg=str((wanted, k)))


def _kernel_operand_shapes(f, *args):
    """The shapes of each kernel call's operands in ``f``'s program, by primitive name."""
    eqns = jax.make_jaxpr(f)(*args).jaxpr.eqns
    return {e.primitive.name: [v.aval.shape for v in e.invars] for e in eqns
            if e.primitive.name.startswith("volsample_")}


def test_vmap_over_one_operand_copies_not_the_other():
    x, grid = map(jnp.asarray, _case(14, N=1))
    f = lambda a, g: vj.grid_sample(a, g)  # noqa: E731
    volumes = jnp.stack([x] * 8)
    shapes = _kernel_operand_shapes(jax.vmap(f, in_axes=(0, None)), volumes, grid)
    assert shapes["volsample_grid_sample_forward"] == [(1, 8 * 3, 5, 6, 7), grid.shape]
    grids = jnp.stack([grid] * 8)
    shapes = _kernel_operand_shapes(jax.vmap(f, in_axes=(None, 0)), x, grids)
    assert shapes["volsample_grid_sample_forward"] == [x.shape, (1, 8 * 4, 3, 5, 3)]
    loss = lambda g: jnp.sum(f(x, g))  # noqa: E731
    shapes = _kernel_operand_shapes(jax.vmap(jax.grad(loss)), grids)
    assert shapes["volsample_grid_sample_backward"][1:] == [x.shape, (1, 8 * 4, 3, 5, 3)]
    # jacfwd maps only the directions: the grid-gradient kernel runs once, for all of them
    shapes = _kernel_operand_shapes(jax.jacfwd(lambda g: f(x, g)), grid)
    assert shapes["volsample_grid_sample_backward"][2] == (3,) + grid.shape[1:]


def _kernel_calls(f, *args) -> dict:
    text = jax.jit(f).lower(*args).as_text()
    return {k: text.count(f"volsample_grid_sample_{k}") for k in ("forward", "backward")}


def test_grad_of_both_operands_is_one_backward_call():
    x, grid = map(jnp.asarray, _case(12))
    loss = _loss("bicubic", "zeros", False)
    assert _kernel_calls(jax.grad(loss, argnums=(0, 1)), x, grid) == {"forward": 1,
                                                                       "backward": 1}
    for argnum in (0, 1):
        assert _kernel_calls(jax.grad(loss, argnum), x, grid)["backward"] == 1


def test_vmap_is_one_kernel_call():
    f = jax.vmap(lambda a, g: vj.grid_sample(a, g))
    x, grid = _case(10, N=4)
    text = jax.jit(f).lower(jnp.asarray(x[None]), jnp.asarray(grid[None])).as_text()
    assert text.count("volsample_grid_sample_forward") == 1


def test_errors_are_the_op_layers_when_traced():
    x, grid = _case(11)
    with pytest.raises(volsample.InvalidArgumentError, match="grid: expected last dimension 3"):
        jax.jit(vj.grid_sample)(x, grid[..., :2])
    with pytest.raises(volsample.InvalidArgumentError, match="mode"):
        vj.grid_sample(x, grid, "linear")
    with pytest.raises(volsample.UnsupportedDTypeError):
        vj.grid_sample(x.astype(np.int32), grid)
    with pytest.raises(volsample.InvalidArgumentError, match="batch size"):
        vj.grid_sample(x, grid[:1])
    with pytest.raises(TypeError, match="input: expected an array"):
        vj.grid_sample([1.0], grid)


def test_other_devices_are_refused_with_what_is_supported():
    from volsample.jax._primitives import unsupported_device
    assert "CPU only" in str(unsupported_device("cuda"))
    assert issubclass(vj.UnsupportedDeviceError, ValueError)


def test_import_volsample_never_imports_jax():
    import subprocess
    import sys
    code = "import sys, volsample; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("module", ["_grid_sample", "_warp", "_upsample", "_spline"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"volsample.jax.{module}"),
                             optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed


def test_a_build_without_the_handlers_says_how_to_get_them():
    import subprocess
    import sys
    code = ("import sys, types, volsample._cpu as cpu\n"
            "stub = types.SimpleNamespace(**{k: getattr(cpu._kernels, k) for k in dir(cpu._kernels)"
            " if k != 'ffi_targets' and not k.startswith('__')})\n"
            "sys.modules['volsample._cpu._kernels'] = cpu._kernels = stub\n"
            "try:\n"
            "    import volsample.jax\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "built without its XLA FFI handlers" in out and "volsample[jax]" in out
