"""The ranks' parts merged into one trace on rank 0 (docs/trace-format.md,
the `rank` column): merge_parts for the events, values and meta of every
rank recorder, merge_contract_parts for the contract tier's contract.csv."""

import itertools

from .write import CONTRACT_HEADER


# meta.csv keys a rank states of its own backward passes: the merged trace
# keeps one only where every rank states it alike (a rank whose weights
# were not all read at its outputs leaves certify the wider fit bound).
_EVERY_RANK = ("weights_read",)


def _fields(row, n):
    return row.rstrip("\n").split(",", n)


def merge_parts(parts):
    """Every rank's (rank, meta, events rows, values rows) -> one trace's
    (meta, events, values) with the rank column.

    Events: each step's rows (the `step` column) rank by rank in turn --
    each rank's i-th row of the step, then its (i+1)-th -- as accumcheck's
    own trainer writes them; an `all_reduce` once, as the collective (rank
    -1, from rank 0's part).  Values: rank 0's gradient and parameters,
    the other ranks' parameters.  meta: rank 0's, with every rank's notes
    and unseen, and whether the ranks saw the same number of all-reduces;
    a key of _EVERY_RANK only where every rank's meta holds it alike."""
    parts = sorted(parts, key=lambda p: p[0])
    by_step = []  # per rank: {step: [rows]}
    steps = set()
    reduces = []
    for rank, _, events, _ in parts:
        d = {}
        n = 0
        for row in events:
            f = _fields(row, 5)
            d.setdefault(int(f[2]), []).append((f[4], row.rstrip("\n")))
            n += f[4] == "all_reduce"
        by_step.append((rank, d))
        reduces.append(n)
        steps.update(d)
    out_events = []
    for step in sorted(steps):
        lists = [(rank, d.get(step, [])) for rank, d in by_step]
        for row_set in itertools.zip_longest(*[rows for _, rows in lists]):
            for (rank, _), item in zip(lists, row_set):
                if item is None:
                    continue
                kind, row = item
                if kind == "all_reduce":
                    if rank == 0:
                        out_events.append(row + ",-1\n")
                else:
                    out_events.append("%s,%d\n" % (row, rank))
    # Step by step: rank 0's gradient and parameters, then each other
    # rank's parameters.
    value_rows = {}
    for rank, _, _, values in parts:
        for row in values:
            f = _fields(row, 3)
            if rank == 0 or f[2] == "param":
                value_rows.setdefault((int(f[1]), rank), []).append(
                    "%s,%d\n" % (row.rstrip("\n"), rank))
    out_values = [row for key in sorted(value_rows) for row in value_rows[key]]
    metas = [dict(m) for _, m, _, _ in parts]
    meta = [(k, v) for k, v in parts[0][1] if k not in ("notes", "unseen")
            and (k not in _EVERY_RANK or all(m.get(k) == v for m in metas))]
    notes, unseen = [], []
    for rank, m, _, _ in parts:
        md = dict(m)
        for key, into in (("notes", notes), ("unseen", unseen)):
            if md.get(key):
                into.append(md[key] if len(parts) == 1 else "rank %d: %s" % (rank, md[key]))
    if len(set(reduces)) > 1:
        unseen.append("the ranks saw different numbers of all-reduces (%s): a collective "
                      "the recorder did not see" % ", ".join(
                          "rank %d: %d" % (p[0], n) for p, n in zip(parts, reduces)))
    meta.append(("ranks", str(len(parts))))
    if notes:
        meta.append(("notes", " | ".join(notes)))
    if unseen:
        meta.append(("unseen", " | ".join(unseen)))
    return meta, out_events, out_values


def merge_contract_parts(parts):
    """Every rank's (rank, contract.csv rows) -> one contract.csv with the
    rank column: micro-batch, backward and clip indices renumbered over
    the ranks (rank 0's first), a coef row's 'q:b' made rank q's
    backward b's index; step and epoch indices stay per rank."""
    parts = sorted(parts, key=lambda p: p[0])
    offsets, at = {}, [0, 0, 0]  # micro, backward, clip
    for rank, rows in parts:
        offsets[rank] = list(at)
        for row in rows:
            kind = row.split(",", 1)[0]
            if kind in ("micro", "backward", "clip"):
                at[("micro", "backward", "clip").index(kind)] += 1
    out = []
    for rank, rows in parts:
        om, ob, oc = offsets[rank]
        for row in rows:
            f = row.rstrip("\n").split(",")
            if f[0] == "micro":
                f[1] = str(int(f[1]) + om)
            elif f[0] == "backward":
                f[1], f[2] = str(int(f[1]) + ob), str(int(f[2]) + om)
            elif f[0] == "clip":
                f[1] = str(int(f[1]) + oc)
            elif f[0] == "coef" and ":" in f[2]:
                q, b = f[2].split(":")
                f[2] = str(offsets[int(q)][1] + int(b))
            out.append(",".join(f) + ",%d\n" % rank)
    # Every rank's micro-batches and backward passes before any step's
    # rows: a coef row may name another rank's backward.
    first = [r for r in out if r.startswith(("micro,", "backward,"))]
    rest = [r for r in out if not r.startswith(("micro,", "backward,"))]
    return CONTRACT_HEADER + ",rank\n" + "".join(first + rest)
