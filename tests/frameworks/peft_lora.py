"""PEFT LoRA adapters on the Transformers Trainer: the tiny
LlamaForCausalLM (from a config) wrapped by get_peft_model(LoraConfig(r=4)
on q_proj and v_proj: only the adapters train), 22 prompt-completion
pairs with the prompt masked by -100 (_sft.py: prompts of 2..6 tokens,
completions of 1..7), micro-batches of 2 (11 per epoch: windows 4, 4, 3),
gradient_accumulation_steps=4, 2 epochs, constant lr, no clipping;
AccumcheckCallback recording.

Variants:
  sgd     torch SGD without momentum over the adapters, lr 0.1
          (optimizers=(sgd, None)): PASS where the release weighs each
          completion token 1/T of its window
  adamw   the Trainer's own AdamW (optim="adamw_torch"), lr 0.01

The Trainer's loss on a PeftModel is the base model's (PEFT forwards
labels and num_items_in_batch through **kwargs), so each release's
accumulation is the Transformers release's it is pinned beside
(versions.txt)."""

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sft  # noqa: E402
import _tiny  # noqa: E402

VARIANTS = ["sgd", "adamw"]
K, BATCH, N, EPOCHS = 4, 2, 22, 2


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments

    from accumcheck_torch.integrations.transformers import AccumcheckCallback

    torch.set_num_threads(1)
    model = get_peft_model(_tiny.tiny_llama(), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], bias="none",
        task_type="CAUSAL_LM"))
    lr = 0.1 if a.variant == "sgd" else 0.01
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, gradient_accumulation_steps=K, per_device_train_batch_size=BATCH,
            num_train_epochs=EPOCHS, learning_rate=lr, lr_scheduler_type="constant",
            max_grad_norm=0.0, weight_decay=0.0, optim="adamw_torch", report_to="none",
            save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
            dataloader_num_workers=0, remove_unused_columns=False)
        opts = (None, None)
        if a.variant == "sgd":
            opts = (torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr,
                                    momentum=0.0), None)
        callbacks = [] if a.no_record else [AccumcheckCallback(out=a.out)]
        trainer = Trainer(model=model, args=targs,
                          train_dataset=Rows(_sft.processed(_sft.sft_examples(N))),
                          data_collator=_sft.collate_masked, optimizers=opts, callbacks=callbacks)
        trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(_tiny.exit_on_refusal(main))
