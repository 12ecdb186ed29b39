"""Per-element training state (Adam's moments, the EMA) as values.bin blocks.

A values.bin trace carries exp_avg, exp_avg_sq and ema as blocks of kinds
2-4 (state.csv keeps the scalars); a values.csv trace keeps them as
state.csv rows.  Both certify alike, a moment changed in either is caught
by the optimizer-state check, and malformed state blocks are refused with
the byte offset."""
import os
import re
import struct
import subprocess

import pytest
from torch.optim.swa_utils import AveragedModel

import accumcheck_torch as act
from test_certify import correct_loop
from test_state import rows
from test_values_bin import certify, corrupt, refused

pytestmark = pytest.mark.calls_accumcheck  # each test runs accumcheck (conftest.py)

KINDS = {0: "grad", 1: "param", 2: "exp_avg", 3: "exp_avg_sq", 4: "ema"}


def record(bundle_dir, trace, values):
    b = act.load_bundle(bundle_dir)
    net = b.model()
    opt = b.optimizer(net)
    sched = b.scheduler(opt)
    ema = AveragedModel(net, avg_fn=lambda a, p, n: 0.9 * a + 0.1 * p)
    rec = act.Recorder(b, net, opt, sched, out=trace, quiet=True, values=values,
                       ema=ema, ema_decay=0.9)
    orig = opt.step

    def step(*a, **k):
        out = orig(*a, **k)
        ema.update_parameters(net)
        return out
    opt.step = step
    correct_loop(b, net, opt, sched)
    rec.close()


def blocks(path):
    """[(kind name, step, byte offset of the block, of its values, values)]."""
    with open(path, "rb") as f:
        d = f.read()
    assert d[:8] == b"ACVALUES"
    version, width, n_tensors = struct.unpack_from("<III", d, 8)
    at, per_block = 20, 0
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<I", d, at)
        (k,) = struct.unpack_from("<Q", d, at + 4 + n)
        at += 12 + n
        per_block += k
    out = []
    while at < len(d):
        (n,) = struct.unpack_from("<I", d, at)
        step, _, kind = struct.unpack_from("<qqI", d, at + 4 + n)
        values = at + 4 + n + 20
        out.append((KINDS[kind], step, at, values, per_block))
        at = values + width * per_block
    return version, out


@pytest.fixture(scope="module")
def batchnorm_bin(tmp_path_factory):
    """certify-batchnorm's bundle and one values.bin trace of it, exported
    and recorded once for this module's tests, which only read them (an
    edit goes to a copy: corrupt())."""
    from conftest import export
    tmp = tmp_path_factory.mktemp("state_blocks")
    bundle = export(tmp, "certify-batchnorm")
    binary = str(tmp / "bin")
    record(bundle, binary, "bin")
    return bundle, binary


def test_state_tensors_go_to_values_bin_and_certify_as_csv_rows_do(tmp_path, batchnorm_bin):
    bundle, binary = batchnorm_bin
    text = str(tmp_path / "csv")
    record(bundle, text, "csv")
    version, bl = blocks(os.path.join(binary, "values.bin"))
    assert version == 2
    kinds = {k for k, *_ in bl}
    assert {"exp_avg", "exp_avg_sq", "ema"} <= kinds
    # state.csv keeps the scalars only; the CSV trace has the moments as rows.
    assert not rows(binary, "exp_avg") and not rows(binary, "ema")
    assert rows(binary, "opt_step") and rows(binary, "ema_update")
    n = bl[0][4]
    steps = sum(1 for k, *_ in bl if k == "param")
    assert len(rows(text, "exp_avg")) == n * steps
    assert len(rows(text, "ema")) == n * steps
    a, c = certify(bundle, binary), certify(bundle, text)
    assert a.returncode == 0 and c.returncode == 0, a.stdout + a.stderr + c.stdout + c.stderr
    assert "ok   optimizer state" in a.stdout and "ok   EMA" in a.stdout, a.stdout

    def lines(out):  # all but the timing line
        return [line for line in out.splitlines() if not line.startswith("certify: ")]
    assert lines(a.stdout) == lines(c.stdout.replace(text, binary))


def test_a_moment_changed_in_values_bin_fails_its_step(tmp_path, batchnorm_bin):
    bundle, binary = batchnorm_bin
    _, bl = blocks(os.path.join(binary, "values.bin"))
    # Step 1's exp_avg, its first value doubled.
    _, _, _, values, _ = next(b for b in bl if b[0] == "exp_avg" and b[1] == 1)

    def double_it(d):
        (v,) = struct.unpack_from("<f", d, values)
        struct.pack_into("<f", d, values, 2 * v if v else 1e-3)
        return d
    trace = corrupt(binary, tmp_path, double_it, "moment")
    junit = str(tmp_path / "moment.xml")
    r = certify(bundle, trace, "--junit", junit)
    assert r.returncode == 1, r.stdout + r.stderr
    # Judged with step 1 (its check "step 1 exp_avg"), the gradients and
    # parameters still correct's: the training state is the diagnosis.
    assert "FAIL: step 1 exp_avg: 1 of " in r.stdout, r.stdout
    assert "the gradients and parameters are correct's; the training state is not" in r.stdout, r.stdout
    # The moment outside the bound is not carried into step 2 (the oracle
    # steps from its own moments there): step 2's parameters and moments
    # pass, and step 1's exp_avg is the one check that fails.
    with open(junit) as f:
        failing = re.findall(r'name="([^"]*)">\s*<failure', f.read())
    assert failing == ["step 1 exp_avg"], failing
    # Judged on threads, each a range of steps: a range after the first
    # starts from the recorded moments before it as if found within the
    # bound, and is judged again where the range before found them not (6
    # threads: a range starts at step 2, after step 1's).  The same output
    # and JUnit for every count.
    def untimed(path):
        with open(path) as f:
            return re.sub(r' time="[^"]*"', "", f.read())
    for threads in (1, 2, 3, 6, 12):
        tj = str(tmp_path / ("threads%d.xml" % threads))
        t = certify(bundle, trace, "--threads", str(threads), "--junit", tj)
        assert t.returncode == 1, t.stdout + t.stderr
        assert t.stdout == r.stdout, (threads, t.stdout)
        assert untimed(tj) == untimed(junit), threads
    # Judged in two parts and merged: one certify's verdict and diagnosis,
    # with step 1 in the first part (the second checks it again, unreported,
    # before its range) or in the second.
    for m in (1, 2):
        parts = [str(tmp_path / ("part%d-%d.txt" % (m, k))) for k in (0, 1)]
        for rng, part in (("0:%d" % m, parts[0]), ("%d:" % m, parts[1])):
            p = certify(bundle, trace, "--steps", rng, "--part", part)
            assert p.returncode in (0, 1), p.stdout + p.stderr
        merged = subprocess.run([os.environ["ACCUMCHECK_BIN"], "certify-merge", *parts],
                                capture_output=True, text=True)
        assert merged.returncode == 1, merged.stdout + merged.stderr

        def verdict(out):
            return [line for line in out.splitlines()
                    if line.startswith(("FAIL", "PASS", "diagnosis", "the gradients"))]
        assert verdict(merged.stdout) == verdict(r.stdout), merged.stdout


def test_malformed_state_blocks_are_refused_with_the_byte_offset(tmp_path, batchnorm_bin):
    bundle, binary = batchnorm_bin
    _, bl = blocks(os.path.join(binary, "values.bin"))
    first = next(b for b in bl if b[0] == "exp_avg")
    second = next(b for b in bl if b[0] == "exp_avg" and b[1] != first[1])
    kind_at = lambda b: b[3] - 4  # noqa: E731  (the u32 before the values)

    def make_kind(b, k):
        def edit(d):
            struct.pack_into("<I", d, kind_at(b), k)
            return d
        return edit

    def make_step(b, s):
        def edit(d):
            struct.pack_into("<q", d, kind_at(b) - 16, s)
            return d
        return edit

    def version_1(d):
        struct.pack_into("<I", d, 8, 1)
        return d
    refused(bundle, corrupt(binary, tmp_path, make_kind(first, 5), "k5"),
            "values.bin:byte %d: kind: unknown kind 5" % kind_at(first))
    refused(bundle, corrupt(binary, tmp_path, make_step(second, first[1]), "dup"),
            "values.bin:byte %d: duplicated block: run 'trainer' step %d exp_avg"
            % (second[2], first[1]))
    refused(bundle, corrupt(binary, tmp_path, version_1, "v1"),
            "values.bin:byte %d: kind: unknown kind 2; expected 0 (grad) or 1 (param) "
            "in a version 1 file" % kind_at(first))
