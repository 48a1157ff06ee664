"""Running a Markdown document: its fenced blocks, in order, in a scratch project.

`run_doc(path, project, env)` parses the document with Sybil and evaluates every
example in document order; the first block that fails raises `DocFailure`, naming
the document's line and what went wrong. Each language has one way to run:

    sh       a bash script (`set -e -o pipefail`), in the project
    console  its `$ ` lines, each a bash command (the other lines are output)
    python   the document's python blocks so far, this one last, as one script of the
             venv's python in a new process; every block keeps its own line numbers
    yaml     a CI recipe: its `run:` steps as commands, then every `with: path:` must exist
    c++      `$CXX -fsyntax-only -I kernels/cpp`
    toml     parsed
    text     output shown to the reader: never run

A directive, an HTML comment right before a block, changes how that block runs:

    <!-- docs-test: file PATH -->      write the block to PATH (later blocks use it)
    <!-- docs-test: excerpt PATH -->   the block's lines are lines of PATH, in order
    <!-- docs-test: collect -->        pytest commands select this suite's tests: collect only,
                                       and a selection of nothing fails
    <!-- docs-test: exit S... -->      one command, allowed to exit with S (a finding it
                                       reports), never with a traceback
    <!-- docs-test: smoke SECONDS -->  a long command (a benchmark) must run that long,
                                       then it is interrupted as Ctrl-C would
    <!-- docs-test: project empty -->  (anywhere) the project starts as an empty folder
    <!-- skip: next "why" -->          Sybil's: the next block does not run here, and why
    <!-- invisible-code-block: python   Sybil's: python the reader does not see, run as a
         ... -->                        visible block would (assertions on what they saw)
"""
import os
import re
import shlex
import signal
import subprocess
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from unittest import SkipTest

import yaml
from markdown_it import MarkdownIt
from sybil import Document, Example
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

from golden_tasks.project.layout import tomllib  # the tomli backport below Python 3.11

# The verbs each language reads; a directive before a block of another language is a mistake.
VERBS = {
    "sh": {"file", "collect", "exit", "smoke"},
    "console": {"collect", "exit", "smoke"},
    "python": {"file", "excerpt"},
    "c++": {"file", "excerpt"},
    "toml": {"file", "excerpt"},
    "yaml": set(),
    "text": set(),
}
COMMENT = re.compile(r"<!--(.*?)-->", re.S)
KNOWN_COMMENT = re.compile(r"\s*(docs-test: \S.*|skip: next \"[^\"]+\"|invisible-code-block: python\n.*)\s*", re.S)
TIMEOUT = 1200  # seconds one block may take (the README's first block verifies the library cold)


class DocFailure(AssertionError):
    """A block of a document did not do what the document says."""


@dataclass
class Directive:
    verb: str
    args: list
    line: int


@dataclass
class Block:
    language: str
    source: str
    line: int  # of the block's first source line in the document
    directive: Directive = None


@dataclass
class Run:
    """The state of one document's run: where it runs and what it has seen so far."""
    path: Path
    project: Path
    env: dict
    python: list = field(default_factory=list)  # the python blocks so far (Blocks)
    pending: Directive = None
    skipped: list = field(default_factory=list)  # (line, reason)

    def where(self, line: int) -> str:
        return f"{self.path.name}:{line}"

    def fail(self, line: int, what: str) -> None:
        raise DocFailure(f"{self.where(line)}: {what}{self.case_logs()}")

    def case_logs(self, chars=4000) -> str:
        """The logs a failed run left (runs/<case>.log: every message of a failing case), which the summary
        shows one line of; CI keeps nothing else of the project."""
        runs = Path(self.env.get("GOLDEN_TASKS_RUNS") or self.project / "runs")
        return "".join(f"\n--- {log} ---\n{log.read_text(errors='replace')[-chars:]}" for log in sorted(runs.glob("*.log")))

    def process(self, line: int, argv: list, what: str, timeout: float = TIMEOUT, interrupt: bool = False):
        """Run `argv` in the project, in a session of its own so that a timeout ends everything it started
        (doit's workers too). A timeout fails the document, or, with `interrupt`, is what was asked for:
        the process is then interrupted as Ctrl-C would. Returns the CompletedProcess, or None if it was
        interrupted."""
        proc = subprocess.Popen(argv, cwd=self.project, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGINT,) * interrupt + (signal.SIGKILL,):
                os.killpg(proc.pid, sig)
                try:
                    proc.communicate(timeout=60)
                    break
                except subprocess.TimeoutExpired:
                    continue
            if interrupt:
                return None
            self.fail(line, f"{what} still ran after {timeout:g} s")
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def shell(self, line: int, script: str, allowed=(0,)) -> subprocess.CompletedProcess:
        proc = self.process(line, ["bash", "-e", "-o", "pipefail", "-c", script], f"`{script.strip()}`")
        if proc.returncode not in allowed:
            self.fail(line, f"`{script.strip()}` exited {proc.returncode}\n{_tail(proc)}")
        return proc


def _tail(proc, chars=6000) -> str:
    return f"--- stdout ---\n{proc.stdout[-chars:]}\n--- stderr ---\n{proc.stderr[-chars:]}"


def _source_line(example: Example) -> int:
    return example.line + 1  # the fence is on example.line


def _directive(example: Example) -> None:
    run: Run = example.namespace["run"]
    words = example.parsed.split()
    if words[:2] == ["project", "empty"]:
        return  # read when the project is made (project_is_empty)
    run.pending = Directive(words[0], words[1:], example.line)


def _block(example: Example) -> None:
    run: Run = example.namespace["run"]
    language = example.region.lexemes["arguments"].strip()
    block = Block(language, str(example.parsed), _source_line(example), run.pending)
    run.pending = None
    if language not in VERBS:
        run.fail(example.line, f"a code block must be fenced with one of {sorted(VERBS)}, not {language!r}")
    if block.directive and block.directive.verb not in VERBS[language]:
        run.fail(block.directive.line, f"`docs-test: {block.directive.verb}` does not apply to a {language} block "
                                       f"(it reads {sorted(VERBS[language]) or 'none'})")
    LANGUAGES[language](run, block)


def _invisible_python(example: Example) -> None:
    run: Run = example.namespace["run"]
    _python(run, Block("python", str(example.parsed), _source_line(example), None))


def _commands(block: Block, prompt: str) -> list:
    """(line, command) of each line that starts with `prompt` (continued by a trailing backslash)."""
    commands, lines = [], block.source.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith(prompt) and lines[i].strip() and not lines[i].lstrip().startswith("#"):
            start, command = i, lines[i][len(prompt):]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            commands.append((block.line + start, command))
        i += 1
    return commands


def _run_commands(run: Run, block: Block, commands: list) -> None:
    directive = block.directive
    verb = directive.verb if directive else None
    if verb in ("exit", "smoke") and len(commands) != 1:
        run.fail(directive.line, f"`docs-test: {verb}` reads one command, the block has {len(commands)}")
    for line, command in commands:
        if verb == "collect":
            _collect(run, line, command)
        elif verb == "exit":
            allowed = {0, *(int(s) for s in directive.args)}
            proc = run.shell(line, command, allowed)
            if "Traceback (most recent call last)" in proc.stdout + proc.stderr:
                run.fail(line, f"`{command}` printed a traceback\n{_tail(proc)}")
        elif verb == "smoke":
            _smoke(run, line, command, float(directive.args[0]))
        else:
            run.shell(line, command)


def _collect(run: Run, line: int, command: str) -> None:
    words = shlex.split(command, comments=True)
    if not any(w == "pytest" or w.endswith("/pytest") for w in words) or {"&&", "||", "|", ";"} & set(words):
        run.fail(line, f"`docs-test: collect` reads one pytest command per line, not `{command}`")
    proc = run.shell(line, shlex.join([*words, "--collect-only", "-q", "-p", "no:cacheprovider"]), allowed=(0, 5))
    if proc.returncode == 5 or re.search(r"^no tests (collected|ran)", proc.stdout, re.M):
        run.fail(line, f"`{command}` selects no test\n{_tail(proc)}")


def _smoke(run: Run, line: int, command: str, seconds: float) -> None:
    proc = run.process(line, ["bash", "-c", command], f"`{command}`", timeout=seconds, interrupt=True)
    if proc is not None and proc.returncode != 0:
        run.fail(line, f"`{command}` exited {proc.returncode} within {seconds:g} s\n{_tail(proc)}")


def _sh(run: Run, block: Block) -> None:
    if block.directive and block.directive.verb == "file":
        _write(run, block)
        return
    if block.directive:  # one command per line: the directive reads each on its own
        _run_commands(run, block, _commands(block, ""))
    else:
        run.shell(block.line, block.source)


def _console(run: Run, block: Block) -> None:
    commands = _commands(block, "$ ")
    if not commands:
        run.fail(block.line, "a console block without `$ ` commands (output alone is a text block)")
    _run_commands(run, block, commands)


def _write(run: Run, block: Block) -> Path:
    path = run.project / block.directive.args[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block.source)
    return path


def _excerpt(run: Run, block: Block) -> None:
    """Every line of the block (but `...`) is a line of the file, in order."""
    path = run.project / block.directive.args[0]
    if not path.is_file():
        run.fail(block.directive.line, f"excerpt of {block.directive.args[0]}: no such file")
    lines = [text.rstrip() for text in path.read_text().splitlines()]
    at = 0
    for i, text in enumerate(block.source.splitlines()):
        if text.strip() in ("", "...", "// ...", "# ..."):
            continue
        try:
            at = lines.index(text.rstrip(), at) + 1
        except ValueError:
            run.fail(block.line + i, f"{text.strip()!r} is not a line of {block.directive.args[0]} "
                                     "(in this order): the excerpt has drifted")


def _python(run: Run, block: Block) -> None:
    verb = block.directive.verb if block.directive else None
    if verb == "excerpt":
        _excerpt(run, block)
        return
    if verb == "file":
        path = _write(run, block)
        _checked(run, block, ["python", "-m", "py_compile", str(path)])
        return
    run.python.append(block)
    # each block at its own lines: a traceback names the document's line
    script, at = [], 1
    for earlier in run.python:
        script.append("\n" * (earlier.line - at) + earlier.source)
        at = earlier.line + earlier.source.count("\n")
    script_path = run.project / f".docs-test-{run.path.stem}.py"
    script_path.write_text("".join(script))
    _checked(run, block, ["python", str(script_path)])


def _checked(run: Run, block: Block, argv: list) -> None:
    proc = run.process(block.line, argv, "the python block")
    if proc.returncode != 0:
        run.fail(block.line, f"the python block failed ({shlex.join(argv)})\n{_tail(proc)}")


def _yaml(run: Run, block: Block) -> None:
    steps = yaml.safe_load(block.source)
    for step in steps:
        if "run" in step:
            run.shell(block.line, step["run"])
    for step in steps:
        path = (step.get("with") or {}).get("path")
        if path and not (run.project / path).exists():
            run.fail(block.line, f"step `{step.get('uses', step)}` names {path}, which the run steps did not make")


def _cxx(run: Run, block: Block) -> None:
    verb = block.directive.verb if block.directive else None
    if verb == "excerpt":
        _excerpt(run, block)
        return
    if verb == "file":
        path = _write(run, block)
    else:
        path = run.project / f".docs-test-{block.line}.cpp"
        path.write_text(block.source)
    include = shlex.quote(str(run.project / "kernels" / "cpp"))
    run.shell(block.line, f'"${{CXX:-c++}}" -std=c++17 -fsyntax-only -I {include} '
                          f'$(python -c "import torch.utils.cpp_extension as e; '
                          f'print(\' \'.join(\'-I\' + p for p in e.include_paths()))") {shlex.quote(str(path))}')


def _toml(run: Run, block: Block) -> None:
    verb = block.directive.verb if block.directive else None
    if verb == "excerpt":
        _excerpt(run, block)
        return
    try:
        tomllib.loads(block.source)
    except tomllib.TOMLDecodeError as exc:
        run.fail(block.line, f"not TOML: {exc}")
    if verb == "file":
        _write(run, block)


LANGUAGES = {"sh": _sh, "console": _console, "python": _python, "yaml": _yaml, "c++": _cxx, "toml": _toml,
             "text": lambda run, block: None}


def _parser(lexer, evaluator, lexeme: str):
    def parse(document: Document):
        for region in lexer(document):
            region.parsed = region.lexemes[lexeme]
            region.evaluator = evaluator
            yield region
    return parse


SKIP = SkipParser()
PARSERS = [
    _parser(FencedCodeBlockLexer(language=r"[^\n]*", mapping={"language": "arguments", "source": "source"}), _block,
            "source"),
    _parser(DirectiveInHTMLCommentLexer(directive="docs-test", arguments=r"\S.*?"), _directive, "arguments"),
    _parser(DirectiveInHTMLCommentLexer(directive="invisible-code-block", arguments="python"), _invisible_python,
            "source"),
    SKIP,
]


def parse(path: Path) -> Document:
    return Document.parse(str(path), *PARSERS)


PROJECT_EMPTY = re.compile(r"^<!--\s*docs-test:\s*project\s+empty\s*-->", re.M)


def project_is_empty(path: Path) -> bool:
    return bool(PROJECT_EMPTY.search(path.read_text()))


def problems(path: Path, root: Path) -> list:
    """What is wrong with a document before anything runs: code blocks that are not fenced with a
    language the runner knows, comments that are not directives, relative links to nothing."""
    text, found = path.read_text(), []
    for token in MarkdownIt().parse(text):
        line = token.map[0] + 1 if token.map else 0
        if token.type == "code_block":
            found.append(f"{path.name}:{line}: an indented code block (fence it, with its language)")
        elif token.type == "fence" and token.info.strip() not in VERBS:
            found.append(f"{path.name}:{line}: a code block fenced as {token.info.strip()!r}, "
                         f"not one of {sorted(VERBS)}")
        for child in token.children or ():
            href = child.attrGet("href") if child.type == "link_open" else None
            if href and not re.match(r"[a-z]+:|#", href):
                target = (path.parent / href.partition("#")[0]).resolve()
                if not target.exists() or not target.is_relative_to(root):
                    found.append(f"{path.name}:{line}: the link {href} names no file of the repository")
    for match in COMMENT.finditer(text):
        comment = match.group(1)
        if text[text.rfind("\n", 0, match.start()) + 1:match.start()].strip():
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.name}:{line}: a comment inside a line is never read: a directive starts its line")
        elif not KNOWN_COMMENT.fullmatch(comment) or (comment.strip().startswith("docs-test:") and (
                comment.split()[1] not in {v for verbs in VERBS.values() for v in verbs} | {"project"})):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.name}:{line}: {textwrap.shorten(match.group(0), 60)} is not a directive "
                         "this runner reads (a misspelling would silently do nothing)")
    return found


def run_doc(path: Path, project: Path, env: dict) -> Run:
    """Run every block of `path` in `project`; return the run (its skips), or raise DocFailure."""
    document = parse(path)
    run = Run(path, project, env)
    regions = [region for _, region in document.regions]
    for here, after in zip(regions, [*regions[1:], None]):
        if (here.evaluator is SKIP.skipper or (here.evaluator is _directive and not here.parsed.startswith("project"))) \
                and (after is None or after.evaluator is not _block):
            run.fail(document.text.count("\n", 0, here.start) + 1,
                     "a directive (or skip) must sit right before the fenced block it applies to")
    document.namespace["run"] = run
    for example in document:
        try:
            example.evaluate()
        except SkipTest as skip:
            run.skipped.append((example.line, str(skip)))
    return run
