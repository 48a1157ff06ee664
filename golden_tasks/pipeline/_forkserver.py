# ruff: noqa: E402 -- the settings below come before the imports they govern
"""Preloaded once by the isolation forkserver (golden_tasks.forms.isolate): the work that every
kernel child would otherwise repeat, inherited by each fork instead. It ignores SIGINT
(reaper.sigint_ignored: a Ctrl-C is the caller's to handle, which kills this server and everything below it)."""
import os
import warnings

from golden_tasks.project import config, toolchain

# The probe below imports torch.utils.cpp_extension, which asks torch.cuda.is_available(): asked of the
# CUDA driver, that marks every later fork of this process unable to use CUDA ("Cannot re-initialize CUDA
# in forked subprocess"); asked of NVML, as torch offers for processes that fork, it marks nothing.
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

# Triton decides as it is imported whether its own library functions (tl.zeros, tl.sum) are interpreted, and
# the import below imports it (torch._inductor does): every fork inherits the mode, so it is this machine's.
toolchain.settle_triton_mode()

config.quiet_third_party_logs()  # before the import below loads torch's cpp_extension
import torch._inductor.cpu_vec_isa

import golden_tasks.model.compare
import golden_tasks.pipeline.graph

# What every child imports to run a stage (about 45 ms a child when each imported it again).
import golden_tasks.planning.case
import golden_tasks.stages.abi
import golden_tasks.stages.bench
import golden_tasks.stages.compile
import golden_tasks.stages.dispatch
import golden_tasks.stages.golden
import golden_tasks.stages.golden2
import golden_tasks.stages.golden_bench
import golden_tasks.stages.inputs
import golden_tasks.stages.inputs2
import golden_tasks.stages.validate
import golden_tasks.storage.tensors  # noqa: F401
from golden_tasks.project import reaper

# Orphans of the children (a daemon a kernel started) come here, where the caller finds and kills
# them (so the forkserver reaping them is expected); and the forkserver, with everything below
# it, ends with the process that started it.
reaper.own_tree_until_parent_dies()
warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")

# Loading an AOTInductor package probes the CPU's vector ISAs by compiling and running
# small programs (about 2 s); the result is cached per process. Only a warm-up: without a working
# compiler (a bad CXX) the child that needs one meets the failure and reports it for its case.
try:
    torch._inductor.cpu_vec_isa.valid_vec_isa_list()
except Exception:  # noqa: BLE001 -- see above
    pass
