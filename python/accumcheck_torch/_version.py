"""The package's version (accumcheck_trace._version: its one home is
project(accumcheck VERSION ...) in the source tree's CMakeLists.txt)."""
from accumcheck_trace._version import __version__  # noqa: F401
