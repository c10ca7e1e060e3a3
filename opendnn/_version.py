"""opendnn's version. Compatibility policy: see README.md."""

__version__ = "0.1.0"


def version() -> int:
    """The version as one int, MAJOR * 10000 + MINOR * 100 + PATCH (as cuDNN 9's cudnnGetVersion)."""
    major, minor, patch = (int(part) for part in __version__.split("."))
    return major * 10000 + minor * 100 + patch
