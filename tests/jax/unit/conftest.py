import pytest


def pytest_addoption(parser):
    parser.addoption("--accumcheck", default=None, help="the accumcheck command (certify)")


@pytest.fixture
def accumcheck(request):
    path = request.config.getoption("--accumcheck")
    if not path:
        pytest.skip("no --accumcheck given")
    return path
