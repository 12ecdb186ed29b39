"""The recorder sees every call style; the bundle maps a user's module."""
import csv
import os

import pytest
import torch
from torch.nn.utils import clip_grad_norm_  # imported before any Recorder exists

import accumcheck_torch as act

PYTORCH_CLIP_CODE = clip_grad_norm_.__code__  # what closing a recorder must restore


def events(folder):
    with open(os.path.join(folder, "events.csv"), newline="") as f:
        return list(csv.DictReader(f))


def meta(folder):
    with open(os.path.join(folder, "meta.csv"), newline="") as f:
        return {r["key"]: r["value"] for r in csv.DictReader(f)}


def session(bundle_dir, tmp_path, model=None, names=None):
    b = act.load_bundle(bundle_dir)
    net = b.model() if model is None else model
    if model is not None:
        b.load_initial(net, names)
    opt = b.optimizer(net)
    sched = b.scheduler(opt)
    rec = act.Recorder(b, net, opt, sched, out=str(tmp_path / "trace"), names=names, quiet=True)
    return b, net, opt, sched, rec


def kinds(folder):
    return [e["event"] for e in events(folder)]


def test_backward_call_styles_are_all_seen(mlp_bundle, tmp_path):
    b, net, opt, sched, rec = session(mlp_bundle, tmp_path)
    (x, y), (x2, y2), (x3, y3) = b.micro_batches(0)[:3]
    b.loss_mean(net(x), y).backward()
    torch.autograd.backward(b.loss_mean(net(x2), y2))
    torch.autograd.backward([b.loss_mean(net(x3), y3)], [torch.tensor(1.0)])
    opt.step()
    rec.close()
    ev = events(str(tmp_path / "trace"))
    fb = [e for e in ev if e["event"] == "forward_backward"]
    assert len(fb) == 3
    assert [e["micro"] for e in fb] == ["0", "1", "2"]
    assert fb[0]["sample_ids"] == " ".join(str(i) for i in b.windows(0)[0][0])
    step = [e for e in ev if e["event"] == "optimizer_step"]
    assert len(step) == 1 and step[0]["micro"] == "-1"


def test_clip_imported_by_name_before_the_recorder_is_seen(mlp_bundle, tmp_path):
    b, net, opt, sched, rec = session(mlp_bundle, tmp_path)
    x, y = b.micro_batches(0)[0]
    b.loss_mean(net(x), y).backward()
    norm = clip_grad_norm_(net.parameters(), 1e-3)
    opt.step()
    rec.close()
    clips = [e for e in events(str(tmp_path / "trace")) if e["event"] == "clip"]
    assert len(clips) == 1
    assert float(clips[0]["grad_norm"]) == pytest.approx(float(norm), rel=1e-7)
    assert "notes" not in meta(str(tmp_path / "trace"))
    # clip_grad_norm_ is itself again once the recorder is closed.
    assert clip_grad_norm_.__code__ is PYTORCH_CLIP_CODE


def test_a_clip_the_recorder_did_not_see_is_inferred_and_said(mlp_bundle, tmp_path):
    b, net, opt, sched, rec = session(mlp_bundle, tmp_path)
    x, y = b.micro_batches(0)[0]
    b.loss_mean(net(x), y).backward()
    with torch.no_grad():  # a hand-written clip
        for p in net.parameters():
            p.grad.mul_(0.25)
    opt.step()
    rec.close()
    folder = str(tmp_path / "trace")
    assert "clip" in kinds(folder)
    assert "clip inferred from the values" in meta(folder)["notes"]


def test_a_gradient_change_that_is_no_scaling_is_unseen(mlp_bundle, tmp_path):
    b, net, opt, sched, rec = session(mlp_bundle, tmp_path)
    x, y = b.micro_batches(0)[0]
    b.loss_mean(net(x), y).backward()
    with torch.no_grad():
        next(net.parameters()).grad.add_(1.0)
    opt.step()
    rec.close()
    assert "unseen" in meta(str(tmp_path / "trace"))


def test_eval_forward_and_zero_grad_by_hand(mlp_bundle, tmp_path):
    b, net, opt, sched, rec = session(mlp_bundle, tmp_path)
    (x, y), (x2, y2) = b.micro_batches(0)[:2]
    b.loss_mean(net(x), y).backward()
    opt.step()
    for p in net.parameters():
        p.grad = None  # zeroing by hand
    with torch.no_grad():
        net(x2)  # evaluation
    b.loss_mean(net(x2), y2).backward()
    rec.close()
    folder = str(tmp_path / "trace")
    assert kinds(folder) == ["forward_backward", "optimizer_step", "zero_grad", "forward_backward"]
    notes = meta(folder)["notes"]
    assert "zeroed without a zero_grad() call" in notes and "under no_grad" in notes


class Net(torch.nn.Module):
    def __init__(self, d_in, hidden, d_out):
        super().__init__()
        self.encoder = torch.nn.Linear(d_in, hidden)
        self.head = torch.nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.head(torch.tanh(self.encoder(x)))


def test_own_module_is_mapped_by_order_and_shape(mlp_bundle, tmp_path):
    b = act.load_bundle(mlp_bundle)
    net = Net(b.d_in, b.widths[1], b.d_out)
    mapping = b.load_initial(net)
    assert [m for m, _ in mapping.values()] == ["encoder.weight", "encoder.bias",
                                                "head.weight", "head.bias"]
    ref = b.model()
    x, _ = b.micro_batches(0)[0]
    assert torch.equal(net(x), ref(x))


def test_a_module_that_does_not_fit_is_refused_with_a_table(mlp_bundle, tmp_path, capsys):
    b = act.load_bundle(mlp_bundle)
    wrong = Net(b.d_in, b.widths[1] + 1, b.d_out)
    with pytest.raises(act.Refused) as e:
        b.load_initial(wrong)
    assert e.value.code == 2
    text = str(e.value)
    assert "scenario tensor" in text and "model parameter" in text
    assert "0.weight [8, 4]" in text and "encoder.weight [9, 4]" in text


def test_explicit_name_map(mlp_bundle, tmp_path):
    class Swapped(Net):  # head registered first: order alone cannot map it
        def __init__(self, d_in, hidden, d_out):
            torch.nn.Module.__init__(self)
            self.head = torch.nn.Linear(hidden, d_out)
            self.encoder = torch.nn.Linear(d_in, hidden)
    b = act.load_bundle(mlp_bundle)
    net = Swapped(b.d_in, b.widths[1], b.d_out)
    with pytest.raises(act.Refused):
        b.load_initial(net)
    names = {"encoder.weight": "0.weight", "encoder.bias": "0.bias",
             "head.weight": "2.weight", "head.bias": "2.bias"}
    b.load_initial(net, names)
    x, _ = b.micro_batches(0)[0]
    assert torch.equal(net(x), b.model()(x))


def test_dataset_items_carry_their_sample_id(mlp_bundle):
    b = act.load_bundle(mlp_bundle)
    ds = b.dataset()
    assert len(ds) == b.samples
    x, y, i = ds[7]
    assert i == 7 and torch.equal(x, b.x[7]) and torch.equal(y, b.y[7])


def test_own_dataloader_ids_and_epochs(mlp_bundle, tmp_path):
    b, net, opt, sched, rec = session(mlp_bundle, tmp_path)
    loader = torch.utils.data.DataLoader(b.dataset(), batch_size=b.micro_batch, shuffle=True,
                                         generator=torch.Generator().manual_seed(3))
    drawn = []
    for epoch in range(2):
        for x, y, ids in loader:
            drawn.append(ids.tolist())
            b.loss_mean(net(x), y).backward()
    rec.close()
    fb = [e for e in events(str(tmp_path / "trace")) if e["event"] == "forward_backward"]
    assert [[int(i) for i in e["sample_ids"].split()] for e in fb] == drawn
    per_epoch = len(drawn) // 2
    assert [int(e["epoch"]) for e in fb] == [0] * per_epoch + [1] * per_epoch


@pytest.mark.calls_accumcheck
def test_ranks_above_one_are_exported_per_rank(tmp_path, scenario_text):
    # Issue 12: DDP bundles; each rank loads its own view (test_distributed.py).
    text = scenario_text("certify-mlp").replace("epochs = 3", "epochs = 3\nranks = 2")
    binary = os.environ.get("ACCUMCHECK_BIN")
    if not binary:
        pytest.skip("ACCUMCHECK_BIN is not set")
    src = tmp_path / "ranks.toml"
    src.write_text(text)
    import subprocess
    r = subprocess.run([binary, "export", str(src), "--out", str(tmp_path / "b")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    b0, b1 = (act.load_bundle(str(tmp_path / "b"), rank=k) for k in (0, 1))
    assert b0.ranks == 2 and b0.order != b1.order


def test_the_adapter_refuses_a_rank_outside_the_bundle(mlp_bundle):
    with pytest.raises(act.Refused) as e:
        act.load_bundle(mlp_bundle, rank=1)
    assert e.value.code == 2 and "ranks = 1" in str(e.value)



def test_contract_compile_settings(tmp_path):
    """While a ContractRecorder lives, a torch.compile'd model's backward
    keeps its buffers (g_j is taken from the compiled forward with
    retain_graph) and inductor draws random numbers as eager PyTorch does
    (the float64 recompute replays dropout); close() restores both.
    Without them an inductor-compiled GPT with dropout gave a false PASS for
    a loop without /K (examples/contract/train.py --compile)."""
    import torch._functorch.config as fconf
    import torch._inductor.config as iconf
    before = (fconf.donated_buffer, iconf.fallback_random)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = act.ContractRecorder(model, opt, loss_fn=lambda m, b: m(b).sum(), count_fn=len,
                               accumulation=1, out=str(tmp_path / "trace"), quiet=True)
    assert (fconf.donated_buffer, iconf.fallback_random) == (False, True)
    for batch in rec.watch([torch.randn(4, 3)]):
        model(batch).sum().backward()
        opt.step()
        opt.zero_grad()
    rec.close()
    assert (fconf.donated_buffer, iconf.fallback_random) == before


def _schedule_rows(folder):
    with open(os.path.join(folder, "schedule.csv"), newline="") as f:
        return list(csv.DictReader(f))


def _contract_run(tmp_path, schedule, model=None, opt=None, steps=3, **kw):
    """A one-layer model trained `steps` windows of K = 2, its scheduler
    (when `schedule` is one) stepped after each optimizer step."""
    torch.manual_seed(0)
    model = model or torch.nn.Linear(3, 2)
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = schedule(opt) if callable(schedule) and getattr(schedule, "user", False) else None
    rec = act.ContractRecorder(model, opt, loss_fn=lambda m, b: m(b).sum(), count_fn=len,
                               accumulation=2, out=str(tmp_path / "trace"), quiet=True,
                               schedule=sched if sched is not None else schedule, **kw)
    data = [torch.randn(4, 3) for _ in range(2 * steps)]
    for i, batch in enumerate(rec.watch(data)):
        (model(batch).sum() / 8).backward()
        if i % 2 == 1:
            opt.step()
            if sched is not None:
                sched.step()
            opt.zero_grad()
    rec.close()
    return rec, opt, sched


def test_contract_schedule_forms_tabulate_the_same_lr(tmp_path):
    """An lr_lambda, a factory and the scheduler object give one table:
    PyTorch's own lr after 0, 1, 2, ... scheduler.step() calls, and the
    recorder never steps your scheduler or changes your optimizer's lr."""
    from torch.optim.lr_scheduler import LambdaLR
    f = lambda s: min(1.0, (s + 1) / 3)  # noqa: E731

    def user(opt):
        return LambdaLR(opt, f)
    user.user = True
    tables = []
    for i, form in enumerate((f, lambda opt: LambdaLR(opt, f), user)):
        rec, opt, sched = _contract_run(tmp_path / str(i), form)
        rows = _schedule_rows(str(tmp_path / str(i) / "trace"))
        assert meta(str(tmp_path / str(i) / "trace"))["schedule_kind"] == "table"
        # 6 micro-batches drawn, the loader's 6, one epoch, and the first.
        assert [int(r["calls"]) for r in rows] == list(range(6 + 6 + 1 + 2))
        assert all(r["lr_stretched"] == "" for r in rows)
        tables.append([float(r["lr"]) for r in rows])
        if sched is not None:
            # The loop stepped its scheduler 3 times, no more.
            assert sched.last_epoch == 3 and opt.param_groups[0]["lr"] == 0.1 * f(3)
    assert tables[0] == tables[1] == tables[2]
    assert tables[0][:4] == [0.1 * f(n) for n in range(4)]


def test_contract_schedule_scaled_factory_and_refusals(tmp_path):
    """A factory of (optimizer, scale) gives the stretched table too; a
    scheduler already stepped, or one over another optimizer, is refused
    (exit 2; lr= beside a scheduler: test_schedule.py); OneCycleLR's table ends where
    PyTorch refuses to step it."""
    from torch.optim.lr_scheduler import LambdaLR, OneCycleLR
    _contract_run(tmp_path / "s", lambda opt, scale: LambdaLR(opt, lambda s: s / (4 * scale)))
    rows = _schedule_rows(str(tmp_path / "s" / "trace"))
    assert [float(r["lr_stretched"]) for r in rows[:3]] == [0.0, 0.1 / 8, 0.2 / 8]
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stepped = LambdaLR(opt, lambda s: 1.0)
    opt.step()
    stepped.step()
    for bad, kw, text in ((stepped, {}, "stepped 1 times already"),
                          (LambdaLR(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1),
                                    lambda s: 1.0), {}, "another optimizer"),
                          (3, {}, "expected a dict of a named kind")):
        with pytest.raises(act.Refused) as e:
            act.ContractRecorder(model, opt, loss_fn=lambda m, b: m(b).sum(), count_fn=len,
                                 accumulation=2, out=str(tmp_path / "r"), quiet=True,
                                 schedule=bad, **kw)
        assert e.value.code == 2 and text in str(e.value)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    one = OneCycleLR(opt, max_lr=1.0, total_steps=3)

    def user(o):
        return one
    user.user = True
    _contract_run(tmp_path / "o", user, model=model, opt=opt)
    rows = _schedule_rows(str(tmp_path / "o" / "trace"))
    # PyTorch steps it up to total_steps calls and refuses the next.
    assert len(rows) == 4
