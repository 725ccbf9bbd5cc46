"""The colocated switch (`jax_amem.vllm.Colocated`) against its bound: plain arithmetic and the
table, shared by `demo --rollout vllm` on a real-size preset and benchmarks/vllm_colocated.py.

The bound of one round trip (to the rollout and back) is what its copies must move at the
speeds measured in the same run: the trainer's kept bytes over the pinned copy, down at the
pause and up at the resume, plus the engine's weight bytes over one device copy (the update).
vLLM's sleep and wake have no bound of their own: at sleep level 2 they move no bytes, and
what they cost counts against the round trip's bound.
"""

from __future__ import annotations

import dataclasses
import statistics

from .units import gb

GOAL = 1.2   # the round trip's target, as a multiple of its bound

# Colocated's SwitchReport.parts, in the order they run, and the bound each is judged against
# (None: none of its own).
ROLLOUT_PARTS = ("wake weights", "update", "pause trainer", "wake kv cache")
TRAINER_PARTS = ("engine sleep", "resume trainer")
PART_BOUND = {"update": "update", "pause trainer": "pause", "resume trainer": "resume"}


@dataclasses.dataclass(frozen=True)
class SwitchBound:
    trainer_bytes: int        # what the pause copies down and the resume copies back
    engine_bytes: int         # what the update writes into the engine
    pinned_down_gb_s: float
    pinned_up_gb_s: float
    device_copy_gb_s: float

    def __post_init__(self):
        for name in ("pinned_down_gb_s", "pinned_up_gb_s", "device_copy_gb_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SwitchBound: {name} must be a measured speed above 0, got {getattr(self, name)!r}")
        if self.trainer_bytes < 0 or self.engine_bytes < 0:
            raise ValueError(f"SwitchBound: byte counts must be >= 0, got trainer {self.trainer_bytes}, "
                             f"engine {self.engine_bytes}")

    @property
    def pause(self) -> float:
        return self.trainer_bytes / (self.pinned_down_gb_s * 1e9)

    @property
    def resume(self) -> float:
        return self.trainer_bytes / (self.pinned_up_gb_s * 1e9)

    @property
    def update(self) -> float:
        return self.engine_bytes / (self.device_copy_gb_s * 1e9)

    @property
    def to_rollout(self) -> float:
        return self.update + self.pause

    @property
    def to_trainer(self) -> float:
        return self.resume

    @property
    def round_trip(self) -> float:
        return self.to_rollout + self.to_trainer

    def of(self, part: str) -> float | None:
        """The bound of one of SwitchReport.parts, None for a part with none of its own."""
        name = PART_BOUND.get(part)
        return None if name is None else getattr(self, name)


def median_parts(reports) -> dict:
    """{part: median seconds} over SwitchReports of one direction, in the parts' order, and
    "total": the median of the whole switches."""
    if not reports:
        raise ValueError("median_parts: no switch reports (at least one round is needed)")
    parts = {name: statistics.median(r.parts[name] for r in reports) for name in reports[0].parts}
    parts["total"] = statistics.median(r.seconds for r in reports)
    return parts


def rows(to_rollout: dict, to_trainer: dict, bound: SwitchBound) -> list[tuple]:
    """(label, seconds, bound or None) per part, each switch and the round trip, from
    median_parts of each direction."""
    out = [(name, seconds, bound.of(name)) for name, seconds in to_rollout.items() if name != "total"]
    out.append(("= to rollout", to_rollout["total"], bound.to_rollout))
    out += [(name, seconds, bound.of(name)) for name, seconds in to_trainer.items() if name != "total"]
    out.append(("= to trainer", to_trainer["total"], bound.to_trainer))
    out.append(("round trip", to_rollout["total"] + to_trainer["total"], bound.round_trip))
    return out


def ratio(seconds: float, bound: float | None) -> float | None:
    return seconds / bound if bound else None


def table(title: str, table_rows: list[tuple]) -> str:
    """The rows as text: part, median seconds, bound seconds, x bound (the goal on the round trip)."""
    lines = [title, f"  {'part':<16}{'seconds':>10}{'bound':>10}{'x bound':>10}"]
    for label, seconds, bound in table_rows:
        times = ratio(seconds, bound)
        goal = f"  (goal <= {GOAL}x)" if label == "round trip" else ""
        lines.append(f"  {label:<16}{seconds:>10.4f}{'' if bound is None else f'{bound:.4f}':>10}"
                     f"{'' if times is None else f'{times:.2f}x':>10}{goal}")
    return "\n".join(lines)


def bound_line(bound: SwitchBound) -> str:
    return (f"bound: {gb(bound.trainer_bytes)} of trainer state over the pinned copy "
            f"({bound.pinned_down_gb_s:.1f} GB/s down, {bound.pinned_up_gb_s:.1f} GB/s up) + "
            f"{gb(bound.engine_bytes)} of engine weights over one device copy "
            f"({bound.device_copy_gb_s:.1f} GB/s) = {bound.round_trip:.4f} s")
