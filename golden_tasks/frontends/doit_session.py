"""One doit process's session with the project: what was asked (the command line), the library planned
once, the cache hits its up-to-date checks found, and, for `doit run`, the run's journal and record.

The control flow of a run, in the doit parent unless said otherwise:

    tasks_for (doit_tasks, as doit loads the dodo.py) -> Session(root, line) -> start(): the journal file,
        the SIGINT handler, the collector's thresholds, finish and draw at exit
    doit checks each task (doit_checks): a hit is kept in `hits` (what the stages downstream read), tallied,
        and journaled as the task's outcome (`journal`: kept in memory in the parent)
    doit runs the rest, in workers forked from the parent with -n: each action journals its outcome
        (`journal`: one line appended to the journal file, which the run's context names: config.RunContext)
    the reporter's complete_run, or the process's exit with another reporter: finish() reads the journal
        into the RunRecord and writes the run's files (report.write_files), then draw() the HTML page
    Ctrl-C: `interrupted`, and nothing is written: the files stay the last complete run's

The doit parent stays light: no torch, no kernel modules (Library plans them in processes of its own).
"""
import atexit
import dataclasses
import fnmatch
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from doit import get_var
from doit.cmd_base import DoitCmdBase, opt_cwd, opt_dodo, opt_seek_file
from doit.cmd_run import Run
from doit.cmdparse import CmdOption, CmdParse, CmdParseError
from doit.doit_cmd import DoitMain

from ..model.errors import VerificationFailure
from ..model.outputs import Worst
from ..model.records import RunRecord
from ..model.verdicts import StageState, Verdict
from ..pipeline import cluster, summary
from ..planning.library import Library
from ..project import config
from ..project.toolchain import machine, toolchain
from ..reports import report

PLAN = "plan"
VERIFY = "verify"

# The doit parent's plans and tasks (a million objects at 1,000 cases) live until it exits, and Python's collector
# would scan them again at each full collection: a quarter of a no-op run at that size. So a run's doit parent
# collects young objects after YOUNG_OBJECTS allocations rather than 700, and what is loaded when the first task is
# checked is frozen (never scanned again: doit_checks). A process that runs stages collects as Python does.
PYTHONS_THRESHOLDS = gc.get_threshold()
YOUNG_OBJECTS = 100_000


def usage_error(message: str):
    """End the run before anything ran: doit's exit status 3, one line, no traceback."""
    sys.stderr.write(f"golden-tasks: {message}\n")
    sys.exit(3)


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """A doit command line as doit reads it (doit does not expose it to dodo files): its command,
    its options (doit's names: num_process, reporter, ...) and its task arguments; a run with no
    task arguments runs the default tasks."""
    command: str
    options: dict
    tasks: tuple
    variables: tuple = ()  # the NAME of each NAME=VALUE

    @classmethod
    def parse(cls, argv) -> "CommandLine":
        args = [a for a in argv if a.startswith("-") or "=" not in a]  # NAME=VALUE are doit's variables
        variables = tuple(a.partition("=")[0] for a in argv if not a.startswith("-") and "=" in a)
        common = DoitCmdBase.base_options + (opt_dodo, opt_cwd, opt_seek_file)
        parser = CmdParse([CmdOption(o) for o in common + Run.cmd_options])
        try:
            given, args = parser.parse_only(args)  # doit's options, up to the command or the first task
            command = args.pop(0) if args and args[0] in _COMMANDS else "run"
            if command == "run":
                given, args = parser.parse_only(args, given)
            else:  # another command's own options (`info --no-status`) are not task names
                own = CmdParse([CmdOption(o) for o in common + getattr(_COMMANDS[command], "cmd_options", ())])
                args = own.parse_only(args)[1]
        except CmdParseError:  # doit itself will say what is wrong with it
            return cls("invalid", {}, (), variables)
        return cls(command, given, tuple(args), variables)

    @property
    def workers(self) -> int:
        """doit's worker processes (-n N): 1 without."""
        return max(1, self.options.get("num_process", 1))

    def selects(self, task: str) -> bool:
        """Whether the run selects `task` by name, group or pattern (the default tasks: verify)."""
        group = task.partition(":")[0]
        return any(t in (task, group) or ("*" in t and fnmatch.fnmatchcase(task, t)) for t in self.tasks or [VERIFY])


_COMMANDS = {c.get_name(): c for c in DoitMain.DOIT_CMDS} | {"auto": None}  # "auto": the doit-auto plugin's


class Session:
    """This process's session (see the module): made in the doit parent, inherited by its forked workers."""

    def __init__(self, root: Path, line: CommandLine):
        self.root, self.line = root, line
        self.parent = os.getpid()  # the doit parent: workers fork after the session is made
        self.hits = {}  # case -> {stage: entry} found cached by this process's checks (doit_checks)
        self.tally = summary.Tally()  # the checks' hits and misses, logged at exit
        self.outcomes = []  # the doit parent's own part of the journal (its up-to-date checks)
        self.journal_path = None  # the run's journal file (`doit run` only)
        self.started = time.time()
        self.interrupted = self.finished = self.drawn = False
        self.record = None
        self._library = None

    @property
    def library(self) -> Library:
        """The project's library, planned once per process. A cache that cannot be written or a bad
        doit variable ends the run before anything ran (exit status 3) with its message alone (doit would
        print its loader's traceback)."""
        if self._library is None:
            try:
                self._library = Library(self.root, get_var, self.line.workers)
            except (VerificationFailure, ValueError, RuntimeError) as exc:  # RuntimeError: planning itself failed
                usage_error(str(exc))
        return self._library

    @property
    def project(self) -> config.Project:
        """The project the library was planned from: its layout, store and runs folders."""
        return self.library.project

    def start(self) -> None:
        """In the doit parent of a run, before workers fork: the journal, and what happens at its end."""
        # in a folder of its own, which a kernel's process is kept out of (isolate.confinement)
        self.journal_path = Path(tempfile.mkdtemp(prefix="golden-tasks-run-")) / "journal.jsonl"
        self.journal_path.touch()
        config.enter(dataclasses.replace(config.current(), journal=str(self.journal_path)))
        signal.signal(signal.SIGINT, self._interrupt)
        gc.set_threshold(YOUNG_OBJECTS)
        atexit.register(self._at_exit)

    def journal(self, task: str, state: StageState, message: str = None, worst: Worst = None) -> None:
        """Record a task's outcome: the doit parent's in its list, a worker's in the journal file in one
        write (atomic next to other processes')."""
        line = {"task": task, "state": state, "message": message, "worst": worst and worst.to_json()}
        if os.getpid() == self.parent:
            self.outcomes.append(line)
        elif self.journal_path:
            fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)

    def finish(self) -> RunRecord | None:
        """The run record, built from the journal and written (report.write_files) once, in the doit
        parent; None when the run verified no case, checked no task (doit stopped before running) or
        was interrupted."""
        if self.finished or self.interrupted or self.journal_path is None or self._library is None:
            return self.record
        self.finished = True
        lines = self.outcomes + [json.loads(line) for line in self.journal_path.read_text().splitlines()]
        lib = self._library
        # a case's baselines with it (verify:CASE verifies them too), a sweep's points (verify:SWEEP)
        cases = [c for c, p in lib.plans.items() if any(self.line.selects(f"{VERIFY}:{name}")
                                                         for name in (c, p.baseline_of, p.sweep_of) if name)]
        if not lines or not cases:
            return None
        states, errors, worst = {}, {}, {}
        for line in lines:
            stage, _, case = line["task"].partition(":")
            states.setdefault(case, {})[stage] = StageState(line["state"])
            if line["message"]:
                errors.setdefault(case, {})[stage] = line["message"]
            if line["worst"]:
                worst[case] = Worst(**line["worst"])
        runs = lib.project.runs
        declared = lib.project.layout.machine
        rows = summary.with_baselines([summary.case_row(lib.plans[c], *summary.walked(lib.plans[c], states, errors),
                                                        lib.store, self.hits.get(c), worst.get(c), declared)
                                       for c in cases])
        lib.store.record_use({(stage, key) for row in rows for stage, key in row.keys.items() if key})
        for row in rows:
            row.log = str(report.log_path(runs, row.case)) if row.status == Verdict.FAIL else None
        self.record = RunRecord(cases=rows, started=self.started, finished=time.time(), machine=machine(),
                                declared=declared,
                                toolchain=toolchain())
        try:
            report.write_files(runs, self.record)
        except (VerificationFailure, OSError) as exc:  # CacheWriteError: the runs dir cannot be written
            sys.stderr.write(f"golden-tasks: the run's files were not written: {exc}\n")
            self.record = None
        return self.record

    def draw(self, say=lambda line: None) -> None:
        """Once, after finish wrote the record: runs/report.html (slow when it plots, in its own process:
        it `say`s so first), unless GOLDEN_TASKS_HTML=0."""
        if self.drawn or not self.record:
            return
        self.drawn = True
        if not config.draws_html():  # a page from an earlier run would pass for this one's
            (self.project.runs / "report.html").unlink(missing_ok=True)
            return
        if failed := report.write_html(self.root, say):
            sys.stderr.write(f"golden-tasks: runs/report.html was not written: {failed}\n")

    def _at_exit(self) -> None:
        if os.getpid() != self.parent:  # a process forked without exec may run its parent's atexit hooks
            return
        try:
            self.finish()
            self.draw()
            if self._library and self.tally.cases:  # only if it checked anything
                self._library.store.log_run(self.tally.to_json())
        finally:
            shutil.rmtree(self.journal_path.parent, ignore_errors=True)

    def _interrupt(self, signum, frame):
        self.interrupted = True
        if config.current().executor == "ray":  # doit's threads wait on their tasks: cancelled, they end
            cluster.cluster(self.root).cancel()
        raise KeyboardInterrupt


current: Session = None  # this process's session, made by doit_tasks.tasks_for (a worker inherits it)
