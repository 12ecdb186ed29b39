"""The trees of tensors a training loop passes (a batch, a forward's
output: a tensor, a tuple or list, a named tuple, a dict, nested): their
first tensor, their tensors moved to a device, rebuilt with other items.
The contract recorder's capture (capture.py) reads batches and outputs
through these."""

import copy

import torch


def _compiled(output):
    """The output of a torch.compile'd graph (its autograd node is
    AOTAutograd's CompiledFunction)."""
    try:
        t = _first(output)
    except (TypeError, IndexError, StopIteration, KeyError):
        return False
    return t.grad_fn is not None and "Compiled" in type(t.grad_fn).__name__


def _first(batch):
    t = batch
    while not torch.is_tensor(t):
        t = next(iter(t.values())) if isinstance(t, dict) else t[0]
    return t


def _on_device(batch, first):
    """The batch with its first tensor (_first) replaced by `first` (the
    forward's input, a device copy of it) and every other tensor moved to
    first's device: an input's size, host to device."""
    if torch.is_tensor(batch):
        return first
    if isinstance(batch, dict):
        out, k0 = dict(batch), next(iter(batch))
        for k, v in batch.items():
            out[k] = _on_device(v, first) if k == k0 else _moved(v, first.device)
        return out
    return _rebuilt(batch, [_on_device(batch[0], first)]
                    + [_moved(v, first.device) for v in batch[1:]])


def _moved(x, device):
    """x's tensors moved to device (a nested tuple, list or dict)."""
    if torch.is_tensor(x):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _moved(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return _rebuilt(x, [_moved(v, device) for v in x])
    return x


def _rebuilt(seq, items):
    """A list or tuple like seq (a named tuple too) holding items."""
    return type(seq)(*items) if hasattr(seq, "_fields") else type(seq)(items)


def _replaced(output, new, depth=0):
    """output with its tensors whose id is in `new` replaced by new[id]
    (a tensor, a tuple or list, a dict (a Transformers ModelOutput),
    nested as outputs._out_tensors reads them: to its depth, below which it
    finds no tensor to replace)."""
    if torch.is_tensor(output):
        return new.get(id(output), output)
    if depth > 4:
        return output
    if isinstance(output, dict):
        out = copy.copy(output)
        for k, v in output.items():
            out[k] = _replaced(v, new, depth + 1)
        return out
    if isinstance(output, (list, tuple)):
        return _rebuilt(output, [_replaced(v, new, depth + 1) for v in output])
    return output


def _same_values(t, drawn):
    """t holds the drawn tensor's values: equal, or its cast to t's
    floating dtype (a bf16 model's loop casts each batch).  The drawn
    tensor is moved to t's device (a loop's batch.to("cuda")): an input's
    size to the device, nothing of t to the host."""
    if t.dtype != drawn.dtype and not (t.is_floating_point() and drawn.is_floating_point()):
        return False
    return torch.equal(t, drawn.to(device=t.device, dtype=t.dtype))
