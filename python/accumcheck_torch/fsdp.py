"""accumcheck inside an FSDP trainer (the contract tier, gloo on CPU).

    model = fully_shard(MyNet(), mesh=mesh)   # FSDP2 (FSDP1: FullyShardedDataParallel,
                                              # use_orig_params=True, ContractFSDP1Recorder)
    recorder = ContractFSDPRecorder(model, optimizer, summed_loss, items, accumulation=K,
                                    out="trace/")
    for batch in recorder.watch(loader): ...  # your loop, unchanged
    recorder.close()                          # every rank; rank 0 writes trace/
    accumcheck certify --contract --trace trace/

The sharding recorders are ContractDistributedRecorder (distributed.py)
with what FSDP hides seen: each backward's whole local gradient from hooks
on the unsharded parameters (FSDP2) or FlatParameters (FSDP1), each rank's
step fit on its own shard of the consumed gradient (_ShardFit), each
weight read at the forward's outputs with no copy of the model and
nothing recomputed (_FromOutputs; both mixins in sharded.py), each
reduce-scatter counted as the step's gradient collective.  docs/memory-systems.md says what each
refuses.

These classes lived in accumcheck_torch.distributed, which the docs named;
`from accumcheck_torch.distributed import ContractFSDPRecorder` (and
ContractFSDP1Recorder) keeps working through a lazy re-export there.
"""

import torch
from torch.distributed.tensor import DTensor

from .distributed import ContractDistributedRecorder
from .sample import Coordinates
from .sharded import _FromOutputs, _ShardFit, _Whole
from .trace import Refused


class ContractFSDPRecorder(_ShardFit, _FromOutputs, ContractDistributedRecorder):
    """The contract tier's recorder for one rank of an FSDP2 trainer
    (torch.distributed.fsdp.fully_shard, gloo on CPU): ContractRecorder's
    arguments, with `model` the fully_shard'ed root module (`replica`,
    which older scripts pass: accepted and unused, a FutureWarning).

    What FSDP2 hides and how it is seen:
      - each backward's gradient: FSDP2 computes it on the unsharded
        parameters (each FSDPParam's unsharded nn.Parameter, made at the
        first all-gather) and writes only the reduce-scattered shard into
        the sharded parameter's .grad; the recorder hooks the unsharded
        parameters after the first forward, so c_b is this rank's whole
        local gradient (as under DDP, before any communication);
      - the gradient a step consumes: this rank's shard of the sharded
        .grad (to_local), fitted over every rank's backward passes
        restricted to it (_ShardFit);
      - the optimizer steps on shards: the replay steps this rank's shards
        (to_local) with this rank's shard of the optimizer state;
      - each weight: read at the root's outputs (_FromOutputs), the
        premise checked on the loss's graph and, on the forwards the ranks
        calibrate, by a backward through FSDP's graph (_calibration_backward);
      - gradient sync: a backward whose FSDP parameter groups reduce
        (set_requires_gradient_sync left on) is a reduce-scatter, recorded
        as the step's gradient collective (an all_reduce event: averaged
        over the ranks as DDP's all-reduce is), so certify counts them."""

    def __init__(self, model, optimizer, loss_fn, count_fn, accumulation, replica=None, **kw):
        from torch.distributed.fsdp import FSDPModule
        if not isinstance(model, FSDPModule):
            raise Refused("ContractFSDPRecorder takes the fully_shard'ed root module; got %s"
                          % type(model).__name__)
        self._take_replica("ContractFSDPRecorder", replica)
        self.groups = [g for m in model.modules() if isinstance(m, FSDPModule)
                       for g in m._get_fsdp_state()._fsdp_param_groups]
        self.state_ctx = model._get_fsdp_state()._state_ctx
        self.unsharded = None  # each parameter's unsharded nn.Parameter, once made
        super().__init__(model, optimizer, loss_fn, count_fn, accumulation, **kw)
        self._setup_shards()

    def _shard_ranges(self):
        """Each parameter's shard on this rank: FSDP2's dim-0 chunk of the
        DTensor, as (first element in the flattened parameter, elements)."""
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        out = []
        for p in self.params:
            if not isinstance(p, DTensor) or any(type(pl) is not Shard or pl.dim != 0
                                                 for pl in p.placements):
                self._refuse("ContractFSDPRecorder: a parameter %s is not sharded on dim 0 "
                             "(placements %s): the recorder fits each rank's dim-0 shard; "
                             "record a run sharded over a 1-D mesh with fully_shard's default "
                             "placement, Shard(0) (HSDP's replicated dimension, another dim from "
                             "shard_placement_fn, or a parameter left unsharded are not modelled)"
                             % (tuple(p.shape), getattr(p, "placements", "none")))
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                  p.placements)
            row = p.numel() // p.shape[0] if p.dim() and p.shape[0] else 0
            out.append((offset[0] * row if p.dim() else 0, p.to_local().numel()))
        return out

    def _full(self, t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    def _local(self, t):
        return t.to_local() if isinstance(t, DTensor) else t

    def _take_from_forward(self, j, pending, output):
        """Hooks the unsharded parameters once they exist (after the first
        forward), then reads the weight at the outputs (_FromOutputs)."""
        if self.unsharded is None:
            self.unsharded = [None] * len(self.params)
            index = {id(p): i for i, p in enumerate(self.params)}
            for g in self.groups:
                for fp in g.fsdp_params:
                    i = index.get(id(fp.sharded_param))
                    if i is None or getattr(fp, "_unsharded_param", None) is None:
                        continue
                    self.unsharded[i] = fp._unsharded_param
                    self._hooks.append(fp._unsharded_param.register_hook(self._grad_hook(i)))
        super()._take_from_forward(j, pending, output)

    def _all_params(self):
        return list(self.params) + [p for p in self.unsharded or () if p is not None]

    def _can_calibrate(self):
        return any(p is not None for p in self.unsharded or ())

    def _autograd_params(self):
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [("the unsharded parameter of %s" % names.get(id(p), tuple(p.shape)), u)
                for p, u in zip(self.params, self.unsharded or ()) if u is not None]

    def _calibration_backward(self, pairs):
        """The premise check's backward of s_j through your FSDP graph to
        the unsharded parameters, on every rank at the same forward
        (_FromOutputs): its unshards are the all-gathers FSDP's own
        backward makes, in the same order on every rank.  Around it no
        parameter group reduces (reduce_grads off: no reduce-scatter, a
        no_sync window's accumulated gradient untouched) and the backward
        is not the last (no finalize of FSDP's backward state); both
        restored.  Nothing is accumulated into any .grad (autograd.grad;
        the hooks keep the coordinates and hand on an empty gradient)."""
        inputs = [p for p in self.unsharded or () if p is not None]
        reduce = [g.reduce_grads for g in self.groups]
        last = self.state_ctx.is_last_backward
        try:
            for g in self.groups:
                g.reduce_grads = False
            self.state_ctx.is_last_backward = False
            torch.autograd.grad([t for t, _ in pairs], inputs,
                                grad_outputs=[sg for _, sg in pairs], retain_graph=True,
                                allow_unused=True)
        finally:
            for g, r in zip(self.groups, reduce):
                g.reduce_grads = r
            self.state_ctx.is_last_backward = last

    def _end_backward(self):
        if any(g.reduce_grads for g in self.groups):
            self.sync_pending = True
        super()._end_backward()


class ContractFSDP1Recorder(_ShardFit, _FromOutputs, ContractDistributedRecorder):
    """The contract tier's recorder for one rank of an FSDP1 trainer
    (torch.distributed.fsdp.FullyShardedDataParallel with
    use_orig_params=True; on CPU with device_id=torch.device("cpu") and
    gloo): ContractRecorder's arguments, with `model` the root
    FullyShardedDataParallel module (`replica`: accepted and unused).

    What FSDP1 hides and how it is seen:
      - each backward's gradient: FSDP1 computes it on each FlatParameter
        unsharded (its views are what the forward uses) and reduce-scatters
        it, or under no_sync() keeps it unsharded; the recorder hooks each
        FlatParameter, so c_b is this rank's whole local gradient of every
        parameter (the flat gradient cut by FSDP's own views, padding left
        out), before any communication;
      - the gradient a step consumes: this rank's shard of it (the
        original parameters' local .grad, each a slice of the flattened
        parameter: FSDP's _shard_param_infos), fitted over the backward
        passes restricted to that slice;
      - each weight: read at the outputs, the premise checked on the
        loss's graph and, on the calibrated forwards, by a backward of s_j
        through FSDP1's graph to the parameters' unsharded views
        (_calibration_backward), before any hook on a FlatParameter;
      - the optimizer steps the original parameters' local shards: the
        replay steps them with their own .grad and optimizer state;
      - gradient sync: a backward outside no_sync() reduce-scatters (the
        root's _sync_gradients at the backward's end), recorded as the
        step's gradient collective, so certify counts them;
      - clip: FSDP1's own model.clip_grad_norm_ (the whole gradient's
        norm, all-reduced: the right clip) is seen on the root module, as
        torch.nn.utils.clip_grad_norm_ is (on FSDP1's shards: each rank's
        shard's norm, ddp-clip-local-norm)."""

    def __init__(self, model, optimizer, loss_fn, count_fn, accumulation, replica=None, **kw):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from .contract import _Rows
        if not isinstance(model, FSDP):
            raise Refused("ContractFSDP1Recorder takes the root FullyShardedDataParallel "
                          "module; got %s" % type(model).__name__)
        handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]
        if not all(h._use_orig_params for h in handles):
            raise Refused("ContractFSDP1Recorder needs FullyShardedDataParallel(..., "
                          "use_orig_params=True): the optimizer must step the original "
                          "parameters the recorder replays")
        self._take_replica("ContractFSDP1Recorder", replica)
        self.fsdp = model
        super().__init__(model, optimizer, loss_fn, count_fn, accumulation, **kw)
        # The parameters are local shards: every row holds the whole
        # parameters' coordinates (their sizes from the FlatParameters), and
        # c_b comes from the FlatParameters' hooks, not the shards' (which
        # no backward reaches).
        numel = {id(p): n for h in handles
                 for p, n in zip(h.flat_param._params, h.flat_param._numels)}
        whole = [_Whole(numel[id(p)]) for p in self.params]
        self.n = sum(p.numel() for p in whole)
        self.coords = Coordinates(whole, self.coords.per_tensor, self.coords.seed)
        self.buf = _Rows(whole, self.K + 2, self.coords)
        self.vec = [torch.zeros(self.coords.d, dtype=torch.float64) for _ in range(4)]
        index = {id(p): i for i, p in enumerate(self.params)}
        for h in handles:
            hooks = [None if index.get(id(p)) is None else self._grad_hook(index[id(p)])
                     for p in h.flat_param._params]
            self._hooks.append(h.flat_param.register_hook(self._flat_hook(h, hooks)))
        self.handles = handles
        # Each forward's views of the unsharded FlatParameters (what the
        # wrapped modules compute with): the calibration's inputs.
        self.views, self.views_noted = {}, False
        self._hooks.append(model.register_forward_pre_hook(lambda *_: self.views.clear()))
        for m in FSDP.fsdp_modules(model):
            if m._handle is not None:
                self._hooks.append(m._fsdp_wrapped_module.register_forward_pre_hook(
                    self._views_hook(m, index)))
        self._setup_shards()
        orig = model.clip_grad_norm_

        def clip_grad_norm_(max_norm, *a, **k):
            norm, shard = self._clip_norms(self.params)
            total = orig(max_norm, *a, **k)
            self._clipped(min(1.0, float(max_norm) / (float(total) + 1e-6)), norm, shard,
                          float(max_norm))
            return total
        model.clip_grad_norm_ = clip_grad_norm_

    def _unpatch(self):
        self.fsdp.__dict__.pop("clip_grad_norm_", None)
        super()._unpatch()

    def _shard_ranges(self):
        """Each original parameter's shard on this rank: a slice of its
        flattened whole (FSDP1's _shard_param_infos), or nothing."""
        info = {}
        for h in self.handles:
            for p, si in zip(h.flat_param._params, h.flat_param._shard_param_infos):
                info[id(p)] = si
        out = []
        for p in self.params:
            si = info[id(p)]
            out.append((si.intra_param_start_idx, si.intra_param_end_idx - si.intra_param_start_idx
                        + 1) if si.in_shard else (0, 0))
        return out

    @staticmethod
    def _flat_hook(handle, hooks):
        def hook(grad):
            for f, view in zip(hooks, handle._get_unflat_views(grad)):
                if f is not None:
                    f(view)
            return None
        return hook

    def _all_params(self):
        return list(self.params) + [h.flat_param for h in self.handles]

    def _views_hook(self, state, index):
        """At a wrapped module's forward (FSDP1 has unsharded its
        FlatParameter): the tensors its parameters are in this forward,
        views of the FlatParameter, each with the recorder's index."""
        handle = state._handle

        def hook(module, args):
            if not torch.is_grad_enabled() or self.abandoned:
                return
            fp = handle.flat_param
            views = [(index[id(p)], getattr(info.module, info.param_name))
                     for p, info in zip(fp._params, fp._param_infos) if id(p) in index]
            self.views[handle] = (state, [(i, v) for i, v in views
                                          if v.requires_grad and v.grad_fn is not None])
        return hook

    def _can_calibrate(self):
        """Every FlatParameter that takes a gradient has its views from
        this forward (a wrapped module run without grad mode, as inside a
        reentrant activation checkpoint, has none: then no calibration)."""
        if not all(h.uses_sharded_strategy for h in self.handles):
            if not self.views_noted:
                self.views_noted = True
                self.notes.append(
                    "FSDP1: a FlatParameter not sharded (NO_SHARD, as FSDP1 makes it on one "
                    "rank): no forward is calibrated (the calibration's backward to its views "
                    "broke the run's own backward there, in testing); the premise stands on the "
                    "loss's graph")
            return False
        missing = [h for h in self.handles if h.flat_param.requires_grad and h not in self.views]
        if missing and not self.views_noted:
            self.views_noted = True
            self.notes.append(
                "FSDP1: a forward in which %d of the %d FlatParameters were not computed with "
                "under grad mode (a reentrant activation checkpoint?): such a forward is not "
                "calibrated; the premise stands on the loss's graph there"
                % (len(missing), len(self.handles)))
        return not missing and any(v for _, v in self.views.values())

    def _autograd_params(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        out = []
        for name, m in self.fsdp.named_modules():
            if isinstance(m, FSDP) and m._handle is not None:
                name = name.replace("_fsdp_wrapped_module.", "").replace("_fsdp_wrapped_module", "")
                fqns = m._handle.flat_param._fqns
                out.append(("the FlatParameter of %s (%s)" % (
                    name.strip(".") or "the root",
                    ", ".join(fqns[:2]) + (", ..." if len(fqns) > 2 else "")), m._handle.flat_param))
        return out

    def _calibration_backward(self, pairs):
        """The premise check's backward of s_j through FSDP1's graph, to
        the views of the unsharded FlatParameters this forward computed
        with (not to the FlatParameters: their AccumulateGrad never runs,
        so neither FSDP's post-backward hooks -- no reduce-scatter, no
        .grad touched -- nor any hook on a FlatParameter, yours or the
        recorder's).  The gradients there, g_j's, are what autograd hands
        a FlatParameter before any hook: a hook of yours that scales it
        then shows as c_b != w_b g_j.  FSDP1's pre-backward hooks on the
        outputs run as in your backward (unshards: all-gathers every rank
        makes, the same forward on every rank, _FromOutputs), except the
        root's queueing of the end-of-backward callback, which would
        remove the post-backward hooks your backward needs: FSDP's own
        flag for "queued" is set around it (and the root's reset of the
        gradients' state run here, as that hook would); each FlatParameter
        unsharded by it is resharded once its views' gradients are taken,
        as FSDP's post-backward does; every state restored after."""
        from torch.distributed.fsdp import _runtime_utils as fsdp_runtime
        root = self.fsdp
        states = [(st, st.training_state) for st in root._all_fsdp_states]
        handles = [(h, h._training_state, h._needs_pre_backward_unshard,
                    h._ran_pre_backward_hook, h._prefetched) for h in self.handles]
        sharded = {h for h in self.handles if h.needs_unshard()}
        queued = root._post_backward_callback_queued
        left = {h: len(v) for h, (_, v) in self.views.items()}
        owner = {st._handle: st for st in root._all_fsdp_states if st._handle is not None}
        inputs, removable = [], []

        def done(h):
            left[h] -= 1
            # Resharded in its pre-backward state (FSDP's post-backward one
            # would drop the forward's views your backward unshards into).
            if left[h] == 0 and h in sharded and not h.needs_unshard():
                fsdp_runtime._reshard(owner[h], h, True)

        def view_hook(h, take):
            def hook(grad):
                out = take(grad)  # the coordinates kept, an empty gradient handed on
                done(h)
                return out
            return hook

        for h, (_, views) in self.views.items():
            for i, v in views:
                inputs.append(v)
                removable.append(v.register_hook(view_hook(h, self._grad_hook(i))))
        try:
            root._post_backward_callback_queued = True
            fsdp_runtime._reset_flat_param_grad_info_if_needed(root._all_handles)
            torch.autograd.grad([t for t, _ in pairs], inputs,
                                grad_outputs=[sg for _, sg in pairs], retain_graph=True,
                                allow_unused=True)
        finally:
            for r in removable:
                r.remove()
            for h in self.handles:
                if h in sharded and not h.needs_unshard():
                    fsdp_runtime._reshard(owner[h], h, True)
            for st, t in states:
                st.training_state = t
            for h, t, need, ran, pre in handles:
                h._training_state, h._needs_pre_backward_unshard = t, need
                h._ran_pre_backward_hook, h._prefetched = ran, pre
            root._post_backward_callback_queued = queued
            self.views.clear()

    def _consumed(self):
        if any(p.grad is not None and p.grad.shape != p.shape for p in self.params):
            self._refuse(
                "rank %d: optimizer.step() on FSDP1 gradients that are still unsharded: the "
                "window's last backward ran under no_sync(), so nothing was reduce-scattered "
                "and the gradients do not fit the sharded parameters (PyTorch's optimizer "
                "fails on them with a size mismatch); run the window's last backward outside "
                "no_sync()" % self.rank)
        return [p.grad for p in self.params]

    def _end_backward(self):
        if self.fsdp._sync_gradients:
            self.sync_pending = True
        super()._end_backward()
