"""torchtune's recipe loop: FullFinetuneRecipeSingleDevice.train() of the
installed release (recipes/full_finetune_single_device.py, loaded from
the wheel), its components set by hand instead of from a YAML config
and a checkpoint (no files, no hub): a tiny torchtune llama2
TransformerDecoder (2 layers, dim 16, vocab 32), torchtune's
padded_collate_sft over prompt-completion pairs of uneven lengths
(_sft.py), micro-batches of 2, gradient_accumulation_steps=4, 2 epochs,
SGD without momentum (lr 0.1), no scheduler, no clip, the recipe's
CrossEntropyLoss(ignore_index=-100) token mean.  The loop is the
recipe's own: each micro-batch's token-mean loss times its count of
labels != -100 (over the UNSHIFTED labels), `training.scale_grads(model,
1 / num_tokens)` and a step at `(idx + 1) % K == 0`, the count and the
gradients kept across the epoch's end.  Recorded with ContractRecorder
(the contract tier: there is no torchtune integration), the recorder
watching the recipe's loader.

Variants:
  masked          24 pairs (12 micro-batches an epoch: 3 full windows), the
                  prompt masked (torchtune's train_on_input=False): PASS
  train_on_input  the same with the prompt trained on (labels = tokens):
                  each sequence's position 0 is counted though the shifted
                  loss never sums it: token-count-unshifted-labels
  partial         22 masked pairs (11 micro-batches: windows 4, 4, 3): the
                  epoch's last 3 micro-batches are never stepped at the
                  epoch's end; their gradients and count carry into the next
                  epoch's first window, the last epoch's are never stepped"""

import contextlib
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sft  # noqa: E402
import _tiny  # noqa: E402

VARIANTS = ["masked", "train_on_input", "partial"]
K, BATCH, EPOCHS, LR = 4, 2, 2, 0.1
IGNORE = -100


def recipe_class():
    """FullFinetuneRecipeSingleDevice from the installed wheel's recipes/
    (not an importable package: loaded from its file)."""
    import torchtune

    path = os.path.join(os.path.dirname(os.path.dirname(torchtune.__file__)), "recipes",
                        "full_finetune_single_device.py")
    spec = importlib.util.spec_from_file_location("torchtune_full_finetune_recipe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FullFinetuneRecipeSingleDevice


def summed_loss(model, batch):
    """The summed next-token cross-entropy over labels != -100 (the
    model's logits at i predict labels[i+1])."""
    logits = model(batch["tokens"])[..., :-1, :]
    labels = batch["labels"][..., 1:]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                             labels.reshape(-1), ignore_index=IGNORE,
                                             reduction="sum")


def items(batch):
    return int((batch["labels"][..., 1:] != IGNORE).sum())


def unshifted_items(batch):
    return int((batch["labels"] != IGNORE).sum())


class _Loader:
    """The recipe's loader as it uses it: iterated, and .sampler.set_epoch."""

    def __init__(self, loader, rec):
        self.loader, self.rec, self.sampler = loader, rec, loader.sampler

    def __iter__(self):
        return iter(self.rec.watch(self.loader) if self.rec else self.loader)

    def __len__(self):
        return len(self.loader)


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    from torch.utils.data import DataLoader, DistributedSampler
    from torchtune.data import padded_collate_sft
    from torchtune.models.llama2 import llama2
    from torchtune.training import DummyProfiler

    from accumcheck_torch import ContractRecorder

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = llama2(vocab_size=_tiny.VOCAB, num_layers=2, num_heads=2, num_kv_heads=2,
                   embed_dim=16, max_seq_len=32, intermediate_dim=32)
    n = 22 if a.variant == "partial" else 24
    rows = []
    for r in _sft.sft_examples(n):
        tokens = r["prompt_ids"] + r["completion_ids"]
        labels = (tokens if a.variant == "train_on_input"
                  else [IGNORE] * len(r["prompt_ids"]) + r["completion_ids"])
        rows.append({"tokens": tokens, "labels": labels})
    sampler = DistributedSampler(rows, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(rows, batch_size=BATCH, sampler=sampler,
                        collate_fn=lambda b: padded_collate_sft(b, padding_idx=_tiny.PAD,
                                                                ignore_idx=IGNORE))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.0)
    rec = None if a.no_record else ContractRecorder(
        model, opt, summed_loss, items, accumulation=K, out=a.out, items="tokens",
        run="torchtune", lr=LR, unshifted_count_fn=unshifted_items)

    recipe = recipe_class().__new__(recipe_class())
    recipe.__dict__.update(
        _device=torch.device("cpu"), _compile=False, _optimizer_in_bwd=False, _model=model,
        _optimizer=opt, _loss_fn=torch.nn.CrossEntropyLoss(ignore_index=IGNORE),
        _dataloader=_Loader(loader, rec), _gradient_accumulation_steps=K,
        _clip_grad_norm=None, _lr_scheduler=None, epochs_run=0, total_epochs=EPOCHS,
        _steps_per_epoch=len(loader) // K, max_steps_per_epoch=None, global_step=0,
        _log_every_n_steps=10 ** 9, _metric_logger=None, _profiler=DummyProfiler(),
        profiler_profile_memory=False, _log_peak_memory_stats=False,
        activations_handling_ctx=contextlib.nullcontext(),
        ignore_labels_cache=torch.full((BATCH, 1), IGNORE, dtype=torch.long))
    recipe.save_checkpoint = lambda epoch: None
    recipe.train()
    if rec is not None:
        rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(_tiny.exit_on_refusal(main))
