"""tfm_jax: a JAX/Flax reproduction of "Attention Is All You Need" (Vaswani et al. 2017)."""

__version__ = "0.1.0"
