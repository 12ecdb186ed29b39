"""The contract recorder's trace (ContractRecorder's write part): close()
and the files it writes through the one trace writer (trace.py)."""

import torch
from accumcheck_trace.trace import (  # noqa: F401 -- SCHEDULE_KEYS: contract.py's
    CONTRACT_HEADER,
    SCHEDULE_KEYS,
    contract_event_rows,
    contract_meta,
)

from .trace import VERSION, real, stopped_by, unseen_meta, write_trace


class Write:
    """close() and the trace's files (a mixin of ContractRecorder)."""

    def close(self):
        """Recomputes what is pending, restores the optimizer and
        clip_grad_norm_, and writes the trace (meta.csv, events.csv,
        values.csv, contract.csv, then the completion record complete.csv).
        Called while an exception propagates or is handled (a `with` block
        left by it, a `finally`, an `except`), it writes no trace: the run
        did not finish, and the folder's marker says so."""
        if self.closed:
            return
        if not self.abandoned:
            why = stopped_by()
            if why:
                self._abandon(why)
                return
        self._ema_poll()
        self._recompute_pending()
        self._unpatch()
        if self.optimizer is None:
            self._refuse("ContractRecorder.close: no optimizer was attached: pass it to "
                         "ContractRecorder(model, optimizer, ...) or call rec.attach(optimizer) "
                         "before its first step")
        self.optimizer.__dict__.pop("zero_grad", None)
        self.optimizer.__dict__.pop("step", None)
        if self._own_step is not None:
            self.optimizer.step = self._own_step
        rows = []
        for j, m in enumerate(self.micro):
            # ref: the unshifted label count (unshifted_count_fn), when given.
            rows.append("micro,%d,%s,%d,%d,%d,%d,,,%s\n" % (j, "" if m[8] is None else m[8],
                                                             m[0], m[1], m[2], m[3], real(m[7])))
        for b, rec in enumerate(self.backwards):
            w, resid = rec[3] if rec[3] is not None else (float("nan"), float("nan"))
            rows.append("backward,%d,%d,,%d,,,%s,%s,\n" % (b, rec[0], rec[1], real(w), real(resid)))
        for e, (n, bs) in enumerate(self.epochs):
            rows.append("epoch,%d,,,,%d,%d,,,\n" % (e, n, bs))
        rows += self.rows + self.ema_rows
        for i, (version, factor, norm, max_norm, shard, off) in enumerate(self.clips):
            # samples: the elements of the gradient it saw bfloat16 cannot hold.
            rows.append("clip,%d,%d,,,%s,%s,%s,%s,%s\n" % (
                i, version, "" if shard is None else real(shard), "" if off is None else off,
                real(factor), real(norm), real(max_norm)))
        precision = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                     torch.float16: "float16"}.get(self.compute_dtype, str(self.compute_dtype))
        meta = contract_meta(
            "pytorch", precision, "accumcheck_torch-%s torch-%s" % (VERSION, torch.__version__),
            self.K, self.items_kind, self.n, self.lr0, schedule=self.schedule,
            clip=self.clip_max, accept=self.accept) + self.coords.meta()
        if (self.compute_dtype == torch.bfloat16 and self.read_once
                and self.read_checks and not self.fits_recomputed and self.backwards
                and all(rec[3] is not None for rec in self.backwards)):
            # Every weight read at the outputs, where the float32 gradient
            # is rounded once (capture._rounded_once): certify reads them to
            # that (error model contract_weight_read_ulps).
            meta.append(("weights_read", "float32"))
        if self.clip_terms and not self.clip_lowp:
            meta.append(("clip_norm_terms", str(self.clip_terms)))
        if self.rng_in_backward:
            self.notes.append(
                "the backward of %d of %d micro-batches (the first: %d) drew random numbers from "
                "the CPU RNG after its forward: a recomputation that does not replay the "
                "forward's randomness (torch.utils.checkpoint with preserve_rng_state=False "
                "around dropout?), so that gradient is not of the forward's dropout masks"
                % (len(self.rng_in_backward), len(self.micro), self.rng_in_backward[0]))
        if self.notes:
            meta.append(("notes", " | ".join(self.notes)))
        if self.emas is not None:
            meta += [("ema", self.emas["kind"]), ("ema_decay", real(self.emas["decay"]))]
        bn = sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in self.model.modules())
        if bn:
            meta.append(("batchnorm", str(bn)))
        meta += unseen_meta(self.unseen)
        events = contract_event_rows(self.run, self.events, lambda j: self.micro[j][0])
        self._write(meta, events, rows)
        self._recording.done()

    def _extra_files(self):
        """The trace's files beside contract.csv: schedule.csv for a
        declared scheduler."""
        return {} if self.declared is None else {
            "schedule.csv": self.declared.csv(self._schedule_rows())}

    def _write(self, meta, events, rows):
        write_trace(self.out, meta, events, [],
                    extra=dict(self._extra_files(),
                               **{"contract.csv": CONTRACT_HEADER + "\n" + "".join(rows)}))
