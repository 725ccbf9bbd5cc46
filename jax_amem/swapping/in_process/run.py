"""The in-process swap: resolves (and caches) the plan and compiled program by the signature
of its inputs (names, shardings / devices, shapes, dtypes, rules), checks everything, then
moves bytes with the executor. `jax_amem.swap` comes here for every destination this process
writes itself (PyTorch tensors, jax.Arrays, another process's tensors mapped through CUDA IPC).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from ... import reshard
from .. import by_address, cache, names, tied as tied_weights
from ...reshard.rule_checks import checked_rules
from ..errors import SwapError
from ..report import SwapReport, number_version
from ..sources import Sources, flatten
from . import executor, repeat, routes, schedule
from .programs import Program
from .verify import first_mismatch, raise_on_mismatch

AUTO_PROGRESS_BYTES = 2 << 30    # first run of a program this large shows a bar
AUTO_PROGRESS_SECONDS = 1.0      # so does any program whose last run took longer

_programs = cache.Lru("in-process programs")  # by the swap's inputs: one lookup per swap


def _rules_key(rules):
    return None if rules is None else _RulesKey.of(rules)


class _RulesKey:
    """Rules as a cache key whose hash is computed once: the same rule objects, swap after
    swap, compare by identity, element by element, and need no rehashing."""

    _last = None

    def __init__(self, rules: tuple):
        try:
            self.rules, self._hash = rules, hash(rules)
        except TypeError as error:   # a Piece holding a list or another unhashable field
            try:
                checked_rules(rules)     # names the piece and field when it can
            except reshard.RuleError as named:
                raise SwapError(f"the swap cannot be planned (nothing was written): {named}") from None
            raise SwapError(f"the rules cannot be told apart from another swap's ({error}): give their fields as "
                            "tuples, ints and strings; nothing was written") from None

    @classmethod
    def of(cls, rules) -> "_RulesKey":
        rules = tuple(rules)
        if cls._last is None or cls._last.rules != rules:
            cls._last = cls(rules)
        return cls._last

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, _RulesKey) and self.rules == other.rules


def prepare(sources: Sources, destination, rules, plan, how):
    """The compiled program for these inputs: cached by them; on a miss, every check runs
    once, before anything is planned or compiled: the destination's own (its `targets()` by
    address), the names (folded tied twins counted once), the sources against the plan, the
    buffers against the plan; then the plan (reshard's cache), the schedule and its calls.
    The front door already refused rules and plan together (checks.swap_arguments)."""
    route = routes.choose(destination)
    key = (sources.signature, destination.signature, how, route)
    found = _programs.get(key)
    if found is not None and (plan is None or found.plan is plan):  # an id is reused once its plan is freed
        return found
    process = jax.process_index()
    targets = destination.targets() if destination.writes_by_address else None
    if plan is None:
        plan = _plan(sources, destination, rules)
    else:
        names.check(plan.dst_layouts, destination.names(), tied=destination.tied())
    _check_sources(plan, sources)
    if targets is not None:
        buffers = by_address.check(targets, plan, process)
        made = schedule.make(plan, sources, buffers, process, route[0], targets=targets,
                             torch_copies=destination.torch_tensors is not None)
    else:
        buffers = destination.check(plan, process)
        made = schedule.make(plan, sources, buffers, process, route[0], shard_index=destination.shard_index)
    return _programs.put(key, Program.build(made))


def _plan(sources: Sources, destination, rules):
    """The plan of `rules` (None: same names) from the sources into the destination, tied
    twins folded into one buffer, names checked first so that a missing or extra tensor is
    named as such."""
    src_layouts = sources.layouts()
    tied = destination.tied()
    try:
        rules = checked_rules(rules)   # a hand-made Piece's fields, before its names are read
        folded, dst_layouts = tied_weights.fold(rules, tied, src_layouts, destination.layouts(), sources.same_array())
        wanted = list(dict.fromkeys(r.dst for r in folded)) if folded is not None else list(src_layouts)
        names.check(wanted, destination.names(), "the rules write" if rules is not None
                    else "rules=None writes (one per source, same name)", tied=tied)
        return reshard.plan(src_layouts, dst_layouts, folded)
    except (reshard.RuleError, reshard.LayoutError, reshard.PlanError) as error:
        raise SwapError(f"the swap cannot be planned (nothing was written): {error}") from error


def _check_sources(plan, sources: Sources) -> None:
    layouts = sources.layouts()
    for name, layout in plan.src_layouts.items():
        if name not in layouts:
            raise SwapError(f"the plan reads source {name!r}, which src_params does not hold (nothing was written)")
        if layouts[name] != layout:
            got = sources.arrays[name]
            raise SwapError(f"source {name!r} ({np.dtype(got.dtype).name}{list(got.shape)}, {got.sharding}) is not "
                            f"laid out as the plan says ({layout}): re-plan for these arrays (nothing was written)")


def swap(src_params, destination, rules, plan, verify, version, progress) -> SwapReport:
    """The body of `jax_amem.swap` for a destination this process writes (its arguments as
    there); the version is numbered once the program is ready, so a refusal numbers nothing.
    The source tree is flattened once at most (a repeat of the last swap walks it natively)."""
    start = time.perf_counter()
    how = _how(rules, plan)
    leaves = treedef = None
    if not verify and progress is not True:
        found, leaves, treedef = repeat.find(src_params, destination, how)
        if found is not None and (progress is False or not _shows_progress(found.program)):
            return _repeat(found, leaves, destination, version, start)
    if treedef is None:
        leaves, treedef = flatten(src_params, "source tree")
    sources = Sources(src_params, leaves, treedef)
    program = prepare(sources, destination, rules, plan, how)
    number = number_version(version)
    show = progress if progress is not None else _shows_progress(program)
    written, extra = executor.run(program, sources, destination, bool(show))
    seconds = time.perf_counter() - start
    program.last_seconds = seconds
    if not verify:
        repeat.remember(program, sources, destination, how)
    new_tree = None if destination.writes_by_address else destination.assemble(program.order, program.dst_indices,
                                                                                 written)
    transports = dict(program.transports)
    for name, nbytes in extra.items():
        transports[name] = transports.get(name, 0) + nbytes
    report = SwapReport(version=number, bytes=program.nbytes, seconds=seconds, segments=program.segments,
                        launches=program.launches, calls=len(program.groups), buffers=program.buffers,
                        transports=transports, staging_bytes=program.staging_bytes, plan_key=program.plan.key,
                        dst=new_tree, route=program.route)
    if verify:
        _verify(program, sources, destination if new_tree is None else destination.after(new_tree))
        report.verified = True
    return report


def _shows_progress(program) -> bool:
    """progress=None: a bar when the program's last run took over AUTO_PROGRESS_SECONDS, or
    on its first run when it moves AUTO_PROGRESS_BYTES or more."""
    return ((program.last_seconds or 0) > AUTO_PROGRESS_SECONDS
            or (program.last_seconds is None and program.nbytes >= AUTO_PROGRESS_BYTES))


def _how(rules, plan):
    """What besides the inputs selects the program: the rules, or the plan object itself."""
    return _rules_key(rules) if plan is None else (plan.key, plan.owner, plan.planner, id(plan))


def _repeat(entry, leaves, destination, version, start) -> SwapReport:
    """A swap that repeats a remembered one (repeat.py): the cached calls, the same report."""
    number = number_version(version)
    repeat.run(entry, leaves, destination)
    program = entry.program
    seconds = time.perf_counter() - start
    program.last_seconds = seconds
    return SwapReport(version=number, bytes=program.nbytes, seconds=seconds, segments=program.segments,
                      launches=program.launches, calls=len(program.groups), buffers=program.buffers,
                      transports=dict(program.transports), staging_bytes=program.staging_bytes,
                      plan_key=program.plan.key, dst=None, route=program.route)


def verify(src_params, destination, rules, plan) -> int:
    """The body of `jax_amem.swapping.verify` for a destination this process can read."""
    leaves, treedef = flatten(src_params, "source tree")
    sources = Sources(src_params, leaves, treedef)
    return _verify(prepare(sources, destination, rules, plan, _how(rules, plan)), sources, destination)


def _verify(program, sources: Sources, destination) -> int:
    raise_on_mismatch(first_mismatch(program, sources, destination, jax.process_index()))
    return program.nbytes
