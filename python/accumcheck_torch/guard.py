"""The contract recorder's one rule for its own errors: they end the
recording, never the run it records."""

import functools

from .trace import Refused


def _never_raises(method):
    """A recorder method your run calls into (a hook, the loader's
    iteration, the optimizer's step): an error of the recorder's own ends
    the recording (the trace's marker says why, certify refuses it) and
    never reaches your training, which goes on untouched.  A Refused (a
    misuse the recorder names) still reaches you."""
    @functools.wraps(method)
    def run(self, *a, **k):
        if self.abandoned:
            return None
        try:
            return method(self, *a, **k)
        except Refused:
            raise
        except Exception as e:  # noqa: BLE001 -- the run must go on
            self._failed(method.__name__, e)
            return None
    return run
