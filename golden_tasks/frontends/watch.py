"""`golden-tasks watch [verify:CASE ...] [NAME=VALUE ...]`: verify again on every save of a file the
selected cases depend on.

What a case depends on is what its planning recorded reading (discover.observed): its kernel module and
every user module that imports (the golden, helpers, a C++ kernel's sources and headers), the data files
and `file_deps` it reads, the folders it lists. The first run verifies the selection (every case when
none is named); then each save of one of those files, an editor's atomic save (a temporary file renamed
over it) included, runs `doit verify` again. Each run prints one line: when, what changed, and every
case's verdict (a failure's reason); its reports are rewritten as by any run. A save during a run queues
one run after it. After each run the files are read again, so a module that starts importing another is
followed. Ctrl-C stops the run in progress (its own interrupt: nothing of it is left) and the watch.

The watcher is watchfiles (the operating system's notifications; no polling loop of ours). Nothing here
imports torch or the kernel modules: planning runs in its own process, as for doit.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..model.origin import shown
from ..model.records import BadRecord, RunRecord
from ..planning.discover import observed
from ..planning.library import Library
from ..project import config
from ..project.observe import listing_digest

VERIFY = "verify"
POLL_MS = 250  # how often the watch loop looks whether the run in progress ended


class Watched:
    """The files and folders the selected cases depend on: a change of a file, or a change of a folder's
    listing (a file added, removed or renamed; not a temporary file that came and went), is a change of
    the selection."""

    def __init__(self, root: Path, targets: list, variables: dict):
        library = Library(root, variables.get)
        cases = [t.partition(":")[2] for t in targets]
        modules = {p.module for p in library.plans.values() if p.module and (not cases or p.case in cases)}
        files, dirs = observed(root, library.store, sorted(modules))
        self.files = files
        self.listings = {folder: listing_digest(folder) for folder in dirs}  # planning lists the kernel folders

    def folders(self) -> list:
        """The folders to watch: those of the files, and the listed ones (that exist)."""
        return sorted(f for f in {os.path.dirname(p) for p in self.files} | set(self.listings) if os.path.isdir(f))

    def __call__(self, change, path: str) -> bool:
        """watchfiles' filter (called once the changes settled): whether this change matters."""
        if path in self.files:
            return True
        folder = os.path.dirname(path)
        if folder not in self.listings or (listing := listing_digest(folder)) == self.listings[folder]:
            return False
        self.listings[folder] = listing
        return True

    def saved_since(self, ns: int) -> set:
        """The files modified at or after `ns` (time.time_ns()); a file gone is not one."""
        return {path for path in self.files if _mtime_ns(path) >= ns}

    def __eq__(self, other) -> bool:
        return (self.files, set(self.listings)) == (other.files, set(other.listings))


def _mtime_ns(path) -> int:
    """The file's modification time, or -1 when it is gone (even if it went after a check that it exists)."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


class Run:
    """One `doit verify` of the selection, in its own process; its output goes to a file (the verdicts are
    read from the record it writes)."""

    def __init__(self, root: Path, targets: list, variables: dict, why: str):
        self.root, self.why, self.started = root, why, time.time()
        self.output = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "doit", *targets, *(f"{k}={v}" for k, v in variables.items())],
            cwd=root, stdout=self.output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def done(self) -> bool:
        return self.process.poll() is not None

    def line(self) -> str:
        """What the run found, in one line."""
        when = time.strftime("%H:%M:%S", time.localtime(self.started))
        record = _record(config.Project.at(self.root).runs / "report.json")
        if not record or (record.started or 0) < self.started:  # it stopped before verifying anything
            self.output.seek(0)
            said = [line for line in self.output.read().decode(errors="replace").splitlines() if line.strip()]
            return f"[{when}] {self.why}: doit exited {self.process.returncode}: {said[-1] if said else 'no output'}"
        verdicts = ", ".join(f"{row.case} {row.status}" + (f" ({row.reason})" if row.reason else "")
                             for row in record.cases)
        return f"[{when}] {self.why}: {verdicts}"

    def stop(self) -> None:
        """Interrupt the run as Ctrl-C would, and wait for it (killed if it does not end)."""
        if not self.done():
            self.process.send_signal(signal.SIGINT)  # the run's own interrupt removes what it made
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.close()


def _record(path: Path) -> RunRecord | None:
    try:
        return RunRecord.read(path)
    except BadRecord:
        return None


def _shown(root: Path, paths: set) -> str:
    names = sorted(shown(p, root) for p in paths)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "") + " changed"


def watch(root: Path, targets: list, variables: dict, out=sys.stdout) -> int:
    """Watch until Ctrl-C (the module docstring); returns the exit status, 0."""
    from watchfiles import watch as changes_of  # noqa: PLC0415 -- only for this command

    targets = targets or [VERIFY]
    run, pending = Run(root, targets, variables, "first run"), set()
    watched, unwatched_since = Watched(root, targets, variables), None
    try:
        while True:
            for changes in changes_of(*watched.folders(), watch_filter=watched, debounce=300, step=50,
                                      rust_timeout=POLL_MS, yield_on_timeout=True, recursive=False):
                if unwatched_since is not None:  # this watcher runs: add what was saved while none did
                    pending |= watched.saved_since(unwatched_since)
                    unwatched_since = None
                pending |= {path for _, path in changes}
                if run is not None and run.done():
                    out.write(run.line() + "\n")
                    out.flush()
                    run.stop()
                    finished, run = run, None
                    if (now := Watched(root, targets, variables)) != watched:
                        # from the run's start: a save this watcher has not yet reported is lost with it
                        watched, unwatched_since = now, int(finished.started * 1e9)
                        break  # what the selection depends on changed: watch the new set
                if run is None and pending:
                    run, pending = Run(root, targets, variables, _shown(root, pending)), set()
    except KeyboardInterrupt:
        if run is not None:
            run.stop()
        out.write("golden-tasks watch: stopped\n")
        return 0
