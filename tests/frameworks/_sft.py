"""What the supervised fine-tuning cases share (tests/frameworks/trl_*.py,
peft_*.py, torchtune_*.py): prompt-completion pairs of uneven lengths,
already tokenized, the prompt masked with -100 in the labels (only the
completion bears a loss), and a word-level tokenizer built in memory (no
hub) for the trainers that want one.

Each example: a prompt of 2..6 tokens and a completion of 1..7 (seeded),
so micro-batches differ in their completion-token counts and the label at
position 0 is always -100 (a prompt token)."""

import torch

from _tiny import PAD, VOCAB

IGNORE = -100


def sft_examples(n, seed=0):
    """n dicts {prompt_ids, completion_ids} (seeded), tokens in 3..VOCAB-1
    (0 pad, 1 bos, 2 eos)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p = int(torch.randint(2, 7, (1,), generator=g))
        c = int(torch.randint(1, 8, (1,), generator=g))
        ids = torch.randint(3, VOCAB, (p + c,), generator=g).tolist()
        rows.append({"prompt_ids": ids[:p], "completion_ids": ids[p:]})
    return rows


def processed(rows):
    """The rows as a tokenized SFT dataset holds them: input_ids (prompt
    then completion) and completion_mask (1 on the completion)."""
    return [{"input_ids": r["prompt_ids"] + r["completion_ids"],
             "completion_mask": [0] * len(r["prompt_ids"]) + [1] * len(r["completion_ids"])}
            for r in rows]


def collate_masked(rows):
    """Right-padded input_ids (PAD), attention_mask, labels = input_ids
    with -100 on the prompt and the padding (the model shifts)."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        mask[i, :n] = 1
        keep = torch.tensor(r["completion_mask"]) == 1
        labels[i, :n] = torch.where(keep, torch.tensor(r["input_ids"]), IGNORE)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def tokenizer():
    """A PreTrainedTokenizerFast over words "t0".."t31" (id = the number),
    pad t0, bos t1, eos t2: what a trainer that insists on a tokenizer
    gets, built in memory."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"t%d" % i: i for i in range(VOCAB)}
    tok = Tokenizer(WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", bos_token="t1",
                                   eos_token="t2", unk_token="t0")
