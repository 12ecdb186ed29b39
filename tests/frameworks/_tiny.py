"""What the framework conformance cases share (tests/frameworks/<fw>_<case>.py):
variable-length token data padded with -100, its collator, a tiny Llama
built from a config (no hub), a causal-LM nn.Module whose forward takes no
**kwargs, the case's command line and a free port for gloo ranks."""

import argparse
import os
import socket

import torch
from torch.utils.data import Dataset

VOCAB = 32
PAD = 0


class VariableTokens(Dataset):
    """n sequences of 3..12 tokens (seeded): micro-batches differ in token
    count, so a token mean per micro-batch / K weighs tokens wrongly."""

    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(3, 13, (1,), generator=g))
            self.rows.append(torch.randint(1, VOCAB, (length,), generator=g))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i]}


def collate(rows):
    """Right-padded input_ids (PAD), attention_mask, labels = input_ids
    with -100 at the padding (the model shifts)."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r["input_ids"])] = r["input_ids"]
        mask[i, :len(r["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def tiny_llama(seed=0):
    """LlamaForCausalLM from a config: 2 layers, hidden 16, vocab 32 (a few
    thousand parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                      pad_token_id=PAD, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


class TinyCausal(torch.nn.Module):
    """A causal LM of our own whose forward takes no **kwargs: embedding,
    one GRU, a head; returns {'loss': token mean of the shifted
    cross-entropy, 'logits'} as a Transformers model would."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.rnn = torch.nn.GRU(16, 16, batch_first=True)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.rnn(self.emb(input_ids))[0])
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
        return out


def case_args(doc):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--out", required=True, help="trace folder to write")
    ap.add_argument("--variant", default="default")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--no-record", action="store_true", help="the run without the recorder (bench)")
    return ap.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(main, ranks, *args):
    """main(rank, ranks, *args) in `ranks` processes whose environment says
    torch.distributed's env:// rendezvous (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT), as torchrun would set it: the framework
    initialises the gloo group itself."""
    import torch.multiprocessing as mp

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ["WORLD_SIZE"] = str(ranks)
    mp.spawn(_ranked, args=(main, ranks, args), nprocs=ranks, join=True)


def _ranked(rank, main, ranks, args):
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    main(rank, ranks, *args)
