"""The FSDP recorders' refusals that need no ranks (the rest, made on 2
gloo ranks by examples/systems/fsdp.py --setup/--loop, are the
PyTorch.systems.fsdp* CTest cases), and the module split: fsdp.py on top
of distributed.py, the names the docs published still imported from it."""
import ast

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


def test_distributed_imports_none_of_the_recorders_on_top_of_it():
    """Layers look down: distributed.py's imports (any, at any depth; the
    re-export names its module in a table, not an import statement)."""
    tree = ast.parse(open(distributed.__file__).read())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.split(".")[-1] in ("fsdp", "pipelining", "deepspeed")
                and "torch.distributed" not in m], imported
