"""Lightning, a classifier (an MLP LightningModule whose training_step
returns the batch's mean cross-entropy), Trainer(accumulate_grad_batches=4)
on 40 samples in micro-batches of 4: 10 batches per epoch, so each epoch's
last window holds 2 micro-batches.  2 epochs.

A framework with exact large-batch equivalence weights every sample of a
window 1/N_w, the short window included.  Lightning divides every
micro-batch's loss by K (#19987): the short window's samples weigh
1/(K*b) = half of 1/N_w, which accumcheck names partial-cycle-scale-by-k.

Variants:
  sgd          SGD without momentum, no clip: partial-cycle-scale-by-k
  accept       the same, AccumcheckCallback(accept=["partial-cycle-scale-by-k"]):
               PASS, "accepted: partial-cycle-scale-by-k"
  clip         AdamW, gradient_clip_val=0.5, the partial window accepted: PASS
  sched_step   SGD, a LambdaLR linear warmup in configure_optimizers with
               interval "step", declared: PASS (partial window accepted)
  sched_epoch  the same scheduler with interval "epoch": the lr is constant
               within each epoch (scheduler-per-epoch)
  sgd_2ranks   as sgd on 2 gloo ranks (Trainer(devices=2, strategy="ddp"),
               "ddp_fork" under ACCUMCHECK_START_METHOD=fork),
               48 samples: 24 a rank, 6 micro-batches a rank and epoch
               (windows of 4 and 2); DDP averages the ranks' equal batches,
               so only the short window parts from 1/N_w:
               partial-cycle-scale-by-k
  div_k        as sgd, the user's training_step returns loss / K on top of
               Lightning's own / K: every weight 1/K of what it was,
               partial-cycle-scale-by-k+loss-divided-by-k-twice
  sgd_bf16     as sgd under Trainer(precision="bf16-mixed") (bfloat16
               autocast): the same partial-cycle-scale-by-k, read in
               bfloat16's precision
  sgd_fp16     as sgd under Trainer(precision="16-mixed") (float16
               autocast; on the CPU no GradScaler): the same, read in
               float16's precision"""

import sys

import torch

import _tiny

VARIANTS = ["sgd", "accept", "clip", "sched_step", "sched_epoch", "sgd_2ranks", "div_k", "sgd_bf16",
            "sgd_fp16"]
K, EPOCHS, BATCH = 4, 2, 4
WARMUP, TOTAL = 2, 6  # optimizer steps: 3 per epoch


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    from accumcheck_torch.integrations.lightning import AccumcheckCallback

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _tiny.MLP()

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self(x), y)
            return loss / K if a.variant == "div_k" else loss

        def configure_optimizers(self):
            if a.variant == "clip":
                return torch.optim.AdamW(self.parameters(), lr=1e-2)
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            if a.variant.startswith("sched"):
                sched = torch.optim.lr_scheduler.LambdaLR(opt, _tiny.warmup_linear(WARMUP, TOTAL))
                return {"optimizer": opt, "lr_scheduler": {
                    "scheduler": sched, "interval": "step" if a.variant == "sched_step" else "epoch"}}
            return opt

    torch.manual_seed(0)
    torch.set_num_threads(1)
    module = Classifier()
    ranks = 2 if a.variant.endswith("2ranks") else 1
    loader = torch.utils.data.DataLoader(_tiny.classifier_data(48 if ranks > 1 else 40),
                                         batch_size=BATCH, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
    callbacks = []
    if not a.no_record:
        accept = [] if a.variant in ("sgd", "sgd_2ranks", "div_k", "sgd_bf16", "sgd_fp16") \
            else ["partial-cycle-scale-by-k"]
        schedule = "linear" if a.variant.startswith("sched") else None
        callbacks.append(AccumcheckCallback(out=a.out, accept=accept, schedule=schedule,
                                            warmup=WARMUP))
    trainer = pl.Trainer(max_epochs=EPOCHS, accumulate_grad_batches=K, accelerator="cpu",
                         devices=ranks, strategy=_tiny.lightning_ddp() if ranks > 1 else "auto",
                         logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         gradient_clip_val=0.5 if a.variant == "clip" else None,
                         # precision only where it is asked: 2.0's Trainer refuses None
                         precision={"sgd_bf16": "bf16-mixed", "sgd_fp16": "16-mixed"}.get(a.variant, "32-true"),
                         callbacks=callbacks + _tiny.lightning_digests(a))
    trainer.fit(module, loader)
    return 0


if __name__ == "__main__":
    a = _tiny.variant_args(VARIANTS)
    # strategy="ddp" runs this script again for its other rank: once only
    # (no --identity, _tiny.twice).
    rerun = not a.variant.endswith("2ranks") or _tiny.lightning_ddp() != "ddp"
    sys.exit(_tiny.spawn(main, sys.argv[1:], 1, rerun=rerun))
