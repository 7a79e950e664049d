"""The installed version: ``flopscope.__version__``, from the distribution's metadata
(so the wheel and the code agree; ``"0+unknown"`` in a source tree that was never
installed)."""

from importlib import metadata

# pyproject.toml's name on the package index (its "flopscope" is another project)
DISTRIBUTION = "torch-flopscope"
try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
