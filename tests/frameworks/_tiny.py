"""What the framework conformance cases share (tests/frameworks/<fw>_<case>.py):
variable-length token data padded with -100, its collator, a tiny Llama
built from a config (no hub), a causal-LM nn.Module whose forward takes no
**kwargs, the case's command line, a free port for gloo ranks, and
--identity PATH: the case run without the recorder, then with it, in one
process, each run's trained parameters digested by each rank (digested();
bench/conformance.py compares them)."""

import argparse
import os
import socket
import sys

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


IDENTITY_HELP = ("run the case without the recorder, then with it, in this process; each rank "
                 "appends each run's parameter digest to PATH.rank<r> (digested())")


def case_args(doc):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--out", required=True, help="trace folder to write")
    ap.add_argument("--variant", default="default")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--no-record", action="store_true", help="the run without the recorder (bench)")
    ap.add_argument("--identity", metavar="PATH", help=IDENTITY_HELP)
    return ap.parse_args()


def digested(a, trained, rank=None, ranks=None):
    """The end of one run of a case under --identity PATH: appends
    '<plain|recorded> RANKS SHA256' (examples/contract/identity.py's
    digest of what it trained: this rank's parameters and buffers) to
    PATH.rank<rank> (rank, ranks: torch.distributed's environment unless
    given)."""
    if not getattr(a, "identity", None):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "examples", "contract"))
    import identity

    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    ranks = int(os.environ.get("WORLD_SIZE", 1)) if ranks is None else ranks
    with open("%s.rank%d" % (a.identity, rank), "a") as f:
        f.write("%s %d %s\n" % ("plain" if a.no_record else "recorded", ranks,
                                 identity.digest(trained)))


def twice(main, argv, rerun=True):
    """main(argv) (through exit_on_refusal); under --identity first
    main(argv + ['--no-record']) in this process, the frameworks' process
    state reset between the two (fresh_state).  rerun=False: a run that
    cannot run twice in one process (Lightning's strategy="ddp" starts its
    other ranks as copies of the script at the first fit): once, and
    --identity dropped (no digests: bench/conformance.py says 'not
    compared')."""
    if "--identity" in argv and not rerun:
        i = argv.index("--identity")
        argv = argv[:i] + argv[i + 2:]
    if "--identity" in argv and "--no-record" not in argv:
        rc = exit_on_refusal(main, argv + ["--no-record"])
        if rc:
            return rc
        fresh_state()
    return exit_on_refusal(main, argv)


def fresh_state():
    """Accelerate keeps its state in process-wide singletons
    (AcceleratorState, GradientState: the gradient accumulation step, the
    active loader): a second Accelerator in the process starts from them
    reset, as the first did."""
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


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


def lightning_digests(a):
    """[a LightningDigest callback] under --identity, else []."""
    return [_lightning_digest()(a)] if getattr(a, "identity", None) else []


def __getattr__(name):
    if name == "LightningDigest":  # ddp_spawn's processes unpickle it by name
        return _lightning_digest()
    raise AttributeError(name)


def _lightning_digest():
    """LightningDigest: a Lightning callback whose on_train_end digests each
    rank's trained LightningModule (digested): every rank runs it, forked,
    spawned or not.  Made at its first use (the Transformers and
    Accelerate venvs have no Lightning), a module attribute so that
    ddp_spawn can pickle it into its processes."""
    if "LightningDigest" in globals():
        return globals()["LightningDigest"]
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    class LightningDigest(pl.Callback):
        def __init__(self, a):
            self.a = a

        def on_train_end(self, trainer, module):
            digested(self.a, module, trainer.global_rank, trainer.world_size)
    LightningDigest.__qualname__ = "LightningDigest"  # pickled by name: _tiny.LightningDigest
    globals()["LightningDigest"] = LightningDigest
    return LightningDigest


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
    ap.add_argument("--identity", metavar="PATH", help=IDENTITY_HELP)
    a = ap.parse_args(argv)
    if a.variant == "default":
        a.variant = variants[0]
    return a


def _argv_rank(rank, ranks, main, argv):
    if twice(main, argv) != 0:
        raise SystemExit(1)


def spawn(main, argv, ranks, rerun=True):
    """main(argv) in `ranks` processes with torch.distributed's env://
    rendezvous set (as `accelerate launch` or torchrun would: spawn_ranks),
    or in this one when ranks is 1 or this already is a rank; each runs
    it twice under --identity (twice)."""
    if ranks <= 1 or "RANK" in os.environ:
        return twice(main, argv, rerun)
    spawn_ranks(_argv_rank, ranks, main, argv)
    return 0
