"""AOTInductor's precompiled C++ headers: built once per machine by a trusted process, read by every
confined compile.

Inductor precompiles the headers its generated C++ includes (torch._inductor.codecache._precompile_header),
about 10 s of every AOTInductor build, and would keep them in one folder shared by every build. A confined
call gets a private folder instead (isolate._confine): a shared folder it could write would let one
kernel's compile plant what another kernel's compile reads. So each build precompiled them again.

Control flow: `confinement` (isolate) names the pool (`pool()`), a folder only trusted processes write.
isolate._confine links its headers into the call's private folder (`link`) and lets the call read the
pool, never write it (Landlock); Inductor finds a header there by its name, a digest of the header's
preprocessed text, the compiler and its flags, and precompiles privately any the pool lacks. A call on a
GPU, which Landlock cannot confine (sandbox.GPU_GAPS), never sees the pool: it is covered. When a confined
call did precompile privately (`built_privately`), its caller fills the pool (`fill`): a trusted child
AOTInductor-compiles a fixed function into a staging folder, whose headers then move into the pool each
with one rename, so a call never links a header half written. That happens once per toolchain (a marker
file names it), under a lock, so workers that meet an empty pool together fill it once.
"""
import os
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock

from ..model.errors import StageFailed
from ..model.hashing import digest_json
from ..project import toolchain

SUFFIXES = (".h", ".h.gch")  # a header Inductor precompiles: `<name>.h` (an #include line) and its `.gch`
FILL_SECONDS = 600.0  # the trusted compile that fills the pool; twice a cold AOTInductor build under load


def pool() -> Path | None:
    """The pool of this user: golden-tasks/precompiled-headers in the user's cache folder ($XDG_CACHE_HOME,
    else ~/.cache), made if missing; None where it cannot be made, or is not this user's alone (another user
    who could write it could plant a header), so that every call precompiles privately."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "golden-tasks" / "precompiled-headers"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = folder.stat()
    except OSError:
        return None
    return folder if info.st_uid == os.getuid() and not info.st_mode & 0o022 else None


def link(pool_folder: Path, private: Path) -> None:
    """Link each header of the pool into `private` (Inductor's header folder for a confined call)."""
    private.mkdir(parents=True, exist_ok=True)
    for path in pool_folder.iterdir():
        if path.name.endswith(SUFFIXES):
            (private / path.name).symlink_to(path)


def built_privately(private: Path) -> bool:
    """Whether a call precompiled a header itself into its header folder `private`, which the pool lacked."""
    return private.is_dir() and any(p.name.endswith(".gch") and not p.is_symlink() for p in private.iterdir())


def fill(pool_folder: Path) -> None:
    """Precompile the headers of a CPU AOTInductor build into the pool, unless it has been filled for this
    toolchain; in a trusted child (isolate.call, unconfined), which compiles only our fixed function."""
    from . import isolate  # noqa: PLC0415 -- isolate links the pool into the calls it confines
    marker = pool_folder / f"filled-{_toolchain_digest()}"
    with FileLock(pool_folder / "lock"):
        if marker.exists():
            return
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=pool_folder))
        try:
            try:
                isolate.call(_precompile, (str(staging),), FILL_SECONDS, "precompiling AOTInductor's headers")
            except StageFailed:  # the compile that asked has its artifact: the next precompile privately, as before
                return
            for path in staging.iterdir():
                if path.name.endswith(".h.gch"):  # its header after it: a call links a header with its .gch
                    os.replace(path, pool_folder / path.name)
                    os.replace(staging / path.name.removesuffix(".gch"), pool_folder / path.name.removesuffix(".gch"))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            marker.touch()  # after a failure too: not retried by every compile


def _toolchain_digest() -> str:
    """What makes other headers: torch's release and where it is installed (two installs of one release, for
    a CPU and for CUDA, differ), the compiler, the CPU."""
    found = toolchain.toolchain()
    return digest_json({"torch": found["torch"], "at": os.path.dirname(torch.__file__), "cxx": found["cxx"],
                        "isa": found["isa"]})[:16]


def _precompile(staging: str) -> None:
    """AOTInductor-compile a fixed function, with Inductor's header folder `staging` (trusted: our code alone)."""
    from torch._inductor import codecache  # noqa: PLC0415 -- Inductor, in the child only

    from .jit import AOTI_DEFAULTS  # noqa: PLC0415 -- the configs every @jit build starts from

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(staging, "inductor")
    codecache._HEADER_DIR = staging
    codecache._HEADER_LOCK_DIR = os.path.join(staging, "locks")
    program = torch.export.export(_Fixed(), (torch.zeros(4, 4),), strict=False)
    torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(staging, "fixed.pt2"),
                                             inductor_configs=dict(AOTI_DEFAULTS))


class _Fixed(torch.nn.Module):
    """What the trusted child compiles: a reduction and an elementwise op, so both headers are included."""

    def forward(self, x):
        return x.sum(-1) * 2
