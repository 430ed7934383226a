"""tunaflow: auto-tuning compiler pipeline for tensor operators."""

__version__ = "0.1.0"
