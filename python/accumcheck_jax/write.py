"""accumcheck_jax's output: the contract trace (docs/trace-format.md)
of what the recorder measured, through accumcheck_trace's writer."""

import numpy as np
from accumcheck_trace.trace import (
    CONTRACT_HEADER,
    contract_event_rows,
    contract_meta,
    real,
    write_trace,
)


def write(rec):
    """The contract trace of what `rec` (a ContractRecorder) measured, through
    the one trace writer."""
    rows = []
    for j, m in enumerate(rec.micro):
        rows.append("micro,%d,,%d,%d,%d,%d,,,%s\n" % (j, m[0], m[1], m[2], m[3], real(m[4])))
    for b, (w, resid) in enumerate(rec.backward):
        rows.append("backward,%d,%d,,%d,,,%s,%s,\n" % (b, b, rec.micro[b][1], real(w),
                                                       real(resid)))
    for e, (n, bs) in enumerate(rec.epochs):
        rows.append("epoch,%d,,,,%d,%d,,,\n" % (e, n, bs))
    rows += rec.rows
    # The model's precision: its parameters', or a narrower one the forward
    # rec.apply wrapped computes its outputs in (a bfloat16 forward of
    # float32 parameters, as torch.autocast's: the weights read at those
    # outputs carry its rounding, and so does the full path's g_j, taken
    # through the same forward).
    dtype = rec.dtype
    narrow = sorted(set(getattr(rec, "tap_dtypes", ())) & {"bfloat16", "float16"})
    if rec.tapped and narrow and dtype in ("float32", "float64"):
        dtype = narrow[0]
    precision = {"float32": "float32", "float64": "float64", "bfloat16": "bfloat16",
                 "float16": "float16"}.get(dtype, str(dtype))
    meta = contract_meta(
        engine=rec.engine, precision=precision,
        tool_version=rec._tool_version(),
        accumulation=rec.K, items=rec.items_kind, parameters=rec.layout.d,
        lr=rec.lr0 if rec.lr0 is not None else float("nan"), schedule=rec.schedule,
        clip=rec.clip_max, accept=rec.accept, lr_precision=rec.lr_precision)
    meta += rec._recorder_meta()
    events = contract_event_rows(rec.run, rec.events, lambda j: rec.micro[j][0])
    write_trace(rec.out, meta, events, [],
                extra={"contract.csv": CONTRACT_HEADER + "\n" + "".join(rows)})


def _off_bf16(G):
    """Elements of the consumed gradient bfloat16 cannot hold ('' when
    ml_dtypes, jax's own dependency, is missing)."""
    try:
        import ml_dtypes
    except ImportError:
        return ""
    return str(int(np.sum(G.astype(ml_dtypes.bfloat16).astype(np.float64) != G)))
