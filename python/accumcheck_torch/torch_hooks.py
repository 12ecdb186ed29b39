"""The hooks into torch that the recorders share (the oracle tier's
Recorder and the contract tier's capture): a module hook torch.compile
leaves as Python (eager), a callback at the end of the outermost backward
pass (at_backward_end), and every call of clip_grad_norm_ routed through
a recorder by swapping its code (swap_clip)."""

import types

import torch
import torch.nn.utils.clip_grad as _clip_module

from .trace import Refused


def _clip_entry(*args, **kwargs):
    """clip_grad_norm_'s code while a recorder is active (see swap_clip).
    It runs with clip_grad_norm_'s own globals, where the recorder puts
    `_accumcheck_clip`."""
    return _accumcheck_clip(*args, **kwargs)  # noqa: F821


def eager(hook):
    """A module hook that torch.compile runs as Python, not traced into its
    graph (torch.compiler.disable: a graph break around it)."""
    return torch.compiler.disable(hook, recursive=True)


def at_backward_end(fn):
    """Runs fn once the backward pass that is running ends: a callback on
    autograd's outermost graph task.  A gradient hook may fire inside a
    nested backward (reentrant activation checkpointing runs one inside
    its node's backward): a callback queued there would end the pass at
    the end of that checkpointed segment.  So the callback, run inside a
    node of an enclosing task, moves itself to that task (a hook after
    the node, which queues it again there), until no task encloses it."""
    engine = torch.autograd.Variable._execution_engine
    current = getattr(torch._C, "_current_autograd_node", None)

    def callback():
        node = current() if current is not None else None
        if node is None:
            fn()
            return
        node.register_hook(lambda grad_inputs, grad_outputs: engine.queue_callback(callback))

    engine.queue_callback(callback)


def _closure_entry():
    func = None

    def _clip_entry(*args, **kwargs):
        """The same for PyTorch 2's clip_grad_norm_, a closure (its
        no_grad wrapper holds the function in one cell): a code object
        replacing a closure's must have as many free variables."""
        func  # noqa: B018  (the wrapper's cell, never used)
        return _accumcheck_clip(*args, **kwargs)  # noqa: F821
    return _clip_entry


_ENTRIES = {0: _clip_entry.__code__, 1: _closure_entry().__code__}


def swap_clip(make_clip):
    """Routes every call of torch.nn.utils.clip_grad_norm_ -- through any
    name bound to it, including a `from torch.nn.utils import
    clip_grad_norm_` done before the recorder existed -- to
    make_clip(original), where `original` is a callable copy of PyTorch's
    function.  The function object stays the same (only its code is
    swapped), so every reference sees the swap.  Returns the callable
    that restores PyTorch's code.  One recorder at a time."""
    f = _clip_module.clip_grad_norm_
    if "_accumcheck_clip" in f.__globals__:
        raise Refused("another recorder is active (one recorder at a time)")
    code = f.__code__
    entry = _ENTRIES.get(len(code.co_freevars))
    if entry is None:
        raise Refused("this PyTorch's clip_grad_norm_ is a closure over %d variables (%s); the recorder "
                      "knows 0 or 1" % (len(code.co_freevars), ", ".join(code.co_freevars)))
    original = types.FunctionType(code, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    original.__kwdefaults__ = f.__kwdefaults__
    f.__globals__["_accumcheck_clip"] = make_clip(original)
    f.__code__ = entry

    def restore():
        f.__code__ = code
        f.__globals__.pop("_accumcheck_clip", None)
    return restore
