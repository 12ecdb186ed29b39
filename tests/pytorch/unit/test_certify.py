"""certify on traces the recorder writes: what was not seen, pinned order."""
import os
import subprocess

import pytest
import torch

import accumcheck_torch as act
from conftest import export

pytestmark = pytest.mark.calls_accumcheck  # each test runs accumcheck (conftest.py)


def certify(bundle_dir, trace):
    return subprocess.run([os.environ["ACCUMCHECK_BIN"], "certify",
                           os.path.join(bundle_dir, "scenario.toml"), "--trace", trace],
                          capture_output=True, text=True)


def correct_loop(b, net, opt, sched, tweak=None, loader=None):
    for epoch in range(b.epochs):
        windows = b.windows(epoch)
        if loader is not None:
            batches = [ids.tolist() for _, _, ids in loader]
            windows = [batches[i:i + b.accumulation]
                       for i in range(0, len(batches), b.accumulation)]
        for window in windows:
            n_w = sum(len(ids) for ids in window)
            for ids in window:
                b.window_loss(net(b.x[ids]), b.y[ids], n_w).backward()
            if tweak:
                tweak(net)
            if b.clip:
                torch.nn.utils.clip_grad_norm_(net.parameters(), b.max_norm)
            opt.step()
            sched.step()
            opt.zero_grad()


def session(bundle_dir, trace):
    b = act.load_bundle(bundle_dir)
    net = b.model()
    opt = b.optimizer(net)
    sched = b.scheduler(opt)
    return b, net, opt, sched, act.Recorder(b, net, opt, sched, out=trace, quiet=True)


def test_a_failing_trace_with_something_unseen_exits_2_naming_it(mlp_bundle, tmp_path):
    trace = str(tmp_path / "trace")
    b, net, opt, sched, rec = session(mlp_bundle, trace)

    def shift(net):  # a gradient edit that is no clip
        with torch.no_grad():
            next(net.parameters()).grad.add_(1e-3)
    correct_loop(b, net, opt, sched, tweak=shift)
    rec.close()
    r = certify(mlp_bundle, trace)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "unseen" in r.stderr and "something other than a clip_grad_norm_" in r.stderr


def test_the_same_loop_without_the_edit_passes(mlp_bundle, tmp_path):
    trace = str(tmp_path / "trace")
    b, net, opt, sched, rec = session(mlp_bundle, trace)
    correct_loop(b, net, opt, sched)
    rec.close()
    r = certify(mlp_bundle, trace)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_pinned_order_fails_a_shuffling_loader_with_a_plain_message(tmp_path, scenario_text):
    text = scenario_text("certify-mlp").replace("seed = 21", "seed = 21\npinned_order = true")
    bundle_dir = export(tmp_path, "pinned", text)
    trace = str(tmp_path / "trace")
    b, net, opt, sched, rec = session(bundle_dir, trace)
    loader = torch.utils.data.DataLoader(b.dataset(), batch_size=b.micro_batch, shuffle=True,
                                         generator=torch.Generator().manual_seed(5))
    correct_loop(b, net, opt, sched, loader=loader)
    rec.close()
    r = certify(bundle_dir, trace)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the order differs from the one the scenario pins" in r.stdout
    # Unpinned, the same loader passes (judged on what it drew).
    bundle_free = export(tmp_path, "certify-mlp")
    trace2 = str(tmp_path / "trace2")
    b, net, opt, sched, rec = session(bundle_free, trace2)
    correct_loop(b, net, opt, sched, loader=loader)
    rec.close()
    r = certify(bundle_free, trace2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "order the trainer's own" in r.stdout
