"""TRL's SFTTrainer (over the Transformers Trainer), correct usage on
supervised fine-tuning data: the tiny LlamaForCausalLM (from a config),
22 prompt-completion pairs already tokenized (prompts of 2..6 tokens,
completions of 1..7: _sft.py) with completion_only_loss=True (the prompt
masked with -100 in the labels), micro-batches of 2 (11 per epoch:
windows 4, 4, 3), gradient_accumulation_steps=4, 2 epochs, constant lr,
no clipping, SFTConfig's other defaults (bf16 where the release defaults
to it, no packing); AccumcheckCallback recording.

Variants:
  sgd     torch SGD without momentum, lr 0.1 (optimizers=(sgd, None)): each
          window's summed completion-token loss over its completion-token
          count, the partial window on its own: PASS
  adamw   the optimizer SFTConfig's defaults give (the Trainer's own AdamW,
          lr 0.01): PASS
  lora    SGD as above over the adapters of get_peft_model(model,
          LoraConfig(r=4) on q_proj and v_proj), the PeftModel given to
          SFTTrainer (only the adapters train): PASS

The recorder derives each micro-batch's summed token loss from the
model's logits itself; SFTTrainer's own loss (1.x: a fused LM head that
patches the model's forward, `model(..., fused_lm_head=True)`, and
num_items_in_batch over the window) is what the trace judges."""

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sft  # noqa: E402
import _tiny  # noqa: E402

VARIANTS = ["sgd", "adamw", "lora", "packing"]
K, BATCH, N, EPOCHS, LR = 4, 2, 22, 2, 0.1
PACK = 16  # packing: the packed rows' max_length


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      bias="none", task_type="CAUSAL_LM")


def main(argv=None):
    a = _tiny.variant_args(VARIANTS, argv)
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from accumcheck_torch.integrations.transformers import AccumcheckCallback

    torch.set_num_threads(1)
    model = _tiny.tiny_llama()
    data = Dataset.from_list(_sft.processed(_sft.sft_examples(N)))
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(
            output_dir=tmp, gradient_accumulation_steps=K, per_device_train_batch_size=BATCH,
            num_train_epochs=EPOCHS, learning_rate=0.01 if a.variant == "adamw" else LR,
            lr_scheduler_type="constant",
            max_grad_norm=0.0, weight_decay=0.0, report_to="none", save_strategy="no",
            logging_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
            dataloader_num_workers=0, completion_only_loss=True,
            **({"packing": True, "max_length": PACK} if a.variant == "packing"
               else {"max_length": None}))
        lora = lora_config() if a.variant == "lora" else None
        opt = None
        if lora is not None:
            from peft import get_peft_model

            model = get_peft_model(model, lora)
        if a.variant != "adamw":
            opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR,
                                  momentum=0.0)
        callbacks = [] if a.no_record else [AccumcheckCallback(out=a.out)]
        trainer = SFTTrainer(model=model, args=args, train_dataset=data,
                             processing_class=_sft.tokenizer(), optimizers=(opt, None),
                             callbacks=callbacks)
        trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(_tiny.exit_on_refusal(main))
