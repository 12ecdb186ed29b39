"""ContractRecorder's wiring (attach, epoch, mark, close, ema): what a
framework callback calls, and the misuses it refuses with exit 2."""
import csv
import os

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import accumcheck_torch as act
from accumcheck_torch import trace


def _setup(tmp_path, optimizer=True):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rec = act.ContractRecorder(model, opt if optimizer else None,
                               loss_fn=lambda m, b: m(b).sum(), count_fn=len,
                               accumulation=2, out=str(tmp_path / "trace"), quiet=True)
    return model, opt, rec


def _ended(folder):
    """Why the recording in `folder` ended, from its marker (no trace
    written: no meta.csv, no complete.csv)."""
    assert not os.path.exists(os.path.join(folder, "complete.csv"))
    with open(os.path.join(folder, "rank0.incomplete"), newline="") as f:
        rows = dict(csv.reader(f))
    assert rows["state"] == "ended", rows
    return rows["why"]


def _micro(model, rec, batch, mark=True):
    if mark:
        rec.mark(batch)
    model(batch).sum().backward()


def test_late_attach_and_mark_write_a_trace(tmp_path):
    model, opt, rec = _setup(tmp_path, optimizer=False)
    rec.epoch()
    for _ in range(2):
        _micro(model, rec, torch.randn(4, 3))
    assert rec.attach(opt) is opt and rec.attach(opt) is opt  # a callback may attach twice
    opt.step()
    opt.zero_grad()
    rec.close()
    rec.close()  # idempotent
    rows = open(tmp_path / "trace" / "contract.csv").read().splitlines()
    assert sum(r.startswith("micro,") for r in rows) == 2
    assert sum(r.startswith("step,") for r in rows) == 1


def test_a_step_before_attach_is_refused(tmp_path):
    model, opt, rec = _setup(tmp_path, optimizer=False)
    _micro(model, rec, torch.randn(4, 3))
    opt.step()  # unseen: no optimizer attached yet
    with pytest.raises(act.Refused) as e:
        rec.attach(opt)
    assert e.value.code == 2 and "rec.attach(optimizer)" in e.value.message
    assert rec.closed and _ended(tmp_path / "trace").startswith("the recorder refused: ")


def test_close_without_an_optimizer_is_refused(tmp_path):
    model, opt, rec = _setup(tmp_path, optimizer=False)
    _micro(model, rec, torch.randn(4, 3))
    with pytest.raises(act.Refused) as e:
        rec.close()
    assert "rec.attach(optimizer)" in e.value.message


def test_mark_inside_watch_and_a_second_optimizer_are_refused(tmp_path):
    model, opt, rec = _setup(tmp_path)
    with pytest.raises(act.Refused) as e:
        for b in rec.watch([torch.randn(4, 3)]):
            rec.mark(b)
    assert "use one or the other" in e.value.message
    model, opt, rec = _setup(tmp_path)
    with pytest.raises(act.Refused) as e:
        rec.attach(torch.optim.SGD(model.parameters(), lr=0.1))
    assert "already attached" in e.value.message


def test_context_manager_and_interpreter_exit(tmp_path):
    model, opt, rec = _setup(tmp_path)
    with rec:
        _micro(model, rec, torch.randn(4, 3))
        opt.step()
    assert rec.closed and os.path.exists(tmp_path / "trace" / "meta.csv")
    model, opt, rec = _setup(tmp_path / "b")
    _micro(model, rec, torch.randn(4, 3))
    opt.step()
    trace._at_exit()  # what atexit runs for a recorder nobody closed
    assert rec.closed and _ended(tmp_path / "b" / "trace").startswith(
        "the interpreter exited without the recorder's close()")
    # A `with` block left by an exception: no trace, the marker says which.
    model, opt, rec = _setup(tmp_path / "c")
    with pytest.raises(KeyboardInterrupt):
        with rec:
            _micro(model, rec, torch.randn(4, 3))
            opt.step()
            raise KeyboardInterrupt
    assert rec.closed and _ended(tmp_path / "c" / "trace") == "KeyboardInterrupt"
    assert "steps,1\n" in open(tmp_path / "c" / "trace" / "rank0.incomplete").read()
    # close() in a `finally` while an exception propagates: the same.
    model, opt, rec = _setup(tmp_path / "d")
    with pytest.raises(RuntimeError):
        try:
            raise RuntimeError("the trainer's own error")
        finally:
            rec.close()
    assert _ended(tmp_path / "d" / "trace") == "RuntimeError: the trainer's own error"
    # Refused is an ordinary exception: `except Exception` catches it.
    try:
        act.ContractRecorder(torch.nn.Linear(2, 2), None, loss_fn=None, count_fn=len, accumulation=2)
    except Exception as e:  # noqa: BLE001 -- what a user's handler catches
        assert isinstance(e, act.Refused) and "loss_fn=" in str(e)


def test_ema_declarations(tmp_path):
    model, opt, rec = _setup(tmp_path)
    avg = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.95))
    assert rec.ema(avg) is avg and rec.emas["decay"] == 0.95
    rec.close()
    model, opt, rec = _setup(tmp_path)
    with pytest.raises(act.Refused) as e:
        rec.ema(AveragedModel(model))  # SWA's running mean: no decay
    assert "decay=" in e.value.message
    model, opt, rec = _setup(tmp_path)
    with pytest.raises(act.Refused) as e:
        rec.ema([torch.zeros(2)], decay=0.9)
    assert "one tensor per model parameter" in e.value.message


def _leaky_epochs(tmp_path, weights):
    """A loop like Transformers 4.47's last fetch of an epoch: K=4, epoch 0
    draws one micro-batch and leaves its loader unfinished (no step, no
    zero_grad), epoch 1 draws the three of its epoch; the step after the
    fourth backward pass holds epoch 0's micro-batch 0 and epoch 1's
    micro-batch 0, the same batch at the same parameters, each divided by
    its own fetch group's count (weights[0] and weights[1])."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    x, y = torch.randn(6, 16), torch.randint(0, 8, (6,))
    loader = torch.utils.data.DataLoader(list(zip(x, y)), batch_size=2, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def summed(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1], reduction="sum")

    rec = act.ContractRecorder(model, opt, summed, lambda b: len(b[1]), accumulation=4,
                               out=str(tmp_path / "trace"), quiet=True)
    for epoch, (draw, w) in enumerate(zip((1, 3), weights)):
        for i, b in enumerate(rec.watch(loader)):
            (summed(model, b) * w).backward()
            if i + 1 == draw:
                break
    opt.step()
    rec.close()
    rows = [r.split(",") for r in open(tmp_path / "trace" / "contract.csv").read().splitlines()]
    step = next(r for r in rows if r[0] == "step")
    return [float(r[7]) for r in rows if r[0] == "coef"], float(step[8]) / float(step[9])


@pytest.mark.calls_accumcheck
@pytest.mark.parametrize("weights", [(1 / 2, 1 / 6), (1 / 2, 1 / 2), (1 / 3, 1 / 7)])
def test_a_batch_backwarded_twice_in_one_window_is_fitted_as_it_was(tmp_path, weights):
    """Two backward passes of one batch at the same parameters are one
    gradient: the consumed gradient fixes only their sum, and solving for
    the split divided float32 rounding by a Gram eigenvalue of ~1e-14
    (coefficients off 1 by percents, a step residual thousands of times
    its bound: certify refused the trace).  Each coefficient is 1: .grad
    held the four passes, nothing else; the residual is float32's."""
    coef, rel = _leaky_epochs(tmp_path, weights)
    assert len(coef) == 4
    assert max(abs(a - 1) for a in coef) < 1e-6, coef
    assert rel < 6 * 2.0 ** -24, rel  # (terms + contract_sum_ulps) u32
    binary = os.environ.get("ACCUMCHECK_BIN")
    if binary:
        import subprocess

        p = subprocess.run([binary, "certify", "--contract", "--trace", str(tmp_path / "trace")],
                           capture_output=True, text=True)
        assert p.returncode != 2 and "ok   step fit" in p.stdout, p.stdout + p.stderr


class _Segments(torch.nn.Module):
    """Every parameter but the first layer's inside reentrant checkpoints,
    and a loss with no parameter after them: the first gradient hooks of
    each backward fire inside a checkpoint's nested backward."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(3, 4)
        self.a = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        x = checkpoint(self.a, self.pre(x), use_reentrant=True)
        return checkpoint(self.b, x, use_reentrant=True)


def test_a_backward_through_nested_reentrant_checkpoints_is_one_pass(tmp_path):
    """One backward pass per micro-batch, each of its whole gradient: the
    pass ends with the outermost backward, not with the first checkpoint's
    nested one (which held b's gradient only)."""
    torch.manual_seed(0)
    model = _Segments()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = act.ContractRecorder(model, opt, loss_fn=lambda m, b: (m(b) ** 2).sum(), count_fn=len,
                               accumulation=2, out=str(tmp_path / "trace"), quiet=True)
    for _ in range(2):
        batch = torch.randn(4, 3)
        rec.mark(batch)
        ((model(batch) ** 2).sum() / 8).backward()
    opt.step()
    opt.zero_grad()
    rec.close()
    rows = [r.split(",") for r in open(tmp_path / "trace" / "contract.csv").read().splitlines()]
    passes = [r for r in rows if r[0] == "backward"]
    assert [int(r[2]) for r in passes] == [0, 1]  # one pass per micro-batch
    assert all(float(r[7]) == pytest.approx(1 / 8, rel=1e-6) for r in passes)  # each its whole g_j


def test_a_refusal_while_training_closes_the_recorder_without_a_trace(tmp_path):
    """A refusal raised from inside the loop (here: a backward before any
    batch was drawn) ends the recorder: nothing is left for the
    interpreter's exit to write, so no folder holds a trace to judge."""
    model, opt, rec = _setup(tmp_path)
    with pytest.raises(act.Refused) as e:
        model(torch.randn(4, 3)).sum().backward()
    assert e.value.code == 2 and "rec.watch(loader)" in e.value.message
    assert rec.closed and _ended(tmp_path / "trace").startswith("the recorder refused: a backward pass")
    trace._at_exit()  # what the interpreter's exit runs: nothing more
    assert not os.path.exists(tmp_path / "trace" / "meta.csv")
    assert _ended(tmp_path / "trace").startswith("the recorder refused: a backward pass")


def _env():
    """This environment, with the package under test importable."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(act.__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def test_a_refusal_on_the_command_line_exits_2_with_its_message(tmp_path):
    """exit_on_refusal, the examples' `__main__`: a Refused ends the process
    with exit 2 and its message, no traceback; anything else is left alone."""
    import warm_python
    script = tmp_path / "refused.py"
    script.write_text("import accumcheck_torch as act\n"
                      "def main():\n"
                      "    act.ContractRecorder(None, None, loss_fn=None, count_fn=None, accumulation=2)\n"
                      "act.exit_on_refusal(main)\n")
    # As `python refused.py`, in a fork of this process (warm_python.run_here).
    r = warm_python.run_here([str(script)], env=_env())
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("accumcheck_torch: ContractRecorder: pass loss_fn=") and "Traceback" not in r.stderr
    assert act.exit_on_refusal(lambda x: x + 1, 1) == 2


def test_the_pytest_plugin_fails_a_test_with_the_refusal(tmp_path):
    """A Refused leaving a test fails it with the message alone (the
    plugin's pytest_pyfunc_call); a test that expects it still catches it."""
    import warm_python
    (tmp_path / "test_user.py").write_text(
        "import pytest\n"
        "import accumcheck_torch as act\n"
        "def test_refused():\n"
        "    act.ContractRecorder(None, None, loss_fn=None, count_fn=None, accumulation=2)\n"
        "def test_caught():\n"
        "    with pytest.raises(act.Refused):\n"
        "        act.ContractRecorder(None, None, loss_fn=None, count_fn=None, accumulation=2)\n")
    # As `python -m pytest ...`, in a fork of this process (warm_python.run_here).
    r = warm_python.run_here(["-m", "pytest", "-q", "-p", "accumcheck_torch.pytest_plugin",
                              str(tmp_path / "test_user.py")], cwd=str(tmp_path), env=_env())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 1 passed" in r.stdout, r.stdout
    assert "accumcheck_torch refused: ContractRecorder: pass loss_fn=" in r.stdout, r.stdout
