"""Transforms applied to every sample.

Contract
--------
* A transform is any callable ``TensorDict -> TensorDict``. It receives the gathered rows (a
  copy, so changing them never touches the storage) and returns the sample handed to the user.
  It may return a new TensorDict, including one with ``device=None``.
* ``Transform`` is an optional base class: calling it calls ``forward(td)``, which subclasses implement.
* ``Compose(t1, t2, ...)(td) == t2(t1(td))...``: applied left to right.

Cost: whatever the transforms cost; ``Compose`` adds O(number of transforms).
"""

from __future__ import annotations

from tensordict import TensorDictBase


class Transform:
    """Base class: override ``forward``."""

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return self.forward(td)


class Compose(Transform):
    """Apply ``transforms`` left to right."""

    def __init__(self, *transforms):
        for i, t in enumerate(transforms):
            if not callable(t):
                raise ValueError(f"transforms[{i}]={t!r}, but should be callable")
        self.transforms = list(transforms)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        for t in self.transforms:
            td = t(td)
        return td
