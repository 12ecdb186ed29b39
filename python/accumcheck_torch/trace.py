"""The accumcheck trace schema as accumcheck_torch writes it: the one
trace writer, accumcheck_trace.trace (framework-free, shared with
accumcheck_jax), under its historical name.  Everything the PyTorch
recorders and their tests import from here is that module's own object
(one Recording registry, one atexit handler)."""

from accumcheck_trace.trace import (  # noqa: F401  (re-exported)
    BLOCK_KINDS,
    COMPLETE_FILE,
    COMPLETE_HEADER,
    EVENTS_HEADER,
    RANK_MARKER_PREFIX,
    RANK_MARKER_SUFFIX,
    TRACE_FILES,
    TRACE_SCHEMA,
    VALUES_HEADER,
    VALUES_MAGIC,
    VALUES_VERSION,
    VERSION,
    Recording,
    Refused,
    Values,
    Written,
    _at_exit,
    _field,
    clear_rank_markers,
    complete_csv,
    describe,
    exit_on_refusal_as,
    rank_marker_path,
    read_csv,
    real,
    seal_trace,
    stopped_by,
    unseen_meta,
    write_atomically,
    write_rank_marker,
    write_trace,
)

exit_on_refusal = exit_on_refusal_as("accumcheck_torch")
