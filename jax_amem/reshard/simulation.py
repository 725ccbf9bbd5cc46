"""Predicts a plan's transfer time from per-link bandwidths, before any GPU is used.

Links: every owner has a local copy engine ("device"), and an egress and an
ingress port per link class ("nvlink" between owners of one process/host,
"network" across processes). All links run at once, full duplex; a link's time
is its bytes over its bandwidth; the plan takes as long as its busiest link.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PlanError
from .plan_data import BYTES, DST_OWNER, SRC_OWNER, Plan

CLASSES = ("device", "nvlink", "network")


@dataclass(frozen=True)
class Bandwidths:
    """Bytes per second: same-device copy, NVLink per GPU per direction, network per GPU per direction."""

    device: float = 2000e9
    nvlink: float = 450e9
    network: float = 50e9


@dataclass(frozen=True)
class Simulation:
    seconds: float
    bytes_by_class: dict[str, int]
    busiest: tuple[tuple[int, int], str, str]  # (owner, class, "out"/"in"/"copy")
    busiest_bytes: int
    egress_max_over_mean: float  # over sending owners, on the class that carries most bytes
    egress_class: str
    links: dict[tuple[tuple[int, int], str, str], int]

    def __str__(self):
        owner, cls, way = self.busiest
        by_class = ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in self.bytes_by_class.items())
        return (f"predicted {self.seconds * 1e3:.2f} ms; {by_class}; busiest link {cls} {way} of owner "
                f"{owner} ({self.busiest_bytes / 1e9:.3f} GB); {self.egress_class} egress max/mean "
                f"{self.egress_max_over_mean:.3f}")


def link_classes(plan: Plan) -> np.ndarray:
    """0 same device, 1 same process (NVLink), 2 across processes (network), per transfer."""
    src = plan.owners[plan.transfers[:, SRC_OWNER]]
    dst = plan.owners[plan.transfers[:, DST_OWNER]]
    same_owner = (src == dst).all(axis=1)
    same_process = src[:, 0] == dst[:, 0]
    return np.where(same_owner, 0, np.where(same_process, 1, 2))


def simulate(plan: Plan, bandwidths: Bandwidths = Bandwidths()) -> Simulation:
    if not isinstance(plan, Plan) or not isinstance(bandwidths, Bandwidths):
        raise PlanError(f"simulate takes a Plan and Bandwidths, got {type(plan).__name__} and "
                        f"{type(bandwidths).__name__}")
    n = len(plan.owners)
    cls = link_classes(plan)
    nbytes = plan.transfers[:, BYTES]
    speed = {"device": bandwidths.device, "nvlink": bandwidths.nvlink, "network": bandwidths.network}
    links = {}
    for c, name in enumerate(CLASSES):
        mine = cls == c
        ways = (("copy", SRC_OWNER),) if c == 0 else (("out", SRC_OWNER), ("in", DST_OWNER))
        for way, column in ways:
            per_owner = np.bincount(plan.transfers[mine, column], weights=nbytes[mine], minlength=n)
            for i in np.nonzero(per_owner)[0].tolist():
                links[(tuple(int(x) for x in plan.owners[i]), name, way)] = int(per_owner[i])
    bytes_by_class = {name: int(nbytes[cls == c].sum()) for c, name in enumerate(CLASSES)}
    if links:
        busiest = max(links, key=lambda k: (links[k] / speed[k[1]], k))
        seconds = links[busiest] / speed[busiest[1]]
    else:
        busiest, seconds = (((-1, -1), "none", "none")), 0.0
    egress_class = max(("nvlink", "network"), key=lambda k: bytes_by_class[k])
    senders = {owner for layout in plan.src_layouts.values() for owner in layout.owners}
    egress = np.array([links.get((tuple(o), egress_class, "out"), 0) for o in senders], dtype=np.float64)
    ratio = float(egress.max() / egress.mean()) if len(egress) and egress.mean() > 0 else 1.0
    return Simulation(seconds, bytes_by_class, busiest, links.get(busiest, 0), ratio, egress_class, links)
