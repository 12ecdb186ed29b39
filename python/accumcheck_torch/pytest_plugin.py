"""accumcheck's pytest plugin, registered by `pip install accumcheck` (the
`pytest11` entry point): a test records a trainer run and asserts that it
certifies.

    def test_my_trainer_accumulates_correctly(accumcheck):
        model, optimizer, loader = build()                    # your code
        rec = accumcheck.contract_recorder(model, optimizer, loss_fn=summed_loss,
                                           count_fn=items, accumulation=4)
        train(model, optimizer, rec.watch(loader))            # your loop
        rec.close()
        accumcheck.certify()          # AssertionError with the diagnosis on FAIL

The oracle tier (accumcheck's own models) works the same way:
`bundle = accumcheck.export("certify-mlp")`, `accumcheck.recorder(bundle, model,
optimizer, scheduler)`, then `accumcheck.certify(bundle)`.

On FAIL the assertion message is certify's report: the verdict, the pitfall
the trace matches (or "no modelled pitfall"), the step and its evidence.  Bad
input (a trace certify cannot judge: exit 2) fails the test with certify's
message, and so does a Refused the recorders raise (accumcheck_torch cannot
work with what the test gave it).  With pytest's --junitxml, certify's own JUnit file lands beside it,
in accumcheck/<test>.xml.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("accumcheck", "gradient accumulation certification")
    group.addoption("--accumcheck-bin", default=None,
                    help="the accumcheck command (default: $ACCUMCHECK_BIN, then accumcheck on PATH "
                         "or beside this Python)")
    group.addoption("--accumcheck-junit-dir", default=None,
                    help="where certify's JUnit files go (default: accumcheck/ beside --junitxml's file)")


def find_command(config=None):
    """The accumcheck command: --accumcheck-bin, $ACCUMCHECK_BIN, `accumcheck`
    on PATH, or the one installed beside this interpreter."""
    if config is not None and config.getoption("accumcheck_bin"):
        return config.getoption("accumcheck_bin")
    if os.environ.get("ACCUMCHECK_BIN"):
        return os.environ["ACCUMCHECK_BIN"]
    found = shutil.which("accumcheck")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "accumcheck")
    if os.access(beside, os.X_OK):
        return beside
    raise FileNotFoundError("the accumcheck command was not found: `pip install accumcheck` puts it on PATH; "
                            "or pass --accumcheck-bin or set ACCUMCHECK_BIN")


class CertifyResult:
    """One `accumcheck certify` run: exit code (0 PASS, 1 FAIL, 2 bad input),
    its report, the pitfall its diagnosis names (None when none), the JUnit
    file it wrote (None without one)."""

    def __init__(self, argv, returncode, stdout, stderr, junit):
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.junit = junit
        m = re.search(r"diagnosis: matches(?:, tied \(all within the bound\):)? ([^ \n]+)", stdout)
        self.pitfall = m.group(1) if m else None

    @property
    def passed(self):
        return self.returncode == 0

    def report(self):
        return (self.stdout + self.stderr).strip()


def _safe(nodeid):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_") or "test"


class Accumcheck:
    """The `accumcheck` fixture: a trace folder of this test's own, the
    recorders writing to it, and certify."""

    def __init__(self, request, tmp_path):
        self._config = request.config
        self._nodeid = request.node.nodeid
        self.tmp_path = tmp_path
        self.trace_dir = str(tmp_path / "trace")
        self.command = find_command(request.config)

    # ---- recording ----
    def export(self, scenario, out=None):
        """`accumcheck export SCENARIO`: the bundle folder for the oracle
        tier.  SCENARIO is a .toml path, or the name of one of accumcheck's
        scenarios (`accumcheck list`)."""
        out = out or str(self.tmp_path / "bundle")
        r = subprocess.run([self.command, "export", scenario, "--out", out, "--quiet"], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail("accumcheck export %s failed (exit %d):\n%s" % (scenario, r.returncode, r.stderr + r.stdout),
                        pytrace=False)
        return out

    def recorder(self, bundle, model, optimizer, scheduler=None, **kwargs):
        """accumcheck_torch.Recorder writing this test's trace."""
        from . import Recorder, load_bundle
        if isinstance(bundle, str):
            bundle = load_bundle(bundle)
        return Recorder(bundle, model, optimizer, scheduler, out=self.trace_dir, **kwargs)

    def contract_recorder(self, model, optimizer, **kwargs):
        """accumcheck_torch.ContractRecorder writing this test's trace."""
        from . import ContractRecorder
        return ContractRecorder(model, optimizer, out=self.trace_dir, **kwargs)

    # ---- judging ----
    def run_certify(self, bundle=None, trace=None, args=()):
        """Runs certify and returns its CertifyResult without asserting.
        bundle: the export folder (its scenario.toml) for the oracle tier;
        None for a contract-tier trace."""
        trace = trace or self.trace_dir
        argv = [self.command, "certify"]
        if bundle is not None:
            scenario = os.path.join(bundle, "scenario.toml") if os.path.isdir(bundle) else bundle
            argv.append(scenario)
        else:
            argv.append("--contract")
        argv += ["--trace", trace]
        junit = self._junit_path()
        if junit:
            os.makedirs(os.path.dirname(junit), exist_ok=True)
            argv += ["--junit", junit]
        argv += list(args)
        r = subprocess.run(argv, capture_output=True, text=True)
        return CertifyResult(argv, r.returncode, r.stdout, r.stderr, junit)

    def certify(self, bundle=None, trace=None, args=()):
        """Certifies the recorded trace and asserts PASS: on FAIL the
        AssertionError carries certify's report (verdict, pitfall,
        evidence); on bad input the test fails with certify's message."""
        __tracebackhide__ = True
        result = self.run_certify(bundle, trace, args)
        if result.returncode == 1:
            raise AssertionError("accumcheck certify: FAIL%s\n%s"
                                 % (" (matches %s)" % result.pitfall if result.pitfall else "", result.report()))
        if result.returncode != 0:
            pytest.fail("accumcheck certify could not judge the trace (exit %d):\n%s"
                        % (result.returncode, result.report()), pytrace=False)
        return result

    def _junit_path(self):
        folder = self._config.getoption("accumcheck_junit_dir")
        if not folder:
            xml = getattr(self._config.option, "xmlpath", None)
            if not xml:
                return None
            folder = os.path.join(os.path.dirname(os.path.abspath(xml)), "accumcheck")
        return os.path.join(folder, _safe(self._nodeid) + ".xml")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A Refused (accumcheck_torch cannot work with the test's input, e.g.
    a recorder given no loss_fn) that leaves a test fails it with the
    message alone, as the command line exits 2 with it.  The class is read
    from accumcheck_torch.trace only once that module is loaded (a test
    that never imported it cannot raise it): the plugin imports nothing."""
    try:
        return (yield)
    except Exception as e:
        trace = sys.modules.get("accumcheck_torch.trace")
        if trace is not None and isinstance(e, trace.Refused):
            __tracebackhide__ = True
            pytest.fail("accumcheck_torch refused: %s" % e.message, pytrace=False)
        raise


@pytest.fixture
def accumcheck(request, tmp_path):
    """Record a trainer run in this test and certify it: see
    accumcheck_torch.pytest_plugin."""
    return Accumcheck(request, tmp_path)
