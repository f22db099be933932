"""Numba CPU kernels, one module per operator family."""
