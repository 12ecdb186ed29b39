"""schedule.Schedule's stated base lr (lr=) and Cadence: the table is
PyTorch's own scheduler built over an optimizer at the stated lr, stepped
as the cadence says."""

import pytest
import torch
from torch.optim import lr_scheduler as L

import accumcheck_torch as act
from accumcheck_torch.schedule import Cadence, Schedule

K = 4


def _opt(lr, momentum=0.9):
    return torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=lr, momentum=momentum)


def _torch_table(make, lr, rows):
    """The group-0 lr of make(optimizer at lr) after 0 .. rows-1 steps."""
    opt = _opt(lr)
    sched = make(opt)
    out = [opt.param_groups[0]["lr"]]
    for _ in range(rows - 1):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


MAKERS = {
    "step": lambda o: L.StepLR(o, step_size=2, gamma=0.5),
    "multistep": lambda o: L.MultiStepLR(o, milestones=[1, 4], gamma=0.3),
    "warmup": lambda o: L.LambdaLR(o, lambda s: min(1.0, (s + 1) / 3)),
    "cosine_floor": lambda o: L.CosineAnnealingLR(o, T_max=5, eta_min=0.01),
    "sequential": lambda o: L.SequentialLR(o, [L.LinearLR(o, 0.25, 1.0, 2),
                                               L.ExponentialLR(o, 0.9)], milestones=[2]),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_stated_lr_gives_the_scheduler_built_at_it(name):
    """An optimizer built at lr * K, its scheduler built over it: with
    lr=0.1 stated, every form's table is the scheduler's over an optimizer
    built at 0.1 (eta_min and other absolute values kept), not 4 x it."""
    make, rows = MAKERS[name], 9
    want = _torch_table(make, 0.1, rows)
    wrong = _torch_table(make, 0.1 * K, rows)
    assert wrong != want
    for form in ("object", "factory"):
        opt = _opt(0.1 * K)
        declared = make(opt) if form == "object" else make
        got = Schedule(declared, opt, K, lr=0.1).table(rows, 1)
        assert got == pytest.approx(want, rel=1e-15, abs=0), (form, got, want)
        # Not stated: the optimizer's own (the mistake baked in).
        opt = _opt(0.1 * K)
        declared = make(opt) if form == "object" else make
        assert Schedule(declared, opt, K).table(rows, 1) == pytest.approx(wrong, rel=1e-15)


def test_stated_lr_with_an_lr_lambda_and_refusals():
    f = lambda s: 1.0 / (s + 1)  # noqa: E731
    got = Schedule(f, _opt(0.4), K, lr=0.1).table(4, 1)
    assert got == pytest.approx([0.1 * f(n) for n in range(4)], rel=1e-15)
    opt = _opt(0.4)
    one = L.OneCycleLR(opt, max_lr=1.0, total_steps=5)
    with pytest.raises(act.Refused) as e:
        Schedule(one, opt, K, lr=0.1)
    assert e.value.code == 2 and "never reads the optimizer's" in str(e.value)
    with pytest.raises(act.Refused) as e:
        Schedule(f, _opt(0.4), K, lr=0)
    assert "expected both > 0" in str(e.value)


def test_cadence_steps_the_table_every_f_steps_or_epochs():
    make = MAKERS["step"]
    calls = _torch_table(make, 0.1, 6)
    opt = _opt(0.1)
    # Of interval "step" the table stays in scheduler.step() calls; the
    # frequency goes to meta.csv (certify steps the calls as it says).
    every2 = Schedule(Cadence(make(opt), "step", 2), opt, K)
    assert every2.table(6, 1) == calls and every2.frequency == 2
    opt = _opt(0.1)
    epochs = Schedule(Cadence(make, "epoch", 1, steps_per_epoch=3), opt, K).table(9, 1)
    assert epochs == [calls[n // 3] for n in range(9)]
    opt = _opt(0.4)
    both = Schedule(Cadence(make(opt), "epoch", 2, steps_per_epoch=2), opt, K, lr=0.1).table(9, 1)
    assert both == pytest.approx([calls[n // 4] for n in range(9)], rel=1e-15)
    for kw, text in (({"interval": "batch"}, "expected 'step' or 'epoch'"),
                     ({"frequency": 0}, "expected a whole number >= 1"),
                     ({"interval": "epoch"}, "needs the optimizer steps of an epoch")):
        with pytest.raises(act.Refused) as e:
            Cadence(make, **kw)
        assert text in str(e.value)


def test_recorder_states_the_base_lr(tmp_path):
    """ContractRecorder(schedule=scheduler, lr=...): schedule.csv holds the
    scheduler's lr at the stated base, meta's lr the stated lr."""
    import csv
    import os
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * K)
    sched = L.StepLR(opt, step_size=1, gamma=0.5)
    rec = act.ContractRecorder(model, opt, loss_fn=lambda m, b: m(b).sum(), count_fn=len,
                               accumulation=2, out=str(tmp_path / "t"), quiet=True,
                               schedule=sched, lr=0.1)
    for i, batch in enumerate(rec.watch([torch.randn(4, 3) for _ in range(4)])):
        (model(batch).sum() / 8).backward()
        if i % 2 == 1:
            opt.step()
            sched.step()
            opt.zero_grad()
    rec.close()
    with open(os.path.join(str(tmp_path / "t"), "schedule.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [float(r["lr"]) for r in rows[:3]] == [0.1, 0.05, 0.025]


def test_integrations_take_declarations_and_lightning_configs():
    """_common.Semantics passes a declaration through to the recorder; a
    Lightning config becomes a Cadence over the configured epoch's steps;
    what cannot be declared is refused (exit 2)."""
    from accumcheck_torch.integrations._common import Semantics, declaration
    make = MAKERS["step"]
    # 22 samples, micro-batches of 2: 11 per epoch, 3 optimizer steps.
    sem = Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=2, schedule=make, lr=0.1)
    assert sem.recorder_kwargs()["schedule"] is make and sem.recorder_kwargs()["lr"] == 0.1
    c = Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=2,
                  schedule={"scheduler": make, "frequency": 2}).schedule()
    assert isinstance(c, Cadence) and (c.interval, c.frequency, c.steps_per_epoch) == ("epoch", 2, 3)
    assert [c.calls(n) for n in range(7)] == [0, 0, 0, 0, 0, 0, 1]
    opt = _opt(0.1)
    plateau = L.ReduceLROnPlateau(opt)
    for bad, text in (({"kind": "linear"}, "expected the key 'scheduler'"),
                      ({"scheduler": make, "every": 2}, "unknown lr_scheduler config key(s) every"),
                      ({"scheduler": plateau}, "ReduceLROnPlateau follows a metric"),
                      ({"scheduler": make, "interval": "batch"}, "expected 'step' or 'epoch'")):
        with pytest.raises(act.Refused) as e:
            declaration(bad, 3)
        assert e.value.code == 2 and text in str(e.value), str(e.value)
    with pytest.raises(act.Refused) as e:
        Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=2, schedule=make, warmup=2)
    assert "the warmup is the scheduler's own" in str(e.value)
