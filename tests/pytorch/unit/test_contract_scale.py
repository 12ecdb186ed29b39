"""The contract recorder at scale (issue 43): rows of sampled coordinates,
g_j read at the forward's outputs, no copy of the model, and a recorder
that never changes or crashes the run it records."""
import csv
import hashlib
import itertools
import os
import subprocess

import accumcheck_torch as act
import pytest
import torch
from accumcheck_torch.sample import Coordinates

pytestmark = pytest.mark.calls_accumcheck  # each test runs accumcheck (conftest.py)


def _certify(folder):
    """certify --contract's (exit code, output), or None without the binary."""
    binary = os.environ.get("ACCUMCHECK_BIN")
    if not binary:
        return None
    p = subprocess.run([binary, "certify", "--contract", "--trace", str(folder)],
                       check=False, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def _digest(model):
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _Wide(torch.nn.Module):
    """An embedding far larger than the sample, and a small head."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20000, 32)
        self.head = torch.nn.Linear(32, 5)

    def forward(self, idx):
        return self.head(torch.tanh(self.emb(idx).mean(1)))


def _summed(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y, reduction="sum")


def _data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 20000, (3, 6), generator=g), torch.randint(0, 5, (3,), generator=g))
            for _ in range(n)]


def _train(tmp_path, record=True, loss=_summed, user=None, K=3, break_at=None, **kw):
    """A correct loop (each micro-batch's summed loss over the window's
    items), recorded or not; returns (model, recorder)."""
    torch.manual_seed(0)
    model = _Wide()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rec = act.ContractRecorder(model, opt, loss_fn=loss, count_fn=lambda b: len(b[1]),
                               accumulation=K, out=str(tmp_path / "trace"), quiet=True,
                               **kw) if record else None
    if rec is not None and break_at is not None:
        orig, calls = rec._fit_from_outputs, [0]

        def broken():
            calls[0] += 1
            if calls[0] == break_at:
                raise RuntimeError("a fault injected into the recorder")
            return orig()
        rec._fit_from_outputs = broken
    data = _data()
    it = iter(rec.watch(data) if rec is not None else data)
    while True:
        window = list(itertools.islice(it, K))
        if not window:
            break
        n_w = sum(len(b[1]) for b in window)
        for batch in window:
            ((user or loss)(model, batch) / n_w).backward()
        opt.step()
        opt.zero_grad()
    if rec is not None:
        rec.close()
    return model, rec


def test_the_rows_hold_a_sample_of_every_tensor(tmp_path):
    model = _Wide()
    c = Coordinates([p for p in model.parameters()], per_tensor=64, seed=7)
    assert c.d == 64 + 64 + 5  # the embedding's 640000 and the head's 160 sampled; the bias whole
    again = Coordinates([p for p in model.parameters()], per_tensor=64, seed=7)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(c.index, again.index))
    other = Coordinates([p for p in model.parameters()], per_tensor=64, seed=8)
    assert not torch.equal(c.index[0], other.index[0])
    _, rec = _train(tmp_path, coordinates=64)
    assert rec.buf.m.shape[1] == rec.coords.d == 64 + 64 + 5
    assert rec.mref is None and rec.m64 is None  # no copy of the model
    with open(tmp_path / "trace" / "meta.csv") as f:
        meta = dict(csv.reader(f))
    assert meta["coordinates"] == str(64 + 64 + 5) and meta["sample_seed"] == str(rec.coords.seed)
    assert meta["parameters"] == str(20000 * 32 + 32 * 5 + 5)
    judged = _certify(tmp_path / "trace")
    if judged is not None:
        assert judged[0] == 0 and "PASS (contract tier)" in judged[1], judged[1]


def test_a_mistake_is_seen_on_the_sample(tmp_path):
    """No division by the window's items: every sampled coordinate shows it."""
    _train(tmp_path, user=lambda m, b: _summed(m, b) * 3.0, coordinates=64)
    judged = _certify(tmp_path / "trace")
    if judged is not None:
        assert judged[0] == 1 and "FAIL" in judged[1], judged[1]


def test_recording_leaves_the_run_bit_identical(tmp_path):
    plain, _ = _train(tmp_path, record=False)
    recorded, _ = _train(tmp_path)
    assert _digest(plain) == _digest(recorded)


def test_a_penalty_read_by_attribute_is_recomputed(tmp_path):
    """The loss reaches the head's weight by another path than the output:
    the outputs' premise fails at the first calibration and every
    micro-batch is recomputed on the model itself, the penalty included."""
    def penalised(model, batch):
        return _summed(model, batch) + len(batch[1]) * 0.5 * model.head.weight.pow(2).sum()
    plain, _ = _train(tmp_path, record=False, loss=penalised)
    model, rec = _train(tmp_path, loss=penalised)
    assert _digest(plain) == _digest(model)
    assert rec.no_take and any("another path" in n for n in rec.notes), rec.notes
    judged = _certify(tmp_path / "trace")
    if judged is not None:
        assert judged[0] == 0 and "PASS (contract tier)" in judged[1], judged[1]


def test_an_error_inside_the_recorder_ends_the_recording_not_the_training(tmp_path, capsys):
    plain, _ = _train(tmp_path, record=False)
    model, rec = _train(tmp_path, break_at=5)
    assert _digest(plain) == _digest(model)  # the training went on, untouched
    assert rec.abandoned and "a fault injected into the recorder" in rec.abandoned
    with open(tmp_path / "trace" / "rank0.incomplete", newline="") as f:
        marker = dict(csv.reader(f))
    assert "the recorder failed in end_backward (RuntimeError" in marker["why"], marker
    judged = _certify(tmp_path / "trace")
    if judged is not None:
        assert judged[0] == 2 and "the recorder failed" in judged[1], judged[1]


def test_a_step_on_a_non_finite_gradient_is_recorded_and_fails(tmp_path):
    """A loss that overflows at one micro-batch, stepped without a loss
    scaler: the run goes on as it would unrecorded (NaN weights and all),
    and the step on inf or NaN is recorded (an overflow row, not skipped):
    certify FAILs it."""
    def overflowing(model, batch):
        loss = _summed(model, batch)
        return loss * (float("inf") if int(batch[0][0, 0]) % 7 == 0 else 1.0)
    plain, _ = _train(tmp_path, record=False, loss=overflowing)
    model, rec = _train(tmp_path, loss=overflowing)
    assert _digest(plain) == _digest(model)
    assert rec.abandoned is None, rec.abandoned
    with open(tmp_path / "trace" / "contract.csv") as f:
        assert any(r.startswith("overflow,") and r.split(",")[4] == "0" for r in f), \
            "no overflow row of a step taken"
    judged = _certify(tmp_path / "trace")
    if judged is not None:
        assert judged[0] == 1 and "the optimizer stepped on a gradient holding inf or NaN" \
            in judged[1], judged[1]


def _scaled_run(tmp_path, record, fused=False, init_scale=2.0 ** 20, after_skip=None,
                optimizer=None):
    """float16 autocast under a GradScaler whose first scale overflows:
    the scaler skips windows until the scale fits.  after_skip: what the
    loop does instead of scaler.step(opt) ("step_anyway": unscale_ and
    optimizer.step() past the scaler).  optimizer: builds the optimizer
    from the parameters (Adam at lr 0.01, fused or not, by default)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = (optimizer or (lambda ps: torch.optim.Adam(ps, lr=0.01, fused=fused)))(
        model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
            for _ in range(8)]

    def summed(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1], reduction="sum")
    rec = act.ContractRecorder(model, opt, summed, lambda b: len(b[1]), accumulation=2,
                               out=str(tmp_path / "trace"), quiet=True) if record else None
    it = iter(rec.watch(data) if rec else data)
    with torch.autocast("cpu", dtype=torch.float16):
        for window in iter(lambda: list(itertools.islice(it, 2)), []):
            n = sum(len(b[1]) for b in window)
            for b in window:
                scaler.scale(summed(model, b) / n).backward()
            if after_skip == "step_anyway":
                scaler.unscale_(opt)
                opt.step()
            else:
                scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    if rec:
        rec.close()
    return model, rec


def test_a_window_a_loss_scaler_skips_is_judged(tmp_path):
    """The windows GradScaler skips for overflow (plain Adam, whose step
    is not called; fused Adam, called with found_inf): the run goes on
    untouched, each skip is recorded (nothing updated, the scale halved)
    and the next windows are fitted: certify PASSes."""
    for fused in (False, True):
        plain, _ = _scaled_run(tmp_path, False, fused)
        model, rec = _scaled_run(tmp_path, True, fused)
        assert _digest(plain) == _digest(model)
        assert rec.abandoned is None, rec.abandoned
        with open(tmp_path / "trace" / "contract.csv") as f:
            rows = [r.split(",") for r in f if r.startswith(("overflow,", "step,"))]
        skips = [r for r in rows if r[0] == "overflow"]
        assert skips and rows[-1][0] == "step", rows  # skipped, then stepped
        assert all(r[4] == "1" and r[6] == "0" and float(r[8]) == float(r[7]) / 2
                   for r in skips), skips
        judged = _certify(tmp_path / "trace")
        if judged is not None:
            assert judged[0] == 0 and "window(s) with inf or NaN, each its own overflow" \
                in judged[1], judged[1]


def test_a_step_past_the_loss_scaler_fails(tmp_path):
    """optimizer.step() after unscale_ on a window that overflowed (the
    scaler's skip bypassed): recorded as a step on inf or NaN, FAIL."""
    plain, _ = _scaled_run(tmp_path, False, after_skip="step_anyway")
    model, _ = _scaled_run(tmp_path, True, after_skip="step_anyway")
    assert _digest(plain) == _digest(model)
    judged = _certify(tmp_path / "trace")
    if judged is not None:
        assert judged[0] == 1 and "FAIL loss scaler: step 0: the optimizer stepped" \
            in judged[1], judged[1]


class _StepsThroughFoundInf(torch.optim.SGD):
    """An optimizer that unscales inside its step, as a fused one does
    (GradScaler then calls it with found_inf set), but updates anyway."""

    _step_supports_amp_scaling = True

    def step(self, closure=None):
        scale = getattr(self, "grad_scale", None)
        with torch.no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.add_(p.grad / (1.0 if scale is None else scale), alpha=-g["lr"])


def test_a_skipped_step_that_updates_fails(tmp_path):
    """A step GradScaler told found_inf that updates the parameters all
    the same: the skip changed them, FAIL."""
    _scaled_run(tmp_path, True, optimizer=lambda ps: _StepsThroughFoundInf(ps, lr=0.01))
    judged = _certify(tmp_path / "trace")
    if judged is not None:
        assert judged[0] == 1 and "FAIL loss scaler: step 0: the skipped step changed" \
            in judged[1], judged[1]
