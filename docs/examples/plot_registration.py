"""
Registering two volumes
=======================

``volsample.registration`` aligns a moving volume to a fixed one with a free-form
deformation: a coarse grid of control-point displacements, upsampled trilinearly to every
voxel, warps the moving volume through ``warp_3d`` (no sampling grid is stored), and
Adam follows the gradient that ``warp_3d_backward`` and ``upsample_trilinear_3d_backward``
give. This is what ``volsample demo`` runs, on a smaller volume.
"""

import matplotlib.pyplot as plt
import numpy as np

from volsample import registration

# %%
# A pair with a known answer
# --------------------------
# The fixed volume is the moving phantom under a known smooth deformation, so the
# registration's displacement can be compared with the truth.
shape = (32, 32, 32)
pair = registration.synthetic_pair(shape)
result = registration.register(
    pair.fixed, pair.moving, "ncc", levels=2, iterations=[40, 20]
)

inside = pair.fixed_labels > 0
before = registration.deformation_error(
    np.zeros_like(pair.displacement), pair.displacement, inside
)
after = registration.deformation_error(
    result.displacement, pair.displacement, inside
)
warped_labels = result.warp(pair.moving_labels, "nearest")
print(f"deformation error (voxels): {before:.3f} -> {after:.3f}")
print(
    f"dice: {registration.dice(pair.fixed_labels, pair.moving_labels):.4f} -> "
    f"{registration.dice(pair.fixed_labels, warped_labels):.4f}"
)

# %%
# Before and after
# ----------------
# The middle slice. The differences from the fixed volume show what is left to align;
# the last panel is how far the found displacement is from the true one.
z = shape[0] // 2
residual = np.linalg.norm(result.displacement - pair.displacement, axis=-1)
before_image = pair.fixed[z] - pair.moving[z]
limit = np.abs(before_image).max()
panels = [
    ("fixed", pair.fixed[z], "gray", None),
    ("moving", pair.moving[z], "gray", None),
    ("warped", result.warped[z], "gray", None),
    ("fixed - moving", before_image, "RdBu_r", limit),
    ("fixed - warped", pair.fixed[z] - result.warped[z], "RdBu_r", limit),
    ("displacement error (voxels)", residual[z], "magma", None),
]
fig, axes = plt.subplots(2, 3, figsize=(9, 6))
for ax, (title, image, cmap, bound) in zip(axes.flat, panels):
    if bound is None:
        shown = ax.imshow(image, cmap=cmap)
    else:
        shown = ax.imshow(image, cmap=cmap, vmin=-bound, vmax=bound)
    ax.set_title(title)
    ax.axis("off")
    fig.colorbar(shown, ax=ax, fraction=0.046)
fig.tight_layout()

# %%
# The optimisation
# ----------------
# Local normalised cross-correlation after each Adam step, per stage (an affine stage,
# then the deformable one) and level. Each level measures it at its own resolution (the
# coarse one on a blurred, halved volume), so the curves are not comparable with each
# other: what matters is that each climbs.
fig, ax = plt.subplots(figsize=(7, 3))
for stage, level in dict.fromkeys(
    (stage, level) for stage, level, _, _ in result.history
):
    similarity = [
        sim for st, lv, _, sim in result.history if (st, lv) == (stage, level)
    ]
    name = f"{stage}, " + (
        "coarse level (half resolution)" if level == 0 else "fine level"
    )
    ax.plot(similarity, label=name)
ax.set_xlabel("Adam step")
ax.set_ylabel("local NCC")
ax.legend()
fig.tight_layout()
