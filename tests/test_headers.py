"""golden_tasks.forms.headers: AOTInductor's precompiled headers, filled once by a trusted process, read by every
confined compile, written by none. The honest control: a confined AOTInductor build links the pool's headers,
precompiles none, and computes what it should. The attacks: a confined call that writes the pool through its
links, beside them, or over them fails, and the pool is what it was; a call on a GPU sees no pool."""
import os
import stat
import tempfile
from pathlib import Path

import cloudpickle
import pytest
import torch
from test_sandbox import _run_pickled

from golden_tasks.forms import headers, isolate
from golden_tasks.model.hashing import digest_file
from golden_tasks.project import sandbox

pytestmark = pytest.mark.skipif(sandbox.support() is not None, reason=f"no confinement: {sandbox.support()}")


@pytest.fixture(scope="module")
def pool() -> Path:
    """This user's pool, filled (by the README's run or an earlier test, or here: a trusted compile)."""
    folder = headers.pool()
    assert folder is not None
    headers.fill(folder)
    assert any(p.name.endswith(".h.gch") for p in folder.iterdir()), sorted(folder.iterdir())
    return folder


def confined_call(work, confinement):
    ok, value = isolate.call(_run_pickled, (cloudpickle.dumps(work),), 600.0, "the probe", confinement)
    if not ok:
        raise value
    return value


def test_a_confined_aotinductor_build_reads_the_pool_and_precompiles_nothing(pool, tmp_path):
    def build():
        class Scaled(torch.nn.Module):
            def forward(self, x):
                return x.sum(-1) * 3

        x = torch.arange(32.0).reshape(4, 8)
        program = torch.export.export(Scaled(), (x,), strict=False)
        package = torch._inductor.aoti_compile_and_package(
            program, package_path=os.path.join(tempfile.gettempdir(), "scaled.pt2"))
        return torch._inductor.aoti_load_package(package)(x).tolist()  # data: a tensor would cross as a handle

    work = tmp_path / "work"
    work.mkdir()
    assert confined_call(build, isolate.confinement((), writable=str(work))) == \
        (torch.arange(32.0).reshape(4, 8).sum(-1) * 3).tolist()
    private = work / isolate.HEADERS
    linked = {p.name: p.resolve().parent for p in private.iterdir() if p.is_symlink()}
    assert any(name.endswith(".h.gch") for name in linked) and set(linked.values()) == {pool.resolve()}
    assert not headers.built_privately(private)


def test_a_confined_call_cannot_write_the_pool(pool, tmp_path):
    before = {p.name: digest_file(p) for p in pool.iterdir() if p.name.endswith(headers.SUFFIXES)}

    def attack():
        private = Path(tempfile.gettempdir(), isolate.HEADERS)
        gch = next(p for p in private.iterdir() if p.name.endswith(".h.gch"))
        target = gch.resolve()
        attempts = {
            "through its link": lambda: open(gch, "ab").write(b"planted"),
            "beside it": lambda: (target.parent / "planted.h.gch").write_bytes(b"planted"),
            "over it": lambda: os.replace(_planted(private / "planted"), target),
            "its removal": lambda: target.unlink(),
        }
        outcomes = {}
        for name, attempt in attempts.items():
            try:
                attempt()
                outcomes[name] = "done"
            except OSError as exc:
                outcomes[name] = type(exc).__name__
        return outcomes

    (tmp_path / "work").mkdir()
    outcomes = confined_call(attack, isolate.confinement((), writable=str(tmp_path / "work")))
    assert set(outcomes.values()) == {"PermissionError"}, outcomes
    assert {p.name: digest_file(p) for p in pool.iterdir() if p.name.endswith(headers.SUFFIXES)} == before
    assert not (pool / "planted.h.gch").exists()


def _planted(path: Path) -> Path:
    path.write_bytes(b"planted")
    return path


def test_a_call_on_a_gpu_never_sees_the_pool(pool, tmp_path):
    """A GPU's call is confined without Landlock (sandbox.GPU_GAPS): the pool is covered, not linked."""
    confinement = isolate.confinement((), writable=str(tmp_path), gpu=True)
    assert confinement.headers is None and str(pool) in confinement.hidden

    def look():
        try:
            (pool / "planted.h.gch").write_bytes(b"planted")
            wrote = "done"
        except OSError as exc:
            wrote = type(exc).__name__
        return sorted(os.listdir(pool)), wrote

    assert confined_call(look, confinement) == ([], "OSError")
    assert not (pool / "planted.h.gch").exists()


def test_a_pool_another_user_could_write_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "golden-tasks" / "precompiled-headers"
    assert headers.pool() == folder and stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o777)
    assert headers.pool() is None


def _precompile_privately():
    """As a build the pool's headers do not fit: a header precompiled in the call's own folder."""
    Path(tempfile.gettempdir(), isolate.HEADERS, "other.h.gch").write_bytes(b"")


def _link_only():
    return None


def test_a_call_that_precompiled_privately_fills_the_pool(tmp_path, monkeypatch):
    """The trigger, in this process: the trusted fill itself is the pool fixture's (or the README run's)."""
    filled = []
    monkeypatch.setattr(headers, "fill", filled.append)
    (tmp_path / "pool").mkdir(mode=0o700)
    (tmp_path / "pool" / "known.h.gch").write_bytes(b"")
    for target, expected in ((_link_only, []), (_precompile_privately, [tmp_path / "pool"])):
        (tmp_path / target.__name__).mkdir()
        confinement = isolate.Confinement(writable=str(tmp_path / target.__name__), headers=str(tmp_path / "pool"))
        isolate.call(target, (), 60.0, "the probe", confinement)
        assert filled == expected
