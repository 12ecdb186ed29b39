"""An `accumcheck export` bundle, loaded for a PyTorch trainer."""

import math
import os

import torch
import torch.nn.functional as F

from .trace import Refused, read_csv


class Bundle:
    """An accumcheck export bundle, loaded (attributes: docs/python.md)."""

    """An accumcheck export bundle, loaded."""

    def __init__(self, folder, rank=None):
        self.dir = folder
        hp = {r["key"]: r["value"] for r in read_csv(os.path.join(folder, "hyperparameters.csv"))}
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
        # DDP (ranks > 1): the bundle is one rank's view (its shard of every
        # micro-batch: order, windows(), micro_batches()); `rank` defaults
        # to torch.distributed's rank when a process group is initialized.
        self.sampler = hp.get("sampler", "pad")
        self.rank = _default_rank() if rank is None else int(rank)
        if not 0 <= self.rank < self.ranks:
            raise Refused("%s: rank %d, but the scenario has ranks = %d"
                          % (os.path.join(folder, "hyperparameters.csv"), self.rank, self.ranks))
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

        rows = read_csv(os.path.join(folder, "data.csv"))
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
        for r in read_csv(os.path.join(folder, "tensors.csv")):
            shape = (int(r["rows"]), int(r["cols"])) if r["dims"] == "2" else (int(r["rows"]),)
            self.tensors.append((r["tensor"], shape))
        init = {}
        for r in read_csv(os.path.join(folder, "params.csv")):
            init.setdefault(r["tensor"], []).append((int(r["index"]), float(r["value"])))
        self.initial = {}
        for name, shape in self.tensors:
            vals = [v for _, v in sorted(init[name])]
            self.initial[name] = torch.tensor(vals, dtype=torch.float64).float().reshape(shape)

        # Batch order: rank -> epochs -> windows -> micro-batches (each
        # rank's shard of every micro-batch; a rank that ran out of samples
        # holds an empty one, as under DDP's Join).
        self.rank_orders = [[[] for _ in range(self.epochs)] for _ in range(self.ranks)]
        windows = {}
        for r in read_csv(os.path.join(folder, "batches.csv")):
            e, w, m = int(r["epoch"]), int(r["window"]), int(r["micro"])
            rk = int(r.get("rank", 0))
            windows.setdefault((e, w), {}).setdefault(m, {}).setdefault(rk, []).append(
                (int(r["position"]), int(r["sample"])))
        for (e, w) in sorted(windows):
            micro = windows[(e, w)]
            for rk in range(self.ranks):
                self.rank_orders[rk][e].append(
                    [[s for _, s in sorted(micro[m].get(rk, []))] for m in sorted(micro)])
        self.order = self.rank_orders[self.rank]
        self.lr_per_step = [float(r["lr"]) for r in read_csv(os.path.join(folder, "lr_schedule.csv"))]

    # ---- what a trainer builds from the bundle

    def model(self):
        """nn.Sequential(Linear, act, Linear, ...) with the exact initial parameters."""
        acts = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "gelu": torch.nn.GELU,
                "identity": torch.nn.Identity}
        if self.kind == "token":
            # Embedding -> Linear(embed, vocab): "0.weight", "1.weight", "1.bias".
            net = torch.nn.Sequential(torch.nn.Embedding(self.vocab, self.embed),
                                      torch.nn.Linear(self.embed, self.vocab))
            self.load_initial(net)
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
        self.load_initial(net)
        return net

    def optimizer(self, model, **options):
        """The scenario's optimizer over model's parameters; `options` go to
        its constructor as they are (PyTorch 2's foreach=True, fused=True)."""
        params = model.parameters()
        if self.optimizer_kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                   weight_decay=self.weight_decay, **options)
        cls = torch.optim.Adam if self.optimizer_kind == "adam" else torch.optim.AdamW
        return cls(params, lr=self.lr, betas=self.betas, eps=self.eps,
                   weight_decay=self.weight_decay, **options)

    def lr_multiplier(self, n):
        """S(n) after n scheduler.step() calls, in double (LambdaLR multiplies
        the base lr, a Python float, by it):
          constant: 1
          step:     gamma ** (n // step_size)
          warmup (linear, cosine): n / warmup for n < warmup (0 at n = 0)
          linear:   max(0, (total - n) / (total - warmup))     (0 past total)
          cosine:   max(0, 0.5 * (1 + cos(pi * (n - warmup) / (total - warmup))))
                    (past total the cosine rises again: PyTorch's formula,
                    kept; scenarios set total >= the steps they take)"""
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

    def dataset(self, epoch=None):
        """A torch.utils.data.Dataset of the scenario's samples: item i is
        (x_i, y_i, i), the sample id last.  Use it with your own DataLoader,
        sampler, shuffle or drop_last; the recorder finds each micro-batch's
        sample ids from the model's inputs (or from `recorder.sample_ids`).
        With `epoch`, item i is the i-th sample of that epoch's order (every
        rank's samples, in the order the scenario deals them): a
        DistributedSampler(shuffle=False) over it gives each rank the
        scenario's shard (sampler = "pad"; "drop-last": drop_last=True)."""
        return SampleDataset(self, None if epoch is None else self.epoch_order(epoch))

    def epoch_order(self, epoch):
        """The epoch's sample order before it is dealt out to the ranks:
        position i went to rank i % R (DistributedSampler's deal)."""
        R = self.ranks
        shards = [[s for w in self.rank_orders[r][epoch] for m in w for s in m]
                  for r in range(R)]
        n = self.samples if self.sampler != "drop-last" else self.samples // R * R
        return [shards[i % R][i // R] for i in range(n)]

    def load_initial(self, model, names=None):
        """Copies the scenario's initial parameters into `model` (the
        bundle's nn.Sequential or your own nn.Module), mapped as
        map_parameters says; returns that mapping."""
        mapping = map_parameters(self, model, names)
        with torch.no_grad():
            for bundle_name, (_, p) in mapping.items():
                p.copy_(self.initial[bundle_name].to(p.dtype))
        return mapping

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


class SampleDataset(torch.utils.data.Dataset):
    """The bundle's samples; item i is (x_i, y_i, i)."""

    def __init__(self, bundle, order=None):
        self.bundle = bundle
        self.order = list(range(bundle.samples)) if order is None else order

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        i = self.order[i]
        return self.bundle.x[i], self.bundle.y[i], i


def _shape(t):
    return tuple(int(d) for d in t.shape)


def map_parameters(bundle, model, names=None):
    """Maps the scenario's tensors to `model`'s parameters: {bundle name:
    (model name, parameter)}.

    By default by order and shape: the i-th parameter of
    model.named_parameters() (registration order: Linear weight then bias,
    norm weight then bias, embedding) is the bundle's i-th tensor and must
    have its shape.  `names` ({model name: bundle name}, or the reverse)
    maps explicitly.  Anything else is refused (exit 2) with a two-column
    table of both sides."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    want = bundle.tensors
    if names:
        by_model = dict(params)
        bundle_names = {n for n, _ in want}
        # Accept either direction of the map.
        if all(k in bundle_names for k in names) and not all(k in by_model for k in names):
            names = {v: k for k, v in names.items()}
        inverse = {b: m for m, b in names.items()}
        ordered = [(inverse.get(b), by_model.get(inverse.get(b))) for b, _ in want]
        extra = [n for n, _ in params if n not in names]
        ok = all(p is not None and _shape(p) == s for (_, p), (_, s) in zip(ordered, want)) \
            and not extra
        if ok:
            return {b: mp for (b, _), mp in zip(want, ordered)}
        _refuse_mapping(want, params, "the explicit name map does not fit" +
                        (" (model parameters not in the map: %s)" % ", ".join(extra)
                         if extra else ""))
    if len(params) == len(want) and all(_shape(p) == s for (_, p), (_, s) in zip(params, want)):
        return {b: mp for (b, _), mp in zip(want, params)}
    _refuse_mapping(want, params, "the model's parameters do not match the scenario's "
                    "tensors by order and shape")


def _refuse_mapping(want, params, why):
    rows = max(len(want), len(params))
    left = ["%s %s" % (n, list(s)) for n, s in want] + [""] * (rows - len(want))
    right = ["%s %s" % (n, list(p.shape)) for n, p in params] + [""] * (rows - len(params))
    width = max([len("scenario tensor")] + [len(x) for x in left])
    lines = ["%-*s | %s" % (width, "scenario tensor", "model parameter")]
    lines.append("-" * width + "-+-" + "-" * 20)
    for a, b in zip(left, right):
        mark = "" if a and b and a.split(" ", 1)[1] == b.split(" ", 1)[1] else "   <-- differs"
        lines.append("%-*s | %s%s" % (width, a, b, mark))
    raise Refused("%s; pass names={model name: scenario name} to map them "
                  "explicitly:\n%s" % (why, "\n".join(lines)))


def load_bundle(folder, rank=None):
    """Loads an `accumcheck export` bundle; with ranks > 1, as `rank` sees
    it (default: torch.distributed's rank, or 0)."""
    return Bundle(folder, rank)


def _default_rank():
    import torch.distributed as dist
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
