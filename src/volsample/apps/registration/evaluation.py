"""How well a registration did: label overlap (Dice) and the error against a known
displacement."""
from __future__ import annotations

import numpy as np

from ..._checks import InvalidArgumentError

_FEW_LABELS = 8  # label ranges compared label by label (three passes each, no index array)
_JOINT_LABELS = 1 << 10  # label ranges counted in one joint histogram (a size^2 table)


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Mean Dice overlap of two label maps over the labels > 0 present in either."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iub" and b.dtype.kind in "iub" and a.size:
        # integer maps: counted per label (bincount), not compared label by label
        low, high = min(int(a.min()), int(b.min())), max(int(a.max()), int(b.max()))
        if high - max(low, 1) < _FEW_LABELS:  # a few labels > 0 (a brain's tissue classes)
            return _dice_of_labels(a, b, range(max(low, 1), high + 1))
        size = high - low + 1
        if size <= _JOINT_LABELS:  # one pass: the (a, b) pairs' histogram
            index = a.astype(np.intp) * size
            index += b
            index -= low * (size + 1)
            joint = np.bincount(index.ravel(), minlength=size * size).reshape(size, size)
            in_a, in_b, in_both = joint.sum(1), joint.sum(0), np.diagonal(joint)
        elif size <= 1 << 16:  # three passes
            def count(x):
                return np.bincount((x.astype(np.int64) - low).ravel(), minlength=size)
            in_a, in_b, in_both = count(a), count(b), count(a[a == b])
        if size <= 1 << 16:
            labels = np.arange(low, low + size)
            keep = (labels > 0) & (in_a + in_b > 0)
            if not keep.any():
                raise InvalidArgumentError(
                    "dice: expected label maps with some label > 0, got none")
            return float(np.mean(2 * in_both[keep] / (in_a[keep] + in_b[keep])))
    labels = np.union1d(np.unique(a), np.unique(b))
    return _dice_of_labels(a, b, labels[labels > 0])


def _dice_of_labels(a, b, labels) -> float:
    """Mean Dice of two label maps over those of ``labels`` present in either, each label
    compared voxel by voxel."""
    scores = []
    for k in labels:
        in_a, in_b = a == k, b == k
        total = np.count_nonzero(in_a) + np.count_nonzero(in_b)
        if total:
            scores.append(2 * np.count_nonzero(in_a & in_b) / total)
    if not scores:
        raise InvalidArgumentError("dice: expected label maps with some label > 0, got none")
    return float(np.mean(scores))


def deformation_error(displacement: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> float:
    """Mean Euclidean distance (voxels) between two (D, H, W, 3) displacements in ``mask``."""
    return float(np.mean(np.linalg.norm(displacement - truth, axis=-1)[mask]))
