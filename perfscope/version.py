"""perfscope's own version, and the installed version of any distribution (ground floor:
the page footer, `--version` and the run manifests' environment read them)."""

from importlib import metadata

__version__ = "0.1.0"


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution (a wheel's name), None when it is absent."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
