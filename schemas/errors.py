"""The errors an import can end with: each names what is wrong and where, before any tuning starts."""

from __future__ import annotations


class ModelError(ValueError):
    """The model cannot be compiled as given (unsupported variant, unbound dimension, bad shapes...)."""


class UnsupportedOpsError(ModelError):
    """Every operator type tunaflow does not support, with the names of the nodes that use it."""

    def __init__(self, unsupported: dict[str, list[str]]):
        self.unsupported = unsupported
        lines = [f"  {op}: {', '.join(names[:8])}" + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
                 for op, names in sorted(unsupported.items())]
        super().__init__(f"the model uses {len(unsupported)} unsupported operator type(s):\n" + "\n".join(lines))
