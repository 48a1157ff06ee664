"""Preloaded once by the isolation forkserver (golden_tasks.isolate): the work that every
kernel child would otherwise repeat, inherited by each fork instead."""
import torch._inductor.cpu_vec_isa

# Loading an AOTInductor package probes the CPU's vector ISAs by compiling and running
# small programs (about 2 s); the result is cached per process.
torch._inductor.cpu_vec_isa.valid_vec_isa_list()
