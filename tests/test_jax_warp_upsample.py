"""volsample.jax.warp and upsample_trilinear: the NumPy API's bits (forward and
gradients), forward mode against finite differences and reverse mode, vmap."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="volsample.jax needs JAX (pip install 'volsample[jax]')")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

import volsample  # noqa: E402
import volsample.jax as vj  # noqa: E402


def _bits(a):
    return np.asarray(a).view(np.uint8)


def _warp_case(seed, dtype=np.float32, layout="NCDHW", N=2, C=2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, 5, 6, 7)).astype(dtype)
    if layout == "NDHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    coord = np.float64 if dtype == np.float64 else np.float32
    theta = (np.eye(3, 4) + 0.1 * rng.standard_normal((N, 3, 4))).astype(coord)
    displacement = (0.1 * rng.standard_normal((N, 4, 3, 5, 3))).astype(coord)
    return x, theta, displacement


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic", "bspline"])
@pytest.mark.parametrize("units", ["normalized", "voxels"])
def test_warp_bits_equal_numpy(mode, units, layout):
    x, theta, u = _warp_case(0, layout=layout)
    kw = dict(mode=mode, padding_mode="border", align_corners=False, layout=layout,
              displacement_units=units)
    for args in ((theta, u), (None, u), (theta, None)):
        expected = volsample.warp_3d(x, *args, **kw)
        f = jax.jit(lambda a, t, d: vj.warp(a, t, d, **kw))
        out, vjp = jax.vjp(f, *(None if a is None else jnp.asarray(a) for a in (x,) + args))
        np.testing.assert_array_equal(_bits(out), _bits(expected))
        gout = np.random.default_rng(1).standard_normal(expected.shape).astype(x.dtype)
        grads = vjp(jnp.asarray(gout))
        mask = (True, args[0] is not None, args[1] is not None)
        expected_grads = volsample.warp_3d_backward(gout, x, *args, output_mask=mask, **kw)
        for got, want in zip(grads, expected_grads):
            if want is not None:
                np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_warp_dtypes_bits_equal_numpy(dtype):
    x, theta, u = _warp_case(2, dtype)
    expected = volsample.warp_3d(x, theta, u, mode="bicubic")
    out, vjp = jax.vjp(lambda a, t, d: vj.warp(a, t, d, mode="bicubic"),
                       jnp.asarray(x), jnp.asarray(theta), jnp.asarray(u))
    np.testing.assert_array_equal(_bits(out), _bits(expected))
    gout = np.random.default_rng(3).standard_normal(expected.shape).astype(dtype)
    for got, want in zip(vjp(jnp.asarray(gout)),
                         volsample.warp_3d_backward(gout, x, theta, u, mode="bicubic")):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("units", ["normalized", "voxels"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_warp_jvp_matches_finite_differences_and_vjp(units, layout):
    x, theta, u = _warp_case(4, np.float64, layout)
    f = jax.jit(lambda a, t, d: vj.warp(a, t, d, mode="bicubic", padding_mode="reflection",
                                        displacement_units=units, layout=layout))
    rng = np.random.default_rng(5)
    primals = tuple(map(jnp.asarray, (x, theta, u)))
    tangents = tuple(jnp.asarray(rng.standard_normal(p.shape)) for p in primals)
    out, tangent = jax.jvp(f, primals, tangents)
    h = 1e-6
    fd = (f(*(p + h * t for p, t in zip(primals, tangents)))
          - f(*(p - h * t for p, t in zip(primals, tangents)))) / (2 * h)
    np.testing.assert_allclose(tangent, fd, rtol=1e-5, atol=1e-7)
    c = jnp.asarray(rng.standard_normal(out.shape))
    _, vjp = jax.vjp(f, *primals)
    np.testing.assert_allclose(sum(jnp.sum(g * t) for g, t in zip(vjp(c), tangents)),
                               jnp.sum(c * tangent), rtol=1e-10)


@pytest.mark.parametrize("units, layout", [("normalized", "NCDHW"), ("voxels", "NDHWC")])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic", "bspline"])
def test_warp_second_derivatives_match_finite_differences_of_grad(mode, units, layout):
    """Forward over reverse against central differences of the kernels' gradient, reverse
    over reverse against forward over reverse, in input, theta and the displacement."""
    x, theta, u = _warp_case(11, np.float64, layout)
    primals = tuple(map(jnp.asarray, (x, theta, u)))
    gradient = jax.jit(jax.grad(lambda a, t, d: jnp.sum(jnp.sin(vj.warp(
        a, t, d, mode=mode, padding_mode="reflection", displacement_units=units,
        layout=layout))), argnums=(0, 1, 2)))
    rng = np.random.default_rng(12)
    tangents = tuple(jnp.asarray(rng.standard_normal(p.shape)) for p in primals)
    _, second = jax.jvp(gradient, primals, tangents)
    h = 1e-5
    plus = gradient(*(p + h * t for p, t in zip(primals, tangents)))
    minus = gradient(*(p - h * t for p, t in zip(primals, tangents)))
    for got, p, m in zip(second, plus, minus):
        np.testing.assert_allclose(got, (p - m) / (2 * h), rtol=1e-5,
                                   atol=1e-6 * float(np.max(np.abs(p))))
    reverse = jax.grad(lambda *p: sum(jnp.sum(d * t) for d, t in zip(gradient(*p), tangents)),
                       argnums=(0, 1, 2))(*primals)
    for got, expected in zip(reverse, second):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_warp_hessian_in_theta_alone():
    x, theta, _ = _warp_case(13, np.float64)
    loss = lambda t: jnp.sum(jnp.sin(vj.warp(jnp.asarray(x), t, mode="bicubic")))  # noqa: E731
    hessian = jax.hessian(loss)(jnp.asarray(theta)).reshape(theta.size, theta.size)
    np.testing.assert_allclose(hessian, hessian.T, rtol=1e-10, atol=1e-12)
    h, g = 1e-6, jax.grad(loss)  # (a small step: bicubic's curvature jumps at whole voxels)
    fd = np.stack([(g(theta + s.reshape(theta.shape)) - g(theta - s.reshape(theta.shape)))
                   .ravel() / (2 * h) for s in h * np.eye(theta.size)])
    np.testing.assert_allclose(hessian, fd, rtol=1e-6, atol=1e-5)


def test_warp_grad_of_every_operand_is_one_backward_call():
    primals = tuple(map(jnp.asarray, _warp_case(7)))
    loss = lambda a, t, d: jnp.sum(jnp.sin(vj.warp(a, t, d, mode="bicubic")))  # noqa: E731
    for argnums in ((0, 1, 2), (0, 2), (1, 2), 0, 1):
        text = jax.jit(jax.grad(loss, argnums)).lower(*primals).as_text()
        assert text.count("volsample_warp_backward") == 1, argnums


def test_warp_vmap_equals_one_call_with_n_folded():
    x, theta, u = _warp_case(6, N=4)
    f = lambda a, t, d: vj.warp(a, t, d, displacement_units="voxels")  # noqa: E731
    fold = lambda a: jnp.asarray(a.reshape((2, 2) + a.shape[1:]))  # noqa: E731
    batched = jax.jit(jax.vmap(f))(fold(x), fold(theta), fold(u))
    expected = volsample.warp_3d(x, theta, u, displacement_units="voxels")
    np.testing.assert_array_equal(_bits(batched.reshape(expected.shape)), _bits(expected))


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("in_axes", [(0, None, None), (2, None, None), (None, 0, 0),
                                     (0, None, 0), (None, None, 0)])
def test_warp_vmap_over_any_operands_bits_equal_numpy(in_axes, layout):
    B, N = 3, 2
    x, theta, u = _warp_case(8, layout=layout, N=B * N)
    batch = [a.reshape((B, N) + a.shape[1:]) for a in (x, theta, u)]
    operands = [jnp.asarray(a[0] if axis is None else np.moveaxis(a, 0, axis))
                for a, axis in zip(batch, in_axes)]
    kw = dict(mode="bicubic", displacement_units="voxels", layout=layout)
    f = lambda a, t, d: vj.warp(a, t, d, **kw)  # noqa: E731
    out = jax.jit(jax.vmap(f, in_axes=in_axes))(*operands)
    c = np.random.default_rng(9).standard_normal(out.shape).astype(np.float32)
    for wanted in ((0, 1, 2), (0,), (2,)):
        def vjp(a, t, d, c, wanted=wanted):
            def of_wanted(*chosen):
                full = [a, t, d]
                for k, v in zip(wanted, chosen):
                    full[k] = v
                return f(*full)
            return jax.vjp(of_wanted, *([a, t, d][k] for k in wanted))[1](c)
        grads = jax.jit(jax.vmap(vjp, in_axes=in_axes + (0,)))(*operands, c)
        for b in range(B):
            member = [a[0 if axis is None else b] for a, axis in zip(batch, in_axes)]
            np.testing.assert_array_equal(_bits(out[b]), _bits(volsample.warp_3d(*member, **kw)))
            expected = volsample.warp_3d_backward(c[b], *member, **kw)
            for got, k in zip(grads, wanted):
                np.testing.assert_array_equal(_bits(got[b]), _bits(expected[k]),
                                              err_msg=str((wanted, k)))


def test_warp_vmap_over_the_input_copies_not_theta():
    x, theta, u = _warp_case(10, N=1)
    volumes = jnp.stack([jnp.asarray(x)] * 8)
    jaxpr = jax.make_jaxpr(jax.vmap(lambda a: vj.warp(a, theta, u)))(volumes)
    call, = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "volsample_warp_forward"]
    assert [v.aval.shape for v in call.invars] == [(1, 16, 5, 6, 7), theta.shape, u.shape]


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_upsample_bits_equal_numpy(dtype, layout):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4, 5, 6)).astype(dtype)
    if layout == "NDHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    for kw in (dict(size=(7, 9, 11), align_corners=True), dict(scale_factor=1.7),
               dict(scale_factor=(2.0, 0.5, 1.5), align_corners=False)):
        expected = volsample.upsample_trilinear_3d(x, layout=layout, **kw)
        out, vjp = jax.vjp(jax.jit(lambda a, kw=kw: vj.upsample_trilinear(a, layout=layout, **kw)),
                           jnp.asarray(x))
        np.testing.assert_array_equal(_bits(out), _bits(expected))
        gout = rng.standard_normal(expected.shape).astype(dtype)
        gi, = vjp(jnp.asarray(gout))
        logical = x.shape if layout == "NCDHW" else (x.shape[0], x.shape[4]) + x.shape[1:4]
        scales = kw.get("scale_factor")
        scales = None if scales is None else (
            (scales,) * 3 if np.isscalar(scales) else scales)
        want = volsample.upsample_trilinear_3d_backward(
            gout, logical, kw.get("align_corners", False), scales, layout=layout)
        np.testing.assert_array_equal(_bits(gi), _bits(want))


def test_upsample_jvp_and_second_derivatives():
    x = jnp.asarray(np.random.default_rng(8).standard_normal((1, 2, 3, 4, 5)))
    f = lambda a: vj.upsample_trilinear(a, scale_factor=2.0)  # noqa: E731
    t = jnp.ones_like(x)
    _, tangent = jax.jvp(f, (x,), (t,))
    np.testing.assert_array_equal(tangent, f(t))  # linear
    hessian_vector = jax.grad(lambda a: jnp.sum(jax.grad(lambda b: jnp.sum(f(b) ** 2))(a)))(x)
    assert hessian_vector.shape == x.shape
    batched = jax.vmap(f)(x[None].repeat(3, 0))
    np.testing.assert_array_equal(batched[1], f(x))


def test_upsample_same_size_is_the_input():
    x = jnp.ones((1, 1, 2, 3, 4))
    assert vj.upsample_trilinear(x, size=(2, 3, 4)) is x


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_spline_coefficients_bits_equal_numpy(dtype, layout):
    x = np.random.default_rng(9).standard_normal((2, 3, 4, 5, 6)).astype(dtype)
    if layout == "NDHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    for padding in ("zeros", "border", "reflection"):
        for align in (False, True):
            expected = volsample.spline_coefficients(x, padding, align, layout=layout)
            f = jax.jit(lambda a, p=padding, c=align: vj.spline_coefficients(a, p, c, layout=layout))
            out, vjp = jax.vjp(f, jnp.asarray(x))
            np.testing.assert_array_equal(_bits(out), _bits(expected))
            g = np.random.default_rng(10).standard_normal(x.shape).astype(dtype)
            want = volsample.spline.spline_coefficients_adjoint(g, padding, align, layout=layout)
            np.testing.assert_array_equal(_bits(vjp(jnp.asarray(g))[0]), _bits(want))


def test_spline_then_bspline_interpolates():
    x = jnp.asarray(np.random.default_rng(11).standard_normal((1, 1, 4, 5, 6)))
    c = vj.spline_coefficients(x, "border", True)
    z, y, w = np.meshgrid(*(np.linspace(-1, 1, n) for n in (4, 5, 6)), indexing="ij")
    centres = jnp.asarray(np.stack([w, y, z], -1)[None])
    np.testing.assert_allclose(vj.grid_sample(c, centres, "bspline", "border", True), x,
                               atol=1e-12)
    _, tangent = jax.jvp(lambda a: vj.spline_coefficients(a), (x,), (x,))
    np.testing.assert_allclose(tangent, vj.spline_coefficients(x))
