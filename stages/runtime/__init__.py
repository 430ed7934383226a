"""Load a built library and run it on numpy arrays."""

from stages.runtime.loader import LoadError, Model, RunError, load

__all__ = ["LoadError", "Model", "RunError", "load"]
