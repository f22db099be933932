"""
Interpolation modes
===================

``grid_sample_3d`` reads between voxels with the ``mode`` it is given. Here a coarse
volume is sampled on a grid eight times finer with each mode this build of volsample
offers: "nearest" copies the closest voxel, "bilinear" (trilinear on volumes) blends the
eight around the point. Builds that have the higher-order modes show them too: "bicubic"
(PyTorch's cubic convolution carried to 3-D) and "bspline" (a cubic B-spline, which
interpolates once ``spline_coefficients`` has prefiltered the volume).
"""

import matplotlib.pyplot as plt
import numpy as np

import volsample
from volsample import registration

# %%
# A coarse volume and a fine grid over it
# ---------------------------------------
rng = np.random.default_rng(0)
coarse = rng.random((1, 1, 6, 6, 6))
# 9 fine steps per coarse voxel: fine rows 0, 9, .., 45 lie on the voxels.
fine_shape = (6, 46, 46)
grid = registration.identity_grid(fine_shape, np.float64)


def sample(mode):
    volume = coarse
    if (
        mode == "bspline"
    ):  # the B-spline samples coefficients: prefilter the volume first
        volume = volsample.spline_coefficients(
            coarse, "border", align_corners=True
        )
    return volsample.grid_sample_3d(
        volume, grid, mode, "border", align_corners=True
    )


def available(mode):
    try:
        sample(mode)
    except (
        volsample.InvalidArgumentError,
        AttributeError,
    ):  # not in this build
        return False
    return True


modes = [
    m for m in ("nearest", "bilinear", "bicubic", "bspline") if available(m)
]
print("modes:", modes)
results = {mode: sample(mode) for mode in modes}

# %%
# One slice of each
# -----------------
fig, axes = plt.subplots(
    1, len(modes) + 1, figsize=(3.2 * (len(modes) + 1), 3.2)
)
axes[0].imshow(coarse[0, 0, 3], cmap="viridis", vmin=0, vmax=1)
axes[0].set_title("the 6x6 slice")
for ax, mode in zip(axes[1:], modes):
    ax.imshow(results[mode][0, 0, 3], cmap="viridis", vmin=0, vmax=1)
    ax.set_title(mode)
for ax in axes:
    ax.axis("off")
fig.tight_layout()

# %%
# Along one line
# --------------
# The profile through the slice's middle row: every mode but "nearest" passes through the
# voxel values (the dots); the smoother modes overshoot a little between sharp changes.
x = np.linspace(0, 5, fine_shape[2])
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.plot(np.arange(6), coarse[0, 0, 3, 3], "ko", label="voxels")
row = 27  # the fine row through coarse row 3
for mode in modes:
    ax.plot(x, results[mode][0, 0, 3, row], label=mode)
ax.set_xlabel("x (voxels of the coarse volume)")
ax.legend()
fig.tight_layout()
