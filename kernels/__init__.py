"""Kernel modules: each defines a @jit kernel, its golden and its CASES."""
