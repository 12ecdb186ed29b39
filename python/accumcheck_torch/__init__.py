"""accumcheck for PyTorch: train on an export bundle, record a trace.

    bundle = load_bundle("bundle/")          # accumcheck export ... --out bundle/
    model = bundle.model()                   # or your own nn.Module + bundle.load_initial(model)
    optimizer = bundle.optimizer(model)      # SGD / Adam / AdamW as exported
    scheduler = bundle.scheduler(optimizer)  # LambdaLR with the exported schedule
    recorder = Recorder(bundle, model, optimizer, scheduler, out="trace/")
    ... your training loop, unchanged ...
    recorder.close()                         # writes trace/{meta,events,values}.csv

    accumcheck certify bundle/scenario.toml --trace trace/

What the recorder hooks: see recorder.py (autograd gradient hooks, not
Tensor.backward).  The attributes of a bundle: docs/python.md.
"""

from ._version import __version__
from .bundle import Bundle, SampleDataset, load_bundle, map_parameters
from .contract import ContractRecorder
from .recorder import Recorder
from .trace import TRACE_SCHEMA, VERSION, Refused, exit_on_refusal

__all__ = ["__version__", "Bundle", "SampleDataset", "load_bundle", "map_parameters", "Recorder",
           "ContractRecorder", "TRACE_SCHEMA", "VERSION", "Refused", "exit_on_refusal",
           "example_session"]


def example_session(doc, model=None):
    """The set-up shared by the example trainers: `--bundle DIR --out DIR`
    from the command line, the bundle's model (or `model(bundle)`, a
    callable building your own), optimizer and scheduler, and a Recorder
    writing the trace to --out.  Returns (bundle, model, optimizer,
    scheduler, recorder); the caller's loop stays its own."""
    import argparse

    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--bundle", required=True, help="accumcheck export folder")
    ap.add_argument("--out", required=True, help="trace folder to write")
    args = ap.parse_args()
    bundle = load_bundle(args.bundle)
    if model is None:
        net = bundle.model()
    else:
        net = model(bundle)
        bundle.load_initial(net)
    optimizer = bundle.optimizer(net)
    scheduler = bundle.scheduler(optimizer)
    recorder = Recorder(bundle, net, optimizer, scheduler, out=args.out)
    return bundle, net, optimizer, scheduler, recorder
