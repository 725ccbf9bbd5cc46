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
from .. import cache
from ..errors import SwapError
from ..report import SwapReport, number_version
from ..sources import Sources
from . import executor, repeat, routes, schedule
from .programs import Program
from .verify import first_mismatch, raise_on_mismatch

AUTO_PROGRESS_BYTES = 2 << 30    # first run of a program this large shows a bar
AUTO_PROGRESS_SECONDS = 1.0      # so does any program whose last run took longer

_plans = cache.Lru("in-process plans")
_programs = cache.Lru("in-process programs")
_ready = cache.Lru("in-process programs by swap inputs")  # one lookup per swap


def _rules_key(rules):
    return None if rules is None else _RulesKey.of(rules)


class _RulesKey:
    """Rules as a cache key whose hash is computed once: the same rule objects, swap after
    swap, compare by identity, element by element, and need no rehashing."""

    _last = None

    def __init__(self, rules: tuple):
        self.rules, self._hash = rules, hash(rules)

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


def program_for(sources: Sources, destination, rules, plan):
    """The compiled program for these inputs: cached; on a miss, planned, checked and compiled."""
    if plan is not None and rules is not None:
        raise SwapError("give rules or plan, not both: a plan already holds its rules")
    route = routes.choose(destination)
    how = _how(rules, plan)
    key = (sources.signature, destination.signature, how, route)
    found = _ready.get(key)
    if found is not None and (plan is None or found.plan is plan):
        return found
    return _ready.put(key, resolve_program(resolve_plan(sources, destination, rules, plan), sources, destination,
                                           route))


def _check_rule_names(sources: Sources, destination, rules) -> None:
    wanted = list(dict.fromkeys(r.dst for r in rules)) if rules is not None else list(sources.arrays)
    destination.check_written_names(wanted, "the rules write" if rules is not None
                                    else "rules=None writes (one per source, same name)")


def resolve_plan(sources: Sources, destination, rules, plan):
    if plan is not None:
        if rules is not None:
            raise SwapError("give rules or plan, not both: a plan already holds its rules")
        return plan
    key = (sources.signature, destination.signature, _rules_key(rules))
    found = _plans.get(key)
    if found is not None:
        return found
    _check_rule_names(sources, destination, rules)
    destination.validate()
    try:
        src_layouts = sources.layouts()
        rules, dst_layouts = destination.planned(rules, src_layouts)
        made = reshard.plan(src_layouts, dst_layouts, rules)
    except (reshard.RuleError, reshard.LayoutError, reshard.PlanError) as error:
        raise SwapError(f"the swap cannot be planned (nothing was written): {error}") from error
    return _plans.put(key, made)


def _check_sources(plan, sources: Sources) -> None:
    layouts = sources.layouts()
    for name, layout in plan.src_layouts.items():
        if name not in layouts:
            raise SwapError(f"the plan reads source {name!r}, which src_params does not hold (nothing was written)")
        if layouts[name] != layout:
            got = sources.arrays[name]
            raise SwapError(f"source {name!r} ({np.dtype(got.dtype).name}{list(got.shape)}, {got.sharding}) is not "
                            f"laid out as the plan says ({layout}): re-plan for these arrays (nothing was written)")


def resolve_program(plan, sources: Sources, destination, route: tuple = ("per-transfer",)):
    """The compiled program of `plan` for these inputs: cached; on a miss every input is
    checked against the plan, then scheduled (schedule.py) and compiled (one jitted call per
    group, routes.py). `route`: routes.choose's."""
    key = (plan.key, plan.owner, plan.planner, sources.signature, destination.signature, route)
    found = _programs.get(key)
    if found is not None:
        return found
    destination.validate()
    _check_sources(plan, sources)
    made = schedule.make(plan, sources, destination, jax.process_index(), route[0])
    return _programs.put(key, Program.build(made))


def swap(src_params, destination, rules, plan, verify, version, progress) -> SwapReport:
    """The body of `jax_amem.swap` for a destination this process writes (its arguments as
    there); the version is numbered once the program is ready, so a refusal numbers nothing."""
    start = time.perf_counter()
    if not verify and progress is not True and (rules is None or plan is None):
        found = repeat.find(src_params, destination, _how(rules, plan))
        if found is not None and (progress is False or not _shows_progress(found[0].program)):
            return _repeat(found, destination, version, start)
    sources = Sources(src_params)
    program = program_for(sources, destination, rules, plan)
    number = number_version(version)
    show = progress if progress is not None else _shows_progress(program)
    written, extra = executor.run(program, sources, destination, bool(show))
    seconds = time.perf_counter() - start
    program.last_seconds = seconds
    if not verify:
        repeat.remember(program, src_params, destination, _how(rules, plan))
    new_tree = destination.assemble(program, written)
    transports = dict(program.transports)
    for name, nbytes in extra.items():
        transports[name] = transports.get(name, 0) + nbytes
    report = SwapReport(version=number, bytes=program.nbytes, seconds=seconds, segments=program.segments,
                        launches=program.launches, calls=len(program.groups), buffers=program.buffers,
                        transports=transports, staging_bytes=program.staging_bytes, plan_key=program.plan.key,
                        dst=new_tree, route=program.route)
    if verify:
        _verify(program, sources, destination.after(new_tree))
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


def _repeat(found, destination, version, start) -> SwapReport:
    """A swap that repeats a remembered one (repeat.py): the cached calls, the same report."""
    entry, leaves = found
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
    sources = Sources(src_params)
    return _verify(program_for(sources, destination, rules, plan), sources, destination)


def _verify(program, sources: Sources, destination) -> int:
    raise_on_mismatch(first_mismatch(program, sources, destination, jax.process_index()))
    return program.nbytes
