"""The registration's two stages, each coarse to fine over the pyramid: Adam's steps on
the affine's parameters, then on the free-form deformation's control grid, each level
ending early when its objective stalls."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .geometry import IDENTITY_PARAMS, Frame, control_shape, refine
from .losses import STALL_SCALES, Measure, similarity_measure, smoothness
from .objectives import StepBuffers, affine_objective, objective
from .velocity import Exponential

# called after every step: (stage, level, iteration, objective, similarity)
Record = Callable[[str, int, int, float, float], None]
Pyramid = Sequence[tuple[int, np.ndarray, np.ndarray]]


class Adam:
    """Adam (Kingma & Ba) updating one array in place; ``lr`` is a number or an array of
    steps per parameter (broadcast against it)."""

    def __init__(self, params: np.ndarray, lr: float | np.ndarray,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = 0

    def step(self, grad: np.ndarray) -> None:
        b1, b2 = self.betas
        self.t += 1
        self.m += (1 - b1) * (grad - self.m)
        self.v += (1 - b2) * (grad * grad - self.v)
        m_hat = self.m / (1 - b1 ** self.t)
        v_hat = self.v / (1 - b2 ** self.t)
        self.params -= (self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(self.params.dtype)


STALL_STEPS = 10  # steps over which a stalled objective is judged


class _Stall:
    """Fed one objective value per step, says when the best of the last ``STALL_STEPS``
    improves on the best before them by less than ``threshold`` (never when 0)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.values: list[float] = []

    def __call__(self, value: float) -> bool:
        self.values.append(value)
        if not self.threshold or len(self.values) <= STALL_STEPS:
            return False
        recent, before = self.values[-STALL_STEPS:], self.values[:-STALL_STEPS]
        return min(before) - min(recent) < self.threshold


def affine_stage(pyramid: Pyramid, frame: Frame, loss: str, steps: Sequence[int], *,
                 lr: float, affine_lr: float, voxel_mm: float, window: int, tolerance: float,
                 interp: str, record: Record, start: np.ndarray = IDENTITY_PARAMS) -> np.ndarray:
    """The affine's parameters (``Frame``) after ``steps[level]`` steps per level (see
    ``register``), from ``start`` (default: the headers' alignment)."""
    params = start.copy()
    for level, (factor, fixed_l, moving_l) in enumerate(pyramid):
        step = np.full((3, 4), affine_lr * factor)
        step[:, 3] = lr * factor * voxel_mm
        adam = Adam(params, step)
        measure = similarity_measure(loss, fixed_l, window) if steps[level] else None
        stall = _Stall(tolerance * STALL_SCALES[loss])
        buffers = StepBuffers()
        for it in range(steps[level]):
            value, grad, sim = affine_objective(params, fixed_l, moving_l, frame, measure=measure,
                                                interp=interp, buffers=buffers)
            adam.step(grad)
            record("affine", level, it, value, sim)
            if stall(value):
                break
        del measure, buffers
    return params


def deformable_stage(pyramid: Pyramid, theta: np.ndarray, shape: Sequence[int], loss: str,
                     weight: float, steps: Sequence[int], *, grid_spacing: float, lr: float,
                     window: int, tolerance: float, interp: str, record: Record,
                     diffeomorphic: bool = False
                     ) -> tuple[np.ndarray, Measure | None]:
    """The finest control grid after ``steps[level]`` steps per level (see ``register``),
    from no displacement, and the last level's measure (None when it took no step). With
    ``diffeomorphic``, the grid holds a stationary velocity (``velocity``): the objective
    reads its exponential, the smoothness penalty the velocity itself."""
    control = np.zeros((1,) + control_shape(shape, grid_spacing * 2 ** (len(pyramid) - 1))
                       + (3,), np.float32)
    measure = None
    for level, (factor, fixed_l, moving_l) in enumerate(pyramid):
        control = refine(control, control_shape(shape, grid_spacing * factor))
        adam = Adam(control, lr * factor)
        measure = similarity_measure(loss, fixed_l, window) if steps[level] else None
        stall = _Stall(tolerance * STALL_SCALES[loss])
        buffers = StepBuffers()
        for it in range(steps[level]):
            if diffeomorphic:
                value, grad, sim = _velocity_objective(control, fixed_l, moving_l, loss, weight,
                                                       theta, shape, measure, interp, buffers)
            else:
                value, grad, sim = objective(control, fixed_l, moving_l, loss, weight,
                                             theta=theta, full_shape=shape, measure=measure,
                                             interp=interp, buffers=buffers)
            adam.step(grad)
            record("deformable", level, it, value, sim)
            if stall(value):
                break
        del buffers  # the steps' parts
    return control, measure


def _velocity_objective(velocity, fixed, moving, loss, weight, theta, shape, measure, interp,
                        buffers):
    """``objective`` of the velocity's exponential, the penalty on the velocity: (value,
    d value / d velocity, similarity)."""
    exponential = Exponential(shape)
    value, grad, sim = objective(exponential.forward(velocity), fixed, moving, loss, 0.0,
                                 theta=theta, full_shape=shape, measure=measure, interp=interp,
                                 buffers=buffers)
    spacing = [(n - 1) / (c - 1) for n, c in zip(shape, velocity.shape[1:4])]
    penalty, grad_penalty = smoothness(velocity, spacing)
    return (value + weight * penalty,
            exponential.backward(grad) + velocity.dtype.type(weight) * grad_penalty, sim)
