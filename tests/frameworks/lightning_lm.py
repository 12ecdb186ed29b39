"""Lightning, a causal token model (_tiny.TinyCausal, a plain nn.Module
whose forward takes no **kwargs) in a LightningModule whose
training_step returns the token mean of the shifted cross-entropy, on
variable-length sequences padded with -100 (token counts differ between
micro-batches); Trainer(accumulate_grad_batches=4), micro-batches of 4,
40 sequences (10 batches an epoch: windows of 4, 4 and 2), 2 epochs, SGD
without momentum.

Exact large-batch equivalence weighs every token of a window 1/N_w.
Lightning divides each micro-batch's token mean by K, the short window
included: token j of micro-batch k weighs 1/(K*n_k):
partial-cycle-scale-by-k+token-mean-of-means.

Variants:
  mean         the loop above: partial-cycle-scale-by-k+token-mean-of-means
  underivable  the batch is an (ids, labels, weights) triple: the callback
               cannot derive the summed item loss and refuses before the
               first forward, naming loss_fn and count_fn (the case exits 2)"""

import sys

import torch

import _tiny

VARIANTS = ["mean", "underivable"]
K, EPOCHS, BATCH = 4, 2, 4


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    from accumcheck_torch.integrations.lightning import AccumcheckCallback

    class LM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lm = _tiny.TinyCausal()

        def forward(self, input_ids, attention_mask=None, labels=None):
            return self.lm(input_ids, attention_mask, labels)

        def training_step(self, batch, batch_idx):
            if a.variant == "underivable":
                batch = {"input_ids": batch[0], "labels": batch[1]}
            return self(**batch)["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    collate = _tiny.collate
    if a.variant == "underivable":
        def collate(rows):
            b = _tiny.collate(rows)
            return b["input_ids"], b["labels"], torch.ones(len(rows))
    loader = torch.utils.data.DataLoader(_tiny.VariableTokens(40), batch_size=BATCH, shuffle=True,
                                         collate_fn=collate,
                                         generator=torch.Generator().manual_seed(1))
    callbacks = [] if a.no_record else [AccumcheckCallback(out=a.out)]
    trainer = pl.Trainer(max_epochs=EPOCHS, accumulate_grad_batches=K, accelerator="cpu",
                         devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks)
    trainer.fit(LM(), loader)
    return 0


if __name__ == "__main__":
    sys.exit(main())
