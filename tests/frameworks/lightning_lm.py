"""Lightning, a causal token model (_tiny.TinyCausal, a plain nn.Module
whose forward takes no **kwargs) in a LightningModule whose
training_step returns the token mean of the shifted cross-entropy, on
variable-length sequences padded with -100 (token counts differ between
micro-batches); Trainer(accumulate_grad_batches=4), micro-batches of 4,
2 epochs, SGD without momentum.  One process: 40 sequences (10 batches
an epoch: windows of 4, 4 and 2).

Exact large-batch equivalence weighs every token of a window 1/N_w.
Lightning divides each micro-batch's token mean by K, the short window
included: token j of micro-batch k weighs 1/(K*n_k):
partial-cycle-scale-by-k+token-mean-of-means.

Two processes, as Lightning's docs show DDP on CPU (Trainer(accelerator=
"cpu", devices=2, strategy="ddp"), gloo; Lightning gives each rank a
DistributedSampler's half): 48 sequences, 24 a rank, 6 micro-batches a
rank and epoch (windows of 4 and 2), the ranks' micro-batches holding
different token counts.  Lightning skips DDP's all-reduce on the
accumulating micro-batches (no_sync) and DDP averages the ranks at the
window's last: token j of rank q's micro-batch k weighs 1/(R*K*n_qk)
where exact equivalence gives 1/N_w, N_w the window's tokens over both
ranks -- the same two pitfalls, now across ranks.

Variants:
  mean          one process, the loop above: partial-cycle-scale-by-k+token-mean-of-means
  underivable   the batch is an (ids, labels, weights) triple: the callback
                cannot derive the summed item loss and refuses before the
                first forward, naming loss_fn and count_fn (the case exits 2)
  mean_2ranks   2 ranks, strategy="ddp" (Lightning re-runs this script for
                rank 1; "ddp_fork" under ACCUMCHECK_START_METHOD=fork, as
                CTest runs it): partial-cycle-scale-by-k+token-mean-of-means
  accept_2ranks 2 ranks, strategy="ddp_spawn" (torch.multiprocessing),
                AccumcheckCallback(accept=["partial-cycle-scale-by-k",
                "token-mean-of-means"]), Lightning's documented loop
                accepted: PASS, "accepted: ..."
  underivable_2ranks  the underivable batch on 2 ranks ("ddp_spawn"): each
                rank refuses at its first batch and the launching process
                exits 2 too (refused)"""

import sys

import torch

import _tiny

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

VARIANTS = ["mean", "underivable", "mean_2ranks", "accept_2ranks", "underivable_2ranks"]
K, EPOCHS, BATCH = 4, 2, 4


class LM(pl.LightningModule):
    """At module level: ddp_spawn pickles it into its processes."""

    def __init__(self, variant):
        super().__init__()
        self.variant = variant
        self.lm = _tiny.TinyCausal()

    def forward(self, input_ids, attention_mask=None, labels=None):
        return self.lm(input_ids, attention_mask, labels)

    def training_step(self, batch, batch_idx):
        if self.variant.startswith("underivable"):
            batch = {"input_ids": batch[0], "labels": batch[1]}
        return self(**batch)["loss"]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def underivable_collate(rows):
    b = _tiny.collate(rows)
    return b["input_ids"], b["labels"], torch.ones(len(rows))


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    from accumcheck_torch.integrations.lightning import AccumcheckCallback

    ranks = 2 if a.variant.endswith("2ranks") else 1
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(
        _tiny.VariableTokens(48 if ranks > 1 else 40), batch_size=BATCH, shuffle=True,
        collate_fn=underivable_collate if a.variant.startswith("underivable") else _tiny.collate,
        # Under DDP Lightning's DistributedSampler shuffles (seed 0); a
        # torch.Generator does not survive ddp_spawn's pickling here (torch
        # 2.13: "unable to resize file").
        generator=torch.Generator().manual_seed(1) if ranks == 1 else None)
    callbacks = []
    if not a.no_record:
        accept = ["partial-cycle-scale-by-k", "token-mean-of-means"] \
            if a.variant.startswith("accept") else []
        callbacks.append(AccumcheckCallback(out=a.out, accept=accept))
    trainer = pl.Trainer(max_epochs=EPOCHS, accumulate_grad_batches=K, accelerator="cpu",
                         devices=ranks,
                         strategy="ddp_spawn" if a.variant in ("accept_2ranks", "underivable_2ranks") else
                         _tiny.lightning_ddp() if ranks > 1 else "auto",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks + _tiny.lightning_digests(a))
    trainer.fit(LM(a.variant), loader)
    return 0


if __name__ == "__main__":
    a = _tiny.variant_args(VARIANTS)
    # strategy="ddp" runs this script again for its other rank: once only
    # (no --identity, _tiny.twice).
    rerun = a.variant != "mean_2ranks" or _tiny.lightning_ddp() != "ddp"
    sys.exit(_tiny.spawn(main, sys.argv[1:], 1, rerun=rerun))
