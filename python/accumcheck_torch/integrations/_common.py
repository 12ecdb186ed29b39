"""What the framework integrations share: the standard heads' summed item
loss and item count, the semantics a run is judged against (computed here
from what the user configured, never from a value the framework derived)
and the certify call.

    loss_fn, count_fn, items = standard_head(model)      # or the user's own
    sem = Semantics(accumulation=K, micro_batch=B, dataset=N, epochs=E,
                    lr=3e-4, schedule="linear", warmup=2, clip=1.0)
    ContractRecorder(model, opt, loss_fn, count_fn, **sem.recorder_kwargs(), ...)
"""

import math
import os
import subprocess

import torch
import torch.nn.functional as F

from ..trace import Refused

IGNORE_INDEX = -100
SCHEDULE_KINDS = ("constant", "linear", "cosine")


def _field(obj, name):
    """obj.name or obj[name] (a ModelOutput is both; a plain dict only the
    second), None when absent."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _logits(out):
    logits = _field(out, "logits")
    if logits is None and torch.is_tensor(out):
        logits = out
    if logits is None:
        raise Refused("the model's output has no 'logits' (attribute or key) and is not a tensor: "
                      "pass loss_fn= and count_fn= (the summed item loss and the item count)")
    return logits


def _model_inputs(batch):
    """The batch as the model is called with it: every key but the labels
    (the summed loss is ours, not the model's own mean)."""
    return {k: v for k, v in batch.items() if k != "labels"}


def _pair(batch):
    """An (inputs, labels) pair, as a plain DataLoader over (x, y) samples
    gives it (Lightning's and Accelerate's everyday batch)."""
    return isinstance(batch, (list, tuple)) and len(batch) == 2 and torch.is_tensor(batch[1])


def _call(model, batch):
    """The model's output on a dict batch (model(**inputs)) or an (x, y)
    pair (model(x))."""
    return model(batch[0]) if _pair(batch) else model(**_model_inputs(batch))


def _labels(batch):
    if _pair(batch):
        return batch[1]
    if hasattr(batch, "keys") and "labels" in batch:
        return batch["labels"]
    raise Refused("cannot derive the loss of a %s batch: expected a dict with 'labels' or an "
                  "(inputs, labels) pair; pass loss_fn=(model, batch) -> summed item loss and "
                  "count_fn=(batch) -> item count" % type(batch).__name__)


def causal_lm_loss(model, batch):
    """The SUM over label tokens of the next-token cross-entropy: logits at
    position i predict labels[i+1], labels -100 carry no loss (Transformers'
    causal-LM convention: the model shifts)."""
    logits = _logits(_call(model, batch))[..., :-1, :]
    labels = _labels(batch)[..., 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def causal_lm_items(batch):
    """The label tokens that carry a loss: labels[..., 1:] that are not -100
    (the first position predicts nothing)."""
    return int((_labels(batch)[..., 1:] != IGNORE_INDEX).sum())


def causal_lm_unshifted_items(batch):
    """The labels that are not -100 over the UNSHIFTED labels (each
    sequence's position 0 included): the count of a loop that forgets the
    shift (token-count-unshifted-labels), for ContractRecorder's
    unshifted_count_fn."""
    return int((_labels(batch) != IGNORE_INDEX).sum())


def unshifted_count_fn(count_fn):
    """The unshifted count beside a standard head's count_fn (None for
    any other)."""
    return causal_lm_unshifted_items if count_fn is causal_lm_items else None


def classification_loss(model, batch):
    """The SUM over samples of the cross-entropy of the logits against
    batch['labels'] (sequence classification)."""
    logits = _logits(_call(model, batch))
    return F.cross_entropy(logits.float(), _labels(batch).reshape(-1), reduction="sum")


def classification_items(batch):
    return int(_labels(batch).shape[0])


HEADS = {
    "causal_lm": (causal_lm_loss, causal_lm_items, "tokens"),
    "sequence_classification": (classification_loss, classification_items, "samples"),
}


def _head_by_name(model):
    """The head a model's class name says (...ForCausalLM, ...LMHeadModel,
    ...ForSequenceClassification), or None."""
    name = type(model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    if name.endswith("ForSequenceClassification"):
        return "sequence_classification"
    return None


def standard_head(model, head=None):
    """(loss_fn, count_fn, items) for a standard head: `head` when given
    ('causal_lm' | 'sequence_classification'), else from the model's class
    name (...ForCausalLM, ...LMHeadModel, ...ForSequenceClassification).
    Anything else: Refused (exit 2) saying what to pass."""
    if head is None:
        head = _head_by_name(model)
        if head is None:
            raise Refused("cannot derive the summed item loss of a %s: pass head='causal_lm' or "
                          "'sequence_classification' (labels in batch['labels'], logits in the "
                          "output), or loss_fn=(model, batch) -> summed loss and "
                          "count_fn=(batch) -> item count" % type(model).__name__)
    if head not in HEADS:
        raise Refused("head: expected one of %s, got %r" % (", ".join(sorted(HEADS)), head))
    return HEADS[head]


def standard_head_of(model, batch, head=None):
    """standard_head, or where the model's class name does not say the head
    (a LightningModule, a model of your own), the head the batch's labels
    say: (B, T) token labels: causal_lm; (B,) sample labels:
    sequence_classification.  Called on the first batch, before its
    forward."""
    if head is not None or _head_by_name(model) is not None:
        return standard_head(model, head)
    labels = _labels(batch)
    if labels.dim() == 2:
        return HEADS["causal_lm"]
    if labels.dim() == 1:
        return HEADS["sequence_classification"]
    raise Refused("labels of shape %s are no standard head's (causal LM: (B, T); "
                  "classification: (B,)): pass loss_fn=(model, batch) -> summed item loss and "
                  "count_fn=(batch) -> item count" % (tuple(labels.shape),))


def accepted(accept):
    """The pitfall ids the user accepts as their loop: a list."""
    return [accept] if isinstance(accept, str) else list(accept or ())


class Semantics:
    """What the user configured, and what it means, computed here: the
    micro-batches each rank draws per epoch, the optimizer steps (every
    window of K, the epoch's partial last window included: exact
    large-batch equivalence), the accepted lr schedule with its warmup and
    horizon in optimizer steps, the clip.  dataset: the samples of the
    training set; world: the data-parallel processes."""

    def __init__(self, accumulation, micro_batch, dataset, epochs=None, max_steps=None, world=1,
                 drop_last=False, lr=None, schedule="constant", warmup=0, warmup_ratio=0.0,
                 clip=None):
        self.K = int(accumulation)
        self.micro_batch, self.dataset, self.world = int(micro_batch), int(dataset), int(world)
        if self.K < 1 or self.micro_batch < 1 or self.world < 1:
            raise Refused("accumulation, micro-batch size and world size must be >= 1, got "
                          "%r, %r, %r" % (accumulation, micro_batch, world))
        if self.dataset < 1:
            raise Refused("the training set is empty (or has no len()): pass a sized dataset")
        per_rank = (self.dataset // self.world if drop_last
                    else -(-self.dataset // self.world))  # DistributedSampler pads
        self.rank_samples = per_rank
        self.micro_per_epoch = (per_rank // self.micro_batch if drop_last
                                else -(-per_rank // self.micro_batch))
        if self.micro_per_epoch < 1:
            raise Refused("an epoch has no micro-batch (%d samples per rank, micro-batch %d, "
                          "drop_last): the run never steps" % (per_rank, self.micro_batch))
        self.steps_per_epoch = -(-self.micro_per_epoch // self.K)
        if max_steps is not None and int(max_steps) > 0:
            self.steps = int(max_steps)
        else:
            if epochs is None or float(epochs) <= 0 or float(epochs) != int(epochs):
                raise Refused("epochs: expected a whole number of epochs > 0 (or max_steps > 0), "
                              "got %r" % (epochs,))
            self.steps = int(epochs) * self.steps_per_epoch
        # The schedule: a named kind (its warmup and horizon computed here
        # in optimizer steps), or a declaration in the form the trainer has
        # it (schedule.Schedule tabulates it on the recorder's own copy).
        self.declared = None
        if isinstance(schedule, str) or schedule is None:
            schedule = schedule or "constant"
            if schedule not in SCHEDULE_KINDS:
                raise Refused(
                    "lr schedule %r: a named schedule is %s (with warmup= optimizer steps); any "
                    "other is declared as your trainer has it: schedule=your scheduler object "
                    "(not yet stepped), an lr_lambda, a factory of the optimizer, or a Lightning "
                    "lr_scheduler config {'scheduler': ..., 'interval': 'step' | 'epoch', "
                    "'frequency': n} (docs/frameworks.md; the same forms as "
                    "ContractRecorder(schedule=...), docs/tiers.md 'Declaring the lr schedule')"
                    % (schedule, " | ".join(repr(k) for k in SCHEDULE_KINDS)))
        else:
            if warmup or warmup_ratio:
                raise Refused("warmup=%r, warmup_ratio=%r beside a scheduler declaration: the "
                              "warmup is the scheduler's own; pass warmup= with a named kind "
                              "only" % (warmup, warmup_ratio))
            self.declared = declaration(schedule, self.steps_per_epoch)
            schedule = "declared"
        self.kind = schedule
        self.warmup = int(warmup) if warmup else int(math.ceil(self.steps * float(warmup_ratio or 0)))
        # A warmup taken of the horizon (get_warmup_steps): its ratio goes
        # with it, for a trainer whose horizon is not the run's steps.
        self.warmup_ratio = None if warmup or not warmup_ratio else float(warmup_ratio)
        self.lr = None if lr is None else float(lr)
        self.clip = None if clip is None or float(clip) <= 0 else float(clip)

    def schedule(self):
        if self.declared is not None:
            return self.declared
        if self.kind == "constant":
            return {"kind": "constant"}
        out = {"kind": self.kind, "warmup": self.warmup, "total": max(self.steps, self.warmup + 1)}
        if self.warmup_ratio is not None:
            out["warmup_ratio"] = self.warmup_ratio
        return out

    def recorder_kwargs(self):
        return {"accumulation": self.K, "lr": self.lr, "schedule": self.schedule(),
                "clip": self.clip}

    def __repr__(self):
        return ("Semantics(K=%d, micro_batch=%d, world=%d, %d micro-batches per epoch per rank, "
                "%d optimizer steps, lr %s %s, clip %s)" % (
                    self.K, self.micro_batch, self.world, self.micro_per_epoch, self.steps,
                    self.lr, self.schedule(), self.clip))


LIGHTNING_CONFIG_KEYS = ("scheduler", "interval", "frequency", "name", "monitor", "strict",
                         "reduce_on_plateau")


def declaration(schedule, steps_per_epoch):
    """What ContractRecorder(schedule=) takes for a scheduler declared as
    the trainer has it: a Lightning lr_scheduler config (a dict with
    'scheduler', or Lightning's LRSchedulerConfig) becomes a
    schedule.Cadence stepping its scheduler every `frequency` optimizer
    steps ('step') or epochs of `steps_per_epoch` steps ('epoch', Lightning's
    default); anything else (a scheduler object, an lr_lambda, a factory,
    a Cadence) goes as it is."""
    from ..schedule import Cadence

    if isinstance(schedule, dict) and "scheduler" not in schedule:
        raise Refused("schedule: a dict is a Lightning lr_scheduler config here, expected the key "
                      "'scheduler' (with 'interval': 'step' | 'epoch' and 'frequency': n), got "
                      "%r; a named kind is schedule='linear' | 'cosine' | 'constant'"
                      % (sorted(schedule),))
    if isinstance(schedule, dict) or type(schedule).__name__ == "LRSchedulerConfig":
        cfg = schedule if isinstance(schedule, dict) else vars(schedule)
        bad = sorted(set(cfg) - set(LIGHTNING_CONFIG_KEYS))
        if bad:
            raise Refused("schedule: unknown lr_scheduler config key(s) %s: expected %s"
                          % (", ".join(bad), ", ".join(LIGHTNING_CONFIG_KEYS)))
        if cfg.get("reduce_on_plateau") or type(cfg["scheduler"]).__name__ == "ReduceLROnPlateau":
            raise Refused("schedule: ReduceLROnPlateau follows a metric, not the step count: its "
                          "lr cannot be declared ahead of the run")
        return Cadence(cfg["scheduler"], cfg.get("interval", "epoch"), cfg.get("frequency", 1),
                       steps_per_epoch=steps_per_epoch)
    return schedule


def recorder(model, optimizer, loss_fn, count_fn, world, ddp=None, **kw):
    """The contract recorder of an integration: ContractRecorder in one
    process, ContractDistributedRecorder on each rank when `world` > 1
    (ddp: the DistributedDataParallel module around `model`, when `model`
    is not DDP's own .module; see ContractDistributedRecorder).  A
    causal-LM head's unshifted count goes with it (unshifted_count_fn)."""
    kw.setdefault("unshifted_count_fn", unshifted_count_fn(count_fn))
    if world > 1:
        from ..distributed import ContractDistributedRecorder

        return ContractDistributedRecorder(model, optimizer, loss_fn, count_fn, ddp=ddp, **kw)
    from ..contract import ContractRecorder

    return ContractRecorder(model, optimizer, loss_fn, count_fn, **kw)


def certify(trace, command=None):
    """`accumcheck certify --contract --trace TRACE`: (exit code, report).
    command: the accumcheck binary (default: $ACCUMCHECK_BIN, or
    `accumcheck` on PATH, as the pytest plugin finds it)."""
    from ..pytest_plugin import find_command

    argv = [command or find_command(), "certify", "--contract", "--trace", os.fspath(trace)]
    p = subprocess.run(argv, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr
