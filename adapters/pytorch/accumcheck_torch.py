"""accumcheck for PyTorch: train on an export bundle, record a trace.

    bundle = load_bundle("bundle/")          # accumcheck export ... --out bundle/
    model = bundle.model()                   # nn.Sequential, exact initial params
    optimizer = bundle.optimizer(model)      # SGD / Adam / AdamW as exported
    scheduler = bundle.scheduler(optimizer)  # LambdaLR with the exported schedule
    recorder = Recorder(bundle, model, optimizer, scheduler, out="trace/")
    ... your training loop, unchanged ...
    recorder.close()                         # writes trace/{meta,events,values}.csv

The recorder monkeypatches optimizer.zero_grad / optimizer.step,
model.zero_grad, scheduler.step, torch.nn.utils.clip_grad_norm_ and
torch.Tensor.backward (and hooks the model's forward), so the loop itself
needs no change.  It writes the accumcheck trace schema (accumcheck-trace/1,
exactly as verify/trace.cpp writes it): one run, named "trainer", with the
events zero_grad, forward_backward, clip, optimizer_step, scheduler_step,
the accumulated gradient just before each optimizer step and the parameters
just after it.  Then:

    accumcheck certify bundle/scenario.toml --trace trace/

Call clip_grad_norm_ as torch.nn.utils.clip_grad_norm_ (or construct the
recorder before `from torch.nn.utils import clip_grad_norm_`), so the
recorder sees it.
"""

import csv
import math
import os
import tempfile

import torch
import torch.nn.functional as F

TRACE_SCHEMA = "accumcheck-trace/1"
EVENTS_HEADER = "run,epoch,step,micro,event,samples,tokens,loss,lr,grad_norm"
VALUES_HEADER = "run,step,kind,tensor,index,value"
VERSION = "0.1.0"


def _real(x):
    """17 significant digits (exact for float32 and float64); NaN is ''."""
    x = float(x)
    if math.isnan(x):
        return ""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return "%.17g" % x


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write_atomically(path, text):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp.")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Bundle:
    """An accumcheck export bundle, loaded."""

    def __init__(self, folder):
        self.dir = folder
        hp = {r["key"]: r["value"] for r in _read_csv(os.path.join(folder, "hyperparameters.csv"))}
        self.hyper = hp
        self.scenario = hp["scenario"]
        self.digest = hp["scenario_digest"]
        self.accepted = hp["accepted"]
        self.widths = [int(w) for w in hp["widths"].split()]
        self.activation = hp["activation"]
        self.norm = hp.get("norm", "none")
        self.norm_groups = int(hp.get("norm_groups", "1"))
        self.loss_kind = hp["loss"]
        self.d_in, self.d_out = self.widths[0], self.widths[-1]
        self.micro_batch = int(hp["micro_batch"])
        self.accumulation = int(hp["accumulation"])
        # K of each epoch (K may change during training); older bundles
        # carry one K.
        self.accumulation_per_epoch = [
            int(k) for k in hp.get("accumulation_per_epoch", "").split()]
        self.epochs = int(hp["epochs"])
        self.ranks = int(hp["ranks"])
        self.max_steps = int(hp["max_steps"])
        self.steps = int(hp["steps"])
        self.optimizer_kind = hp["optimizer"]
        self.lr = float(hp["lr"])
        self.momentum = float(hp["momentum"])
        self.betas = (float(hp["beta1"]), float(hp["beta2"]))
        self.eps = float(hp["eps"])
        self.weight_decay = float(hp["weight_decay"])
        self.l2_in_loss = float(hp["l2_in_loss"])
        self.schedule = hp["schedule"]
        self.warmup = int(hp["warmup"])
        self.total = int(hp["total"])
        # total = "auto" scenarios: warmup = ceil(total * warmup_ratio) when
        # >= 0 (a trainer that counts its own horizon needs the ratio).
        self.warmup_ratio = float(hp.get("warmup_ratio", "-1"))
        self.step_size = int(hp["step_size"])
        self.gamma = float(hp["gamma"])
        self.clip = hp["clip"] == "1"
        self.max_norm = float(hp["max_norm"])

        rows = _read_csv(os.path.join(folder, "data.csv"))
        self.samples = len(rows)
        self.kind = hp.get("kind", "mlp")
        if self.kind == "token":
            # Sequences padded to max_len: token ids, and targets with
            # ignore_index -100 at every padding position.
            self.vocab, self.embed = int(hp["vocab"]), int(hp["embed"])
            self.max_len = int(hp["max_len"])
            L = range(self.max_len)
            self.x = torch.tensor([[int(r["t%d" % j]) for j in L] for r in rows],
                                  dtype=torch.long)
            self.y = torch.tensor([[int(r["y%d" % j]) for j in L] for r in rows],
                                  dtype=torch.long)
        else:
            self.x = torch.tensor([[float(r["x%d" % j]) for j in range(self.d_in)]
                                   for r in rows], dtype=torch.float64).float()
            if self.loss_kind == "mse":
                self.y = torch.tensor([[float(r["y%d" % j]) for j in range(self.d_out)]
                                       for r in rows], dtype=torch.float64).float()
            else:
                self.y = torch.tensor([int(r["label"]) for r in rows], dtype=torch.long)

        # Tensors in layout order: (name, shape).
        self.tensors = []
        for r in _read_csv(os.path.join(folder, "tensors.csv")):
            shape = (int(r["rows"]), int(r["cols"])) if r["dims"] == "2" else (int(r["rows"]),)
            self.tensors.append((r["tensor"], shape))
        init = {}
        for r in _read_csv(os.path.join(folder, "params.csv")):
            init.setdefault(r["tensor"], []).append((int(r["index"]), float(r["value"])))
        self.initial = {}
        for name, shape in self.tensors:
            vals = [v for _, v in sorted(init[name])]
            self.initial[name] = torch.tensor(vals, dtype=torch.float64).float().reshape(shape)

        # Batch order: epochs -> windows -> micro-batches (rank 0's ids).
        self.order = [[] for _ in range(self.epochs)]
        windows = {}
        for r in _read_csv(os.path.join(folder, "batches.csv")):
            if r["rank"] != "0":
                continue
            e, w, m = int(r["epoch"]), int(r["window"]), int(r["micro"])
            windows.setdefault((e, w), {}).setdefault(m, []).append((int(r["position"]), int(r["sample"])))
        for (e, w) in sorted(windows):
            micro = windows[(e, w)]
            self.order[e].append([[s for _, s in sorted(micro[m])] for m in sorted(micro)])
        self.lr_per_step = [float(r["lr"]) for r in _read_csv(os.path.join(folder, "lr_schedule.csv"))]

    # ---- what a trainer builds from the bundle

    def model(self):
        """nn.Sequential(Linear, act, Linear, ...) with the exact initial parameters."""
        acts = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "gelu": torch.nn.GELU,
                "identity": torch.nn.Identity}
        if self.kind == "token":
            # Embedding -> Linear(embed, vocab): "0.weight", "1.weight", "1.bias".
            net = torch.nn.Sequential(torch.nn.Embedding(self.vocab, self.embed),
                                      torch.nn.Linear(self.embed, self.vocab))
            with torch.no_grad():
                for name, p in net.named_parameters():
                    p.copy_(self.initial[name])
            return net
        layers = []
        for i in range(len(self.widths) - 1):
            layers.append(torch.nn.Linear(self.widths[i], self.widths[i + 1]))
            if i + 2 < len(self.widths):
                # The norm sits between the hidden Linear and its activation.
                if self.norm == "batchnorm":
                    layers.append(torch.nn.BatchNorm1d(self.widths[i + 1], eps=1e-5,
                                                       momentum=0.1))
                elif self.norm == "layernorm":
                    layers.append(torch.nn.LayerNorm(self.widths[i + 1], eps=1e-5))
                elif self.norm == "groupnorm":
                    layers.append(torch.nn.GroupNorm(self.norm_groups, self.widths[i + 1],
                                                     eps=1e-5))
                layers.append(acts[self.activation]())
        net = torch.nn.Sequential(*layers)
        with torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(self.initial[name])
        return net

    def optimizer(self, model):
        params = model.parameters()
        if self.optimizer_kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                   weight_decay=self.weight_decay)
        cls = torch.optim.Adam if self.optimizer_kind == "adam" else torch.optim.AdamW
        return cls(params, lr=self.lr, betas=self.betas, eps=self.eps,
                   weight_decay=self.weight_decay)

    def lr_multiplier(self, n):
        """S(n) after n scheduler.step() calls (PyTorch / Transformers formulas)."""
        if self.schedule == "constant":
            return 1.0
        if self.schedule == "step":
            return self.gamma ** (n // max(1, self.step_size))
        if n < self.warmup:
            return float(n) / float(max(1, self.warmup))
        span = float(max(1, self.total - self.warmup))
        if self.schedule == "linear":
            return max(0.0, float(self.total - n) / span)
        progress = float(n - self.warmup) / span
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    def scheduler(self, optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, self.lr_multiplier)

    def accumulation_at(self, epoch):
        """K of `epoch` (from 0): the bundle's K per epoch."""
        ks = self.accumulation_per_epoch or [self.accumulation]
        return ks[min(epoch, len(ks) - 1)]

    def micro_batches(self, epoch):
        """The epoch's micro-batches in order, as (x, y) tensors."""
        out = []
        for window in self.order[epoch]:
            for ids in window:
                idx = torch.tensor(ids, dtype=torch.long)
                out.append((self.x[idx], self.y[idx]))
        return out

    def windows(self, epoch):
        """The epoch's windows: lists of micro-batch sample-id lists."""
        return self.order[epoch]

    def items(self, y):
        """The loss-bearing items of a micro-batch's targets: its samples,
        or (token models) its tokens that are not padding."""
        if self.kind == "token":
            return int((y != -100).sum())
        return int(y.shape[0])

    def window_loss(self, out, y, window_items):
        """The correct loss of one micro-batch: the sum of its per-item
        losses (MSE: mean over outputs; token models: per token) divided by
        the window's item count N_w, in one division (the Transformers fix,
        `num_items_in_batch`)."""
        if self.kind == "token":
            return F.cross_entropy(out.reshape(-1, self.vocab), y.reshape(-1),
                                   ignore_index=-100, reduction="sum") / window_items
        if self.loss_kind == "mse":
            return F.mse_loss(out, y, reduction="sum") / (self.d_out * window_items)
        return F.cross_entropy(out, y, reduction="sum") / window_items

    def loss_mean(self, out, y):
        """The usual criterion: the mean over the micro-batch (token models:
        over its non-padding tokens)."""
        if self.kind == "token":
            return F.cross_entropy(out.reshape(-1, self.vocab), y.reshape(-1),
                                   ignore_index=-100)
        if self.loss_kind == "mse":
            return F.mse_loss(out, y)
        return F.cross_entropy(out, y)


def load_bundle(folder):
    """Loads an `accumcheck export` bundle."""
    return Bundle(folder)


class Recorder:
    """Records a training loop's calls and values in the accumcheck trace schema."""

    def __init__(self, bundle, model, optimizer, scheduler=None, out="trace", run="trainer"):
        self.bundle, self.model, self.optimizer, self.scheduler = bundle, model, optimizer, scheduler
        self.out, self.run = out, run
        self.names = [name for name, _ in bundle.tensors]
        params = dict(model.named_parameters())
        missing = [n for n in self.names if n not in params]
        if missing:
            raise ValueError("model has no parameter(s) %s; expected the bundle's %s"
                             % (missing, self.names))
        self.params = [params[n] for n in self.names]
        self.events = []
        self.values = []
        self.steps = 0          # optimizer steps so far
        self.backwards = 0      # backward calls so far
        self.since_step = 0     # backward calls since the last optimizer step
        self.last_batch = 0     # rows of the last forward
        # epoch of the n-th micro-batch, from the bundle's order
        self.micro_epoch = [e for e in range(bundle.epochs)
                            for w in bundle.order[e] for _ in w]
        self.closed = False
        self._patch()

    # ---- patching

    def _patch(self):
        rec = self
        opt, sched, model = self.optimizer, self.scheduler, self.model
        self._orig = {}

        orig_zero = opt.zero_grad
        def zero_grad(*a, **k):
            rec._event("zero_grad")
            return orig_zero(*a, **k)
        opt.zero_grad = zero_grad

        orig_model_zero = model.zero_grad
        def model_zero_grad(*a, **k):
            rec._event("zero_grad")
            return orig_model_zero(*a, **k)
        model.zero_grad = model_zero_grad

        orig_step = opt.step
        def step(*a, **k):
            lr = opt.param_groups[0]["lr"]
            rec._values("grad", [p.grad for p in rec.params])
            result = orig_step(*a, **k)
            rec._event("optimizer_step", lr=lr)
            rec.steps += 1
            rec.since_step = 0
            rec._values("param", rec.params, step=rec.steps - 1)
            return result
        # Keep LR schedulers' "step was called" bookkeeping (with_counter).
        if getattr(orig_step, "_with_counter", False):
            step._with_counter = True
        opt.step = step

        if sched is not None:
            orig_sched = sched.step
            def sched_step(*a, **k):
                result = orig_sched(*a, **k)
                rec._event("scheduler_step", lr=opt.param_groups[0]["lr"])
                return result
            sched.step = sched_step

        import torch.nn.utils as U
        import torch.nn.utils.clip_grad as CG
        orig_clip = U.clip_grad_norm_
        def clip(*a, **k):
            norm = orig_clip(*a, **k)
            rec._event("clip", grad_norm=float(norm))
            return norm
        self._orig["clip"] = (U, CG, orig_clip, CG.clip_grad_norm_)
        U.clip_grad_norm_ = clip
        CG.clip_grad_norm_ = clip

        orig_backward = torch.Tensor.backward
        def backward(tensor, *a, **k):
            result = orig_backward(tensor, *a, **k)
            rec._event("forward_backward", samples=rec.last_batch)
            rec.backwards += 1
            rec.since_step += 1
            return result
        self._orig["backward"] = orig_backward
        torch.Tensor.backward = backward

        def forward_hook(module, inputs, output):
            rec.last_batch = int(inputs[0].shape[0]) if inputs and inputs[0].dim() > 0 else 1
        self._hook = model.register_forward_hook(forward_hook)

    def _unpatch(self):
        U, CG, orig_clip, orig_cg = self._orig["clip"]
        U.clip_grad_norm_ = orig_clip
        CG.clip_grad_norm_ = orig_cg
        torch.Tensor.backward = self._orig["backward"]
        self._hook.remove()
        for obj, attr in ((self.optimizer, "zero_grad"), (self.optimizer, "step"),
                          (self.model, "zero_grad"), (self.scheduler, "step")):
            if obj is not None and attr in obj.__dict__:
                del obj.__dict__[attr]

    # ---- rows

    def _event(self, kind, samples=0, lr=float("nan"), grad_norm=float("nan")):
        if kind == "forward_backward":
            micro = self.since_step
            n = self.backwards
        else:
            micro = self.since_step - 1
            n = max(0, self.backwards - 1)
        epoch = self.micro_epoch[min(n, len(self.micro_epoch) - 1)] if self.micro_epoch else 0
        self.events.append("%s,%d,%d,%d,%s,%d,0,,%s,%s\n"
                           % (self.run, epoch, self.steps, micro, kind, samples,
                              _real(lr), _real(grad_norm)))

    def _values(self, kind, tensors, step=None):
        step = self.steps if step is None else step
        for name, t, p in zip(self.names, tensors, self.params):
            flat = (torch.zeros_like(p) if t is None else t).detach().reshape(-1).double().tolist()
            prefix = "%s,%d,%s,%s," % (self.run, step, kind, name)
            self.values.extend("%s%d,%s\n" % (prefix, i, _real(v)) for i, v in enumerate(flat))

    def close(self):
        """Restores the patched calls and writes the trace (atomically, meta last)."""
        if self.closed:
            return
        self.closed = True
        self._unpatch()
        os.makedirs(self.out, exist_ok=True)
        precision = {torch.float32: "float32", torch.float64: "float64"}.get(
            self.params[0].dtype, str(self.params[0].dtype))
        meta = [("schema", TRACE_SCHEMA), ("scenario", self.bundle.scenario),
                ("scenario_digest", self.bundle.digest), ("engine", "pytorch"),
                ("precision", precision),
                ("tool_version", "accumcheck_torch-%s torch-%s" % (VERSION, torch.__version__))]
        _write_atomically(os.path.join(self.out, "events.csv"),
                          EVENTS_HEADER + "\n" + "".join(self.events))
        _write_atomically(os.path.join(self.out, "values.csv"),
                          VALUES_HEADER + "\n" + "".join(self.values))
        _write_atomically(os.path.join(self.out, "meta.csv"),
                          "key,value\n" + "".join("%s,%s\n" % kv for kv in meta))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def example_session(doc):
    """The set-up shared by the example trainers: `--bundle DIR --out DIR`
    from the command line, the bundle's model, optimizer and scheduler, and
    a Recorder writing the trace to --out.  Returns (bundle, model,
    optimizer, scheduler, recorder); the caller's loop stays its own."""
    import argparse

    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--bundle", required=True, help="accumcheck export folder")
    ap.add_argument("--out", required=True, help="trace folder to write")
    args = ap.parse_args()
    bundle = load_bundle(args.bundle)
    model = bundle.model()
    optimizer = bundle.optimizer(model)
    scheduler = bundle.scheduler(optimizer)
    recorder = Recorder(bundle, model, optimizer, scheduler, out=args.out)
    return bundle, model, optimizer, scheduler, recorder
