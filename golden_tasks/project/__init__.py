"""The project and this machine: a project's layout and settings (layout, config), what its code reads
(observe, fingerprint), the toolchain and machine every key holds (toolchain), and the process mechanics
kernels run under (sandbox: confinement; reaper: process trees).

Imports: model, storage.
"""
