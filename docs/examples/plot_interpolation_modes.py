"""
Interpolation modes
===================

``grid_sample_3d`` reads between voxels with the ``mode`` it is given. Here a coarse
volume is sampled on a grid nine times finer with every mode volsample has: the page
lists them below, with what each does, and shows one slice and one profile per mode.
"""

import matplotlib.pyplot as plt
import numpy as np

import volsample
from volsample import registration
from volsample._tables import MODES  # the modes every front door accepts

# What each mode does. A mode without an entry here stops this example (and the
# documentation build) until it is described.
DESCRIPTIONS = {
    "nearest": "copies the closest voxel",
    "bilinear": "blends the eight voxels around the point (trilinear on volumes; "
    '"trilinear" is accepted as its name)',
    "bicubic": "PyTorch's cubic convolution (A = -0.75) carried to 3-D: 64 voxels",
    "bspline": "a cubic B-spline through 64 coefficients, which interpolates once "
    "spline_coefficients has prefiltered the volume",
}

modes = MODES.names()
for mode in modes:
    print(f"{mode!r}: {DESCRIPTIONS[mode]}")

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
    if mode == "bspline":  # the B-spline samples coefficients: prefilter first
        volume = volsample.spline_coefficients(
            coarse, "border", align_corners=True
        )
    return volsample.grid_sample_3d(
        volume, grid, mode, "border", align_corners=True
    )


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
# The profile through the slice's middle row: every mode but "nearest" passes through
# the voxel values (the dots).
x = np.linspace(0, 5, fine_shape[2])
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.plot(np.arange(6), coarse[0, 0, 3, 3], "ko", label="voxels")
row = 27  # the fine row through coarse row 3
for mode in modes:
    ax.plot(x, results[mode][0, 0, 3, row], label=mode)
ax.set_xlabel("x (voxels of the coarse volume)")
ax.legend()
fig.tight_layout()
