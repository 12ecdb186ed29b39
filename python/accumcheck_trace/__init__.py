"""The framework-free part of accumcheck's recorders: the trace writer
(trace.py: meta.csv, events.csv, values, contract.csv, the completion
record complete.csv, a recording's rank marker) and the package version.
accumcheck_torch and accumcheck_jax both write their traces through it;
docs/trace-format.md says what any recorder must write."""

from ._version import __version__
from .trace import TRACE_SCHEMA, VERSION, Refused, exit_on_refusal_as, seal_trace, write_trace

__all__ = [
           "TRACE_SCHEMA",
           "VERSION",
           "Refused",
           "__version__",
           "exit_on_refusal_as",
           "seal_trace",
           "write_trace",
]
