"""accumcheck's recorder for JAX (optax, optax.MultiSteps, Flax NNX) and
Keras 3: it writes the contract trace that `accumcheck certify --contract`
judges, through the one trace writer (accumcheck_trace).  jax, optax, flax
and keras are imported only where used (scripts/venv-jax.sh makes
.venv-jax/ with requirements-jax.txt)."""

from accumcheck_trace import TRACE_SCHEMA, VERSION, Refused, exit_on_refusal_as

from .contract import ContractRecorder

exit_on_refusal = exit_on_refusal_as("accumcheck_jax")

__all__ = ["TRACE_SCHEMA", "VERSION", "ContractRecorder", "KerasRecorder", "Refused",
           "exit_on_refusal"]


def __getattr__(name):
    # KerasRecorder imports keras: only when asked for.
    if name == "KerasRecorder":
        from .keras_fit import KerasRecorder
        return KerasRecorder
    raise AttributeError("module 'accumcheck_jax' has no attribute %r" % name)
