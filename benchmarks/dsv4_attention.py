"""DeepSeek-V4 flagship cases: kernel against golden time (small profile), and the memory of
the flash profile's input generation, measured side by side in one run.

Small profile: each flagship case runs through `golden_tasks.run` in a
temporary cache, compiled by AOTInductor (and eagerly, for reference); the
medians of 100 timed rounds after 5 warmups are compared with the golden's.

Flash profile: each case's In/InOut tensors are generated as the inputs stage
does, each case in a fresh subprocess, which reports its peak resident memory
during generation above the resident memory before it (VmHWM after a reset),
the bytes generated and the time.

    python benchmarks/dsv4_attention.py
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGSHIPS = ("decode_swa", "decode_hca", "decode_csa")


def status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: now, VmHWM: peak)."""
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def reset_peak() -> float:
    """Start a fresh peak-RSS measurement (Linux: clear_refs 5 resets VmHWM); the RSS now."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_mib("VmRSS")


def flash_inputs(name: str) -> dict:
    """Generate the case's inputs under the active profile; figures as a dict (run in a subprocess)."""
    from golden_tasks.model.specs import stamp_all
    from golden_tasks.stages import make
    from kernels import decode_attention

    case = decode_attention.case(name).resolved(decode_attention)
    specs = stamp_all(case.specs, case.kernel.params())
    baseline = reset_peak()
    start = time.perf_counter()
    tensors = [make(s, case.seed) for s in specs if s.is_input and not s.by_value]
    return {"seconds": time.perf_counter() - start, "gib": sum(t.nbytes for t in tensors) / 2**30,
            "peak_mib": status_mib("VmHWM") - baseline, "tensors": len(tensors)}


def small_timings(cache: str) -> list:
    import golden_tasks
    from kernels import decode_attention

    rows = []
    for name in FLAGSHIPS:
        case = decode_attention.case(name)
        medians = {}
        for backend in ("aoti", "eager"):
            result = golden_tasks.run(case.kernel, case.specs, case.golden, name=name, compare=case.compare,
                                      backend=backend, warmup=5, rounds=100, cache_dir=cache,
                                      runs_dir=f"{cache}/runs")
            if not result.passed:
                sys.exit(f"{name} ({backend}) did not pass:\n{result.error}")
            medians[backend], golden = result.bench.median, result.golden_bench.median
        rows.append((name, medians["aoti"], medians["eager"], golden))
    return rows


def main():
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="golden-dsv4-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{tmp}/inductor"
        rows = small_timings(f"{tmp}/cache")
    print("small profile (medians of 100 rounds, microseconds)")
    print(f"{'case':12} {'kernel aoti':>12} {'kernel eager':>13} {'golden':>10} {'golden/aoti':>12}")
    for name, aoti, eager, golden in rows:
        print(f"{name:12} {aoti:12.1f} {eager:13.1f} {golden:10.1f} {golden / aoti:11.1f}x")
    print("\nflash profile input generation (one fresh process per case)")
    print(f"{'case':12} {'tensors':>8} {'generated GiB':>14} {'peak RSS MiB':>13} "
          f"{'peak/generated':>15} {'seconds':>8}")
    for name in FLAGSHIPS:
        proc = subprocess.run([sys.executable, __file__, "--flash-inputs", name], cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, "GOLDEN_TASKS_PROFILE": "flash"})
        if proc.returncode != 0:
            sys.exit(f"flash inputs of {name} failed:\n{proc.stderr}")
        f = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name:12} {f['tensors']:8} {f['gib']:14.3f} {f['peak_mib']:13.0f} "
              f"{f['peak_mib'] / 1024 / f['gib']:15.2f} {f['seconds']:8.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--flash-inputs"]:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(flash_inputs(sys.argv[2])))
    else:
        main()
