"""Transformers Trainer, SFT of a tiny Llama built from a config (no download).

Prompt-masked labels (-100), uneven lengths, gradient_accumulation_steps=4,
cosine schedule with warmup, AdamW, max_grad_norm=1, bf16 on CPU unless --fp32.

The new user's trainer of issue 44 (s24), which recorded
tests/data/contract_hf_4461_cosine under Transformers 4.46.1 (torch 2.13.0
CPU; --warmup-ratio 0.25: contract_hf_4461_cosine_ratio):

    PYTHONPATH=python $(bench/conformance.py venv transformers==4.46.1) \
        tests/data/hf_sft_4461.py --out trace/
"""

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="trace/")
ap.add_argument("--no-record", action="store_true")
ap.add_argument("--fp32", action="store_true")
ap.add_argument("--warmup-ratio", type=float, default=None,
                help="warmup_ratio=R instead of warmup_steps=2")
args = ap.parse_args()

torch.manual_seed(0)
VOCAB = 96
g = torch.Generator().manual_seed(1)
ds = []
for _ in range(37):
    p_len = int(torch.randint(3, 12, (1,), generator=g))
    r_len = int(torch.randint(2, 20, (1,), generator=g))
    ids = torch.randint(1, VOCAB, (p_len + r_len,), generator=g)
    labels = ids.clone()
    labels[:p_len] = -100
    ds.append({"input_ids": ids, "labels": labels})


def collate(items):
    T = max(len(e["input_ids"]) for e in items)
    out = {"input_ids": torch.zeros(len(items), T, dtype=torch.long),
           "labels": torch.full((len(items), T), -100),
           "attention_mask": torch.zeros(len(items), T, dtype=torch.long)}
    for i, e in enumerate(items):
        n = len(e["input_ids"])
        out["input_ids"][i, :n], out["labels"][i, :n], out["attention_mask"][i, :n] = e["input_ids"], e["labels"], 1
    return out


config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config)
targs = TrainingArguments(output_dir="hf-out", per_device_train_batch_size=4, gradient_accumulation_steps=4,
                          num_train_epochs=2, learning_rate=3e-3, lr_scheduler_type="cosine",
                          weight_decay=0.1, max_grad_norm=1.0, bf16=not args.fp32, use_cpu=True,
                          logging_steps=100, save_strategy="no", report_to=[], seed=0,
                          disable_tqdm=True,
                          **({"warmup_steps": 2} if args.warmup_ratio is None
                             else {"warmup_ratio": args.warmup_ratio}))
callbacks = []
if not args.no_record:
    from accumcheck_torch.integrations.transformers import AccumcheckCallback

    callbacks.append(AccumcheckCallback(out=args.out))
trainer = Trainer(model, targs, train_dataset=ds, data_collator=collate, callbacks=callbacks)
t0 = time.process_time()
trainer.train()
print("train cpu time %.3f s (%s)" % (time.process_time() - t0, "plain" if args.no_record else "recorded"))
