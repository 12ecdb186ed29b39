"""The recorder never changes the run it records: the same training run
without the recorder and with it must leave the same trained parameters,
bit for bit (docs/tiers.md, "What the recorder changes").  Nothing here
knows accumcheck: the trainers pass their own train function.

digest(model): the SHA-256 of the module's parameters and buffers, each
its name then its bytes (train.py --digest's convention; a sharded
tensor's local shard: each rank digests what it holds).

twice(train, path, rank, ranks, a): train(rank, ranks, a) run twice in this
process, first with a.no_record set (the plain run), then as asked (the
recorded run), each returning what it trained (tensors()); writes
path.rank<rank> holding "plain SHA" and "recorded SHA" (a line each) for
the test to compare (tests/pytorch/ctest_contract.py --identity).  The
plain run goes first: nothing the recorder leaves behind can reach it.
Run in one process, the import of torch and the framework, the process
group and the ranks' start are paid once."""

import copy
import hashlib

import torch


def tensors(trained, prefix=""):
    """(name, tensor) of every parameter and buffer of a module (the local
    shard of a sharded (DTensor) one), of a tensor, or of each item of a
    list or tuple of them (what a trainer trained: its model and an EMA)."""
    if isinstance(trained, (list, tuple)):
        for i, part in enumerate(trained):
            yield from tensors(part, "%s%d." % (prefix, i))
        return
    if isinstance(trained, torch.Tensor):
        named = [("", trained)]
    else:
        named = list(trained.named_parameters()) + list(trained.named_buffers())
    seen = set()
    for name, t in named:
        if id(t) in seen:
            continue
        seen.add(id(t))
        t = t.detach()
        if hasattr(t, "to_local"):
            t = t.to_local()
        yield prefix + name, t


def digest(trained):
    """SHA-256 of what tensors(trained) yields, bit for bit."""
    h = hashlib.sha256()
    for name, t in tensors(trained):
        h.update(name.encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def twice(train, path, rank, ranks, a):
    """train's plain run then its recorded one, this rank's digests of
    both written to path.rank<rank>; returns what the recorded run trained.
    Both on one intra-op thread: with two, a loaded machine once made the
    plain run (no recorder in the process) train other bits than every
    other run of the same trainer, the recorded run's and its trace the
    usual ones (PyTorch.systems.checkpointing.reentrant, twice in about 30
    runs): a comparison of the recorder's effect needs the sums' order
    fixed."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain = copy.copy(a)
        plain.no_record, plain.quiet = True, True
        first = digest(train(rank, ranks, plain))
        model = train(rank, ranks, a)
    finally:
        torch.set_num_threads(threads)
    with open("%s.rank%d" % (path, rank), "w") as f:
        f.write("plain %s\nrecorded %s\n" % (first, digest(model)))
    return model
