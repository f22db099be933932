"""
A warp and its gradient
=======================

Grid sampling moves a volume: every output voxel reads the input where the grid points.
Here a smooth displacement bends a 3-D phantom, and ``grid_sample_3d_backward`` gives the
two gradients a network or a registration needs: how a loss changes with the input voxels
(``grad_input``) and with the sampling positions (``grad_grid``).
"""

import matplotlib.pyplot as plt
import numpy as np

import volsample
from volsample import registration

# %%
# A phantom and a smooth deformation of it
# ----------------------------------------
# ``registration.synthetic_pair`` draws nested soft ellipsoids; its known deformation,
# in voxels, becomes a sampling grid in normalised coordinates ([-1, 1] across each axis,
# channels x, y, z; align_corners=True puts -1 and 1 on the corner voxels' centres).
shape = (32, 48, 48)
pair = registration.synthetic_pair(shape, amplitude=4.0)
volume = pair.moving[None, None]  # (N, C, D, H, W)
displacement_xyz = pair.displacement[..., ::-1]  # (D, H, W, 3) as x, y, z
identity = registration.identity_grid(shape)
grid = identity + displacement_xyz * registration.voxel_to_normalised(shape)
warped = volsample.grid_sample_3d(
    volume, grid, "bilinear", "border", align_corners=True
)

# %%
# Gradients of a loss
# -------------------
# For the loss ``0.5 * sum((warped - fixed)**2)`` the gradient reaching the warp's output
# is ``warped - fixed``; the backward turns it into gradients of the input and the grid.
fixed = pair.fixed[None, None]
grad_input, grad_grid = volsample.grid_sample_3d_backward(
    warped - fixed, volume, grid, "bilinear", "border", align_corners=True
)
print("loss:", 0.5 * float(((warped - fixed) ** 2).sum()))
print("grad_input", grad_input.shape, "grad_grid", grad_grid.shape)

# %%
# The middle slice of each: the grid's gradient is largest on the phantom's edges, where
# moving a sample point changes what it reads.
z = shape[0] // 2
images = {
    "moving (input)": volume[0, 0, z],
    "warped": warped[0, 0, z],
    "fixed (target)": fixed[0, 0, z],
    "warped - fixed": (warped - fixed)[0, 0, z],
    "grad_input": grad_input[0, 0, z],
    "|grad_grid|": np.linalg.norm(grad_grid[0, z], axis=-1),
}
fig, axes = plt.subplots(2, 3, figsize=(9, 6))
for ax, (title, image) in zip(axes.flat, images.items()):
    if title.startswith("|"):
        shown = ax.imshow(image, cmap="magma")
    elif title in ("warped - fixed", "grad_input"):
        limit = np.abs(image).max()
        shown = ax.imshow(image, cmap="RdBu_r", vmin=-limit, vmax=limit)
    else:
        shown = ax.imshow(image, cmap="gray")
    ax.set_title(title)
    ax.axis("off")
    fig.colorbar(shown, ax=ax, fraction=0.046)
fig.tight_layout()


# %%
# The grid gradient checked against a finite difference
# ------------------------------------------------------
# Nudging one sample point along x changes the loss by ``grad_grid`` times the nudge.
def loss(g):
    out = volsample.grid_sample_3d(
        volume.astype(np.float64), g, "bilinear", "border", align_corners=True
    )
    return 0.5 * float(((out - fixed) ** 2).sum())


point = (0, z, 20, 20, 0)
step = 1e-6
nudged = grid.astype(np.float64)
nudged[point] += step
print(
    "finite difference:", (loss(nudged) - loss(grid.astype(np.float64))) / step
)
print("grad_grid:        ", float(grad_grid[point]))
