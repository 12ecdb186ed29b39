"""The oracle-tier Recorder's sample ids: each grad-enabled forward's input
rows looked up in the bundle's data (the scenario's order first, where
identical rows are told apart by it, then by content), or told by the
loop (sample_ids), and the epoch's coverage they give (a mixin of
Recorder)."""

import torch


class SampleIds:
    def _key(self, row):
        return row.detach().cpu().contiguous().numpy().tobytes()

    def _sample_index(self):
        b = self.bundle
        index = {}
        for i in range(b.samples):
            index.setdefault(self._key(b.x[i]), []).append(i)
        return index

    def sample_ids(self, ids):
        """Tells the recorder the sample ids of the next micro-batch's
        forward explicitly (only needed when inputs are not the bundle's
        tensors, e.g. transformed on the fly)."""
        self._explicit = [int(i) for i in ids]

    def _covered(self):
        """Whether the current epoch has drawn all its samples but fewer
        than b (so a repeat starts the next epoch)."""
        b = self.bundle
        return len(self.epoch_ids) >= b.samples - (b.micro_batch - 1)

    def _expected(self):
        """The scenario's next micro-batch, if the trainer follows its order."""
        order = self.bundle.order
        e, k = self.epoch, self.epoch_micro
        if self._covered():
            e, k = e + 1, 0
        flat = [m for w in order[e] for m in w] if e < len(order) else []
        return flat[k] if k < len(flat) else None

    def _ids_of(self, x):
        explicit = getattr(self, "_explicit", None)
        if explicit is not None:
            self._explicit = None
            return explicit
        keys = [self._key(row) for row in x.to(self.bundle.x.dtype)]
        # Rows that several samples share (identical inputs) are told apart
        # by the scenario's order when the trainer follows it ...
        expected = self._expected()
        if expected is not None and len(expected) == len(keys):
            pool = list(expected)
            ids = []
            for key in keys:
                pick = next((i for i in pool if i in self._index.get(key, ())), None)
                if pick is None:
                    break
                pool.remove(pick)
                ids.append(pick)
            else:
                return ids
        # ... else by content, preferring samples not drawn yet this epoch.
        ids, used = [], set()
        for key in keys:
            cands = self._index.get(key)
            if not cands:
                return None
            fresh = [c for c in cands if c not in used]
            pick = next((c for c in fresh if c not in self.epoch_ids), fresh[0] if fresh else cands[0])
            if len(cands) > 1 and not all(torch.equal(self.bundle.y[c], self.bundle.y[cands[0]])
                                          for c in cands):
                self.ambiguous_ids += 1  # their targets differ: a guess
            used.add(pick)
            ids.append(pick)
        return ids
