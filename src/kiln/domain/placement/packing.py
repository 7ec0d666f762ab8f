"""Packing for the scheduling policy (policy.py): the free resources of each node in layers, best-fit placement
of a gang of identical workers on a view of those layers, and the "can this ever fit" check. Pure, no I/O.

A node's resources that no running job holds are split in layers, each CPU count, byte and GPU index in exactly
one of them (SOON is the exception: resources a running job still holds but is being preempted from):

* AVAIL  free now and earmarked for nobody: anyone may use them.
* EASY   free now, earmarked for the job holding the reservation; EASY backfill may borrow them.
* SOON   held by running jobs already being preempted, not yet claimed by a waiting job.
* HELD   free now, earmarked for a job waiting on a preemption: nobody else may use them.

A *view* is a tuple of layers looked at together (plus, optionally, ``extra`` resources per node: what victims
or finishing jobs would give back). GPUs are picked lowest index first within the first of ``extra`` and the
view's layers that has any, so that as little as possible is earmarked or borrowed.

CPUs are whole millicores and memory whole bytes (integers, as Kubernetes counts them): what fits exactly fits,
and what is free never reads as a float residue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kiln.domain.placement.types import Node, Pending, WorkerAlloc
from kiln.domain.quantities import format_cpus, format_memory

AVAIL, EASY, SOON, HELD = 0, 1, 2, 3
EXTRA = -1  # in what NodeState.take returns: taken from the caller's extra resources
# Views, in the order their resources are used (GPUs and CPUs come from ``extra`` first, then the first layer...):
V_AVAIL = (AVAIL,)
V_EASY = (AVAIL, EASY)  # borrow as little as possible of the reservation's earmark
V_SOON = (SOON, AVAIL)  # use what the preempted jobs give back before earmarking what is free now
V_FREE = (AVAIL, EASY, HELD)

# workers, millicores, memory, gpus (per worker), gpu_type, node selector
Shape = tuple[int, int, int, int, "str | None", tuple[tuple[str, str], ...]]


class Res:
    """Resources on one node: millicores, bytes of memory, GPU indices."""

    __slots__ = ("cpus", "gpus", "memory")

    def __init__(self, cpus: int = 0, memory: int = 0, gpus: Iterable[int] = ()) -> None:
        self.cpus = cpus  # millicores
        self.memory = memory
        self.gpus = set(gpus)

    def add(self, cpus: int, memory: int, gpus: Iterable[int]) -> None:
        self.cpus += cpus
        self.memory += memory
        self.gpus.update(gpus)


class NodeState:
    """One node during a decision: static capacity and the layers of what is free."""

    __slots__ = (
        "all_gpus",
        "c",
        "cpus",
        "g",
        "gpu_count",
        "index",
        "labels",
        "m",
        "memory",
        "name",
        "type_count",
        "type_names",
        "types",
    )

    def __init__(self, index: int, node: Node) -> None:
        self.index = index
        self.name = node.name
        self.cpus = node.millicores
        self.memory = node.memory
        self.gpu_count = len(node.gpus)
        self.all_gpus = frozenset(node.gpus)
        # A GPU matches a gpu_type that is any run of words of its model name: "H200", "h200" and "NVIDIA H200"
        # all match "NVIDIA H200" (what NVML reports), so users need not spell the vendor's full name.
        self.types: Mapping[int, frozenset[str]] = {g: type_words(t) for g, t in node.gpu_types.items()}
        self.type_names: frozenset[str] = frozenset(node.gpu_types.get(g, "") for g in node.gpus) - {""}
        self.labels: Mapping[str, str] = node.labels
        self.type_count: dict[str, int] = {}
        for gpu in node.gpus:
            for kind in self.types.get(gpu, ()):
                self.type_count[kind] = self.type_count.get(kind, 0) + 1
        self.c: list[int] = [node.millicores, 0, 0, 0]
        self.m: list[int] = [node.memory, 0, 0, 0]
        self.g: list[set[int]] = [set(node.gpus), set(), set(), set()]

    def hold(self, alloc: WorkerAlloc, preempting: bool) -> None:
        """A running job's worker holds this (if it is being preempted, it is SOON free)."""
        memory = alloc.memory or 0
        self.c[AVAIL] -= alloc.millicores
        self.m[AVAIL] -= memory
        self.g[AVAIL].difference_update(alloc.gpus)
        if preempting:
            self.c[SOON] += alloc.millicores
            self.m[SOON] += memory
            self.g[SOON].update(g for g in alloc.gpus if g in self.all_gpus)

    def take(
        self, view: Sequence[int], cpus: int, memory: int, gpus: Iterable[int], extra: Res | None = None
    ) -> dict[int, Res]:
        """Remove a worker's share from ``extra`` (this node's part of the caller's extra resources, reduced in
        place) first, then from the layers of ``view`` in order; returns what came from which (EXTRA: extra)."""
        taken: dict[int, Res] = {}
        for gpu in gpus:
            if extra is not None and gpu in extra.gpus:
                extra.gpus.discard(gpu)
                taken.setdefault(EXTRA, Res()).gpus.add(gpu)
                continue
            for layer in view:
                if gpu in self.g[layer]:
                    self.g[layer].discard(gpu)
                    taken.setdefault(layer, Res()).gpus.add(gpu)
                    break
        if extra is not None:
            c = min(max(extra.cpus, 0), cpus)
            m = min(max(extra.memory, 0), memory)
            if c > 0 or m > 0:
                extra.cpus -= c
                extra.memory -= m
                res = taken.setdefault(EXTRA, Res())
                res.cpus += c
                res.memory += m
                cpus -= c
                memory -= m
        for layer in view:
            if cpus <= 0 and memory <= 0:
                break
            c = min(max(self.c[layer], 0), cpus)
            m = min(max(self.m[layer], 0), memory)
            if c > 0 or m > 0:
                self.c[layer] -= c
                self.m[layer] -= m
                res = taken.setdefault(layer, Res())
                res.cpus += c
                res.memory += m
                cpus -= c
                memory -= m
        return taken

    def give(self, layer: int, res: Res) -> None:
        self.c[layer] += res.cpus
        self.m[layer] += res.memory
        self.g[layer].update(res.gpus)


def normalize_gpu_type(text: str) -> str:
    return " ".join(text.lower().replace("-", " ").replace("_", " ").split())


def type_words(name: str) -> frozenset[str]:
    """Every run of consecutive words of a GPU model name, normalised: what a gpu_type may say to match it."""
    words = normalize_gpu_type(name).split()
    return frozenset(" ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1))


def shape_of(job: Pending) -> Shape:
    """What placement depends on; jobs of one shape fit or fail alike."""
    selector = tuple(sorted(job.node_selector.items())) if job.node_selector else ()
    return (job.workers, job.millicores, job.memory or 0, job.gpus, job.gpu_type if job.gpus else None, selector)


def matching(nodes: Sequence[NodeState], shape: Shape) -> list[NodeState]:
    """Nodes whose labels include the selector and that have GPUs of the asked type (if it asks GPUs)."""
    _, _, _, _, asked, selector = shape
    gpu_type = normalize_gpu_type(asked) if asked else None
    out = []
    for node in nodes:
        if selector and any(node.labels.get(k) != v for k, v in selector):
            continue
        if gpu_type is not None and not node.type_count.get(gpu_type):
            continue
        out.append(node)
    return out


def fit(
    nodes: Sequence[NodeState],
    shape: Shape,
    view: Sequence[int],
    extra: Mapping[int, Res] | None = None,
    count_only: bool = False,
) -> list[tuple[NodeState, tuple[int, ...]]] | int | None:
    """Best-fit placement of the whole gang on ``view`` (+ ``extra``): per worker the fitting node with the fewest
    free GPUs, then the fewest free CPUs, then the least free memory; GPUs lowest index first. Returns one
    (node, gpus) per worker, or None when not all workers fit. ``count_only``: how many workers fit."""
    workers, cpus, memory, gpus, asked, _ = shape
    gpu_type = normalize_gpu_type(asked) if asked else None
    single = len(view) == 1 and not extra
    cands: list[list] = []  # [free gpus, cpus, memory, free gpus of the type, node, gpu set, workers taken]
    for node in nodes:
        if single:
            layer = view[0]
            c, m, gs = node.c[layer], node.m[layer], node.g[layer]
        else:
            c, m, gs = 0, 0, set()
            for layer in view:
                c += node.c[layer]
                m += node.m[layer]
                gs |= node.g[layer]
            more = extra.get(node.index) if extra else None
            if more is not None:
                c += more.cpus
                m += more.memory
                gs |= more.gpus
        if c < cpus or m < memory:
            continue
        typed = len(gs) if gpu_type is None else sum(1 for g in gs if gpu_type in node.types.get(g, ()))
        if typed < gpus:
            continue
        cands.append([len(gs), c, m, typed, node, gs, 0])
    if not cands:
        return 0 if count_only else None
    placed = 0
    for _ in range(workers):
        best = None
        best_key: tuple[int, int, int, int] | None = None
        for cand in cands:
            if cand[1] < cpus or cand[2] < memory or cand[3] < gpus:
                continue
            key = (cand[0], cand[1], cand[2], cand[4].index)
            if best_key is None or key < best_key:
                best, best_key = cand, key
        if best is None:
            break
        best[0] -= gpus
        best[1] -= cpus
        best[2] -= memory
        best[3] -= gpus
        best[6] += 1
        placed += 1
    if count_only:
        return placed
    if placed < workers:
        return None
    out: list[tuple[NodeState, tuple[int, ...]]] = []
    for cand in cands:
        n = cand[6]
        if not n:
            continue
        node = cand[4]
        if gpus:
            if single:
                pool = sorted(g for g in cand[5] if gpu_type is None or gpu_type in node.types.get(g, ()))
            else:
                pool = []
                more = extra.get(node.index) if extra else None
                for source in (more.gpus if more is not None else set(), *(node.g[layer] for layer in view)):
                    pool.extend(sorted(g for g in source if gpu_type is None or gpu_type in node.types.get(g, ())))
                pool = list(dict.fromkeys(pool))
            for i in range(n):
                out.append((node, tuple(pool[i * gpus : (i + 1) * gpus])))
        else:
            out.extend((node, ()) for _ in range(n))
    return out


# -- descriptions -------------------------------------------------------------------------------------------


def gpus_word(n: int, gpu_type: str | None) -> str:
    return f"{n} {gpu_type + ' ' if gpu_type else ''}GPU{'' if n == 1 else 's'}"


def describe(shape: Shape) -> str:
    """Per-worker demand in words: ``1 GPU, 4 CPUs, 8Gi memory``."""
    _, cpus, memory, gpus, gpu_type, _ = shape
    parts = [gpus_word(gpus, gpu_type)] if gpus else []
    parts.append(f"{format_cpus(cpus)} CPU{'' if cpus == 1000 else 's'}")
    if memory:
        parts.append(f"{format_memory(memory)} memory")
    return ", ".join(parts)


def selector_text(selector: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector)


def never_fits(nodes: Sequence[NodeState], shape: Shape) -> str | None:
    """Why a gang of this shape can never be placed on these nodes, even all empty; None if it can."""
    workers, cpus, memory, gpus, gpu_type, selector = shape
    if not nodes:
        return "there are no nodes to run on"
    where = nodes
    if selector:
        where = [n for n in nodes if all(n.labels.get(k) == v for k, v in selector)]
        if not where:
            return f"node_selector {selector_text(selector)} matches no node"
    wanted = normalize_gpu_type(gpu_type) if gpu_type else None
    if wanted is not None:
        typed = [n for n in where if n.type_count.get(wanted)]
        if not typed:
            have = sorted({t for n in where for t in n.type_names})
            scope = f"nodes matching node_selector {selector_text(selector)}" if selector else "nodes"
            return f"asks gpu_type {gpu_type}; {scope} have {', '.join(have) if have else 'no typed GPUs'}"
        where = typed
    word = "matching node" if selector or gpu_type else "node"
    per = " per worker" if workers > 1 else ""

    def gpus_on(n: NodeState) -> int:
        return n.type_count.get(wanted, 0) if wanted is not None else n.gpu_count

    if cpus > max(n.cpus for n in where):
        return f"asks {format_cpus(cpus)} CPUs{per}; the largest {word} has {format_cpus(max(n.cpus for n in where))}"
    if memory > max(n.memory for n in where):
        most = max(n.memory for n in where)
        return f"asks {format_memory(memory)} memory{per}; the largest {word} has {format_memory(most)}"
    if gpus > max(gpus_on(n) for n in where):
        return f"asks {gpus_word(gpus, gpu_type)}{per}; the largest {word} has {max(gpus_on(n) for n in where)}"
    room = 0
    for n in where:
        if n.cpus < cpus or n.memory < memory or gpus_on(n) < gpus:
            continue
        per_node = workers
        if cpus > 0:
            per_node = min(per_node, n.cpus // cpus)
        if memory:
            per_node = min(per_node, n.memory // memory)
        if gpus:
            per_node = min(per_node, gpus_on(n) // gpus)
        room += per_node
        if room >= workers:
            return None
    if room == 0:
        return f"no {word} has {describe(shape)} at once"
    return (
        f"a gang of {workers} workers ({describe(shape)} each) can never be placed at once: "
        f"the {word}s hold at most {room}"
    )


def capacity_message(nodes: Sequence[NodeState], shape: Shape, view: Sequence[int]) -> str:
    """``capacity: GPUs 2 asked, 1 free``, or for a gang of which some workers fit, ``gang: ...``."""
    workers, cpus, memory, gpus, gpu_type, _ = shape
    fitting = fit(nodes, shape, view, count_only=True)
    assert isinstance(fitting, int)
    if 0 < fitting < workers:
        return (
            f"gang: {fitting} of {workers} workers fit now (each {describe(shape)}); all {workers} are placed together"
        )
    one = len(nodes) == 1
    most = "" if one else "at most "
    where = "" if one else " on one node"
    free_c = max((sum(n.c[layer] for layer in view) for n in nodes), default=0)
    free_m = max((sum(n.m[layer] for layer in view) for n in nodes), default=0)
    free_g = 0
    for n in nodes:
        gs: set[int] = set()
        for layer in view:
            gs |= n.g[layer]
        free_g = max(free_g, sum(1 for g in gs if gpu_type is None or n.types.get(g) == gpu_type))
    short = []
    if cpus > free_c:
        short.append(f"CPUs {format_cpus(cpus)} asked, {most}{format_cpus(max(free_c, 0))} free{where}")
    if memory > free_m:
        short.append(f"memory {format_memory(memory)} asked, {most}{format_memory(max(free_m, 0))} free{where}")
    if gpus > free_g:
        short.append(f"GPUs{' ' + gpu_type if gpu_type else ''} {gpus} asked, {most}{free_g} free{where}")
    if not short:
        short.append(f"no node has {describe(shape)} free at once")
    if workers > 1:
        short.append(f"none of the {workers} workers fits")
    return "capacity: " + "; ".join(short)
