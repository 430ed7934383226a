"""Memory bounds of an import: a model of a few hundred bytes must not make tunaflow allocate gigabytes.

Two limits, both checked from shapes alone, before the array is made:

- the constant budget: everything import computes into new constants (folded ConstantOfShape,
  Range, Expand, Tile, Pad, Concat... outputs, plus the scratch arrays folding them needs) must fit
  in `max_constant_mb` MB (2**20 bytes), by default the larger of 256 MB and 4x the model's own
  tensors (initializers and Constant nodes), so real models fold their weights freely;
- the tensor limit: every run-time tensor (a declared input, every inferred intermediate) must fit
  in `max_tensor_mb` MB of float32, 4096 by default, since `build` allocates each one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from schemas.errors import ModelError
from schemas.options import ImportLimits

MB = 2**20
MIN_CONSTANT_MB = 256
WEIGHTS_FACTOR = 4
DEFAULT_TENSOR_MB = ImportLimits().max_tensor_mb
FLOAT64 = np.dtype(np.float64)


def elements(shape: Sequence[int]) -> int:
    """Element count of a shape; a negative dimension counts as empty (numpy refuses it later)."""
    return math.prod(max(int(d), 0) for d in shape)


def human(nbytes: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = 0
    while nbytes >= 1024 and i < len(units) - 1:
        nbytes, i = nbytes / 1024, i + 1
    return f"{nbytes:.0f} B" if i == 0 else f"{nbytes:.1f} {units[i]}"


def dims(shape: Sequence[int]) -> str:
    """A shape for an error line: a rank-1000 shape prints its first dims and its rank."""
    shown = [int(d) for d in list(shape)[:8]]
    return str(shown) if len(shape) <= 8 else f"{str(shown)[:-1]}, ... ({len(shape)} dims)]"


def _limit_mb(value: float, option: str) -> int:
    if not math.isfinite(value) or value <= 0:
        raise ModelError(f"{option} {value:g}: expected a positive number of MB")
    return int(value * MB)


@dataclass
class Budget:
    """What is left of an import's constant budget, and the per-tensor limit."""

    constant_bytes: int
    tensor_bytes: int
    default_constant: bool = True
    spent: int = 0

    @classmethod
    def for_model(cls, model_bytes: int, max_constant_mb: float | None = None,
                  max_tensor_mb: float = DEFAULT_TENSOR_MB) -> Budget:
        """The default constant budget is sized to the model's own tensors (`model_bytes`)."""
        tensor = _limit_mb(max_tensor_mb, "--max-tensor-mb")
        if max_constant_mb is None:
            return cls(max(MIN_CONSTANT_MB * MB, WEIGHTS_FACTOR * model_bytes), tensor)
        return cls(_limit_mb(max_constant_mb, "--max-constant-mb"), tensor, default_constant=False)

    @property
    def left(self) -> int:
        return self.constant_bytes - self.spent

    def fold(self, op: str, node: str, outputs: Iterable[tuple[Sequence[int], np.dtype]],
             scratch: Iterable[Sequence[int]] = ()) -> None:
        """Refuse a fold whose outputs (or one of its float64 scratch arrays) would not fit in what is left.

        Call it with shapes computed from the inputs' shapes and values, before anything is made."""
        outputs = list(outputs)
        total = sum(elements(s) * np.dtype(t).itemsize for s, t in outputs)
        if total > self.left:
            shape, dtype = max(outputs, key=lambda o: elements(o[0]) * np.dtype(o[1]).itemsize)
            self._refuse(op, node, f"make a constant of shape {dims(shape)} ({np.dtype(dtype).name}, {human(total)})")
        for shape in scratch:
            if elements(shape) * FLOAT64.itemsize > self.left:
                self._refuse(op, node, f"need a scratch array of shape {dims(shape)} "
                                       f"(float64, {human(elements(shape) * FLOAT64.itemsize)})")

    def spend(self, arrays: Iterable[np.ndarray]) -> None:
        """Count folded results against the budget (a broadcast view counts in full: it is materialised later)."""
        self.spent += sum(int(a.size) * a.dtype.itemsize for a in arrays)

    def tensor(self, what: str, shape: Sequence[int], kind: str = "tensor") -> None:
        """Refuse a run-time tensor (or a scratch array the reference evaluation makes) of more float32 elements
        than the per-tensor limit holds; `what` names the input or the node."""
        nbytes = elements(shape) * 4
        if nbytes > self.tensor_bytes:
            raise ModelError(f"{what}: a {kind} of shape {dims(shape)} would take {human(nbytes)} as float32, over "
                             f"the limit of {human(self.tensor_bytes)} per tensor; raise it with --max-tensor-mb")

    def _refuse(self, op: str, node: str, what: str) -> None:
        default = (f" (the default: the larger of {MIN_CONSTANT_MB} MB and {WEIGHTS_FACTOR}x the model's own "
                   "tensors)" if self.default_constant else "")
        raise ModelError(f"{op} {node!r}: folding it would {what}, more than the {human(max(self.left, 0))} left "
                         f"of the import's constant budget of {human(self.constant_bytes)}{default}; raise it with "
                         "--max-constant-mb")
