"""A JAX step that is the program's first use of JAX: its backend starts inside step 1 (for `cold-start`'s
preinit run, which starts it apart and times it).

    cublaslt-probe cold-start -- python scripts/coldstart_programs/jax_first_use_prog.py
"""
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to the other users

import jax.numpy as jnp  # noqa: E402


def step():
    x = jnp.ones((1024, 1024), jnp.float32)
    (x @ x).block_until_ready()
