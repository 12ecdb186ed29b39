"""The DDP side of the adapter without starting processes: multi-rank
bundles (each rank's shard; the epoch order DistributedSampler deals as
the scenario does), the merge of the ranks' parts, and the refusals."""
import torch
from torch.utils.data.distributed import DistributedSampler

from accumcheck_torch import Refused, load_bundle
from accumcheck_torch.distributed import (ContractDistributedRecorder, DistributedRecorder,
                                          merge_contract_parts, merge_parts)
from conftest import export

import pytest


@pytest.mark.calls_accumcheck
@pytest.mark.parametrize("scenario", ["certify-ddp", "certify-ddp-2"])
def test_distributed_sampler_deals_the_scenarios_shards(tmp_path, scenario):
    folder = export(tmp_path, scenario)
    b0 = load_bundle(folder, rank=0)
    for rank in range(b0.ranks):
        b = load_bundle(folder, rank=rank)
        for e in range(b.epochs):
            data = b.dataset(epoch=e)
            sampler = DistributedSampler(data, num_replicas=b.ranks, rank=rank, shuffle=False)
            drawn = [data[i][2] for i in sampler]
            shard = [s for w in b.windows(e) for m in w for s in m]
            assert drawn == shard


@pytest.mark.calls_accumcheck
def test_rank_outside_the_scenario_is_refused(tmp_path):
    with pytest.raises(Refused):
        load_bundle(export(tmp_path, "certify-ddp-2"), rank=2)


@pytest.mark.calls_accumcheck
def test_recorder_needs_a_process_group(tmp_path):
    b = load_bundle(export(tmp_path, "certify-ddp-2"), rank=0)
    model = b.model()
    opt = b.optimizer(model)
    with pytest.raises(Refused):
        DistributedRecorder(b, model, opt)


def _rows(rank, steps, reduces):
    events, values = [], []
    for s in range(steps):
        events.append("trainer,0,%d,0,forward_backward,4,0,,,,%d 1 2 3\n" % (s, rank))
        events += ["trainer,0,%d,-1,all_reduce,0,0,,,,\n" % s] * reduces
        events.append("trainer,0,%d,-1,optimizer_step,0,0,,0.1,,\n" % s)
        values.append("trainer,%d,grad,0.weight,0,%d\n" % (s, rank))
        values.append("trainer,%d,param,0.weight,0,%d\n" % (s, rank))
    return (rank, [("schema", "x"), ("notes", "n%d" % rank)], events, values)


def test_merge_interleaves_ranks_and_writes_the_collective_once():
    meta, events, values = merge_parts([_rows(1, 2, 1), _rows(0, 2, 1)])
    kinds = [(e.split(",")[4], e.rstrip("\n").split(",")[-1]) for e in events]
    assert kinds[:4] == [("forward_backward", "0"), ("forward_backward", "1"),
                         ("all_reduce", "-1"), ("optimizer_step", "0")]
    assert sum(k == "all_reduce" for k, _ in kinds) == 2
    # rank 0's gradient and every rank's parameters, step by step
    assert [v.split(",")[2] + v.rstrip("\n").split(",")[-1] for v in values] == \
        ["grad0", "param0", "param1"] * 2
    m = dict(meta)
    assert m["ranks"] == "2" and "rank 1: n1" in m["notes"] and "unseen" not in m


def test_merge_says_when_ranks_saw_different_all_reduces():
    meta, _, _ = merge_parts([_rows(0, 2, 1), _rows(1, 2, 2)])
    assert "different numbers of all-reduces" in dict(meta)["unseen"]


def test_merge_keeps_weights_read_only_where_every_rank_states_it():
    """weights_read (every weight read at the outputs) holds of the trace
    only where it holds of every rank's backward passes."""
    def with_read(rank, read):
        r, meta, events, values = _rows(rank, 1, 1)
        return r, meta + ([("weights_read", read)] if read else []), events, values
    for reads, kept in ((("float32", "float32"), True), (("float32", None), False),
                        ((None, "float32"), False), (("float32", "bfloat16"), False)):
        meta, _, _ = merge_parts([with_read(0, reads[0]), with_read(1, reads[1])])
        assert ("weights_read" in dict(meta)) == kept, reads


def test_contract_recorder_needs_a_process_group():
    model = torch.nn.Linear(2, 1)
    with pytest.raises(Refused):
        ContractDistributedRecorder(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                    lambda m, b: m(b).sum(), lambda b: len(b), accumulation=2)


def test_contract_merge_renumbers_over_the_ranks():
    """Micro-batch, backward and clip indices run over the ranks (rank 0's
    first); a coef row's 'q:b' becomes rank q's backward b; step and epoch
    indices stay per rank; every row ends in its rank."""
    part = ["micro,0,,0,0,5,2,,,\n", "micro,1,,0,0,4,2,,,\n",
            "backward,0,0,,0,,,0.5,1e-7,\n", "backward,1,1,,0,,,0.5,1e-7,\n",
            "epoch,0,,,,4,2,,,\n", "step,0,4,,,,,0.1,0,1\n",
            "coef,0,0:0,,,,,0.5,,1\n", "coef,0,0:1,,,,,0.5,,1\n",
            "coef,0,1:0,,,,,0.5,,1\n", "coef,0,1:1,,,,,0.5,,1\n",
            "replay,0,,,,,,0,,\n", "clip,0,0,,,,,1,0.3,1\n"]
    text = merge_contract_parts([(1, part), (0, part)])
    rows = text.splitlines()
    assert rows[0].endswith(",scale,rank")
    r1 = [r for r in rows[1:] if r.endswith(",1")]
    assert "micro,2,,0,0,5,2,,,,1" in r1 and "backward,3,3,,0,,,0.5,1e-7,,1" in r1
    assert [r.split(",")[2] for r in r1 if r.startswith("coef")] == ["0", "1", "2", "3"]
    assert "step,0,4,,,,,0.1,0,1,1" in r1 and "epoch,0,,,,4,2,,,,1" in r1
    assert "clip,1,0,,,,,1,0.3,1,1" in r1
