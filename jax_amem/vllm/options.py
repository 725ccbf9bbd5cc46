"""connect's own options, checked before the engine is touched: a bad one is refused by name
before any worker sets up its staging buffer (vLLM's init_weight_transfer_engine), instead of
after it, or (a timeout) handed to the engine's calls as it is."""

from __future__ import annotations

import math
import numbers
import re

from .. import reshard
from ..reshard.presets import ALIASES, FAMILIES, SOURCES, resolved_family
from ..reshard.rule_checks import checked_cast
from .errors import VllmBackendError, VllmPlanError

# A session names files in /dev/shm (jax_amem_vllm/staging.py) and keys in the store: no path
# separators, no spaces.
_SESSION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


MAX_TIMEOUT_S = 365 * 24 * 3600.0   # beyond it a wait is a hang (and PyTorch's store cannot hold 1e300 s)


def checked_timeout(timeout) -> float:
    """Seconds: a number > 0, at most MAX_TIMEOUT_S (not a bool, NaN or infinite)."""
    if (not isinstance(timeout, numbers.Real) or isinstance(timeout, bool) or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_TIMEOUT_S):
        raise VllmBackendError(f"timeout={timeout!r:.60}: give the seconds any one call into the engine's workers "
                               f"may take (a number > 0 and at most {MAX_TIMEOUT_S:.0f}, e.g. 300.0); nothing was "
                               "started")
    return float(timeout)


def checked_staging_bytes(staging_bytes) -> int:
    """connect's `staging_bytes=`: None (the worker's default, -1 on the wire) or a byte count >= 0."""
    if staging_bytes is None:
        return -1
    if isinstance(staging_bytes, bool) or not isinstance(staging_bytes, numbers.Integral) or staging_bytes < 0:
        raise VllmBackendError(f"staging_bytes={staging_bytes!r:.60}: give None (the default, 512 MiB), 0 (one layer "
                               "group at a time) or the bytes each worker may stage at once (an int); nothing was "
                               "started")
    return min(int(staging_bytes), 1 << 62)   # more than any model: the same as the whole model; fits the wire


def checked_session(session) -> None:
    if session is not None and (not isinstance(session, str) or not _SESSION.fullmatch(session)
                                or session.strip(".") == ""):
        raise VllmBackendError(f"session={session!r:.60}: give None (a fresh one), or up to 64 letters, digits, "
                               "'_', '.' or '-' (it names files in /dev/shm); nothing was started")


def checked_rules(family, source, rules, cast) -> None:
    """`family` / `source` / `cast` as the preset reads them, or `rules` a sequence of Rule and
    Piece: VllmPlanError naming the option otherwise."""
    if family is not None:
        if not isinstance(family, str) or family not in FAMILIES + tuple(ALIASES):
            raise VllmPlanError(f"family={family!r:.60} is not a preset family: give one of {', '.join(FAMILIES)} "
                                f"(or {', '.join(f'{a!r}, read as {f!r}' for a, f in ALIASES.items())}), "
                                "or rules= of your own; nothing was started")
        if source not in SOURCES:
            raise VllmPlanError(f"source={source!r:.60}: give the trainer tree's naming, one of {SOURCES}; nothing "
                                "was started")
        try:
            resolved_family(family, source)
        except reshard.RuleError as error:
            raise VllmPlanError(f"{error}; nothing was started") from None
        try:
            checked_cast(cast, "connect", floating=True)
        except reshard.RuleError as error:
            raise VllmPlanError(f"{error}; nothing was started") from None
        return
    if isinstance(rules, (str, bytes, dict)) or not hasattr(rules, "__iter__"):
        raise VllmPlanError(f"rules={rules!r:.60} is not a list of rules: give the list rules.from_function (or "
                            "rules.preset(..., layout='vllm')) returns; nothing was started")
    rules = list(rules)
    if not rules:
        raise VllmPlanError("rules= is empty: it would write none of the engine's tensors; give the list "
                            "rules.from_function returns; nothing was started")
    odd = [r for r in rules if not isinstance(r, (reshard.Rule, reshard.Piece))]
    if odd:
        raise VllmPlanError(f"rules holds {odd[0]!r:.60} ({type(odd[0]).__name__}), not a Rule or Piece: give the "
                            "list rules.from_function returns; nothing was started")
    if cast is not None:
        raise VllmPlanError(f"cast={cast!r:.60} applies to family=; with rules= each rule says its own cast "
                            "(from_function(..., cast=)); nothing was started")


def checked_params(params) -> None:
    """The trainer's tree: layouts can be read from it (sharded arrays)."""
    try:
        layouts = reshard.layouts_of(params)
    except reshard.LayoutError as error:
        raise VllmPlanError(f"params cannot be planned: {error}; nothing was started") from None
    if not layouts:
        raise VllmPlanError(f"params cannot be planned: {type(params).__name__} {params!r:.40} holds no arrays: give "
                            "the trainer's parameter tree; nothing was started")


def checked_version(version):
    """update's `version`: None (one more than the last) or an int >= 0 (not a bool); it numbers
    the engine's version and the NCCL transport's handshake."""
    if version is not None and (not isinstance(version, numbers.Integral) or isinstance(version, bool)
                                or version < 0):
        raise VllmPlanError(f"version={version!r:.60} is not a version number: give an int >= 0, or None for one "
                            "more than the last update's; nothing was written")
    return None if version is None else int(version)


def parallel_config(llm):
    """The engine's parallel config, or VllmBackendError saying what `llm` is not."""
    try:
        return llm.llm_engine.vllm_config.parallel_config
    except AttributeError:
        raise VllmBackendError(f"connect takes a vllm.LLM, and {type(llm).__name__} has no "
                               "llm_engine.vllm_config.parallel_config") from None
