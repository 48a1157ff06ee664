"""Kernel forms, and running a user's code: the KernelForm and Artifact contracts (base: a form is added by
subclassing them), the @jit and @cpp forms, kernels named by import path (untrusted), isolated calls in child
processes (isolate) and multi-rank calls (ranks).

Imports: model, storage, project.
"""
