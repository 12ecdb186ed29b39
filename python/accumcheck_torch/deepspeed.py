"""accumcheck inside a DeepSpeed trainer (the contract tier, gloo on CPU).

    engine = accumcheck_torch.deepspeed.initialize(model=net, optimizer=opt, config=cfg)
    recorder = DeepSpeedRecorder(engine, summed_loss, items, out="trace/")
    for batch in recorder.watch(loader):           # your loop, unchanged
        loss = engine(batch) ...                   # the micro-batch's mean loss
        engine.backward(loss)                      # DeepSpeed scales by 1/K here
        engine.step()                              # and decides the boundary here
    recorder.close()                               # every rank; rank 0 writes trace/
    accumcheck certify --contract --trace trace/

DeepSpeed owns the accumulation: `engine.backward(loss)` divides the loss by
gradient_accumulation_steps, `engine.step()` steps the optimizer only when
its own micro-step counter reaches a boundary, and the data-parallel average
happens inside the engine (ZeRO 1/2: reduce-scatter into each rank's
partition).  The recorder is ContractDistributedRecorder on the module the
engine wraps and on the torch optimizer DeepSpeed steps (the engine's own,
or the one inside its ZeRO / bf16 wrapper): each backward's gradient is
seen by the parameters' autograd hooks, before DeepSpeed moves it.

The consumed gradient.  Under ZeRO 1/2 (and DeepSpeed's bf16 optimizer)
the torch optimizer steps flat float32 partitions, one per rank, not the
model's parameters.  The model's parameters are views into one flat
low-precision buffer per parameter group, partitioned into equal slices
across the ranks; at the optimizer's step the rank's float32 partition
holds the averaged gradient of its slice.  The recorder all-gathers the
partitions (a collective: every rank steps together) and reads each
parameter's gradient at the parameter's offset in the flat buffer: the
gradient the optimizer consumed, whole.  Where that layout does not hold
(a parameter outside the flat buffers, partitions of unequal size) the
recorder says it cannot see the consumed gradient and certify exits 2.
"""

import torch
import torch.distributed as dist

from .distributed import ContractDistributedRecorder
from .trace import Refused


def initialize(config, **kwargs):
    """deepspeed.initialize(config=config, **kwargs) -> the engine; a
    configuration DeepSpeed refuses (batch sizes that do not multiply out:
    train_batch_size != micro batch x gradient_accumulation_steps x ranks)
    is passed on as accumcheck's bad input (exit 2), naming the rank and
    the configuration (its file, when config is a path)."""
    import deepspeed

    try:
        engine = deepspeed.initialize(config=config, **kwargs)[0]
    except (AssertionError, ValueError) as e:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        where = config if isinstance(config, str) else "the config dict passed to initialize"
        raise Refused("rank %d: DeepSpeed refused %s: %s" % (rank, where, str(e).strip()))
    return engine


def _torch_optimizer(engine):
    """The torch.optim.Optimizer DeepSpeed steps: the engine's own, or the
    one its ZeRO / bf16 wrapper holds."""
    opt = engine.optimizer
    while not isinstance(opt, torch.optim.Optimizer) or hasattr(opt, "loss_scaler"):
        inner = getattr(opt, "optimizer", None)
        if inner is None or inner is opt:
            break
        opt = inner
    if not isinstance(opt, torch.optim.Optimizer):
        raise Refused("the DeepSpeed engine holds no torch optimizer (%s): pass the optimizer "
                      "to deepspeed.initialize(optimizer=...) or name one in the config"
                      % type(engine.optimizer).__name__)
    return opt


def _flat_buffers(wrapper):
    """The flat low-precision buffers holding the model's parameters, one
    per group, and the rank's float32 partitions the torch optimizer
    steps: (flats, partitions) of DeepSpeed's ZeRO 1/2 optimizer or its bf16
    optimizer, or None."""
    for flats, parts in (("bit16_groups_flat", "single_partition_of_fp32_groups"),
                         ("bf16_groups_flat", "fp32_groups_flat_partition")):
        if hasattr(wrapper, flats) and hasattr(wrapper, parts):
            return list(getattr(wrapper, flats)), list(getattr(wrapper, parts))
    return None


class DeepSpeedRecorder(ContractDistributedRecorder):
    """DeepSpeedRecorder(engine, loss_fn, count_fn, out="trace", items="samples",
    quiet=None, **kw): ContractRecorder's loss_fn, count_fn and keywords;
    the model, the optimizer and the accumulation K are the engine's.
    loss_fn(model, batch) is the SUM of the batch's item losses (DeepSpeed's
    loop backwards the mean; the recorder measures the weights)."""

    def __init__(self, engine, loss_fn, count_fn, out="trace", quiet=None, **kw):
        self.engine = engine
        opt = _torch_optimizer(engine)
        self.layout = None
        if opt is not engine.optimizer:
            self.layout = _flat_buffers(engine.optimizer)
        super().__init__(engine.module, opt, loss_fn, count_fn,
                         int(engine.gradient_accumulation_steps()), out=out, quiet=quiet, **kw)
        self.slots = None
        if self.layout is not None:
            self.slots = self._slots(*self.layout)

    def _slots(self, flats, parts):
        """Each recorded parameter's (group, offset) in the flat buffers;
        what cannot be placed goes to meta.csv's unseen (certify exits 2)."""
        slots = []
        for i, p in enumerate(self.params):
            at = None
            for g, flat in enumerate(flats):
                if p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr():
                    at = (g, p.storage_offset() - flat.storage_offset())
                    break
            if at is None:
                self.unseen.append("rank %d: parameter %d (%s) is not a view of DeepSpeed's flat "
                                   "buffers: the gradient its optimizer consumed is not seen"
                                   % (self.rank, i, tuple(p.shape)))
            slots.append(at)
        sizes = [int(q.numel()) for q in parts]
        for g, (flat, size) in enumerate(zip(flats, sizes)):
            if size * self.world != flat.numel():
                self.unseen.append("rank %d: group %d's flat buffer holds %d elements, %d ranks x "
                                   "its partition of %d do not cover it: the consumed gradient "
                                   "is not seen" % (self.rank, g, flat.numel(), self.world, size))
        return slots

    def _consumed(self):
        """The gradient the optimizer consumes, per recorded parameter:
        .grad of the model's parameters (DeepSpeed without ZeRO), or the
        ranks' float32 partitions all-gathered and read at each parameter's
        offset."""
        if self.slots is None:
            return super()._consumed()
        flats, parts = self.layout
        whole = []
        for flat, q in zip(flats, parts):
            mine = (q.grad if q.grad is not None else torch.zeros_like(q)).detach()
            every = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(every, mine.contiguous())
            whole.append(torch.cat([e.reshape(-1) for e in every]))
        grads = []
        for p, at in zip(self.params, self.slots):
            if at is None or at[1] + p.numel() > whole[at[0]].numel():
                grads.append(None)
            else:
                grads.append(whole[at[0]][at[1]:at[1] + p.numel()].view(p.shape))
        return grads
