"""What every framework integration shares: the standard heads' summed item
loss and item count (so a user writes no loss code for them), and the
record of the semantics the user configured.

The semantics a run is judged against come from what the USER configured
(K, micro-batch size, epochs, the lr schedule's kind and warmup, the clip's
max_norm, accepted pitfalls), never from a value the framework derived: that
is where a framework's bugs live.

Standard heads (a batch as a dict with "labels", or an (inputs, labels)
pair):
  - causal LM: the model's output has `.logits` (or is a tensor) of shape
    (B, T, V) and the labels are (B, T): shifted token cross-entropy with
    ignore_index -100, items = label tokens after the shift that are not
    -100;
  - sequence classification: logits (B, C) and labels (B,): per-sample
    cross-entropy, items = samples.
Anything else: pass loss_fn(model, batch) -> summed item loss and
count_fn(batch) -> items yourself."""

import torch
import torch.nn.functional as F

from ..trace import Refused

IGNORE = -100


def _split(batch):
    """(call, labels): how the model is called on the batch and its labels."""
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        if "labels" not in batch:
            raise Refused("the batch is a dict without 'labels': pass loss_fn=(model, batch) -> "
                          "summed item loss and count_fn=(batch) -> items")
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return (lambda m: m(**inputs)), batch["labels"]
    if isinstance(batch, (list, tuple)) and len(batch) == 2 and torch.is_tensor(batch[1]):
        x = batch[0]
        return (lambda m: m(x)), batch[1]
    raise Refused("cannot derive the loss of a %s batch: expected a dict with 'labels' or an "
                  "(inputs, labels) pair; pass loss_fn=(model, batch) -> summed item loss and "
                  "count_fn=(batch) -> items" % type(batch).__name__)


def _logits(out):
    if torch.is_tensor(out):
        return out
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, dict):
        logits = out.get("logits")
    if logits is None and isinstance(out, (list, tuple)) and out and torch.is_tensor(out[0]):
        logits = out[0]
    if not torch.is_tensor(logits):
        raise Refused("the model's output has no logits (a tensor, .logits or ['logits']): pass "
                      "loss_fn=(model, batch) -> summed item loss and count_fn=(batch) -> items")
    return logits


def head_of(logits_shape, labels_shape):
    """'causal-lm', 'classification' or None (not a standard head)."""
    if len(logits_shape) == 3 and len(labels_shape) == 2 and logits_shape[:2] == labels_shape:
        return "causal-lm"
    if len(logits_shape) == 2 and len(labels_shape) == 1 and logits_shape[0] == labels_shape[0]:
        return "classification"
    return None


def standard_loss(model, batch):
    """The summed item loss of a standard head (module docstring)."""
    call, labels = _split(batch)
    logits = _logits(call(model))
    head = head_of(tuple(logits.shape), tuple(labels.shape))
    if head == "causal-lm":
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                               ignore_index=IGNORE, reduction="sum")
    if head == "classification":
        return F.cross_entropy(logits.float(), labels, reduction="sum")
    raise Refused("logits of shape %s and labels of shape %s are no standard head (causal LM: "
                  "(B, T, V) and (B, T); classification: (B, C) and (B,)): pass loss_fn=(model, "
                  "batch) -> summed item loss and count_fn=(batch) -> items"
                  % (tuple(logits.shape), tuple(labels.shape)))


def standard_count(batch):
    """Its items: label tokens after the shift that are not -100 (2-D
    labels), or samples (1-D labels)."""
    _, labels = _split(batch)
    if labels.dim() == 2:
        return int((labels[:, 1:] != IGNORE).sum())
    return int(labels.shape[0])


def items_kind(batch):
    """'tokens' for 2-D labels, 'samples' otherwise."""
    _, labels = _split(batch)
    return "tokens" if labels.dim() == 2 else "samples"


def semantics(accumulation, lr=None, schedule=None, clip=None, accept=()):
    """The record of what the user configured, as ContractRecorder takes it
    (plus `accept`, the pitfall ids the user accepts as their loop)."""
    accept = [accept] if isinstance(accept, str) else list(accept or ())
    return {"accumulation": int(accumulation), "lr": lr, "schedule": schedule,
            "clip": None if clip is None else float(clip), "accept": accept}
