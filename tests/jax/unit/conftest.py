import subprocess

import pytest


def pytest_addoption(parser):
    parser.addoption("--accumcheck", default=None, help="the accumcheck command (certify)")


@pytest.fixture
def accumcheck(request):
    path = request.config.getoption("--accumcheck")
    if not path:
        pytest.skip("no --accumcheck given")
    return path


@pytest.fixture
def certify(accumcheck):
    """certify(folder): `accumcheck certify --contract` of the trace in
    folder, its CompletedProcess (returncode, stdout, stderr)."""
    def run(folder):
        return subprocess.run([accumcheck, "certify", "--contract", "--trace", str(folder)],
                              check=False, capture_output=True, text=True)
    return run
