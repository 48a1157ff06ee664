"""Stages on a Ray cluster: with executor=ray (`doit verify executor=ray`, golden_tasks.run(executor="ray"))
each stage that must run is a Ray task, while the caller still decides what is cached, orders the graph and
commits every entry.

    execution.execute(..., producer=RayCluster.produce)   in the driver (doit's parent, submitting from threads)
      -> _connect, once, on the first stage that must run (a run whose stages are all cached never connects):
         ray.init with the checkout as the job's working_dir, the route the sources take to the nodes
      -> _options: CPUs, a GPU when the artifact lives on one (and the cluster has one: else the stage is
         skipped on the node, as on a machine without a GPU), the case's resources for the stages that run
         its kernel or golden, and always the driver's node class (toolchain.node_class); a multi-rank stage
         a placement group of world-size bundles on one node, all or nothing. A resource no node has fails
         the case with its name, rather than waiting for ever.
      -> run_on_node, in a worker: the checkout's kernel sources checked by digest, the upstream objects the
         node's store lacks fetched from Ray's object store (each checked by digest), execution.produce_here there
         (user code isolated and confined as on one machine), and what it made sent back by value
      -> _received: every object re-hashed into the driver's store; execution then commits the entry.

A worker never writes the driver's store. Ray runs a task again elsewhere when its worker or node dies
(RETRIES); a kernel that crashes is not a dead worker (its isolated child dies, and the task returns the
failure), so it is never retried into a PASS. Imports ray only when it connects.
"""
import atexit
import dataclasses
import functools
import importlib.util
import json
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any, cast

from ..model.errors import StageFailed, VerificationFailure
from ..model.hashing import digest_bytes, digest_file
from ..model.plan import Plan
from ..model.records import StoredObject
from ..project import config
from ..project.toolchain import hardware, node_class
from ..storage.entry import CorruptObject, Entry
from ..storage.store import Store, object_problem
from .execution import CaseSource, DamagedUpstream, Producer, produce_here
from .stage_table import BY_NAME, Stage, StageName
from .stored import Produced

RETRIES = 3  # times Ray runs a task again whose worker or node died
REACH_SECONDS = 10.0  # how long the cluster's address may take to answer (ray.init itself waits minutes)
NODE_CLASS_UNITS = 1000  # of its class's resource a node offers; each task asks for CLASS_SHARE of it
CLASS_SHARE = 0.001
PLACEMENT_SECONDS = 120.0  # how long a multi-rank stage waits for its ranks' bundles before it fails
# never uploaded with the checkout (beside the project's store and runs): gitignore patterns
EXCLUDED = (".git", ".venv", ".doit.db*", "__pycache__")
# the driver's variables a worker's stages read, besides the run's context (config.RunContext: sent with each task)
FORWARDED = ("CXX", "PYTHONWARNINGS")
# Ray's token authentication (Ray 2.52 and later): its mode, as every node and driver of a cluster must set it
# alike (docs/cluster.md), and where a token is kept unless $RAY_AUTH_TOKEN or $RAY_AUTH_TOKEN_PATH say otherwise
AUTH_MODE_ENV = "RAY_AUTH_MODE"
DEFAULT_TOKEN = "~/.ray/auth_token"


def producer(root: Path) -> Producer:
    """execution.execute's producer for this run's executor (config.executor): execution.produce_here, or the
    process's RayCluster for the project at `root`."""
    return produce_here if config.current().executor == "local" else cluster(Path(root).resolve()).produce


@functools.cache
def cluster(root: Path) -> "RayCluster":
    return RayCluster(root)


class RayCluster:
    """The driver's side (see the module). `submitted`: the tasks this process submitted."""

    def __init__(self, root: Path):
        self.root = root
        self.submitted = 0
        self.address: str | None = None  # the cluster's, once connected
        self._lock = threading.RLock()  # re-entered by cancel, from a SIGINT handler, in a thread that holds it
        self._ray: Any = None  # the ray module, once connected
        self._remote: Any = None  # run_on_node as a Ray remote function
        self._sources: dict[str, str] | None = None  # sources(): the kernel files' digests
        self.unreachable: str | None = None  # why connecting failed: every stage after the first fails with it at once
        self._refs: dict[str, Any] = {}  # object digest -> its ObjectRef: each object crosses once per run
        self._in_flight: set[Any] = set()  # the ObjectRefs of the tasks submitted and not yet done

    def produce(self, stage: Stage, plan: Plan, store: Store, upstream: dict[str, Entry],
                case: CaseSource) -> Produced | DamagedUpstream:
        """execution.produce_here's contract, on the cluster."""
        ray = self._connect()
        options, group = self._options(stage, plan, upstream)
        try:
            try:
                objects = {r.digest: self._put(store, entry, name, r)
                           for entry in upstream.values() for name, r in entry.objects.items()}
            except CorruptObject as corruption:
                return DamagedUpstream(corruption.entry, corruption.name, corruption.problem)
            crossing = case.crossing(plan)
            # the refs travel inside a list, so that Ray hands them over unresolved: a node fetches only those
            # its store lacks
            ref = self._remote.options(**options).remote(stage.name, plan, upstream, [objects],
                                                         (str(self.root), self._sources), crossing, self._context())
            with self._lock:
                self.submitted += 1
                self._in_flight.add(ref)
            try:
                outcome = ray.get(ref)
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError,
                    ray.exceptions.LocalRayletDiedError) as exc:
                raise StageFailed(f"the {stage.name} stage of {plan.case} was lost on the Ray cluster {RETRIES + 1} "
                                  f"times (its worker or node died): {type(exc).__name__}") from None
            except ray.exceptions.TaskCancelledError:
                raise StageFailed(f"the {stage.name} stage of {plan.case} was cancelled on the Ray cluster") from None
            except ray.exceptions.RayTaskError as exc:  # not the stage's failure (returned): the node's side broke
                cause = exc.cause
                raise StageFailed(f"the {stage.name} stage of {plan.case} broke on the Ray node at {exc.ip}: "
                                  f"{type(cause).__name__}: {cause}\n{exc.traceback_str}") from None
            finally:
                with self._lock:
                    self._in_flight.discard(ref)
        finally:
            if group is not None:
                ray.util.remove_placement_group(group)
        return _received(stage, store, outcome)

    def cancel(self) -> None:
        """Cancel every task still in flight, killing the workers that run them (an interrupted run leaves
        nothing running); the threads waiting on them see a StageFailed."""
        with self._lock:
            refs = list(self._in_flight)
        for ref in refs:
            self._ray.cancel(ref, force=True)

    def _connect(self) -> Any:  # the ray module
        with self._lock:
            if self.unreachable:
                raise StageFailed(self.unreachable)
            if self._ray is None:
                address = config.current().ray_address
                if address and (problem := _unreachable(address)):
                    self.unreachable = (f"cannot reach the Ray cluster at {address} (${config.RAY_ADDRESS_ENV} or "
                                         f"ray_address=): {problem}")
                    raise StageFailed(self.unreachable)
                import ray  # noqa: PLC0415 -- only a run that submits imports ray

                project = config.Project.at(self.root)
                self._sources = sources(project)
                inside = [f"/{p.relative_to(self.root)}" for p in (project.cache, project.runs)
                          if p.is_relative_to(self.root)]
                env = {name: os.environ[name] for name in FORWARDED if name in os.environ}
                # no address: a Ray instance of its own for this run (never the last cluster started here, which
                # ray.init would otherwise join), a node of this machine's class
                own: dict[str, Any] = {} if address else {"address": "local",
                                                          "resources": {node_class(): NODE_CLASS_UNITS}}
                try:
                    context = ray.init(runtime_env={"working_dir": str(self.root), "excludes": [*EXCLUDED, *inside],
                                                    "env_vars": env},
                                       log_to_driver=False, logging_level=logging.ERROR, **own)
                except (ConnectionError, RuntimeError) as exc:  # a refused token, a cluster that does not answer
                    self.unreachable = f"cannot connect to the Ray cluster at {address or 'a new local one'}: " \
                                        f"{_root_cause(exc)}"
                    raise StageFailed(self.unreachable) from None
                # ray.init's declared type is its base class; what it returns is a RayContext
                self.address = cast(Any, context).address_info.get("address") or address
                self._remote = ray.remote(run_on_node)
                atexit.register(self.cancel)
                self._ray = ray
        return self._ray

    @staticmethod
    def _context() -> config.RunContext:
        """The run's context as a task on a node runs in it: without the driver's journal and its workers (a
        task's threads are the CPUs Ray gives it)."""
        return dataclasses.replace(config.current(), journal=None, workers=1, threads=None)

    def _put(self, store: Store, entry: Entry, name: str, record: StoredObject) -> Any:  # an ObjectRef
        """The ObjectRef of an upstream object, read from the store and checked (CorruptObject if damaged)."""
        digest = record.digest
        if digest not in self._refs:
            try:
                data = store.object_path(digest).read_bytes()
            except OSError:
                data = None
            if data is None or digest_bytes(data) != digest:
                raise CorruptObject(entry, name, object_problem(store.object_path(digest), record) or "changed")
            self._refs[digest] = self._ray.put(data)
        return self._refs[digest]

    def _options(self, stage: Stage, plan: Plan, upstream: dict[str, Entry]) -> tuple[dict[str, Any], Any]:
        """(the task's Ray options, its placement group or None), once the cluster is known to have what they
        ask for (else a StageFailed naming what is missing)."""
        ray = self._ray
        cpus = config.current().threads or 1
        device = upstream[StageName.COMPILE].meta.get("device", "cpu") if StageName.COMPILE in upstream else "cpu"
        # a cluster with no GPU at all runs it anywhere: the node skips a CUDA kernel, as a machine without one does
        gpus = 1 if device == "cuda" and ray.cluster_resources().get("GPU", 0) >= 1 else 0
        resources = {node_class(): CLASS_SHARE, **(plan.resources if "resources" in stage.plan_fields else {})}
        options = {"num_cpus": cpus, "num_gpus": gpus, "resources": resources, "max_retries": RETRIES,
                   "retry_exceptions": False}
        world = plan.ranks if StageName.COMPILE in stage.reads and plan.ranks > 1 else 1
        self._check_placeable(plan, {"CPU": cpus * world, "GPU": gpus * world, **resources})
        if world == 1:
            return options, None
        # bundle 0 holds the task and every rank's GPU (the task's ranks see the GPUs Ray gives it); the
        # others the CPUs of ranks 1..world-1; STRICT_PACK: all on one node, or none
        first = {"CPU": cpus, **({"GPU": gpus * world} if gpus else {}), **resources}
        group = ray.util.placement_group([first] + [{"CPU": cpus}] * (world - 1), strategy="STRICT_PACK")
        try:
            ray.get(group.ready(), timeout=PLACEMENT_SECONDS)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(group)
            raise StageFailed(f"case {plan.case!r}: its {world} ranks found no node of the Ray cluster with room "
                              f"for all of them within {PLACEMENT_SECONDS:g} s ({world} x {first})") from None
        strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(group, 0)
        return {**options, "num_gpus": gpus * world, "scheduling_strategy": strategy}, group

    def _check_placeable(self, plan: Plan, demand: dict[str, float]) -> None:
        totals = self._ray.cluster_resources()
        for name, amount in demand.items():
            if amount and totals.get(name, 0) < amount:
                if name == node_class():
                    raise StageFailed(f"no node of the Ray cluster at {self.address} is of this machine's class "
                                      f"{name} (its toolchain and hardware: the keys hold them); start nodes with "
                                      "`golden-tasks node` on machines like this one (docs/cluster.md)")
                has = ", ".join(f"{k}={v:g}" for k, v in sorted(totals.items()) if not k.startswith("node:"))
                raise StageFailed(f"case {plan.case!r} asks for resource {name!r} ({amount:g}), which no node of the "
                                  f"Ray cluster at {self.address} has (the cluster has: {has})")


def _root_cause(exc: BaseException) -> str:
    """The first line of the innermost exception that caused `exc` (Ray wraps a refused token twice), with what
    to do about a refused token."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if type(exc).__name__ == "AuthenticationError":
        first += (f" (the cluster authenticates with a token: set {AUTH_MODE_ENV}=token where doit runs, with the "
                  f"cluster's token in {DEFAULT_TOKEN}; docs/cluster.md)")
    return first


def _unreachable(address: str) -> str | None:
    """Why nothing answers at a cluster's HOST:PORT within REACH_SECONDS (None when something does, or the
    address is of another form: ray://, auto), so that a wrong address is an error, not a wait of minutes."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=REACH_SECONDS).close()
    except OSError as exc:
        return str(exc) or type(exc).__name__
    return None


def start_node(ray_args: list[str]) -> list[str]:
    """The command that starts this machine as a node of its class (`golden-tasks node ARGS`): `ray start ARGS`,
    the class's resource added to the node's custom resources (merged into a --resources JSON given); a
    ValueError says what is wrong (a --resources that is no JSON object, no ray installed)."""
    if importlib.util.find_spec("ray") is None:
        raise ValueError("ray is not installed here: pip install 'golden-tasks[ray]'")
    args, resources = list(ray_args), {}
    for i, arg in enumerate(args):
        if arg == "--resources" or arg.startswith("--resources="):
            text = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            try:
                resources = json.loads(text)
            except ValueError:
                raise ValueError(f"--resources {text!r} is not a JSON object") from None
            del args[i:i + (1 if "=" in arg else 2)]
            break
    if not isinstance(resources, dict):
        raise ValueError(f"--resources {resources!r} is not a JSON object")
    resources[node_class()] = NODE_CLASS_UNITS
    return [sys.executable, "-m", "ray.scripts.scripts", "start", *args, "--resources", json.dumps(resources)]


def sources(project: config.Project) -> dict[str, str]:
    """What the nodes must find in the job's working_dir: every file of the kernel folders, by its path in the
    checkout, and its digest (a kernel folder outside the checkout cannot reach them: a StageFailed)."""
    found = {}
    for folder in project.layout.kernels:
        if not folder.is_relative_to(project.root):
            raise StageFailed(f"kernel folder {folder} lies outside the checkout {project.root}, which is what "
                              "reaches the Ray cluster's nodes")
        found.update({str(p.relative_to(project.root)): digest_file(p) for p in sorted(folder.rglob("*"))
                      if p.is_file() and "__pycache__" not in p.parts})
    return found


# in a worker: (the driver's checkout, its sources' digest) -> the checkout found for them
_arrived: dict[tuple[str, str], Path] = {}


def _checkout(driver_root: str, expected: dict[str, str]) -> Path:
    """The checkout a task runs from (and in): the driver's own path where this node sees the same sources there (a
    shared filesystem, or a cluster on one machine: artifacts that record their source's path are then the
    driver's), else the job's working_dir (the current directory), checked the same way; a StageFailed
    names a file that differs in both."""
    key = (driver_root, digest_bytes(repr(sorted(expected.items())).encode()))
    if key not in _arrived:
        for root in (Path(driver_root), None):  # the working_dir last: its finding is the one reported
            root = root or Path.cwd()  # asked only where the driver's checkout is not this one
            found = {rel: digest_file(root / rel) if (root / rel).is_file() else None for rel in expected}
            if differs := [(rel, digest) for rel, digest in found.items() if digest != expected[rel]]:
                continue
            _arrived[key] = root
            break
        else:
            rel, digest = differs[0]
            raise StageFailed(f"the checkout reached node {hardware()['host']} without {rel} as the driver has it "
                              f"({'missing' if digest is None else 'different content'} in the job's working_dir): "
                              "is it ignored by .gitignore, which Ray's working_dir upload follows?")
    return _arrived[key]


@dataclasses.dataclass(frozen=True)
class Sent:
    """Produced, sent back from a node: each object as (its record, its bytes), for the driver's store."""
    objects: dict[str, tuple[StoredObject, bytes]]
    meta: dict[str, Any]
    stats: dict[str, Any]


def run_on_node(stage_name: str, plan: Plan, upstream: dict[str, Entry], refs: list[dict[str, Any]],
                checkout: tuple[str, dict[str, str]],
                case: CaseSource, context: config.RunContext) -> Sent | DamagedUpstream | VerificationFailure:
    """A Ray task, in a worker of the node Ray placed it on (its working directory: the job's copy of the
    checkout; `checkout`: the driver's path of it and its sources, see _checkout): execution.produce_here on
    the node's own store, in the run's `context` with the CPUs Ray gave the task, what it made sent back; a
    failure of the stage is returned, not raised, so that Ray never retries it."""
    import ray  # noqa: PLC0415 -- this runs in a Ray worker

    try:
        root = _checkout(*checkout)
        os.chdir(root)  # as a local run's stages, which run in the project's root
        runtime: Any = ray.get_runtime_context()  # its get_assigned_resources is not annotated
        assigned = runtime.get_assigned_resources().get("CPU") or 1
        config.enter(dataclasses.replace(context, threads=max(1, int(assigned))))
        project = config.Project.at(root, cache=config.node_store())
        project.layout.importable()
        store = project.store
        for entry in upstream.values():
            for record in entry.objects.values():
                if object_problem(store.object_path(record.digest), record):
                    got = store.put_buffer(ray.get(refs[0][record.digest]))
                    if got.digest != record.digest:
                        raise StageFailed(f"an object of the {entry.stage} stage reached node {hardware()['host']} "
                                          f"altered (digest {got.digest}, not {record.digest})")
        made = produce_here(BY_NAME[stage_name], plan, store, upstream, case)
    except VerificationFailure as exc:
        return exc
    if not isinstance(made, Produced):
        return made
    return Sent({n: (r, store.object_path(r.digest).read_bytes()) for n, r in made.objects.items()},
                made.meta, made.stats)


def _received(stage: Stage, store: Store, outcome: Sent | DamagedUpstream | VerificationFailure
              ) -> Produced | DamagedUpstream:
    """What a task sent back as execution.produce_here's result, its objects re-hashed into the driver's store."""
    if isinstance(outcome, VerificationFailure):
        raise outcome
    if isinstance(outcome, DamagedUpstream):
        return outcome
    objects, stats = {}, outcome.stats
    for name, (record, data) in outcome.objects.items():
        got = store.put_buffer(data)
        if (got.digest, got.nbytes) != (record.digest, record.nbytes):
            raise StageFailed(f"object {name!r} of the {stage.name} stage came back from node "
                              f"{(stats.get('node') or {}).get('host')} as {got.digest}, not the {record.digest} "
                              "it was sent as: not committed")
        objects[name] = record
    return Produced(objects, outcome.meta, stats)
