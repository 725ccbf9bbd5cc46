"""The one check of destination names a swap runs: the names the rules (or the plan) write
against the names the destination holds, tied twins counted as one buffer."""

from __future__ import annotations

from ..reshard.from_jax import nested_names_hint
from .errors import SwapError


def check(written, given, what: str = "the plan writes", tied=()) -> None:
    """Missing or extra destination names, all of them in one message; and no tied group
    written under two names. `tied`: groups of given names that are one buffer (a state
    dict's tied weights): one of a group written is all of it written, so its twins are not
    extra; two of a group written would be two writers of one buffer."""
    written, given = list(written), list(given)
    planned, present = set(written), set(given)
    covered = {n for group in tied if planned.intersection(group) for n in group}
    missing = [n for n in written if n not in present]
    extra = [n for n in given if n not in planned and n not in covered]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} destination(s) that {what}: {few(missing)}")
        if extra:
            parts.append(f"{len(extra)} destination(s) that nothing writes (no rule, not in the plan): {few(extra)}")
        raise SwapError("; ".join(parts) + ". Give exactly the tensors the rules name (nothing was written)."
                        + nested_names_hint(missing, given))
    for group in tied:
        both = [n for n in group if n in planned]
        if len(both) > 1:
            raise SwapError(f"{what} {both[0]!r} and {both[1]!r}, which are one tensor (tied weights): "
                            "make the plan for one of them (nothing was written)")


def few(names, n: int = 5) -> str:
    return ", ".join(repr(x) for x in names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
