"""`golden-tasks`: inspect and manage the cache.

    golden-tasks stats                  entries and bytes per stage; hit/miss counts of the last runs
    golden-tasks verify [--drop]        re-hash every object; report (and drop) bad ones
    golden-tasks gc [--unused] [--older-than DAYS] [--max-size SIZE]
    golden-tasks explain STAGE:CASE     why a stage is (not) up to date
    golden-tasks replay RUNTIME_DIR     re-run a saved case: no compile, no kernel import
    golden-tasks compare A.json B.json  two run records case by case: status changes, timing verdicts
    golden-tasks node ARGS              start this machine as a Ray node of its class: `ray start ARGS`
    golden-tasks machine [--measure]    this machine's measured bandwidth and FLOP rates (measure them now)

--project DIR and --cache DIR go before or after the subcommand (after `node`, every argument is ray start's).
"""
import argparse
import functools
import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from ..model.hashing import digest_file
from ..model.machine import Limits
from ..model.outputs import MachineMeta, Stats
from ..model.plan import Plan
from ..pipeline import graph
from ..pipeline.cluster import start_node
from ..pipeline.stage_table import BY_NAME, STAGES, StageName
from ..planning.library import planned_library, run_variables, unknown_variables
from ..project import config
from ..project.fingerprint_parts import changed_parts
from ..project.layout import LayoutError
from ..project.toolchain import node_class
from ..reports.figures import drawn_from
from ..reports.machine import format_limits
from ..reports.runs_compare import DRIFT, FAIL_ON, BadRecord, compare
from ..storage.entry import CorruptObject
from ..storage.store import Store, object_problem
from .scaffold import InitRefused, init

UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def _variable(text: str) -> str:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return text


def _size(text: str) -> int:
    number, unit = text.lower().rstrip("ib"), ""
    if number and number[-1] in UNITS:
        number, unit = number[:-1], number[-1]
    try:
        return int(float(number) * UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 500M or 2G") from None


def _nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
    return value


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def cmd_stats(store: Store, args) -> int:
    per_stage = {}
    for _, entry in store.entries():
        count, objects = per_stage.setdefault(entry.stage, [0, {}])
        per_stage[entry.stage][0] = count + 1
        objects.update({r.digest: r.nbytes for r in entry.objects.values()})
    print(f"cache: {store.root}")
    print(f"{'stage':10} {'entries':>8} {'bytes':>12}")
    for stage in [s.name for s in STAGES] + sorted(set(per_stage) - set(BY_NAME)):
        count, objects = per_stage.get(stage, (0, {}))
        print(f"{stage:10} {count:8d} {_human(sum(objects.values())):>12}")
    on_disk = sum(p.stat().st_size for p in store.object_files())
    print(f"objects on disk: {_human(on_disk)}")
    if runs := store.runs_logged(args.runs):
        print(f"\nlast {len(runs)} runs:")
        for run in runs:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["time"]))
            hits, misses = sum(run["hits"].values()), sum(run["misses"].values())
            print(f"  {when}  {run['cases']} cases, {hits} hits, {misses} misses")
    return 0


def cmd_verify(store: Store, args) -> int:
    bad = 0
    for path in sorted(store.object_files()):
        if not path.name.startswith(".") and digest_file(path) != path.name:
            bad += 1
            print(f"corrupt object {path}")
            if args.drop:
                path.unlink()
    for path, entry in store.entries():
        if not entry.intact():
            bad += 1
            print(f"bad entry {entry.stage}:{entry.case} ({path.name}): its record does not match its digest")
            if args.drop:
                path.unlink()
            continue
        for name, record in entry.objects.items():
            problem = object_problem(store.object_path(record.digest), record)
            if problem:
                bad += 1
                print(f"bad entry {entry.stage}:{entry.case} ({path.name}): object {name!r} {problem}")
                if args.drop:
                    store.drop(CorruptObject(entry, name, problem))
                break
    print(f"{bad} problem(s) found" + (", dropped" if args.drop and bad else ""))
    return 1 if bad and not args.drop else 0


def _plans(project: Path, store: Store, variables=()) -> dict:
    """The library's plans, with doit-style NAME=VALUE variables applied (profile=NAME as in doit)."""
    pairs = dict(v.split("=", 1) for v in variables)
    return planned_library(project, store, run_variables(project, pairs.get))


def _current_keys(project: Path, store: Store, variables) -> set:
    keep = set()
    for plan in _plans(project, store, variables).values():
        if plan.error:
            continue
        lookups = graph.Lookups(plan, store)
        for stage in STAGES:
            key, _ = lookups.resolve(stage)
            if key:
                keep.add((stage.name, key))
    return keep


def cmd_gc(store: Store, args) -> int:
    if store.readonly:
        print("the cache is read-only (GOLDEN_TASKS_CACHE_READONLY): nothing collected", file=sys.stderr)
        return 2
    recorded = store.last_used()
    listed = list(store.entries())
    used = {p: max(p.stat().st_mtime, recorded.get((e.stage, e.key), 0.0)) for p, e in listed}
    live = sorted(listed, key=lambda pe: used[pe[0]])  # least recently used first
    drop = set()
    if args.unused:
        keep = _current_keys(args.project, store, args.variables)
        drop |= {p for p, e in live if (e.stage, e.key) not in keep}
    if args.older_than is not None:
        cutoff = time.time() - args.older_than * 86400
        drop |= {p for p, _ in live if used[p] < cutoff}
    if args.max_size is not None:  # least recently used first, until manifests and objects fit
        kept = [(p, e) for p, e in live if p not in drop]
        sizes = {r.digest: r.nbytes for _, e in kept for r in e.objects.values()}
        refs = Counter(r.digest for _, e in kept for r in e.objects.values())
        total = sum(sizes.values()) + sum(p.stat().st_size for p, _ in kept)
        for path, entry in kept:
            if total <= args.max_size:
                break
            drop.add(path)
            total -= path.stat().st_size
            for record in entry.objects.values():
                refs[record.digest] -= 1
                if refs[record.digest] == 0:
                    total -= sizes[record.digest]
    for path in drop:
        path.unlink(missing_ok=True)
    kept = [e for _, e in store.entries()]
    _forget_reports(store, {(e.stage, e.key) for e in kept})
    referenced = {r.digest for e in kept for r in e.objects.values()} | {e.recipe for e in kept if e.recipe}
    freed, removed = 0, 0
    for path in store.object_files():
        stale_tmp = path.name.endswith(".tmp") and time.time() - path.stat().st_mtime > 3600
        if stale_tmp or (not path.name.startswith(".") and path.name not in referenced):
            freed += path.stat().st_size
            path.unlink(missing_ok=True)
            removed += 1
    print(f"dropped {len(drop)} entries and {removed} objects, freed {_human(freed)}")
    return 0


def _forget_reports(store: Store, kept: set) -> None:
    """Remove what reports keep in the cache for entries gc dropped: a case's figures once an entry they
    were drawn from is gone, and a record of use (log/used) once none of its entries is left."""
    for path in store.plot_files():
        if not (shown := drawn_from(path)) or not shown <= kept:  # unreadable: drawn again when needed
            path.unlink(missing_ok=True)
    store.forget_use(kept)


def _diff(old, new, path="") -> list:
    """Human-readable differences between two recipes."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _diff(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))
        return out
    if old != new:
        return [f"{path}: {json.dumps(old)[:80]} -> {json.dumps(new)[:80]}"]
    return []


def _specs_by_name(recipe: dict) -> dict:
    specs = recipe.get("plan", {}).get("specs")
    return {s["name"]: s for s in specs} if specs else None


def explain(project: Path, store: Store, target: str, variables=()) -> str:
    stage_name, _, case = target.partition(":")
    if stage_name not in BY_NAME or not case:
        raise SystemExit(f"expected STAGE:CASE with STAGE one of {', '.join(BY_NAME)}, got {target!r}")
    plans = _plans(project, store, variables)
    if case not in plans:
        raise SystemExit(config.Project.at(project).layout.no_case(case))
    plan, stage = plans[case], BY_NAME[stage_name]
    if plan.error:
        return f"{target}: the case cannot be planned: {plan.error}"
    lookups = graph.Lookups(plan, store)
    missed = lookups.not_cached(stage)
    if missed is None:
        return f"{target} is up to date (key {lookups.cached(stage).key[:16]})"
    if missed.kind is not graph.Missing.NO_ENTRY:
        return f"{target} is not up to date: {missed}"
    _, upstream = lookups.resolve(stage)
    current = graph.recipe(stage, plan, upstream)
    current["parts"] = graph.parts_detail(stage, plan)
    previous = [(e, recipe) for _, e in sorted(store.entries(), key=lambda pe: pe[0].stat().st_mtime)
                if e.stage == stage_name and e.case == case and (recipe := store.recipe(e))]
    if not previous:
        return f"{target} is not up to date: it has never run with this cache"
    last = previous[-1][1]
    lines = [f"{target} is not up to date: its key changed since the last run (key {previous[-1][0].key[:16]}):"]
    for field in ("pipeline", "toolchain", "upstream"):
        for d in _diff(last.get(field), current[field], field):
            lines.append("  " + {"pipeline": "golden_tasks code changed: ", "toolchain": "toolchain changed: ",
                                 "upstream": "upstream output changed: "}[field] + d)
    for field in stage.plan_fields:
        if last["plan"].get(field) == current["plan"][field]:
            continue
        if field in current["parts"]:
            changed = changed_parts(last["parts"].get(field, {}), current["parts"][field])
            lines.append(f"  {field} changed: {', '.join(changed) or 'its fingerprint'}")
        elif field == "specs":
            old, new = _specs_by_name(last), _specs_by_name(current)
            changed = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
            lines.append(f"  specs changed: {', '.join(changed)}")
        else:
            lines += ["  " + d for d in _diff(last["plan"].get(field), current["plan"][field], field)]
    return "\n".join(lines)


def _global_options(parser: argparse.ArgumentParser, project, cache) -> None:
    parser.add_argument("--project", type=Path, default=project, help="project root (default: .)")
    parser.add_argument("--cache", type=Path, default=cache,
                        help="cache directory (default: $GOLDEN_TASKS_CACHE or PROJECT/cache)")


def _watch(project: Path, selection: list) -> int:
    """`golden-tasks watch`: its selection checked (a task other than verify:CASE, an unknown variable or a
    layout error is one line and status 2), then golden_tasks.frontends.watch."""
    from .watch import VERIFY, watch  # noqa: PLC0415 -- only for this command

    variables = dict(s.split("=", 1) for s in selection if "=" in s)
    targets = [s for s in selection if "=" not in s]
    wrong = [f"{t!r} is not verify or verify:CASE" for t in targets if t != VERIFY and not t.startswith(f"{VERIFY}:")]
    if what := [*wrong, *filter(None, [unknown_variables(variables)])]:
        print(f"golden-tasks watch: {'; '.join(what)}", file=sys.stderr)
        return 2
    try:
        return watch(project, [t for t in targets if t != VERIFY], variables)
    except (LayoutError, ValueError, RuntimeError) as exc:  # a bad layout or variable value, planning that failed
        print(f"golden-tasks watch: {exc}", file=sys.stderr)
        return 2


def _ray_start_arguments(argv: list) -> tuple[list, list]:
    """(the command line up to `node`, what follows it: `ray start`'s arguments, passed on as they are).
    argparse would read `--head` and `--port` as options of its own, which a REMAINDER takes none of."""
    i = 0
    while i < len(argv):
        if argv[i] in ("--project", "--cache"):  # the options that come with a value
            i += 2
        elif argv[i].startswith("-"):
            i += 1
        else:  # the subcommand
            return (argv[:i + 1], argv[i + 1:]) if argv[i] == "node" else (argv, [])
    return argv, []


def main(argv=None) -> int:
    argv, ray_args = _ray_start_arguments(sys.argv[1:] if argv is None else list(argv))
    parser = argparse.ArgumentParser(prog="golden-tasks", description="Inspect and manage the golden-tasks cache.")
    _global_options(parser, project=Path.cwd(), cache=None)
    # The same options after the subcommand too (`replay DIR --project P`); there their default is SUPPRESS,
    # so that a value given before the subcommand is not overwritten.
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, project=argparse.SUPPRESS, cache=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    command = functools.partial(sub.add_parser, parents=[common])
    stats = command("stats", help="entries and bytes per stage; hit/miss counts of the last runs")
    stats.add_argument("--runs", type=int, default=5, help="how many recent runs to show")
    verify = command("verify", help="re-hash every object; report bad ones")
    verify.add_argument("--drop", action="store_true", help="drop bad objects and the entries using them")
    gc = command("gc", help="drop entries, then the objects no entry uses")
    gc.add_argument("--unused", action="store_true", help="entries the current library does not use")
    gc.add_argument("--older-than", type=float, metavar="DAYS", help="entries not used for DAYS days")
    gc.add_argument("--max-size", type=_size, metavar="SIZE", help="least recently used first, to fit SIZE")
    replay_p = command("replay", help="replay a runtime dir (runs/<case>) without the kernel's source")
    replay_p.add_argument("runtime_dir", type=Path)
    rank_p = command("rank", help="run this process's rank of a multi-rank CASE, as started by torchrun "
                                     "(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK); rank 0 prints the verdict")
    rank_p.add_argument("case")
    init_p = command("init", help="write what a project needs to run `doit verify`: dodo.py and an example "
                                  "case (never over an existing file)")
    init_p.add_argument("--kernels", metavar="DIR", help="the folder of kernel modules (default: the project's, "
                                                         "else kernels); another is added to [tool.golden-tasks]")
    watch_p = command("watch", help="verify again on every save of a file the cases depend on (Ctrl-C stops)")
    watch_p.add_argument("selection", nargs="*", metavar="verify:CASE | NAME=VALUE",
                         help="the cases to watch (default: every case) and doit variables for their runs")
    command("node", usage="golden-tasks node ARGS", help="start this machine as a Ray node of its class, for "
            "executor=ray: `ray start ARGS` (--head, --address ..., every argument after node is ray start's) with "
            "the class's resource added (docs/cluster.md)")
    machine_p = command("machine", help="what the runs measured of this machine: memory bandwidth by working-set "
                                        "size, matmul rates (docs/performance.md)")
    machine_p.add_argument("--measure", action="store_true", help="measure it (again) now: the next run times every "
                           "case again against the new figures")
    explain_p = command("explain", help="why STAGE:CASE is (not) up to date")
    explain_p.add_argument("target", metavar="STAGE:CASE")
    compare_p = command("compare", help="compare two run records (runs/report.json): status changes and "
                                           "kernel times; exit 1 on a regression (docs/comparing-runs.md)")
    compare_p.add_argument("a", type=Path, metavar="A.json", help="the baseline run record")
    compare_p.add_argument("b", type=Path, metavar="B.json", help="the run record to judge against it")
    compare_p.add_argument("--threshold", type=_nonnegative, default=2.0, metavar="PERCENT",
                           help="the smallest difference that counts as FASTER or SLOWER (default: 2)")
    compare_p.add_argument("--sigmas", type=_nonnegative, default=3.0, metavar="K",
                           help="how many standard errors a difference must exceed (default: 3)")
    compare_p.add_argument("--drift", type=_nonnegative, default=DRIFT * 100, metavar="PERCENT",
                           help="how much one run's times move from run to run on this machine, beyond their "
                                f"rounds' noise (default: {DRIFT * 100:g})")
    compare_p.add_argument("--fail-on", choices=FAIL_ON, default="any",
                           help="what exits 1: a PASS case no longer PASS (status), a SLOWER case (slower), "
                                "either (any, the default) or nothing (none)")
    for p in (gc, explain_p):
        p.add_argument("variables", nargs="*", metavar="NAME=VALUE", type=_variable,
                       help="doit variables of the runs to compare with (backend=eager, profile=flash, ...)")
    args = parser.parse_args(argv)
    args.project = args.project.resolve()
    if args.command == "compare":
        try:
            text, code = compare(args.a, args.b, args.threshold / 100, args.sigmas, args.fail_on, args.drift / 100)
        except BadRecord as exc:
            print(f"golden-tasks compare: {exc}", file=sys.stderr)
            return 2
        print(text)
        return code
    if args.command == "init":
        try:
            written = init(args.project, args.kernels)
        except (InitRefused, LayoutError) as exc:
            print(f"golden-tasks init: {exc}", file=sys.stderr)
            return 2
        print("wrote " + ", ".join(str(p.relative_to(args.project)) for p in written) + "\nnext: doit verify")
        return 0
    if args.command == "watch":
        return _watch(args.project, args.selection)
    if args.command == "node":
        try:
            started = start_node(ray_args)
        except ValueError as exc:
            print(f"golden-tasks node: {exc}", file=sys.stderr)
            return 2
        print(f"node class {node_class()} (this machine's toolchain and hardware)", flush=True)
        return subprocess.call(started)
    if args.command == "replay":
        from ..pipeline.replay import main as replay_main  # noqa: PLC0415 -- imports torch

        return replay_main(args.runtime_dir, args.project)
    if args.command == "rank":
        from ..pipeline.launched import main as rank_main  # noqa: PLC0415 -- imports torch

        return rank_main(args.project, args.case)
    try:
        store = config.Project.at(args.project, cache=args.cache).store
    except LayoutError as exc:
        print(f"golden-tasks: {exc}", file=sys.stderr)
        return 2
    if not store.root.is_dir() and not (args.command == "machine" and args.measure):
        print(f"no cache at {store.root}", file=sys.stderr)
        return 2
    if args.command == "explain":
        print(explain(args.project, store, args.target, args.variables))
        return 0
    return {"stats": cmd_stats, "verify": cmd_verify, "gc": cmd_gc, "machine": cmd_machine}[args.command](store, args)


def cmd_machine(store: Store, args) -> int:
    calibrate = BY_NAME[StageName.CALIBRATE]
    if args.measure:  # again: its entry replaced, under the same key
        from ..pipeline.execution import execute  # noqa: PLC0415 -- imports torch

        plan = Plan(case="machine")
        key, _ = graph.Lookups(plan, store).resolve(calibrate)
        store.entry_path(calibrate.name, key).unlink(missing_ok=True)
        execute(calibrate, plan, store)
    declared = config.Project.at(args.project, cache=args.cache).layout.machine  # [tool.golden-tasks.machine]
    found = [(Stats.of(entry).node or {}, limits.with_declared(declared))
             for _, entry in store.entries() if entry.stage == calibrate.name
             for limits in map(Limits.from_json, MachineMeta.of(entry).limits)]
    if not found:
        print(f"nothing measured in {store.root} yet: `doit verify` measures this machine on its first run, "
              "`golden-tasks machine --measure` now")
        return 1
    print(format_limits(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
