"""The trainer's handle on one vLLM engine: connect once (the worker describes its model, the
trainer plans every layer group once), then `update(params)` per training step.

An update is vLLM's protocol driven through `llm.collective_rpc`: start_weight_update; per
layer group, the swap writes the new values into the worker's staging buffer (by address, the
group's cached program) and update_weights({"group": g}) commits them (vLLM's processing
included); finish_weight_update; then the prefix cache is reset, so no KV block computed with
the old weights is reused.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import numpy as np

from .. import reshard
from ..reshard import Layout
from ..swapping import swap
from ..swapping.torch_bridge import owner_of
from .errors import VllmBackendError, VllmPlanError, VllmUpdateError
from .names import match

BACKEND = "jax_amem"


@dataclass
class VllmUpdateReport:
    version: int
    bytes: int
    groups: int
    seconds: float        # the whole update
    swap_seconds: float   # the swaps into staging
    commit_seconds: float  # the worker's commits (vLLM's processing included)

    def __str__(self):
        return (f"vllm update v{self.version}: {self.bytes / 2**20:.1f} MiB in {self.groups} groups, "
                f"{self.seconds * 1e3:.1f} ms (swap {self.swap_seconds * 1e3:.1f} ms, "
                f"commit {self.commit_seconds * 1e3:.1f} ms)")


def _one_layer(rules):
    """A group's rules reading stacked layers (`Part.index`) rewritten to read the one layer,
    and the jitted function that picks those layers (and the unstacked sources) from the tree.

    The swap prepares a transposed or cast source view whole: a group read from the whole
    stack would transpose every layer for each group. Picked first, it transposes its own."""
    import dataclasses

    import jax

    picks: dict[str, tuple[str, tuple[int, ...]]] = {}
    out = []
    for rule in rules:
        parts = []
        for part in rule.parts:
            name = f"{part.src}@{','.join(map(str, part.index))}" if part.index else part.src
            picks[name] = (part.src, tuple(part.index))
            parts.append(dataclasses.replace(part, src=name, index=()))
        out.append(dataclasses.replace(rule, parts=tuple(parts)))

    stacked = {name: pick for name, pick in picks.items() if pick[1]}

    @jax.jit
    def layer(flat):   # one copy of the group's layer; the whole sources are passed as they are
        return {name: flat[src][index] for name, (src, index) in stacked.items()}

    def pick(params):
        flat = reshard.tree_names(params)
        whole = {name: flat[src] for name, (src, index) in picks.items() if not index}
        return {**whole, **layer({src: flat[src] for src, _ in stacked.values()})} if stacked else whole
    return out, pick


def _backend_of(llm) -> str | None:
    try:
        config = getattr(llm.llm_engine.vllm_config, "weight_transfer_config", None)
    except AttributeError:
        raise VllmBackendError(f"connect takes a vllm.LLM, not {type(llm).__name__}") from None
    return None if config is None else config.backend


def _worker(llm, session: str):
    """The worker engine published under `session` in this process."""
    try:
        from jax_amem_vllm.registry import lookup
    except ImportError as error:
        raise VllmBackendError("the jax_amem_vllm package (the backend's worker half, installed with "
                               "jax-amem) is not importable in this process") from error
    return lookup(session)


def connect(llm, params, *, family: str | None = None, source: str = "flax", rules=None,
            cast: str | None = None, session: str | None = None) -> "VllmEngine":
    """Connects to `llm` (a `vllm.LLM` started with weight_transfer_config={"backend": "jax_amem"})
    and plans `params` (the trainer's pytree; only layouts are read) into its model.

    Rules: `family` (a `reshard.rules.preset` family; `source` "flax" or "maxtext") or `rules`
    (e.g. from `reshard.rules.from_function`), in vLLM's layout (fused qkv and gate_up, MoE w13/w2).
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
    session = session or uuid.uuid4().hex
    llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": {"session": session}})
    worker = _worker(llm, session)
    if worker is None:
        raise VllmBackendError(
            "the engine's worker runs in another process (VLLM_ENABLE_V1_MULTIPROCESSING is not 0, or "
            "tensor_parallel_size > 1): this release writes into an engine in the trainer's own process "
            "only; start it with VLLM_ENABLE_V1_MULTIPROCESSING=0 and tensor_parallel_size=1 (docs/vllm.md)")
    return VllmEngine(llm, worker, params, family=family, source=source, rules=rules, cast=cast)


class VllmEngine:
    def __init__(self, llm, worker, params, *, family, source, rules, cast):
        self.llm, self.worker = llm, worker
        self.description = worker.description()
        groups = self.description["groups"]
        names = [t["name"] for group in groups for t in group]
        tp = self.description["tp_size"]
        if family is not None:
            try:
                rules = reshard.rules.preset(family, params, source=source, layout="vllm", tp=tp, cast=cast,
                                             tie_embeddings="lm_head.weight" not in names)
            except (reshard.RuleError, reshard.LayoutError) as error:
                raise VllmPlanError(f"the trainer's tree does not fit the {family!r} preset: {error}") from error
        rules = match(list(rules), names)
        if any(not isinstance(r, reshard.Rule) for r in rules):
            raise VllmPlanError("connect takes Rules (reshard.rules presets, from_function), not Pieces")
        fused_for = {r.groups for r in rules if len(getattr(r, "parts", ())) > 1} - {tp}
        if fused_for:
            raise VllmPlanError(f"the rules fuse tensors for tensor-parallel size {sorted(fused_for)}, but the engine "
                                f"runs tensor_parallel_size={tp}: make them with tp={tp}")
        self._source_layouts = reshard.layouts_of(params)
        self.plans, self.picks, self.bytes = [], [], 0
        for index, group in enumerate(groups):
            staged = worker.staged(index)
            owner = owner_of(next(iter(staged.values())))
            layouts = {t["name"]: Layout.single(tuple(t["shape"]), np.dtype(t["dtype"]), owner) for t in group}
            mine, pick = _one_layer(r for r in rules if r.dst in layouts)
            self.picks.append(pick)
            try:
                plan = reshard.plan(pick(params), layouts, mine)
            except (reshard.RuleError, reshard.PlanError, reshard.LayoutError, ValueError) as error:
                raise VllmPlanError(f"the trainer's tree does not fit the engine's layer group {index} "
                                    f"({', '.join(layouts)[:200]}): {error}") from error
            self.plans.append(plan)
            self.bytes += plan.nbytes
        self.version = 0
        self._in_flight = False

    def _check_source(self, params) -> None:
        try:
            layouts = reshard.layouts_of(params)
        except Exception as error:
            raise VllmPlanError(f"update: the trainer's tree cannot be read: {error}") from error
        if layouts != self._source_layouts:
            changed = sorted(set(layouts) ^ set(self._source_layouts)) or \
                [n for n in layouts if layouts[n] != self._source_layouts[n]]
            raise VllmPlanError(f"update: the trainer's tree is not the one planned at connect "
                                f"(names, shapes, dtypes or shardings of {changed[:6]}): connect again for it")

    def update(self, params, *, version: int | None = None) -> VllmUpdateReport:
        """Writes `params` into the engine. On return the engine serves them, its prefix cache
        reset. On failure, VllmUpdateError says what it serves (`served`: "old" or "refusing")."""
        start = time.perf_counter()
        self._check_source(params)
        if self._in_flight or self.worker.committed is not None:
            raise VllmUpdateError("an update is already in flight on this engine: wait for it to finish; "
                                  "nothing was written", served=self.worker.serving_state())
        self._in_flight = True
        try:
            self.llm.collective_rpc("start_weight_update")
            swap_s = commit_s = 0.0
            try:
                for index, plan in enumerate(self.plans):
                    t0 = time.perf_counter()
                    swap(self.picks[index](params), self.worker.staged(index), plan=plan, progress=False)
                    t1 = time.perf_counter()
                    self.llm.collective_rpc("update_weights", kwargs={"update_info": {"group": index}})
                    swap_s, commit_s = swap_s + t1 - t0, commit_s + time.perf_counter() - t1
            except BaseException as error:
                committed = len(self.worker.committed or ())
                self._finish_quietly()
                served = "old" if committed == 0 else "refusing"
                raise VllmUpdateError(
                    f"the update failed after committing {committed} of {len(self.plans)} layer groups: "
                    + ("the engine still serves the previous version" if served == "old" else
                       "the engine holds a mix of versions and refuses to serve until a complete update")
                    + f" ({type(error).__name__}: {error})", served=served) from error
            self.llm.collective_rpc("finish_weight_update")
        finally:
            self._in_flight = False
        if not self.llm.reset_prefix_cache():
            raise VllmUpdateError("the weights were updated but vLLM did not reset its prefix cache: "
                                  "call llm.reset_prefix_cache() before serving", served="new")
        self.version = version if version is not None else self.version + 1
        return VllmUpdateReport(self.version, self.bytes, len(self.plans), time.perf_counter() - start,
                                swap_s, commit_s)

    def _finish_quietly(self) -> None:
        try:
            self.llm.collective_rpc("finish_weight_update")
        except Exception:
            pass  # vLLM's worker drops an update whose update_weights raised: end ours directly
        self.worker.abandon()
