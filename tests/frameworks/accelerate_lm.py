"""Accelerate, a causal token model (_tiny.TinyCausal: a plain nn.Module
whose forward takes no **kwargs) on variable-length sequences padded with
-100, so token counts differ between micro-batches;
Accelerator(gradient_accumulation_steps=4), micro-batches of 4, 48
sequences (3 full windows per epoch), 2 epochs, SGD without momentum.

Exact large-batch equivalence weighs every token of a window 1/N_w (N_w:
the window's label tokens).
Variants:
  mean  the everyday loop: each micro-batch's token mean, and
        accelerator.backward divides it by K: token j of micro-batch k
        weighs 1/(K*n_k), not 1/N_w: token-mean-of-means
  sum   the loop Accelerate's docs give for token losses: the window's
        batches drawn first, N_w counted, loss = summed * K / N_w (K undoes
        backward's division), optimizer.step() after the window, no
        accumulate(): PASS.  --ranks 2 (2 gloo ranks, unequal token counts):
        N_w gathered over the ranks (accelerator.gather) and the loss x R
        (DDP averages), accelerator.no_sync on all but the window's last
        micro-batch, as the docs give it: PASS; mean at 2 ranks: each
        rank draws 6 micro-batches an epoch (windows of 4 and 2), each
        micro-batch's token mean / K, DDP's average:
        partial-cycle-scale-by-k+token-mean-of-means
  sum_bf16  sum under Accelerator(mixed_precision="bf16"): the forward in
        bfloat16 autocast, the weights read in bfloat16's precision: PASS
  sum_fp16  sum under Accelerator(mixed_precision="fp16"): float16 autocast
        where the release applies it on the CPU (no GradScaler there), the
        weights read in float16's precision: PASS
  prefetch_accumulate  the same window drawn first, each micro-batch inside
        `with accelerator.accumulate(model)` with step/zero_grad in it: the
        loader flags its end when the last batch is DRAWN, so accumulate()
        syncs every micro-batch of the epoch's last window and each steps
        alone (12 steps, not 6), each at 1/N_w of its window:
        end-of-loader-syncs-every-micro-batch"""

import itertools
import sys

import torch
import torch.nn.functional as F

import _tiny

VARIANTS = ["mean", "sum", "prefetch_accumulate", "sum_bf16", "sum_fp16"]
K, EPOCHS, BATCH = 4, 2, 4


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    from accelerate import Accelerator
    from accumcheck_torch.integrations.accelerate import record

    torch.manual_seed(0)
    torch.set_num_threads(1)
    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True,
                              mixed_precision={"sum_bf16": "bf16", "sum_fp16": "fp16"}.get(a.variant, "no"))
    model = _tiny.TinyCausal()
    loader = torch.utils.data.DataLoader(_tiny.VariableTokens(48), batch_size=BATCH, shuffle=True,
                                         collate_fn=_tiny.collate,
                                         generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rec = None if a.no_record else record(accelerator, model, optimizer, loader, out=a.out)
    model.train()
    for _ in range(EPOCHS):
        if a.variant == "mean":
            for batch in loader:
                with accelerator.accumulate(model):
                    accelerator.backward(model(**batch)["loss"])
                    optimizer.step()
                    optimizer.zero_grad()
            continue
        it = iter(loader)
        while True:
            window = list(itertools.islice(it, K))
            if not window:
                break
            n_items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in window)
            if accelerator.num_processes > 1:
                n_items = int(accelerator.gather(torch.tensor([n_items])).sum())
            scale = K * accelerator.num_processes / n_items
            for i, batch in enumerate(window):
                def micro():
                    logits = model(batch["input_ids"], batch["attention_mask"])["logits"]
                    summed = F.cross_entropy(logits[:, :-1].flatten(0, 1),
                                             batch["labels"][:, 1:].flatten(),
                                             ignore_index=-100, reduction="sum")
                    accelerator.backward(summed * scale)
                if a.variant in ("sum", "sum_bf16", "sum_fp16"):
                    if i + 1 < len(window):
                        with accelerator.no_sync(model):
                            micro()
                    else:
                        micro()
                    continue
                with accelerator.accumulate(model):
                    micro()
                    optimizer.step()
                    optimizer.zero_grad()
            if a.variant in ("sum", "sum_bf16", "sum_fp16"):
                optimizer.step()
                optimizer.zero_grad()
    if rec is not None:
        rec.close()
    _tiny.digested(a, accelerator.unwrap_model(model), accelerator.process_index,
                   accelerator.num_processes)
    return 0


if __name__ == "__main__":
    sys.exit(_tiny.spawn(main, sys.argv[1:], _tiny.variant_args(VARIANTS).ranks))
