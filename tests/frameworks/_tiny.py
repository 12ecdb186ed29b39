"""What the framework conformance cases share (tests/frameworks/<fw>_<case>.py):
variable-length token data padded with -100, its collator, a tiny Llama
built from a config (no hub), a causal-LM nn.Module whose forward takes no
**kwargs, the case's command line and a free port for gloo ranks."""

import argparse
import os
import socket

import torch
from torch.utils.data import Dataset

from accumcheck_torch import exit_on_refusal

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
    # ACCUMCHECK_START_METHOD=fork (CTest sets it, as launch() reads it):
    # the ranks are forks of this process instead of fresh interpreters
    # importing torch and the framework again.
    mp.start_processes(_ranked, args=(main, ranks, args), nprocs=ranks, join=True,
                       start_method=os.environ.get("ACCUMCHECK_START_METHOD", "spawn"))


def lightning_ddp():
    """The Lightning strategy of a 2-rank case: "ddp" (Lightning runs the
    script again for each other rank, as its docs show), or "ddp_fork"
    under ACCUMCHECK_START_METHOD=fork (CTest: the ranks fork this process
    instead of importing torch and Lightning again)."""
    return "ddp_fork" if os.environ.get("ACCUMCHECK_START_METHOD") == "fork" else "ddp"


def _ranked(rank, main, ranks, args):
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    exit_on_refusal(main, rank, ranks, *args)  # a refused rank exits 2


# ---- the Accelerate and Lightning cases (one script, several variants)

class MLP(torch.nn.Module):
    """A classifier of our own: Linear, tanh, Linear (forward(x), no
    **kwargs)."""

    def __init__(self, d_in=8, hidden=16, classes=3):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def classifier_data(n, d_in=8, classes=3, seed=0):
    """n (x, y) samples (seeded)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return [(x[i], y[i]) for i in range(n)]


def warmup_linear(warmup, total):
    """The lambda of a linear schedule with warmup, as accumcheck's
    declared {"kind": "linear"} schedule and Transformers'
    get_linear_schedule_with_warmup compute it (0 at step 0)."""
    def f(n):
        if n < warmup:
            return n / max(1, warmup)
        return max(0.0, (total - n) / max(1, total - warmup))
    return f


def variant_args(variants, argv=None):
    """The case's command line, --variant one of `variants` ("default":
    the first)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", choices=variants + ["default"], default=variants[0])
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--no-record", action="store_true", help="the same run without recording")
    a = ap.parse_args(argv)
    if a.variant == "default":
        a.variant = variants[0]
    return a


def _argv_rank(rank, ranks, main, argv):
    if exit_on_refusal(main, argv) != 0:
        raise SystemExit(1)


def spawn(main, argv, ranks):
    """main(argv) in `ranks` processes with torch.distributed's env://
    rendezvous set (as `accelerate launch` or torchrun would: spawn_ranks),
    or in this one when ranks is 1 or this already is a rank."""
    if ranks <= 1 or "RANK" in os.environ:
        return exit_on_refusal(main, argv)
    spawn_ranks(_argv_rank, ranks, main, argv)
    return 0
