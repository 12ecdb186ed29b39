"""The contract recorder on an accelerator, tested on the CPU (issue 43
part 1: "on CUDA tensors no parameter-sized copy ever leaves the device";
part 7 without a GPU): the model and the loop's batches on the fake device
of fake_device.py, every host-bound transfer accounted.  What this cannot
show (CUDA's own kernels, generator, streams, memory): docs/tiers.md "The
recorder on a GPU"."""
import collections
import contextlib
import filecmp
import os

import accumcheck_torch as act
import fake_device
import pytest
import torch

pytestmark = pytest.mark.calls_accumcheck  # each test runs accumcheck (conftest.py)

K, STEPS, PER = 4, 2, 256


class _Net(torch.nn.Module):
    """Every weight larger than the sample (a whole one is parameter-sized),
    dropout drawing from the generator, a bias kept whole."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 600)
        self.norm = torch.nn.LayerNorm(600)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(600, 5)

    def forward(self, x):
        return self.head(self.drop(torch.tanh(self.norm(self.inp(x)))))


def _summed(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y, reduction="sum")


def _penalised(model, batch):
    """A loss reaching the first weight by another path than the outputs:
    every micro-batch recomputed (on the device, from the batch as the
    forward saw it)."""
    return _summed(model, batch) + len(batch[1]) * model.inp.weight.pow(2).sum()


def _data():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(3, 16, generator=g), torch.randint(0, 5, (3,), generator=g))
            for _ in range(K * STEPS)]


def _run(folder, on_device, record, loss=_summed, recorder=act.ContractRecorder, steps=STEPS):
    """A correct loop with a clip, the batches moved to the device as a
    loop's batch.to("cuda") does; returns (model, recorder, transfers)."""
    torch.manual_seed(0)
    model = _Net()
    if on_device:
        fake_device.to_device(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = _data()[:K * steps]
    with fake_device.fake_device() if on_device else contextlib.nullcontext() as log:
        rec = recorder(model, opt, loss_fn=loss, count_fn=lambda b: len(b[1]), accumulation=K,
                       out=str(folder), quiet=True, coordinates=PER, clip=1.0) if record else None
        if log is not None:
            log.clear()  # the recorder's set-up (its sample's indices to the device) is once
        torch.manual_seed(1)
        it = iter(rec.watch(data) if rec is not None else data)
        for _ in range(steps):
            window = [next(it) for _ in range(K)]
            n_w = sum(len(b[1]) for b in window)
            for x, y in window:
                if on_device:
                    x, y = x.to(fake_device.DEVICE), y.to(fake_device.DEVICE)
                (loss(model, (x, y)) / n_w).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        if rec is not None:
            rec.close()
    return model, rec, log


def _host_bound(log, plain, rec, model, steps=STEPS):
    """What the recorder moved to the host beyond the plain loop's own
    transfers, against the documented law (docs/tiers.md "The recorder on
    a GPU"): no transfer larger than a row of the sample (d = sum_i
    min(n_i, PER) numbers: a tensor's sample, or a backward pass's row
    gathered on the device), and per step (calibrate_every >= K: at most
    one calibrated micro-batch a step) at most
      rows:        K backward passes and the consumed gradient, one
                   transfer of d numbers each; on the recompute path also
                   each g_j (K) and a float64 g_j (one);
      calibration: a sample per tensor (T transfers, d numbers);
      scalars:     per forward, whether its input is a drawn batch's copy
                   (1); per backward pass, the output's dot products (one
                   transfer of 2, then 1); per clip, the tensors' norms (one
                   transfer of T), its total and the bfloat16 count; per
                   step, whether the replay moved and its worst (2).
    Returns the violations (empty: the law holds)."""
    d, T = rec.coords.d, sum(1 for _ in model.parameters())
    mine = list((collections.Counter(log.d2h) - collections.Counter(plain.d2h)).elements())
    bad = ["%s of %d numbers: more than a row of the sample (d = %d)" % (what, n, d)
           for what, n in mine if n > d]
    rows = K + 1 + (K + 1 if rec.no_take else 0)
    law = (steps * (rows * d + d + K * 4 + T + 2 + 2),
           steps * (rows + T + K * 3 + 3 + 2))
    got = (sum(n for _, n in mine), len(mine))
    for what, n, most in zip(("numbers", "transfers"), got, law):
        if n > most:
            bad.append("%d %s to the host in %d steps, more than the law's %d" %
                       (n, what, steps, most))
    return bad


def _same_trace(a, b):
    return [f for f in ("meta.csv", "events.csv", "contract.csv", "values.csv")
            if not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False)]


def _certified(folder):
    from test_contract_scale import _certify
    judged = _certify(folder)
    if judged is not None:
        assert judged[0] == 0 and "PASS (contract tier)" in judged[1], judged[1]


def _check_path(tmp_path, loss):
    cpu_plain, _, _ = _run(tmp_path / "p", False, False, loss)
    cpu, _, _ = _run(tmp_path / "cpu", False, True, loss)
    dev_plain, _, plain_log = _run(tmp_path / "dp", True, False, loss)
    dev, rec, log = _run(tmp_path / "dev", True, True, loss)
    assert rec.abandoned is None, rec.abandoned
    # The device path computes what the CPU path computes: the same trace,
    # byte for byte, and the run untouched (the same bits with and without
    # the recorder, on the device and on the CPU).
    assert _same_trace(tmp_path / "cpu", tmp_path / "dev") == []
    for a, b, c, e in zip(cpu_plain.parameters(), cpu.parameters(), dev_plain.parameters(),
                          dev.parameters()):
        assert torch.equal(a, b) and torch.equal(a, fake_device.values(c)) and \
            torch.equal(a, fake_device.values(e))
    assert _host_bound(log, plain_log, rec, dev) == []
    _certified(tmp_path / "dev")
    return rec, plain_log


def test_on_a_device_the_recorder_moves_samples_never_a_parameter(tmp_path):
    """g_j read at the outputs of the forward your loop ran on the device;
    and the check can fail: a recorder that takes a whole gradient to the
    host (.cpu()) is named."""
    rec, plain_log = _check_path(tmp_path, _summed)
    assert not rec.no_take
    model, leaky, log = _run(tmp_path / "leaky", True, True, recorder=_Leaky, steps=1)
    bad = _host_bound(log, plain_log, leaky, model, steps=1)
    assert any(b.startswith("to of 9600 numbers: more than a row") for b in bad), bad


def test_a_recompute_runs_on_the_device(tmp_path):
    """The recompute path (and its float64 calibration) on the batch as
    the forward saw it, on the device."""
    rec, _ = _check_path(tmp_path, _penalised)
    assert rec.no_take


class _Leaky(act.ContractRecorder):
    """A recorder that copies each whole gradient to the host."""

    def _grad_hook(self, i):
        inner = super()._grad_hook(i)

        def hook(grad):
            grad.detach().cpu()
            return inner(grad)
        return hook

