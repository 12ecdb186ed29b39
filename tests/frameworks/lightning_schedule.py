"""Lightning, the classifier of lightning_classifier.py (an MLP
LightningModule returning the batch's mean cross-entropy), SGD, a StepLR
in configure_optimizers, declared as the Trainer has it:
AccumcheckCallback(schedule="trainer") (that scheduler, stepped as its
config's interval and frequency say, frequency counted in optimizer
steps).  48 samples in micro-batches of 4 (12 per epoch), 2 epochs;
accumulate_grad_batches=3 (4 full windows per epoch) unless said.

Variants:
  steplr      StepLR(step_size=2, gamma=0.5), interval "step": PASS
  freq2       StepLR(step_size=1, gamma=0.5), interval "step", frequency 2:
              stepped after every 2nd optimizer step: PASS
  freq2_k4    as freq2 with accumulate_grad_batches=4 (3 windows an epoch):
              Lightning counts `frequency` in micro-batches within the epoch
              ((batch_idx + 1) % frequency at each window's end, #17544), and
              every window ends on an even batch: the scheduler steps after
              every optimizer step, twice as often as declared (FAIL lr,
              "0.5 x the schedule" at step 1): scheduler-frequency-in-micro-batches
  per_epoch   the StepLR with interval "epoch" (Lightning's default) while the
              callback declares it per optimizer step,
              schedule={"scheduler": factory, "interval": "step"}:
              scheduler-per-epoch
  lr_times_k  SGD(lr=0.1 * K) written before the StepLR (interval "step") is
              built (the linear scaling rule), the callback stating lr=0.1:
              FAIL lr, "lr at every step is K x the schedule (... the linear
              scaling rule)\""""

import sys

import torch

import _tiny

VARIANTS = ["steplr", "freq2", "freq2_k4", "per_epoch", "lr_times_k"]
EPOCHS, BATCH, LR = 2, 4, 0.1


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    from accumcheck_torch.integrations.lightning import AccumcheckCallback

    K = 4 if a.variant == "freq2_k4" else 3
    step_size = 1 if a.variant.startswith("freq2") else 2

    def steplr(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=0.5)

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _tiny.MLP()

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=LR * K if a.variant == "lr_times_k" else LR)
            config = {"scheduler": steplr(opt),
                      "interval": "epoch" if a.variant == "per_epoch" else "step"}
            if a.variant.startswith("freq2"):
                config["frequency"] = 2
            return {"optimizer": opt, "lr_scheduler": config}

    torch.manual_seed(0)
    torch.set_num_threads(1)
    module = Classifier()
    loader = torch.utils.data.DataLoader(_tiny.classifier_data(48), batch_size=BATCH,
                                         shuffle=True, generator=torch.Generator().manual_seed(1))
    callbacks = []
    if not a.no_record:
        schedule = ({"scheduler": steplr, "interval": "step"} if a.variant == "per_epoch"
                    else "trainer")
        callbacks.append(AccumcheckCallback(out=a.out, schedule=schedule,
                                            lr=LR if a.variant == "lr_times_k" else None))
    trainer = pl.Trainer(max_epochs=EPOCHS, accumulate_grad_batches=K, accelerator="cpu",
                         devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks + _tiny.lightning_digests(a))
    trainer.fit(module, loader)
    return 0


if __name__ == "__main__":
    sys.exit(_tiny.spawn(main, sys.argv[1:], 1))
