"""The package's version.  Its one home is project(accumcheck VERSION ...)
in the source tree's CMakeLists.txt: an installed package reads it from its
metadata (pyproject.toml takes it from there), a source checkout from that
file."""
import os
import re
from importlib import metadata


def _version():
    try:
        return metadata.version("accumcheck")
    except metadata.PackageNotFoundError:
        pass
    cmake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "CMakeLists.txt")
    try:
        with open(cmake) as f:
            m = re.search(r"project\(accumcheck VERSION ([0-9][0-9.]*)", f.read())
        if m:
            return m.group(1)
    except OSError:
        pass
    return "unknown"


__version__ = _version()
