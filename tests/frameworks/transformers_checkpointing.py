"""Transformers Trainer with gradient checkpointing (docs/memory-systems.md):
the transformers_sgd.py run (a tiny LlamaForCausalLM from a config, 24
variable-length sequences, micro-batches of 2, gradient_accumulation_steps=4,
2 epochs, torch SGD, constant lr, no clipping) with
TrainingArguments(gradient_checkpointing=True): every decoder layer runs
under torch.utils.checkpoint, reentrant (variant `reentrant`) or not
(`non_reentrant`), as gradient_checkpointing_kwargs={"use_reentrant": ...}
says.

Checkpointing recomputes each layer's forward in the backward and must not
change a gradient: each cell is the version's sgd cell."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _tiny  # noqa: E402
from _transformers import train  # noqa: E402

VARIANTS = ["reentrant", "non_reentrant"]

if __name__ == "__main__":
    a = _tiny.variant_args(VARIANTS)
    _tiny.exit_on_refusal(train, a, _tiny.tiny_llama(), optim="sgd", lr=0.1, gradient_checkpointing=True,
          gradient_checkpointing_kwargs={"use_reentrant": a.variant == "reentrant"})
