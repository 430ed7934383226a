"""tunaflow's version, from the installed package's metadata (pyproject.toml is the one place it is written)."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("tunaflow")
except PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0+unknown"
