"""perfscope's own version (ground floor: the page footer and `--version` read it)."""

__version__ = "0.1.0"
