"""SHA-256 of trained parameters given as arrays (numpy or jax): each
one's dtype, shape and bytes, in order.  The JAX examples' --identity
(train_optax.py, train_keras.py) and bench/'s bit-identity checks compare
these digests of a run without the recorder and with it."""

import hashlib

import numpy as np


def digest(leaves):
    h = hashlib.sha256()
    for leaf in leaves:
        a = np.asarray(leaf)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()
