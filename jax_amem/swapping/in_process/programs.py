"""A Program: a schedule (schedule.py, plain data) with one jitted call per group (routes.py),
what the executor runs and the program cache (run.py) holds. Its figures are plain attributes,
copied from the schedule once, so reading them costs nothing per swap."""

from __future__ import annotations

from . import routes
from .schedule import Schedule


class Program:
    def __init__(self, schedule: Schedule, fns: list):
        self.schedule = schedule
        self.fns = fns                      # per group: its jitted call (None: nothing left for XLA, torch_copies.py)
        self.last_seconds = None            # the last run's, for the automatic progress bar
        self.direct_calls = None            # per group: its loaded executable's call or None, made by repeat.py
        self.direct = None                  # direct.py's launch outside XLA (False: runs in XLA), made on its first run
        self.plan = schedule.plan
        self.groups = schedule.groups
        self.route = schedule.route
        self.nbytes = schedule.nbytes
        self.segments = schedule.segments
        self.launches = schedule.launches
        self.transports = schedule.transports
        self.staging_bytes = schedule.staging_bytes
        self.order = schedule.order               # (name, owner) per buffer, in the order the groups write them
        self.dst_indices = schedule.dst_indices   # per buffer: its shard index in the destination (None: whole)
        self.buffers = len(self.order)
        self.torch_copies = any(g.torch_copies for g in self.groups)  # whether PyTorch makes some copies

    @classmethod
    def build(cls, schedule: Schedule) -> "Program":
        return cls(schedule, [routes.jitted(g, schedule.plan.views, schedule.route, schedule.plan)
                              for g in schedule.groups])
