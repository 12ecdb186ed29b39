"""The recorder's training state beyond gradients (state.csv)."""
import csv
import os

import pytest
import torch
from torch.optim.swa_utils import AveragedModel

import accumcheck_torch as act

pytestmark = pytest.mark.calls_accumcheck  # each test runs accumcheck (conftest.py)


def rows(folder, kind=None):
    path = os.path.join(folder, "state.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if kind is None or r["kind"] == kind]


def meta(folder):
    with open(os.path.join(folder, "meta.csv"), newline="") as f:
        return {r["key"]: r["value"] for r in csv.DictReader(f)}


def test_an_unscale_by_the_loss_scale_is_no_clip(mlp_bundle, tmp_path):
    b = act.load_bundle(mlp_bundle)
    net = b.model()
    opt = b.optimizer(net)
    scale = {"s": 2.0 ** 10}
    out = str(tmp_path / "trace")
    rec = act.Recorder(b, net, opt, None, out=out, quiet=True, loss_scale=lambda: scale["s"])
    for x, y in b.micro_batches(0)[:2]:
        (b.loss_mean(net(x), y) * scale["s"]).backward()
    for p in net.parameters():
        p.grad.div_(scale["s"])
    opt.step()
    rec.close()
    m = meta(out)
    assert "unseen" not in m and "notes" not in m  # no inferred clip
    assert [float(r["value"]) for r in rows(out, "loss_scale")] == [1024.0, 1024.0]
    assert {r["run"] for r in rows(out)} == {"trainer"}  # the run column: rec.run


def test_an_overflowed_window_zeroed_without_a_step_is_skipped(mlp_bundle, tmp_path):
    b = act.load_bundle(mlp_bundle)
    net = b.model()
    opt = b.optimizer(net)
    out = str(tmp_path / "trace")
    rec = act.Recorder(b, net, opt, None, out=out, quiet=True)
    rec.loss_scale(2.0 ** 128)  # above float32's range: inf
    x, y = b.micro_batches(0)[0]
    (b.loss_mean(net(x), y) * 2.0 ** 128).backward()
    opt.zero_grad()
    rec.close()
    skipped = rows(out, "skipped")
    assert len(skipped) == 1 and skipped[0]["step"] == "0" and skipped[0]["index"] == "1"


def test_adam_state_ema_and_logged_loss_are_recorded(tmp_path, scenario_text):
    from conftest import export
    bundle = export(tmp_path, "certify-batchnorm")
    b = act.load_bundle(bundle)
    net = b.model()
    opt = b.optimizer(net)
    ema = AveragedModel(net, avg_fn=lambda a, p, n: 0.5 * a + 0.5 * p)
    out = str(tmp_path / "trace")
    rec = act.Recorder(b, net, opt, None, out=out, quiet=True, ema=ema, ema_decay=0.5)
    for x, y in b.micro_batches(0)[:3]:
        b.loss_mean(net(x), y).backward()
    opt.step()
    ema.update_parameters(net)
    rec.log_loss(0.25)
    rec.close()
    assert {r["value"] for r in rows(out, "opt_step")} == {"1"}
    # Adam's moments and the EMA: values.bin blocks (test_state_blocks.py).
    assert not rows(out, "exp_avg") and not rows(out, "ema")
    assert {r["value"] for r in rows(out, "num_batches_tracked")} == {"3"}
    update = rows(out, "ema_update")
    assert len(update) == 1 and update[0]["index"] == "1" and update[0]["value"] == "0"
    assert rows(out, "logged_loss")[0]["value"] == "0.25"
    assert meta(out)["ema_decay"] == "0.5"


def test_no_state_no_state_file(mlp_bundle, tmp_path):
    b = act.load_bundle(mlp_bundle)
    net = b.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    out = str(tmp_path / "trace")
    os.makedirs(out)
    open(os.path.join(out, "state.csv"), "w").write("stale\n")
    rec = act.Recorder(b, net, opt, None, out=out, quiet=True)
    x, y = b.micro_batches(0)[0]
    b.loss_mean(net(x), y).backward()
    opt.step()
    rec.close()
    assert not os.path.exists(os.path.join(out, "state.csv"))
