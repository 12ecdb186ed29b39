"""What a recompute of g_j runs under (capture.py's recompute): the batch
cast to the recompute's precision, activation checkpoints run plainly,
the summed loss as a module over the model for functional_call, and the
random generators taken and put back around the recorder's own
backwards."""

import contextlib

import torch
import torch.utils.checkpoint


def _to(batch, dtype):
    """The batch with its floating tensors in `dtype` (indices untouched)."""
    if torch.is_tensor(batch):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, dtype) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, dtype) for k, v in batch.items()}
    return batch


class _PlainReentrant:
    """Stands in for torch.utils.checkpoint.CheckpointFunction: the
    checkpointed function run once, its activations kept."""

    @staticmethod
    def apply(function, preserve_rng_state, *args):
        return function(*args)


def _plain_generator(fn, preserve_rng_state=True, context_fn=None, *rest, **kw):
    """Stands in for torch.utils.checkpoint's non-reentrant generator:
    checkpoint() runs the function after its one yield, plainly."""
    yield


@contextlib.contextmanager
def _checkpoints_run_plain():
    """torch.utils.checkpoint.checkpoint runs its function plainly (once,
    its activations kept) inside: the recorder's copy computes the
    reference gradient without the recomputation, so a checkpointed
    trainer's gradients are compared with the model's own, uncheckpointed
    ones (what checkpointing must not change), at the cost of one forward
    and one backward.  checkpoint() looks both names up when called; a
    torch without them keeps its checkpointing (the same gradient, dearer)."""
    mod = torch.utils.checkpoint
    swaps = [(name, new) for name, new in (("CheckpointFunction", _PlainReentrant),
                                           ("_checkpoint_without_reentrant_generator",
                                            _plain_generator))
             if hasattr(mod, name)]
    saved = [(name, getattr(mod, name)) for name, _ in swaps]
    for name, new in swaps:
        setattr(mod, name, new)
    try:
        yield
    finally:
        for name, old in saved:
            setattr(mod, name, old)


class _LossOf(torch.nn.Module):
    """summed_loss(model, batch) as a module over the model, so that
    torch.func.functional_call puts the recompute's tensors in place of the
    model's own for the whole loss: its forward and any parameter the loss
    reads by attribute (a penalty on the weights).  Holding the model as a
    submodule changes nothing of it."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, batch):
        return self.loss_fn(self.model, batch)


def _rng_states():
    """The CPU generator's state, and each CUDA device's once CUDA is in use
    (dropout on a CUDA tensor draws from its device's generator: a recompute
    replays that one)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_states(states):
    """Puts back what _rng_states took (or a CPU generator's state alone)."""
    if torch.is_tensor(states):
        torch.set_rng_state(states)
        return
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state_all(states[1])


def _same_rng(a, b):
    """Two _rng_states() are the same: no generator drew between them."""
    if not torch.equal(a[0], b[0]):
        return False
    if a[1] is None or b[1] is None:
        return True  # CUDA came into use between them: the CPU's says it
    return len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def _draw_once():
    """One draw from the CPU generator, and from the current CUDA device's
    once CUDA is in use: between a recompute's forward and its backward, so
    a backward that draws random numbers of its own (a recomputation that
    does not replay the forward's RNG) cannot coincide with yours by
    accident."""
    torch.rand(1)
    if torch.cuda.is_initialized():
        torch.rand(1, device="cuda")
