"""A jitted JAX MLP for `cold-start`: XLA compiles it at its first call and autotunes its bf16 GEMMs.

    cublaslt-probe cold-start -- python scripts/coldstart_programs/jax_prog.py
"""
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to the other users

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


def mlp(x, w1, b1, w2):
    return jax.nn.gelu(x @ w1 + b1) @ w2 + x


def make_step():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(k[0], (4096, 2048), jnp.bfloat16)
    w1 = jax.random.normal(k[1], (2048, 8192), jnp.bfloat16) * 0.02
    b1 = jnp.zeros((8192,), jnp.bfloat16)
    w2 = jax.random.normal(k[2], (8192, 2048), jnp.bfloat16) * 0.02
    jax.block_until_ready((x, w1, b1, w2))
    f = jax.jit(mlp)

    def step():
        f(x, w1, b1, w2).block_until_ready()
    return step
