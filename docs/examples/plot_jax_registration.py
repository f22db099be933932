"""
A registration step in JAX
==========================

``volsample.jax`` puts volsample's kernels inside JAX programs. Here a coarse grid of
control-point displacements is upsampled to every voxel (``upsample_trilinear``), warps the
moving volume (``warp``, no sampling grid stored), and gradient descent on the mean squared
difference to the fixed volume follows ``jax.grad``, the whole step compiled by
``jax.jit``: the same few lines a JAX user writes for a spatial transformer.
"""

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import volsample.jax as vj

# %%
# A pair with a known answer
# --------------------------
# The moving volume is a smooth blob phantom; the fixed one is that phantom under a
# known smooth displacement (in voxels), sampled by the same warp.
shape = (32, 32, 32)
z, y, x = np.meshgrid(*(np.linspace(-1, 1, n) for n in shape), indexing="ij")
moving = np.exp(-((x - 0.2) ** 2 + y**2 + (z + 0.1) ** 2) / 0.15)
moving += 0.6 * np.exp(-((x + 0.4) ** 2 + (y - 0.3) ** 2 + z**2) / 0.05)
moving = jnp.asarray(moving[None, None], jnp.float32)
true = np.stack(
    [
        1.5 * np.sin(np.pi * y),
        1.0 * np.cos(np.pi * x),
        0.5 * np.sin(np.pi * z),
    ],
    -1,
)
true = jnp.asarray(true[None], jnp.float32)
fixed = vj.warp(moving, displacement=true, displacement_units="voxels")

# %%
# One compiled step
# -----------------
# Control points every 4 voxels, upsampled x4 to the volume's size; the loss is the mean
# squared difference plus a little smoothness. ``jax.jit`` compiles the forward, the
# gradient (the warp's and the upsampling's backward kernels) and the update together.
controls = jnp.zeros((1, 3, 8, 8, 8), jnp.float32)  # (N, x/y/z, D, H, W)


def loss(controls):
    field = vj.upsample_trilinear(controls, size=shape, align_corners=True)
    field = jnp.moveaxis(field, 1, -1)  # (N, D, H, W, 3)
    warped = vj.warp(moving, displacement=field, displacement_units="voxels")
    smooth = sum(jnp.mean(jnp.diff(controls, axis=a) ** 2) for a in (2, 3, 4))
    return jnp.mean((warped - fixed) ** 2) + 1e-3 * smooth


@jax.jit
def step(controls, rate):
    value, gradient = jax.value_and_grad(loss)(controls)
    return controls - rate * gradient, value


losses = []
for _ in range(150):
    controls, value = step(controls, 2000.0)
    losses.append(float(value))
print(f"loss: {losses[0]:.5f} -> {losses[-1]:.5f}")

# %%
# Before and after
# ----------------
# The middle slice, and the loss over the steps.
field = jnp.moveaxis(
    vj.upsample_trilinear(controls, size=shape, align_corners=True), 1, -1
)
warped = vj.warp(moving, displacement=field, displacement_units="voxels")
mid = shape[0] // 2
panels = [
    ("fixed", fixed[0, 0, mid]),
    ("moving", moving[0, 0, mid]),
    ("warped", warped[0, 0, mid]),
]
fig, axes = plt.subplots(1, 4, figsize=(12, 3))
for ax, (title, image) in zip(axes, panels):
    ax.imshow(np.asarray(image), cmap="gray")
    ax.set_title(title)
    ax.axis("off")
axes[3].semilogy(losses)
axes[3].set_title("loss")
axes[3].set_xlabel("step")
fig.tight_layout()
plt.show()
