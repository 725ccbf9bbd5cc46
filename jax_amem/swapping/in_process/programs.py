"""A Program: a schedule (schedule.py, plain data) with one jitted call per group (routes.py),
what the executor runs and the program cache (run.py) holds."""

from __future__ import annotations

from dataclasses import dataclass

from . import routes
from .schedule import Schedule


@dataclass
class Program:
    schedule: Schedule
    fns: list                          # per group: its jitted call (None: nothing left for XLA, torch_copies.py)
    last_seconds: float | None = None  # the last run's, for the automatic progress bar
    direct_calls: list | None = None   # per group: its loaded executable's call or None, made by repeat.py

    @classmethod
    def build(cls, schedule: Schedule) -> "Program":
        return cls(schedule, [routes.jitted(g, schedule.plan.views, schedule.route, schedule.plan)
                              for g in schedule.groups])

    # What the executor, verify and the report read, as the schedule says.
    plan = property(lambda self: self.schedule.plan)
    groups = property(lambda self: self.schedule.groups)
    route = property(lambda self: self.schedule.route)
    nbytes = property(lambda self: self.schedule.nbytes)
    segments = property(lambda self: self.schedule.segments)
    launches = property(lambda self: self.schedule.launches)
    transports = property(lambda self: self.schedule.transports)
    staging_bytes = property(lambda self: self.schedule.staging_bytes)
    order = property(lambda self: self.schedule.order)
    dst_indices = property(lambda self: self.schedule.dst_indices)

    @property
    def buffers(self) -> int:
        return len(self.schedule.order)

    @property
    def torch_copies(self) -> bool:
        """Whether PyTorch makes some of the copies (torch_copies.py)."""
        return any(g.torch_copies for g in self.schedule.groups)
