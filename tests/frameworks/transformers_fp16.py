"""Transformers Trainer, float16 mixed precision: transformers_sgd.py's run
(a tiny LlamaForCausalLM, 24 variable-length sequences, micro-batches of 2,
gradient_accumulation_steps=4, 2 epochs, SGD) with
TrainingArguments(fp16=True): the forward under float16 autocast on the
CPU (no loss scaler there: Accelerate makes its GradScaler on an
accelerator only).  The recorder reads each micro-batch's weight at the
logits, in float16's precision, so the cell gives what the version's
float32 sgd cell gives: PASS on a correct Trainer, its token-weighting
pitfall on an older one."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import case_args, exit_on_refusal, tiny_llama  # noqa: E402
from _transformers import train  # noqa: E402

if __name__ == "__main__":
    exit_on_refusal(train, case_args(__doc__), tiny_llama(), optim="sgd", lr=0.1, fp16=True)
