"""The trainer's handle on one vLLM engine: connect once (each worker describes its model, the
trainer plans every layer group once per tensor-parallel rank), then `update(params)` per
training step.

An update is vLLM's protocol driven through `llm.collective_rpc`: start_weight_update; per
batch of layer groups (steps.py), the swap writes each rank's slice of the new values into that
rank's staging buffer (by address, the step's cached program, reading the trainer's arrays whole
where the direct launch reads the groups' layers itself: then a batch is one swap per rank;
transports.py says how the buffer is reached) and update_weights({"groups": [...]}) commits them
on every rank (vLLM's processing included); finish_weight_update; then the prefix cache is reset,
so no KV block computed with the old weights is reused.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

from .. import reshard
from ..reshard import Layout
from ..reshard.presets import resolved_family
from ..reshard.unread import UnreadWeightsError
from ..swapping import swap
from ..swapping.in_process.direct import waits_deferred
from .errors import VllmBackendError, VllmPlanError, VllmUpdateError
from .names import match
from .ranks import rank_pieces
from .steps import Step, common_batches
from .unread import refusal
from . import nccl, options, readiness
from .transports import InProcess, Nccl, alive, checked_transport, open_rank, placement

BACKEND = "jax_amem"
WATCH_S = 0.05   # how often a call into workers of other processes checks that they are alive


@dataclass
class VllmUpdateReport:
    version: int
    bytes: int
    groups: int
    seconds: float        # the whole update
    swap_seconds: float   # the swaps into staging
    commit_seconds: float  # the worker's commits (vLLM's processing included)
    commits: int = 0      # calls into the workers that committed (one per batch of groups)
    start_seconds: float = 0.0   # before the first swap: the tree's check, the engine's readiness, start_weight_update
    finish_seconds: float = 0.0  # after the last commit: finish_weight_update and the prefix cache's reset

    def __str__(self):
        return (f"vllm update v{self.version}: {self.bytes / 2**20:.1f} MiB in {self.groups} groups "
                f"({self.commits} commits), "
                f"{self.seconds * 1e3:.1f} ms (start {self.start_seconds * 1e3:.1f} ms, swap "
                f"{self.swap_seconds * 1e3:.1f} ms, commit {self.commit_seconds * 1e3:.1f} ms, finish "
                f"{self.finish_seconds * 1e3:.1f} ms)")


class WorkerFailure(RuntimeError):
    """A commit the workers refused or failed (their kept failures, each rank's named)."""


def _one_layer(rules, sources):
    """A group's rules rewritten to read the one layer they read of each stacked source, and the
    function that picks those layers (jitted; the other sources passed whole) from the tree: a
    `Pick`, whose `shapes` reads what it would return without running it.

    A Rule reads a layer through `Part.index` (picked and dropped, as numpy indexes). A Piece
    reads a box of its source: the coordinate every one of the group's pieces of that source
    reads on an axis (a layer on the scan axis, 0 or 1, an expert) is picked and kept as an axis
    of extent 1, so the pieces' permutations still fit; their source starts, and any vector
    constant along that axis, move to it. A source the pieces read more of on every axis is
    passed whole.

    For groups whose views XLA makes (`_reads_whole_sources` is False): XLA makes a transposed
    or cast source view whole, so a group read from the whole stack would transpose every layer
    for each group. Picked first, it transposes its own."""
    import dataclasses

    import jax

    picks: dict[str, tuple[str, tuple]] = {}   # picked name -> (source, index: ints and slices)

    def picked(src: str, index: tuple) -> str:
        name = src if not index else f"{src}@" + ",".join(
            str(i) if isinstance(i, int) else ":" if i.start is None else f"{i.start}:{i.stop}" for i in index)
        picks[name] = (src, index)
        return name

    one = _one_coordinate([r for r in rules if isinstance(r, reshard.Piece)], sources)
    out = []
    for rule in rules:
        if isinstance(rule, reshard.Piece):
            out.append(_piece_on_pick(rule, one.get(rule.src, {}), picked))
            continue
        parts = [dataclasses.replace(part, src=picked(part.src, tuple(part.index)), index=()) for part in rule.parts]
        out.append(dataclasses.replace(rule, parts=tuple(parts)))

    stacked = {name: pick for name, pick in picks.items() if pick[1]}

    @jax.jit
    def layer(flat):   # one copy of the group's layer; the whole sources are passed as they are
        return {name: flat[src][index] for name, (src, index) in stacked.items()}

    return out, Pick(picks, stacked, layer)


class Pick:
    """`pick(params)`: a group's sources out of the tree, each stacked one's layer picked (a
    jitted copy), the others as they are. `pick.shapes(params)`: the same tree with each picked
    layer a ShapeDtypeStruct of the shape, dtype and sharding the copy would have, read from
    its compiled program without running it (connect plans from it; the update's first pick
    finds the program compiled)."""

    def __init__(self, picks: dict, stacked: dict, layer):
        self.picks, self.stacked, self.layer = picks, stacked, layer

    def __call__(self, params) -> dict:
        return self._with(params, self.layer)

    def shapes(self, params) -> dict:
        # The arrays themselves are lowered (nothing runs): their committedness places the
        # output as a call would; out_info's sharding is the compiled program's, as the call's.
        return self._with(params, lambda stacks: self.layer.lower(stacks).compile().out_info)

    def _with(self, params, layer) -> dict:
        flat = reshard.tree_names(params)
        whole = {name: flat[src] for name, (src, index) in self.picks.items() if not index}
        if not self.stacked:
            return whole
        return {**whole, **layer({src: flat[src] for src, _ in self.stacked.values()})}


def _one_coordinate(pieces, sources) -> dict[str, dict[int, int]]:
    """Per source: {axis: coordinate} for each axis (of the source's own, extent above 1) on
    which every piece reading it reads that one coordinate."""
    from ..reshard.lowering import aligned_source_size

    boxes: dict[str, dict[int, set]] = {}
    for p in pieces:
        ndim = len(p.src_start)
        perm = range(ndim) if p.perm is None else p.perm
        size = aligned_source_size(p.size, ndim, p.dst)
        seen = boxes.setdefault(p.src, {})
        for j, axis in enumerate(perm):
            seen.setdefault(axis, set()).add(p.src_start[j] if size[j] == 1 else None)
    return {src: {axis: next(iter(c)) for axis, c in axes.items()
                  if len(c) == 1 and None not in c and sources[src].shape[axis] > 1}
            for src, axes in boxes.items()}


def _piece_on_pick(piece, one: dict[int, int], picked):
    """`piece` reading its source with the coordinates `one` ({axis: coordinate}) picked out."""
    import dataclasses

    ndim = len(piece.src_start)
    index = tuple(slice(one[a], one[a] + 1) if a in one else slice(None) for a in range(ndim)) if one else ()
    perm = tuple(range(ndim)) if piece.perm is None else piece.perm
    src_start = tuple(s - one.get(axis, 0) for s, axis in zip(piece.src_start, perm))
    affine = piece.affine
    if affine is not None and one:
        affine = dataclasses.replace(affine, steps=tuple(
            dataclasses.replace(step, start=step.start - one[step.axis]) if step.axis in one else step
            for step in affine.steps))
    return dataclasses.replace(piece, src=picked(piece.src, index), src_start=src_start, affine=affine)


def _reads_whole_sources(plan, arrays: dict) -> bool:
    """Whether the swap's direct launch runs `plan` reading its sources whole (a stacked kernel
    too: its fused transpose-and-cast rows read only the layer they copy), by the direct
    launch's own tests (swapping/in_process/direct.py): single-device sources on a device it
    runs on, and every view one it reads itself. Then a group needs no layer picked first (a
    copy of the layer per group); otherwise XLA would make each view whole, every layer's, for
    each group."""
    from ..swapping.in_process import direct

    if not direct.enabled():
        return False
    for name in plan.src_layouts:
        devices = getattr(getattr(arrays.get(name), "sharding", None), "device_set", ())
        if len(devices) != 1 or not direct.runs_on(next(iter(devices))):
            return False
    return all(direct.reads_view(plan, v) for v in range(len(plan.views)))


def _signature(params):
    """The tree's structure and each leaf's shape, dtype and sharding: equal signatures mean equal
    layouts (`reshard.layouts_of` reads no more than these). None where a leaf has no sharding
    (not a JAX array): such a tree is compared by its layouts."""
    import jax

    try:
        leaves, treedef = jax.tree.flatten(params)
        return treedef, tuple((leaf.shape, leaf.dtype, leaf.sharding) for leaf in leaves)
    except (AttributeError, TypeError):
        return None


def _backend_of(llm) -> str | None:
    try:
        config = getattr(llm.llm_engine.vllm_config, "weight_transfer_config", None)
    except AttributeError:
        raise VllmBackendError(f"connect takes a vllm.LLM, not {type(llm).__name__}") from None
    return None if config is None else config.backend


def _worker(session: str):
    """The worker engine published under `session` in this process, or None."""
    from jax_amem_core.registry import lookup   # the shared package: jax_amem imports it itself

    return lookup(session)


def _notes(directory: str, session: str, tp: int, missing_ok: bool = False) -> list[dict | None]:
    """Each rank's note (jax_amem_vllm/staging.py), read and removed. A rank without one has
    its worker on another host (or not sharing this host's /dev/shm): None with `missing_ok`,
    else VllmBackendError."""
    from jax_amem_core.staging_note import note_path, remove

    notes = []
    for rank in range(tp):
        path = note_path(directory, session, rank)
        try:
            with open(path) as f:
                notes.append(json.load(f))
        except FileNotFoundError:
            if not missing_ok:
                raise VllmBackendError(
                    f"rank {rank}'s worker left no note at {path} after init_weight_transfer_engine: its worker "
                    "runs on another host or does not share this host's /dev/shm") from None
            notes.append(None)
        finally:
            remove(path)
    return notes


def _init(llm, session: str, directory: str, timeout: float, staging_bytes: int, store: str = "") -> None:
    info = {"session": session, "directory": directory, "staging_bytes": staging_bytes}
    if store:
        info.update(store=store, timeout=timeout)
    try:
        llm.collective_rpc("init_weight_transfer_engine", timeout=timeout, kwargs={"init_info": info})
    except Exception as error:
        raise VllmBackendError(f"the engine's workers could not set up the jax_amem backend: {error}") from error


def connect(llm, params, *, family: str | None = None, source: str = "flax", rules=None,
            cast: str | None = None, session: str | None = None, timeout: float = 300.0,
            transport: str = "auto", rendezvous: str | None = None,
            staging_bytes: int | None = None) -> "VllmEngine":
    """Connects to `llm` (a `vllm.LLM` started with weight_transfer_config={"backend": "jax_amem"})
    and plans `params` (the trainer's pytree; only layouts are read) into its model, one plan
    per layer group and tensor-parallel rank.

    Rules: `family` (a `reshard.rules.preset` family; `source` "flax" or "maxtext") or `rules`
    (e.g. from `reshard.rules.from_function`), in vLLM's layout (fused qkv and gate_up, MoE w13/w2).
    `timeout`: seconds any one call into the engine's workers may take before the update fails.
    `transport`: "auto" (by placement: in process, shared memory or CUDA IPC on this host, NCCL
    for a worker on another host) or "nccl" (every rank over NCCL, on this host too).
    `rendezvous`: "host:port" where the workers reach this trainer's store when NCCL is used
    (default: this host's name, a free port).
    `staging_bytes`: each worker's staging budget. Consecutive layer groups are packed into
    batches of at most this many bytes, each batch swapped and committed at once (one call into
    the workers per batch); the buffer is the largest batch, or the largest group where that is
    larger. 0 stages one group at a time (the least memory); None: 512 MiB (a small model's whole
    update is one batch).
    Raises VllmBackendError (engine not set up for it) or VllmPlanError (the tree or rules do not
    match the engine's model), before anything is written."""
    backend = _backend_of(llm)
    if backend != BACKEND:
        raise VllmBackendError(
            f"this vLLM engine was started with {'no weight-transfer backend' if backend is None else f'the {backend!r} weight-transfer backend'}: "
            "start it with vllm.LLM(..., weight_transfer_config={'backend': 'jax_amem'}) "
            "(or --weight-transfer-config '{\"backend\": \"jax_amem\"}')")
    if (family is None) == (rules is None):
        raise VllmPlanError("connect needs exactly one of family= (a preset) and rules=")
    timeout = options.checked_timeout(timeout)   # every option before the engine is touched
    options.checked_session(session)
    options.checked_rules(family, source, rules, cast)
    options.checked_params(params)
    staging_bytes = options.checked_staging_bytes(staging_bytes)
    parallel = options.parallel_config(llm)
    if parallel.pipeline_parallel_size != 1 or parallel.data_parallel_size != 1:
        raise VllmBackendError(f"the engine runs pipeline_parallel_size={parallel.pipeline_parallel_size} and "
                               f"data_parallel_size={parallel.data_parallel_size}: this release writes into "
                               "tensor-parallel engines only (both 1)")
    transport = checked_transport(transport)
    if transport == "nccl" or rendezvous is not None:
        nccl.checked_rendezvous(rendezvous)
    from jax_amem_core.staging_note import default_directory, remove

    session, directory = session or uuid.uuid4().hex, default_directory()
    tp = parallel.tensor_parallel_size
    link = None
    if transport == "auto":
        _init(llm, session, directory, timeout, staging_bytes)
        notes = _notes(directory, session, tp, missing_ok=True)
    if transport == "nccl" or None in notes:
        # A worker elsewhere (or NCCL asked for): the notes travel through the trainer's store,
        # whose address the workers get in a second init (they describe themselves again).
        store, address = nccl.serve_store(rendezvous)
        link = nccl.TrainerLink(store, session, address, timeout)
        _init(llm, session, directory, timeout, staging_bytes, store=address)
        notes = nccl.read_notes(store, session, tp, timeout)
    worker = _worker(session)
    ranks = []
    try:
        if worker is not None and len(notes) == 1:
            if transport == "nccl":
                raise VllmBackendError("transport='nccl' needs the engine's worker in another process: this engine "
                                       "runs it in the trainer's process (VLLM_ENABLE_V1_MULTIPROCESSING=0), where "
                                       "NCCL cannot have both ranks on one GPU; use transport='auto'")
            ranks.append(InProcess(worker, notes[0]))
        process_count = _process_count()
        for note in notes if not ranks else ():
            if placement(note, transport) == "nccl":
                ranks.append(Nccl(note, nccl.rank_owner(sum(r.kind == "nccl" for r in ranks), process_count)))
            else:
                ranks.append(open_rank(note))
        return VllmEngine(llm, ranks, params, family=family, source=source, rules=rules, cast=cast, timeout=timeout,
                          link=link)
    except BaseException:
        for rank in ranks:
            rank.close()
        raise
    finally:
        remove(*(note["staging"].get("path") for note in notes))  # mapped by both sides now


def _process_count() -> int:
    import jax

    return jax.process_count()


class VllmEngine:
    def __init__(self, llm, ranks, params, *, family, source, rules, cast, timeout, link=None):
        self.llm, self.ranks, self.timeout = llm, ranks, timeout
        self.link = link   # nccl.TrainerLink when some rank is written over NCCL
        self.worker = ranks[0].worker   # the worker engine itself when it is in this process
        kinds = sorted({rank.kind for rank in ranks})   # several where ranks sit on this host and elsewhere
        self.transport = "+".join(kinds)
        self.description = ranks[0].note
        groups = self.description["groups"]
        names = [t["name"] for group in groups for t in group]
        tp = self.description["tp_size"]
        for rank in ranks[1:]:
            if [[t["name"] for t in g] for g in rank.note["groups"]] != [[t["name"] for t in g] for g in groups]:
                raise VllmBackendError(f"rank {rank.note['tp_rank']}'s worker holds other tensors than rank 0's")
        if family is not None:
            try:
                # The worker reports the engine's head size: the flax naming merges heads with
                # head_dim, so a split into tp ranks cannot be read from the tree's shapes alone.
                rules = reshard.rules.preset(family, params, source=source, layout="vllm", tp=tp, cast=cast,
                                             tie_embeddings="lm_head.weight" not in names,
                                             head_dim=self.description.get("head_dim") if tp > 1 else None)
            except UnreadWeightsError as error:
                match(error.rules, names)   # an engine tensor no rule writes is said first
                raise refusal(error, resolved_family(family, source), names) from error
            except (reshard.RuleError, reshard.LayoutError) as error:
                raise VllmPlanError(f"the trainer's tree does not fit the {family!r} preset: {error}") from error
        rules = match(list(rules), names, from_preset=family is not None)
        fused_for = {r.groups for r in rules if len(getattr(r, "parts", ())) > 1} - {tp}
        if fused_for:
            raise VllmPlanError(f"the rules fuse tensors for tensor-parallel size {sorted(fused_for)}, but the engine "
                                f"runs tensor_parallel_size={tp}: make them with tp={tp}")
        self._source_layouts = reshard.layouts_of(params)
        self._source_signature = _signature(params)
        arrays = reshard.tree_names(params)
        # An NCCL rank's sends run in an XLA program (cross_host.send): every group reads a picked
        # layer, so no plan against the whole tree is made for them.
        over_nccl = any(rank.kind == "nccl" for rank in ranks)
        self.batches = common_batches([rank.note for rank in ranks], len(groups))
        self._by_batch = [(batch, self._batch_steps(batch, params, rules, arrays, over_nccl))
                          for batch in self.batches]   # each batch with the steps that write it
        self.steps: list[Step] = [step for _, steps in self._by_batch for step in steps]
        self.bytes = sum(plan.nbytes for step in self.steps for plan in step.plans)
        for step in self.steps:   # every destination opened now: a rank that cannot be reached fails connect
            for rank in ranks:
                if rank.kind != "nccl":
                    rank.destination(step.groups)
        if link is not None:
            link.publish(ranks, self.plans, params)   # over NCCL each step is one group
        self.version = 0
        self._in_flight = False
        self._died: list[dict] = []

    @property
    def plans(self) -> list[list]:
        """Each step's plan per rank, in update order."""
        return [step.plans for step in self.steps]

    @property
    def picks(self) -> list:
        """Each step's layer pick (None: the swap reads the tree whole)."""
        return [step.pick for step in self.steps]

    def _batch_steps(self, batch: list[int], params, rules, arrays, over_nccl: bool) -> list[Step]:
        """The batch in one step (one swap per rank) where the swap reads every source whole,
        else one step per group; a batch plan that fails is made again group by group, whose
        error names the group."""
        if len(batch) > 1 and not over_nccl:
            try:
                plans = self._plan(tuple(batch), params, self._source_layouts, rules)
            except VllmPlanError:
                plans = None
            if plans is not None and all(_reads_whole_sources(plan, arrays) for plan in plans):
                return [Step(tuple(batch), None, plans)]
            for rank in self.ranks:
                rank.release(tuple(batch))   # its destination, opened to plan it
        return [self._group_step(index, params, rules, arrays, over_nccl) for index in batch]

    def _group_step(self, index: int, params, rules, arrays, over_nccl: bool) -> Step:
        """Layer group `index` alone: read from the whole tree where the swap reads every source
        whole, else from its layer picked first."""
        group = self.description["groups"][index]
        mine = [r for r in rules if r.dst in {t["name"] for t in group}]
        plans = None if over_nccl else self._plan((index,), params, self._source_layouts, mine)
        pick = None   # the swap reads the whole tree
        if plans is None or not all(_reads_whole_sources(plan, arrays) for plan in plans):
            mine, pick = _one_layer(mine, self._source_layouts)
            picked = pick.shapes(params)   # what the pick makes, read without running it
            plans = self._plan((index,), picked, reshard.layouts_of(picked), mine)
        return Step((index,), pick, plans)

    def _plan(self, groups: tuple[int, ...], sources, layouts, rules) -> list:
        """The plan of layer groups `groups` (one, or a batch's) for every rank, from `sources`
        (the tree, or its picked layer)."""
        tp = self.description["tp_size"]
        plans = []
        for rank in self.ranks:
            wire, owner = [t for g in groups for t in rank.note["groups"][g]], rank.owner(groups)
            targets = {t["name"]: Layout.single(tuple(t["shape"]), np.dtype(t["dtype"]), owner) for t in wire}
            rules_here = [r for r in rules if r.dst in targets]
            try:
                pieces = rules_here if tp == 1 else rank_pieces(rules_here, layouts, wire, owner, rank.note["tp_rank"], tp)
                plans.append(reshard.plan(sources, targets, pieces))
            except (reshard.RuleError, reshard.PlanError, reshard.LayoutError, ValueError) as error:
                where = f"layer group {groups[0]}" if len(groups) == 1 else f"layer groups {groups[0]}-{groups[-1]}"
                raise VllmPlanError(f"the trainer's tree does not fit the engine's {where} "
                                    f"({', '.join(targets)[:200]}) on rank {rank.note['tp_rank']}: "
                                    f"{error}") from error
        return plans

    def close(self) -> None:
        """Unmaps the workers' staging buffers (the engine keeps serving; connect again to update)."""
        for rank in self.ranks:
            rank.close()
        if self.link is not None:
            self.link.close()

    def _check_source(self, params) -> None:
        """`params` has the names, shapes, dtypes and shardings planned at connect. Each update
        first compares the tree's structure and its leaves' shapes, dtypes and shardings with the
        last tree that passed (microseconds); only a tree that differs there has its layouts
        read and compared (tens of microseconds per leaf), which names what changed."""
        signature = _signature(params)
        if signature is not None and signature == self._source_signature:
            return
        try:
            layouts = reshard.layouts_of(params)
        except Exception as error:
            raise VllmPlanError(f"update: the trainer's tree cannot be read: {error}") from error
        if layouts != self._source_layouts:
            changed = sorted(set(layouts) ^ set(self._source_layouts)) or \
                [n for n in layouts if layouts[n] != self._source_layouts[n]]
            raise VllmPlanError(f"update: the trainer's tree is not the one planned at connect "
                                f"(names, shapes, dtypes or shardings of {changed[:6]}): connect again for it")
        self._source_signature = signature   # the same layouts through other objects: compared so next time

    def _rpc(self, method: str, alongside=None, **kwargs):
        """`llm.collective_rpc(method)`, bounded by the timeout. Into workers of other processes it
        runs on a thread while this one watches their processes: a worker that dies ends the call
        at once (vLLM would wait for its answer until the timeout). `alongside()` runs here while
        the workers are in the call (the NCCL sends they receive); when it fails, the call is
        waited for (its workers then fail within their timeout) and its error raised."""
        call = lambda: self.llm.collective_rpc(method, timeout=self.timeout, kwargs=kwargs or None)  # noqa: E731
        if self.worker is not None:
            return call()
        box = {}

        def run():
            try:
                box["result"] = call()
            except BaseException as error:  # noqa: BLE001 - handed to the caller below
                box["error"] = error
        thread = threading.Thread(target=run, daemon=True, name=f"jax_amem {method}")
        thread.start()
        if alongside is not None:
            try:
                alongside()
            except BaseException:
                thread.join(self.timeout)
                raise
        while thread.is_alive():
            thread.join(WATCH_S)
            if thread.is_alive() and self._dead():
                raise RuntimeError(f"a worker process exited during {method}")
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _ask(self, question: str, **kwargs) -> list:
        """Each worker's answer to `question` (jax_amem_core.answers), asked by the method's name."""
        from jax_amem_core import answers

        return self._rpc(answers.METHOD, question=question, **kwargs)

    def _dead(self) -> list[dict]:
        """The ranks whose processes are gone; the first ones seen are kept (`_died`): once one
        worker dies, vLLM stops the others."""
        dead = [rank.note for rank in self.ranks if rank.worker is None and not alive(rank.note)]
        if dead and not self._died:
            self._died = dead
        return dead

    def update(self, params, *, version: int | None = None) -> VllmUpdateReport:
        """Writes `params` into the engine. On return the engine serves them, its prefix cache
        reset. On failure, VllmUpdateError says what it serves (`served`: "old", "refusing", or
        "dead" when a worker died or the device copies failed, which loses the GPU context)."""
        start = time.perf_counter()
        version = options.checked_version(version)
        self._check_source(params)
        if self._in_flight or (self.worker is not None and self.worker.committed is not None):
            raise VllmUpdateError("an update is already in flight on this engine: wait for it to finish; "
                                  "nothing was written", served=self.worker.serving_state() if self.worker else "updating")
        self._in_flight = True
        self._died = []
        try:
            self._start()
            started = time.perf_counter()
            # A worker in this process: the copies are queued and waited for once, at the end,
            # while the commit and finish calls (bookkeeping for groups written in place) run on
            # the host. They run on PyTorch's current stream, which orders every later kernel of
            # the engine after them.
            with waits_deferred(self.worker is not None and self.link is None) as pending:
                swap_s, commit_s, commits = self._write_batches(params, version, pending)
                committed_at = time.perf_counter()
                self._rpc("finish_weight_update")
                reset = self.llm.reset_prefix_cache()
                if pending is not None:
                    try:
                        pending.wait()
                    except Exception as error:
                        raise VllmUpdateError(
                            f"the device copies of this update failed ({error}): the GPU context of this "
                            "process is lost (CUDA keeps such errors); restart the trainer and the engine",
                            served="dead") from error
        finally:
            self._in_flight = False
        if not reset:
            raise VllmUpdateError("the weights were updated but vLLM did not reset its prefix cache: "
                                  "call llm.reset_prefix_cache() before serving", served="new")
        self.version = version if version is not None else self.version + 1
        end = time.perf_counter()
        return VllmUpdateReport(self.version, self.bytes, len(self.description["groups"]), end - start, swap_s,
                                commit_s, commits, start_seconds=started - start, finish_seconds=end - committed_at)

    def _write_batches(self, params, version: int | None, pending) -> tuple[float, float, int]:
        """Every batch swapped and committed: (swap seconds, commit seconds, commits). `pending`
        (deferred_wait.Pending, or None): the queued copies, waited for before a commit that
        reads what they wrote. A failure raises VllmUpdateError saying what the engine serves."""
        swap_s = commit_s = 0.0
        attempted = committed = commits = 0
        try:
            for batch, steps in self._by_batch:
                t0 = time.perf_counter()
                for step in steps:
                    picked = self._swap(params, step)
                    if pending is not None:
                        pending.keep(picked)   # the queued copies read it
                if pending is not None and not set(batch) <= self.worker.nothing_to_commit:
                    pending.wait()   # the commit copies or processes what the swap wrote
                t1 = time.perf_counter()
                if self._dead():
                    raise RuntimeError("a worker process exited")
                attempted += len(batch)
                sent = self._send(params, steps, version if version is not None else self.version + 1)
                info = {"group": batch[0]} if len(batch) == 1 else {"groups": batch}
                self._rpc("update_weights", alongside=sent, update_info=info)
                self._raise_worker_failures()
                committed += len(batch)
                commits += 1
                send_s = sent.seconds if sent else 0.0
                swap_s, commit_s = swap_s + t1 - t0 + send_s, commit_s + time.perf_counter() - t1 - send_s
        except BaseException as error:
            raise self._failed(error, attempted, committed) from error
        return swap_s, commit_s, commits

    def _swap(self, params, step: Step):
        """The step's swap into every rank written by address (the NCCL ranks' sends come later);
        returns what it read (the tree, or the layer picked from it), or None."""
        local = [(rank, plan) for rank, plan in zip(self.ranks, step.plans) if rank.kind != "nccl"]
        if not local:
            return None
        picked = params if step.pick is None else step.pick(params)
        for rank, plan in local:
            swap(picked, rank.destination(step.groups), plan=plan, progress=False)
        return picked

    def _send(self, params, steps: list[Step], version: int):
        """The NCCL sends of one batch, group by group (run while the workers receive in
        update_weights), or None. Each group's layer is picked just before its sends."""
        if not any(rank.kind == "nccl" for rank in self.ranks):
            return None

        def sent():
            t0 = time.perf_counter()
            for index, step in enumerate(steps):
                sends = [(rank, plan) for rank, plan in zip(self.ranks, step.plans) if rank.kind == "nccl"]
                try:
                    picked = params if step.pick is None else step.pick(params)
                except BaseException as error:
                    self.link.abort([rank for rank, _ in sends], version, error)   # each waits for this offer
                    raise
                self.link.send_group(picked, sends, version, more=index + 1 < len(steps))
            sent.seconds = time.perf_counter() - t0
        sent.seconds = 0.0
        return sent

    def _start(self) -> None:
        try:
            if self._dead():
                raise RuntimeError("a worker process exited")
            # The first update joins the NCCL link: the workers join in start_weight_update.
            self._check_ready()
            self._check_setup()
            join = None if self.link is None or self.link.joined else self.link.join
            self._rpc("start_weight_update", alongside=join)
        except VllmUpdateError:
            raise
        except Exception as error:
            if self._dead():
                raise self._failed(error, 0, 0) from error
            if self._quietly(self._updating):
                raise VllmUpdateError("an update is already in flight on this engine (its workers say so): "
                                      "wait for it to finish; nothing was written", served="updating") from error
            raise VllmUpdateError(f"the engine refused to start an update: {error}; nothing was written",
                                  served="old") from error

    def _updating(self) -> str:
        """"updating" where a worker's engine has an update open (its own state, which vLLM's
        refusal of a second start follows), else ""."""
        states = self._serving_states()
        return "updating" if isinstance(states, list) and "updating" in states else ""

    def asleep(self) -> list[str]:
        """The memory tags ("weights", "kv_cache") asleep on any of the engine's workers, sorted."""
        return sorted({tag for tags in self._ask("asleep") for tag in tags})

    def refuse_until_update(self, why: str) -> None:
        """Every worker refuses to serve until the next complete update (`why` in the refusal)."""
        if self.worker is not None:
            self.worker.refuse_until_update(why)
            return
        if not all(self._ask("refuse_until_update", why=why)):
            raise VllmBackendError("a worker of the engine has no jax_amem backend: it cannot refuse to serve")

    def _check_ready(self) -> None:
        """A generate in flight or weights asleep: refused before anything is written (readiness.py)."""
        why = readiness.refusal(self.llm, self.asleep() if readiness.sleep_mode(self.llm) else [])
        if why is not None:
            raise VllmUpdateError(f"{why}; nothing was written", served="old")

    def _raise_worker_failures(self) -> None:
        """The workers keep an update_weights failure for this call rather than raising it
        (jax_amem_vllm/engine.py says why): raised here, each rank's named."""
        failures = self._worker_failures()
        if failures:
            raise WorkerFailure(failures)

    def _worker_failures(self) -> str:
        """Each rank's kept update_weights failure, taken, in words ("" when none). A worker in
        this process is asked directly (asked after every commit: no call through vLLM's RPC)."""
        failures = [self.worker.take_failure()] if self.worker is not None else self._ask("failure")
        return "; ".join(f"rank {rank}'s worker: {failure}" for rank, failure in enumerate(failures) if failure)

    def _check_setup(self) -> None:
        """Workers of other processes, before anything is written: one set up again since this
        connect (another connect, a failed one or one under the same session name included) no
        longer stages where this engine's mappings point (on a GPU that memory may hold something
        else now). A worker in this process is written where it stages now (transports.InProcess)."""
        if self.worker is not None or not all(rank.note.get("setup") for rank in self.ranks):
            return
        setups = self._ask("setup")
        stale = [rank.note["tp_rank"] for rank, setup in zip(self.ranks, setups) if setup != rank.note["setup"]]
        if stale:
            raise VllmUpdateError(f"the engine's workers (ranks {stale}) were set up again by another connect since "
                                  "this one: its staging buffers are not where this handle writes. Update through "
                                  "the newest connect's handle, or connect again; nothing was written", served="old")

    def _failed(self, error: BaseException, attempted: int, committed: int) -> VllmUpdateError:
        """The error for an update stopped by `error`, after `attempted` commits were sent."""
        total = len(self.description["groups"])
        dead = self._dead()
        if dead:
            name = lambda notes: ", ".join(f"rank {n['tp_rank']} (pid {n['pid']})" for n in notes)  # noqa: E731
            first = self._died
            then = [n for n in dead if n not in first]
            return VllmUpdateError(
                f"the engine's worker {name(first)} died during the update, after {committed} of {total} layer groups "
                "were committed"
                + (f" (vLLM then stopped {name(then)})" if then else "")
                + ": vLLM shuts an engine down when one of its workers dies, so it serves nothing now. Restart the "
                "engine (a new vllm.LLM) and connect to it again; the trainer's weights are intact "
                f"({type(error).__name__}: {error})", served="dead")
        kept = "" if isinstance(error, WorkerFailure) else self._quietly(self._worker_failures)
        self._finish_quietly()
        served = self._quietly(self._served) or ("old" if attempted == 0 else "refusing")
        return VllmUpdateError(
            f"the update failed after committing {committed} of {total} layer groups: "
            + ("the engine still serves the previous version" if served == "old" else
               "the engine holds a mix of versions and refuses to serve until a complete update")
            + f" ({type(error).__name__}: {error}{'; ' + kept if kept else ''})", served=served)

    @staticmethod
    def _quietly(question) -> str:
        """`question()`, or "" where asking fails: what a failed update's error adds, never what
        it depends on."""
        try:
            return question()
        except Exception:  # noqa: BLE001
            return ""

    def _served(self) -> str:
        """What the engine serves after a failed update ended: "refusing" where any rank holds a
        mix, "old" where every rank serves (no group of this update was committed), "" when the
        workers' answers are not that."""
        states = self._serving_states()
        if not isinstance(states, list) or not states or not set(states) <= {"serving", "refusing"}:
            return ""
        return "refusing" if "refusing" in states else "old"

    def _serving_states(self):
        """Each worker engine's serving_state ("serving", "refusing", "updating"): asked directly
        in this process, through collective_rpc elsewhere."""
        if self.worker is not None:
            return [self.worker.serving_state()]
        return self._ask("serving_state")

    def _finish_quietly(self) -> None:
        try:
            self._rpc("finish_weight_update")
        except Exception:
            pass  # the engine may be gone; an update left open ends at the next start (abandon)
        if self.worker is not None:
            self.worker.abandon()
