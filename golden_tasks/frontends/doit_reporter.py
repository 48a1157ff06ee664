"""What a run prints: doit's console reporter without a line per up-to-date task, a live progress view on a
terminal, and the summary of the run's record at its end."""
from doit.exceptions import TaskFailed, UnmetDependency
from doit.reporter import ConsoleReporter

from ..model.records import RunRecord
from ..model.verdicts import StageState, Verdict
from ..pipeline import cluster
from ..pipeline.stage_table import StageName
from ..project import config, sandbox
from ..reports import report
from . import doit_session
from .doit_session import PLAN, VERIFY


class _LiveProgress:
    """The live view on a terminal: tasks done of the run's total, cache hits, failures, the tasks
    running now. rich draws it below whatever the run prints (`print`) and removes it at `stop`."""

    def __init__(self, outstream, total: int):
        from rich.console import Console  # noqa: PLC0415 -- only on a terminal
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

        self.running, self.cached, self.failed = [], 0, 0
        self.view = Progress(TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                             TimeElapsedColumn(), TextColumn("{task.fields[detail]}"),
                             console=Console(file=outstream), transient=True)
        self.task = self.view.add_task("", total=total, detail="")
        self.view.start()

    def update(self, advance: int = 0) -> None:
        detail = f"{self.cached} cached" + (f", {self.failed} failed" if self.failed else "")
        if self.running:
            detail += "  running: " + ", ".join(self.running)
        self.view.update(self.task, advance=advance, detail=detail)

    def print(self, text: str) -> None:
        self.view.console.out(text, end="", highlight=False)

    def stop(self) -> None:
        self.view.stop()


def _closure(tasks: dict, selected) -> set:
    """The names of the selected tasks and every task they depend on."""
    seen, todo = set(), list(selected)
    while todo:
        name = todo.pop()
        if name not in seen and name in tasks:
            seen.add(name)
            todo.extend(tasks[name].task_dep)
    return seen


class SummaryReporter(ConsoleReporter):
    """doit's console output without a line per up-to-date task: on a terminal a live progress view,
    elsewhere a line per task that runs. A run that verifies cases ends with the summary table of
    its record (Session.finish) and one reason line per failing case; doit's own failure output (each
    message as it happens, dependency cascades, the failed tasks' captured output) only with
    `--failure-verbosity` 1 or 2, or in a run that verifies nothing (it has no table).

    A verified case whose row is not PASS or SKIPPED although no task failed (an entry that
    vanished under the run, say) ends the run with exit status 1: no CI may read a green exit
    beside a row that is not a pass."""

    desc = "console output with a per-case summary"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.live = None
        self.wrote = False
        self.quiet = False  # a run that verifies cases: its failures are summarised under the table

    def initialize(self, tasks, selected_tasks):
        self.quiet = any(t.partition(":")[0] == VERIFY for t in _closure(tasks, selected_tasks))
        if self.outstream.isatty():
            total = sum(1 for t in _closure(tasks, selected_tasks) if tasks[t].actions)
            self.live = _LiveProgress(self.outstream, total)

    def write(self, text):
        self.wrote = True
        if self.live:
            self.live.print(text)
        else:
            super().write(text)

    def _done(self, task, failed=False):
        if self.live and task.actions:
            if task.name in self.live.running:
                self.live.running.remove(task.name)
            self.live.failed += failed
            self.live.update(advance=1)

    def execute_task(self, task):
        if self.live:
            if task.actions:
                self.live.running.append(task.name)
                self.live.update()
        else:
            super().execute_task(task)

    def add_success(self, task):
        super().add_success(task)
        self._done(task)

    def add_failure(self, task, fail):
        # Summarised: what our actions report (TaskFailed: journaled, in the case's log) and the cascade
        # it causes; doit's own errors (an up-to-date check that raised, say) print as doit prints them.
        if self.quiet and not self.failure_verbosity and isinstance(fail, (TaskFailed, UnmetDependency)):
            self.failures.append({"task": task, "exception": fail})
        else:
            super().add_failure(task, fail)
        self._done(task, failed=not isinstance(fail, UnmetDependency))

    def skip_uptodate(self, task):
        if self.live and task.actions and task.name.partition(":")[0] != PLAN:  # a plan is no cache hit
            self.live.cached += 1
        self._done(task)

    def skip_ignore(self, task):
        super().skip_ignore(task)
        self._done(task)

    def complete_run(self):
        if self.live:
            self.live.stop()
            self.live = None
        session = doit_session.current
        if session and session.interrupted:
            return
        if not self.quiet or self.failure_verbosity:
            super().complete_run()
        elif self.runtime_errors:
            self.write("Execution aborted.\n" + "\n".join(self.runtime_errors) + "\n")
        record = session and session.finish()
        if not record:
            return
        rows = record.cases
        self.write(("\n" if self.wrote else "") + report.format_table(rows) + "\n")
        unjudged = [r for r in rows if r.status.failed]
        unreached = [r.case for r in unjudged if r.status == Verdict.INCOMPLETE]
        if unreached and self.failures:
            self.write(f"not reached: {', '.join(unreached)} (--no-continue stopped the run at the first "
                       "failure)\n")
        self.outstream.flush()  # the table first: the page takes a few seconds to draw
        session.draw(lambda line: (self.write(line + "\n"), self.outstream.flush()))
        runs = session.project.runs
        self.write(f"report: {runs / 'report.json'} (also report.xml{', report.html' * config.draws_html()})\n")
        if config.current().executor == "ray":
            ray = cluster.cluster(session.root)
            self.write(f"ray: {ray.submitted} task{'s' * (ray.submitted != 1)} submitted to {ray.address}\n"
                       if ray.address else f"ray: not connected: {ray.unreachable}\n" if ray.unreachable
                       else "ray: nothing to run, so no connection to a cluster\n")
        if any(r.stages.get(StageName.COMPILE) == StageState.RAN for r in rows) and config.current().sandbox == "auto" \
                and (reason := sandbox.support()):
            self.write(f"note: kernels ran unconfined: {reason} (docs/threat-model.md)\n")
        if unjudged and not self.failures:
            for row in unjudged:
                self.write(f"golden-tasks: {row.case} is {row.status} although no task failed\n")
        self.write(report.outcome_line(rows) + "\n")
        raise SystemExit(self.exit_status(record))

    def exit_status(self, record: RunRecord) -> int:
        """doit's meanings, the same with or without --no-continue and -n: 0 when every case is PASS or
        SKIPPED, 1 when a case failed (its stage failed, or it is not judged although none did), 2 when
        something other than a case's verdict went wrong while running (an up-to-date check or action
        that raised, a runtime error of doit's)."""
        ours = (TaskFailed, UnmetDependency)  # a stage's verdict, and the tasks it kept from running
        if self.runtime_errors or any(not isinstance(f["exception"], ours) for f in self.failures):
            return 2
        return 0 if record.passed else 1
