"""tunaflow: auto-tuning compiler pipeline for tensor operators."""

from schemas.version import VERSION as __version__

__all__ = ["__version__"]
