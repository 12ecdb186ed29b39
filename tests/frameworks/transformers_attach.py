"""The sgd case (transformers_sgd.py: a tiny LlamaForCausalLM, 24 sequences,
micro-batches of 2, gradient_accumulation_steps=4, 2 epochs, torch SGD,
constant lr) on a Trainer whose callback handler passes its callbacks no
model, optimizer or train DataLoader (_transformers.blind_handler: a
release whose callbacks do not receive them, simulated on this one).

Variants:
  attach    the callback attached with
            integrations.transformers.attach(trainer, out=...): it takes
            them from the Trainer itself: the version's sgd cell (PASS on
            a correct release)
  callback  callbacks=[AccumcheckCallback(...)] as usual: refused (exit 2)
            at on_train_begin, the message naming attach()"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import exit_on_refusal, tiny_llama, variant_args  # noqa: E402
from _transformers import train  # noqa: E402

VARIANTS = ["attach", "callback"]

if __name__ == "__main__":
    a = variant_args(VARIANTS)
    exit_on_refusal(train, a, tiny_llama(), optim="sgd", lr=0.1, blind=True,
                    attach=a.variant == "attach")
