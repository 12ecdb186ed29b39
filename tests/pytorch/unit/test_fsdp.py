"""The FSDP recorders' refusals that need no ranks (the rest, made on 2
gloo ranks by examples/systems/fsdp.py --setup/--loop, are the
PyTorch.systems.fsdp* CTest cases), and the module split: fsdp.py on top
of distributed.py, the names the docs published still imported from it."""
import ast
import contextlib

import pytest
import torch

from accumcheck_torch import Refused
from accumcheck_torch import distributed, fsdp


def _summed(model, batch):
    return model(batch[0]).sum()


@pytest.mark.parametrize("make, says", [
    (fsdp.ContractFSDPRecorder, "ContractFSDPRecorder takes the fully_shard'ed root module; got Sequential"),
    (fsdp.ContractFSDP1Recorder,
     "ContractFSDP1Recorder takes the root FullyShardedDataParallel module; got Sequential"),
])
def test_a_root_the_recorder_cannot_shard_is_refused(make, says, capsys):
    """A root module FSDP did not wrap (fully_shard on the blocks alone,
    FSDP1 on the blocks alone): refused by its type, before any collective
    (so no process group is needed to see it)."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(Refused) as e:
        make(net, opt, _summed, lambda b: 1, accumulation=2, replica=net)
    assert e.value.code == 2
    assert str(e.value) == says
    # An ordinary exception: nothing printed until a command line (or the
    # pytest plugin) reports it; the caller may catch it.
    assert says not in capsys.readouterr().err


def test_the_published_names_still_import_from_distributed():
    """docs/memory-systems.md published accumcheck_torch.distributed.
    ContractFSDPRecorder (and ContractFSDP1Recorder): the same classes."""
    from accumcheck_torch.distributed import ContractFSDP1Recorder, ContractFSDPRecorder
    assert ContractFSDPRecorder is fsdp.ContractFSDPRecorder
    assert ContractFSDP1Recorder is fsdp.ContractFSDP1Recorder
    with pytest.raises(AttributeError, match="ContractPipelineRecorder"):
        distributed.ContractPipelineRecorder  # never published there: pipelining.py's


@pytest.mark.parametrize("module", ["distributed", "rank_life", "merge_ranks", "launch"])
def test_distributed_imports_none_of_the_recorders_on_top_of_it(module):
    """Layers look down: distributed.py's imports and those of the modules
    it stands on (any, at any depth; the re-export names its module in a
    table, not an import statement)."""
    path = distributed.__file__.replace("distributed.py", module + ".py")
    tree = ast.parse(open(path).read())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.split(".")[-1] in ("fsdp", "pipelining", "deepspeed")
                and "torch.distributed" not in m], imported


def _one_rank_group():
    """A 1-rank gloo process group on a free local port (no spawn)."""
    import socket

    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)


def test_fsdp2_reads_each_weight_at_the_outputs_and_checks_the_premise(tmp_path):
    """On a 1-rank gloo group (no spawn): FSDP2's recorder keeps no
    replica (replica= accepted, a FutureWarning), reads every backward's
    weight at the outputs, runs the premise's backward through FSDP's
    graph on micro-batch 0 (its calibration in the trace) and leaves the
    training bit-identical to the unrecorded run."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    _one_rank_group()
    try:
        data = [(torch.randn(4, 8, generator=torch.Generator().manual_seed(i)),) for i in range(6)]

        def run(record):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
            mesh = init_device_mesh("cpu", (1,))
            for m in net:
                if isinstance(m, torch.nn.Linear):
                    fully_shard(m, mesh=mesh)
            fully_shard(net, mesh=mesh)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
            rec = None
            if record:
                with pytest.warns(FutureWarning, match="replica= is no longer used"):
                    rec = fsdp.ContractFSDPRecorder(net, opt, _summed, lambda b: 4, accumulation=3,
                                                    replica=torch.nn.Linear(1, 1),
                                                    out=str(tmp_path / "trace"))
            for w in range(0, 6, 3):
                for i, b in enumerate(data[w:w + 3]):
                    net.set_requires_gradient_sync(i == 2)
                    if rec is not None:
                        rec.mark(b)
                    (_summed(net, b) / 12).backward()
                opt.step()
                opt.zero_grad()
            if rec is not None:
                assert rec.mref is None and rec.abandoned is None
                assert all(b[3] is not None for b in rec.backwards)  # every weight read
                rec.close()
            return torch.cat([p.detach().to_local().reshape(-1) for p in net.parameters()])
        assert torch.equal(run(False), run(True))
        rows = (tmp_path / "trace" / "contract.csv").read_text().splitlines()
        cal = [r.split(",")[9] for r in rows if r.startswith("micro,")]
        assert cal[0] != "" and float(cal[0]) < 1e-5, cal  # the premise checked on micro-batch 0
        assert cal[1:] == [""] * 5, cal
    finally:
        dist.destroy_process_group()


def test_fsdp1_unsharded_is_not_calibrated_and_never_breaks_the_run(tmp_path):
    """On a 1-rank gloo group FSDP1 makes every FlatParameter NO_SHARD:
    there the calibration's backward to the views broke the run's own
    backward ("Output 0 of T is a view and its base ... has been modified
    inplace"), so the recorder does not calibrate (a note says so) and the
    training is bit-identical, every weight read at the outputs.  (The
    sharded calibration: PyTorch.systems.fsdp1.correct and .flat_hook.)"""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    _one_rank_group()
    try:
        data = [(torch.randn(4, 8, generator=torch.Generator().manual_seed(i)),) for i in range(6)]

        def run(record):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
            net = FSDP(net, device_id=torch.device("cpu"), use_orig_params=True,
                       auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}))
            opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
            rec = None
            if record:
                rec = fsdp.ContractFSDP1Recorder(net, opt, _summed, lambda b: 4, accumulation=3,
                                                 out=str(tmp_path / "trace"))
            for w in range(0, 6, 3):
                for i, b in enumerate(data[w:w + 3]):
                    if rec is not None:
                        rec.mark(b)
                    with net.no_sync() if i < 2 else contextlib.nullcontext():
                        (_summed(net, b) / 12).backward()
                opt.step()
                opt.zero_grad()
            if rec is not None:
                assert rec.abandoned is None
                assert all(b[3] is not None for b in rec.backwards)  # every weight read
                assert any("FSDP1: a FlatParameter not sharded (NO_SHARD" in n for n in rec.notes)
                rec.close()
            return torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        assert torch.equal(run(False), run(True))
    finally:
        dist.destroy_process_group()
