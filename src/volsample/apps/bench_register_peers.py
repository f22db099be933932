"""The child processes of ``volsample bench --register``: one script per tool, each run as
``python -c SCRIPT ...`` by ``bench_register.run_tool``.

Every child reports its own peak resident set on its last line of stderr (``PEAK``). A
peer's child (``PEERS``) takes the pair's files (JSON), an output folder and the thread
count; it leaves under that folder ``warped_labels.npy`` (the moving labels on the fixed
grid, nearest) and ``psi.npy`` (the moving world point, mm, of every fixed voxel: the
moving voxel indices, as three images on the moving grid, resampled by the tool's own
transform linearly, exact for a linear function inside the grid, then through the moving
NIfTI affine), and prints ``{"registration_s": ...}`` (its registration calls alone) on
its last line of stdout.
"""
from __future__ import annotations

import dataclasses

# the child's peak resident set (VmHWM: a fork's copy of the parent's pages, which the
# kernel's rusage would count, is not in it), on its last line of stderr
PEAK = r"""
import atexit, sys
def _peak():
    with open("/proc/self/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(f"peak-kB {kb}", file=sys.stderr)
atexit.register(_peak)
"""

# volsample register, as ``python -m volsample register ...`` runs it
VOLSAMPLE = r"""
import sys
from volsample.cli import main
sys.exit(main(sys.argv[1:]))
"""

# what every peer's child starts with: its arguments, and the moving voxel indices as images
_PEER_PRELUDE = r"""
import json, os, sys, time
import numpy as np
import nibabel as nib

paths, out, threads = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
image = nib.load(paths["moving"])
index = np.stack(np.meshgrid(*(np.arange(n, dtype=np.float32) for n in image.shape),
                             indexing="ij"), 0)

def save_psi(mapped):
    index = np.stack(mapped, -1).astype(np.float64)
    np.save(out + "/psi.npy", index @ image.affine[:3, :3].T + image.affine[:3, 3])
"""

# ANTsPy's SyN (its default settings), its result applied by ants.apply_transforms
_ANTS = _PEER_PRELUDE + r"""
import ants

fixed, moving = ants.image_read(paths["fixed"]), ants.image_read(paths["moving"])
start = time.perf_counter()
reg = ants.registration(fixed, moving, type_of_transform="SyN")
seconds = time.perf_counter() - start
labels = ants.image_read(paths["moving_labels"])
warped = ants.apply_transforms(fixed, labels, reg["fwdtransforms"], interpolator="genericLabel")
np.save(out + "/warped_labels.npy", np.rint(warped.numpy()).astype(np.int16))
mapped = []
for channel in index:
    ants_image = ants.from_numpy(channel, origin=moving.origin, spacing=moving.spacing,
                                 direction=moving.direction)
    mapped.append(ants.apply_transforms(fixed, ants_image, reg["fwdtransforms"],
                                        interpolator="linear").numpy())
save_psi(mapped)
print(json.dumps({"registration_s": seconds}))
"""

# Greedy as its tutorial registers brain MRI: affine (12 dof, from the images' centres),
# then deformable on top of it, both NCC over 2x2x2 windows and 100x50x10 iterations,
# single precision; its result applied by its own reslicing (-r warp affine). The pair's
# files may name another metric ("greedy_metric": NMI for the contrast pair).
_GREEDY = _PEER_PRELUDE + r"""
from picsl_greedy import GreedyFloat3D

affine, warp = out + "/affine.mat", out + "/warp.nii.gz"
common = (f"-d 3 -float -threads {threads} -m {paths.get('greedy_metric', 'NCC 2x2x2')} "
          f"-n 100x50x10 "
          f"-i {paths['fixed']} {paths['moving']}")
greedy = GreedyFloat3D()
start = time.perf_counter()
greedy.execute(f"{common} -a -dof 12 -ia-image-centers -o {affine}")
greedy.execute(f"{common} -it {affine} -o {warp}")
seconds = time.perf_counter() - start
names = []
for axis, channel in enumerate(index):
    names.append((out + f"/index{axis}.nii.gz", out + f"/mapped{axis}.nii.gz"))
    nib.save(nib.Nifti1Image(channel, image.affine), names[-1][0])
reslice = f"-d 3 -float -threads {threads} -rf {paths['fixed']}"
greedy.execute(f"{reslice} -ri NN -rm {paths['moving_labels']} {out}/warped_labels.nii.gz "
               f"-ri LINEAR " + " ".join(f"-rm {a} {b}" for a, b in names)
               + f" -r {warp} {affine}")
warped = np.asarray(nib.load(out + "/warped_labels.nii.gz").dataobj)
np.save(out + "/warped_labels.npy", np.rint(warped).astype(np.int16))
save_psi([np.asarray(nib.load(b).dataobj, np.float32) for _, b in names])
print(json.dumps({"registration_s": seconds}))
"""


@dataclasses.dataclass(frozen=True)
class Peer:
    module: str   # what the child imports: the peer is installed when it imports
    package: str  # the distribution whose version is reported
    script: str   # the child's code
    title: str    # in tables and figures


PEERS = {
    "greedy": Peer("picsl_greedy", "picsl-greedy", _GREEDY, "Greedy"),
    "ants-syn": Peer("ants", "antspyx", _ANTS, "ANTs SyN"),
}
