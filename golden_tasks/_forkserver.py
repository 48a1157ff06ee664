"""Preloaded once by the isolation forkserver (golden_tasks.isolate): the work that every
kernel child would otherwise repeat, inherited by each fork instead."""
import os
import warnings

# The probe below imports torch.utils.cpp_extension, which asks torch.cuda.is_available(): asked of the
# CUDA driver, that marks every later fork of this process unable to use CUDA ("Cannot re-initialize CUDA
# in forked subprocess"); asked of NVML, as torch offers for processes that fork, it marks nothing.
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

import torch._inductor.cpu_vec_isa

from golden_tasks import reaper

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
