"""The op layer's one store of prepared calls (``volsample._prepared``): every door's calls
in it, one bound, one forget."""
from __future__ import annotations

import numpy as np
import pytest

import volsample
from volsample import _prepared


def test_every_door_keeps_its_calls_in_the_one_store():
    torch = pytest.importorskip("torch")
    import volsample.torch as vt

    _prepared.forget_prepared_calls()
    x = np.zeros((1, 1, 4, 4, 4), np.float32)
    grid = np.zeros((1, 2, 2, 2, 3), np.float32)
    volsample.grid_sample_3d(x, grid)
    volsample.upsample_trilinear_3d(x, (5, 5, 5))
    volsample.warp_3d(x, np.eye(3, 4, dtype=np.float32)[None])
    vt.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), align_corners=False)
    for site in ("grid_sample_3d", "upsample_trilinear_3d", "warp_3d", "torch.grid_sample",
                 "torch.grid_sampler_3d"):
        assert len(_prepared.kept(site)) == 1, site
    _prepared.forget_prepared_calls()
    assert not any(_prepared.kept(site) for site in ("grid_sample_3d", "torch.grid_sample"))


def test_the_store_is_bounded_and_drops_its_oldest_call(monkeypatch):
    _prepared.forget_prepared_calls()
    monkeypatch.setattr(_prepared, "KEPT", 3)
    for k in range(5):
        _prepared.remember(("test", k), k)
    assert _prepared.kept("test") == [2, 3, 4]
    own: dict = {}  # a prepared call's own calls: the same policy
    for k in range(4):
        _prepared.remember(k, k, own)
    assert list(own) == [1, 2, 3]
    _prepared.forget_prepared_calls()
    assert _prepared.kept("test") == []


def test_a_key_that_cannot_hash_finds_nothing():
    assert _prepared.lookup("test", [1, 2]) == (None, None)
    key, found = _prepared.lookup("test", (1, 2))
    assert key == ("test", (1, 2)) and found is None


def test_memoised_descriptions_remember_only_calls_that_pass():
    built = []

    @_prepared.memoised(lambda value: value)
    def describe(value):
        built.append(value)
        if value == -1:
            raise ValueError("value: negative")
        return value * 2

    _prepared.forget_prepared_calls()
    assert describe(3) == describe(3) == 6 and built == [3]
    for _ in range(2):
        with pytest.raises(ValueError, match="negative"):
            describe(-1)
    assert built == [3, -1, -1]
    assert describe([1]) == [1, 1] and describe([1]) == [1, 1]  # no key: built each time
    assert built == [3, -1, -1, [1], [1]]
    _prepared.forget_prepared_calls()
    describe(3)
    assert built[-1] == 3 and len(built) == 6
