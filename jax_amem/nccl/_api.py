"""jax_amem.nccl: pause and resume every NCCL communicator in the process, XLA's included."""

from __future__ import annotations

import dataclasses
import math
import numbers
import threading
import time
import warnings
from concurrent.futures import Future

from .. import settings
from ..errors import NcclArgumentError, NcclNotInstalledError
from ..pause_block import PausedBlock
from . import _agree, _leaks, _loader
from ._control import STRATEGIES, TEARDOWNS, Control, NcclPauseError

_state = _loader.LoadState()
_control: Control | None = None
_paused_ids: list[int] = []
# Some process of the job paused something in the last agreed pause, so every
# process must take part in the next resume (even one that paused nothing itself).
_job_paused = False
_lock = threading.Lock()
_ID_LIMIT = 2**64
_TIMEOUT_LIMIT = 1e6  # seconds (11.6 days): the store's barrier counts milliseconds in an int
# True while a resume (async_=True: on its own thread) runs: every call here is collective and
# numbered in call order (_agree), so another one meanwhile would put this process out of step.
_resuming = False


def _checked_timeout(timeout, verb: str) -> float:
    """`timeout` as seconds, refused before anything is touched unless 0 < timeout <= 1e6."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise NcclArgumentError(f"jax_amem.nccl.{verb}(timeout={timeout!r}): timeout is a number of seconds, "
                                f"not {type(timeout).__name__}")
    value = float(timeout)
    if not (math.isfinite(value) and 0 < value <= _TIMEOUT_LIMIT):
        raise NcclArgumentError(f"jax_amem.nccl.{verb}(timeout={timeout!r}): timeout must be a finite number of "
                                f"seconds, above 0 and at most {_TIMEOUT_LIMIT:g} (the default is 60)")
    return value


def _check_flag(value, verb: str, name: str) -> None:
    """A flag must be a bool: agree="no" is a true string, and would agree."""
    if not isinstance(value, bool):
        raise NcclArgumentError(f"jax_amem.nccl.{verb}({name}={value!r}): {name} is True or False, "
                                f"not {type(value).__name__}")


def _refuse_while_resuming(verb: str) -> None:
    """Under _lock."""
    if _resuming:
        raise NcclPauseError(f"jax_amem.nccl.{verb}() while a resume is still running (resume(async_=True) "
                             "returned a Future): wait for that Future first. Every process must make these "
                             "collective calls in the same order. Nothing was changed by this call.")


@dataclasses.dataclass(frozen=True)
class Communicator:
    """One communicator the interposer tracks (a row of `communicators()`)."""

    id: int
    key: str           # identical on every rank of the communicator
    owner: str         # "xla", "torch", "jax_amem" or "other"
    created_by: str    # the NCCL function that made it
    rank: int
    nranks: int
    device: int
    state: str         # "active", "paused" or "broken"
    split_share: bool  # children split from it share its resources (NCCL's splitShare)
    parent_id: int     # the tracked communicator it was split from (0: none)
    shares_memory_manager: bool  # with a live parent or child: ncclCommSuspend refuses it
    registrations: int
    windows: int
    device_comms: int
    last_strategy: str  # what the last pause ran: "suspend" or "recreate"
    why: str            # why that strategy
    bytes_before_pause: int
    bytes_freed: int    # this communicator's own bytes (NCCL's count or the driver's); -1 unknown
    bytes_kept: int     # what stayed allocated while paused (ncclCommMemStats' persistent bytes)
    suspendable_bytes: int  # ncclCommMemStats' suspendable bytes before the pause; -1 unknown
    refused_calls: int  # calls the guard turned away while it was paused or broken
    pause_seconds: float
    resume_seconds: float
    error: str
    teardown_seconds: float = 0.0  # recreate: of pause_seconds, ending the real communicator
    # What its last first collective after an initialisation took, NCCL's connection
    # included (a recreate makes it connect again there); -1: none has run yet.
    connect_seconds: float = -1.0


@dataclasses.dataclass
class NcclReport:
    """What one pause or resume did."""

    action: str
    seconds: float     # NCCL's part (suspend / teardown, resume / re-init), the agreement excluded
    communicators: list[Communicator]
    device_free_before: dict[int, int]
    device_free_after: dict[int, int]
    agree_seconds: float = 0.0  # the agreement over the jax.distributed store before it (0: none)

    @property
    def bytes_freed(self) -> dict[int, int]:
        """Per device: free memory after minus before, as the CUDA driver reports it."""
        return {d: self.device_free_after[d] - self.device_free_before[d]
                for d in self.device_free_before if d in self.device_free_after}

    def table(self) -> str:
        lines = [f"nccl {self.action}: {len(self.communicators)} communicator(s) in "
                 f"{self.seconds * 1e3:.1f} ms (+ {self.agree_seconds * 1e3:.1f} ms agreeing)"]
        lines.append(f"{'id':>4} {'owner':>8} {'rank':>6} {'device':>6} {'strategy':>9} "
                     f"{'freed MiB':>10} {'kept MiB':>9} {'pause ms':>9} {'resume ms':>10}  key: why")

        def mib(value):
            return f"{value / 2**20:.1f}" if value >= 0 else "?"

        for c in self.communicators:
            lines.append(f"{c.id:>4} {c.owner:>8} {c.rank:>3}/{c.nranks:<2} {c.device:>6} "
                         f"{c.last_strategy or '-':>9} {mib(c.bytes_freed):>10} {mib(c.bytes_kept):>9} "
                         f"{c.pause_seconds * 1e3:>9.1f} {c.resume_seconds * 1e3:>10.1f}  "
                         f"{c.key}: {c.why}")
        for device, freed in sorted(self.bytes_freed.items()):
            lines.append(f"device {device}: {freed / 2**20:+.1f} MiB free (driver)")
        return "\n".join(lines)

    __str__ = table


def install() -> bool:
    """Puts the interposer in front of NCCL (done by `import jax_amem`); True when it is."""
    global _state, _control
    with _lock:
        if not _state.installed:
            _state = _loader.load()
            _control = Control(_state.library) if _state.installed else None
    return _state.installed


def warn_if_loaded_first() -> None:
    """`import jax_amem`'s call: a warning, naming the library, when NCCL was in the process first."""
    if _state.late:
        warnings.warn(f"jax_amem.nccl cannot pause NCCL in this process: {_state.reason}", RuntimeWarning,
                      stacklevel=3)


def is_installed() -> bool:
    return _state.installed


def status() -> str:
    """'' when installed, else why not and how to fix it."""
    return "" if _state.installed else _state.reason


def _require() -> Control:
    if _control is None:
        raise NcclNotInstalledError(f"jax_amem.nccl is not active in this process: {_state.reason}"
                                    + (" Nothing was paused." if _state.late else ""))
    return _control


def communicators(owner: str | None = None, device: int | None = None,
                  state: str | None = None) -> list[Communicator]:
    """Tracked communicators in the collective order every rank uses (by key)."""
    if _control is None:
        return []
    rows = [Communicator(**row) for row in _control.snapshot()]
    return [c for c in rows if (owner is None or c.owner == owner)
            and (device is None or c.device == device) and (state is None or c.state == state)]


def _device_free(devices) -> dict[int, int]:
    from .._native import core

    free = {}
    for device in sorted(d for d in devices if d >= 0):
        try:
            free[device] = core.cuda.mem_get_info(device)[0]
        except RuntimeError:
            pass  # no driver: CPU tests with the fake NCCL
    return free


def _checked_ids(ids) -> list[int]:
    """Communicator ids as given, refused (nothing touched) when one is not a valid id."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise NcclArgumentError(f"ids must be a list of communicator ids (ints), got {ids!r}")
    chosen = []
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, int):
            raise NcclArgumentError(f"communicator id {value!r} is not an int: use the ids from "
                                    "jax_amem.nccl.communicators()")
        if not 0 <= value < _ID_LIMIT:
            raise NcclArgumentError(f"communicator id {value} is out of range (ids are 1 .. 2**64-1): use "
                                    "the ids from jax_amem.nccl.communicators()")
        if value in chosen:
            raise NcclArgumentError(f"communicator id {value} is given twice in ids={list(ids)!r}: name "
                                    "each communicator once")
        chosen.append(value)
    return chosen


def pause(strategy: str = "auto", *, owner: str | None = None, device: int | None = None,
          ids: list[int] | None = None, timeout: float = 60.0,
          teardown: str = "parallel", agree: bool = True) -> NcclReport:
    """Frees the GPU memory of the selected active communicators (default: all). Collective.

    strategy: "suspend" (ncclCommSuspend, NCCL >= 2.29.7, communicators that do not
    share NCCL's memory manager), "recreate" (destroy now, initialise again behind the
    same handle on resume: frees everything, works on any NCCL), or "auto" (per
    communicator, whichever of the two makes this pause + resume shortest by the bytes
    NCCL reports and the rates this process measured, see cost_rates(); recreate where
    NCCL refuses suspend; the report says which and why).
    Every process of the job must call pause with the same selection. Before any NCCL
    call, the processes agree on the plan over the jax.distributed key-value store
    (agree=False skips that: only for programs without jax.distributed peers); a
    process that does not join within `timeout` makes every other one raise
    NcclPauseError with every communicator left active.
    teardown (recreate): "parallel" (default: every ncclCommDestroy on its own thread),
    "destroy" (in turn, each measured alone) or "abort" (in turn).
    Raises NcclPauseError with the communicator and the fix; nothing is paused then,
    except communicators whose peers vanished mid-pause (reported as broken: see recover()).
    """
    global _job_paused
    timeout = _checked_timeout(timeout, "pause")
    _check_flag(agree, "pause", "agree")
    control = _require()
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise NcclArgumentError(f"strategy must be one of {sorted(STRATEGIES)}, got {strategy!r}")
    if not isinstance(teardown, str) or teardown not in TEARDOWNS:
        raise NcclArgumentError(f"teardown must be one of {sorted(TEARDOWNS)}, got {teardown!r}")
    requested = None if ids is None else _checked_ids(ids)
    with _lock:
        _refuse_while_resuming("pause")
        if requested is None:  # the one snapshot of a pause: the selection
            chosen = [c.id for c in communicators(owner=owner, device=device, state="active")]
        else:
            chosen = requested  # unknown or inactive ids: the plan names them
        job = _agree.peers() if agree else None
        # Rank 0 of each communicator to recreate makes its replacement's id for the plan, and the
        # agreement carries it (JAX_AMEM_NCCL_IDS=communicator: sent over the communicator instead).
        make_ids = (settings.value("JAX_AMEM_NCCL_IDS") or "agreement") != "communicator"
        plan = control.plan(chosen, strategy, make_ids, agreed=job is not None) if chosen else []
        agree_seconds = 0.0
        if job is None:
            refused = [entry["why"] for entry in plan if entry["refused"]]
            if refused:
                raise NcclPauseError(refused[0])
            strategies = [entry["strategy"] for entry in plan]
            everyone = [{"plan": plan}]
            anything = bool(plan)
        else:
            agree_start = time.perf_counter()
            everyone = job.exchange("pause", {"plan": plan}, timeout)
            strategies = _agree.merge_plans(plan, everyone)
            anything = any(other["plan"] for other in everyone)
            agree_seconds = time.perf_counter() - agree_start
        next_ids = _agree.agreed_next_ids(plan, strategies, everyone)
        chosen = [entry["id"] for entry in plan]
        devices = {entry["device"] for entry in plan}
        before = _device_free(devices)
        start = time.perf_counter()
        try:
            rows = control.pause(chosen, strategy, strategies, next_ids, timeout, teardown) if chosen else []
        except NcclPauseError as error:
            raise _failed_pause(error, chosen) from error
        seconds = time.perf_counter() - start
        _paused_ids.extend(chosen)
        _job_paused = _job_paused or (anything and job is not None)
        after = _device_free(devices)
        _leaks.warn_once(control.real_version(), {row["last_strategy"] for row in rows})
    return NcclReport("pause", seconds, [Communicator(**row) for row in rows], before, after, agree_seconds)


def _failed_pause(error: NcclPauseError, chosen: list[int]) -> NcclPauseError:
    """The error of a pause that failed part way (a teardown that failed, peers that vanished),
    naming what each communicator of it is now. Under _lock: those that did pause are recorded,
    so that resume() brings them back."""
    rows = [c for c in communicators() if c.id in set(chosen)]
    done = [c for c in rows if c.state == "paused"]
    _paused_ids.extend(c.id for c in done if c.id not in _paused_ids)

    def listed(group):
        return ", ".join(f"id {c.id} ({c.owner}, device {c.device}, rank {c.rank}/{c.nranks})" for c in group)

    broken = [c for c in rows if c.state == "broken"]
    parts = [str(error)]
    if broken:
        parts.append(f"broken now: {listed(broken)}; every call on them fails until every process of the job "
                     "calls jax_amem.nccl.recover(), which initialises them again behind the same handles")
    if done:
        parts.append(f"paused: {listed(done)}; jax_amem.nccl.resume() brings them back")
    still = [c for c in rows if c.state == "active"]
    if still:
        parts.append(f"still active (not paused): {listed(still)}")
    return NcclPauseError(". ".join(parts))


def resume(*, timeout: float = 60.0, async_: bool = False, agree: bool = True) -> NcclReport | Future:
    """Brings back every communicator paused by `pause()`, behind the same handles. Collective.

    async_=True returns a Future at once; collectives issued meanwhile (by XLA) wait
    for their communicator instead of failing. The processes agree first (as in pause):
    one that does not join within `timeout` leaves every communicator paused, and
    resume can be called again.
    """
    global _job_paused, _resuming
    timeout = _checked_timeout(timeout, "resume")
    _check_flag(agree, "resume", "agree")
    _check_flag(async_, "resume", "async_")
    control = _require()
    with _lock:
        _refuse_while_resuming("resume")
        job = _agree.peers() if agree else None
        if not _paused_ids and not (_job_paused and job is not None):
            raise NcclPauseError("nothing to resume: no communicator was paused by jax_amem.nccl.pause()")
        chosen = list(_paused_ids)
        if chosen:
            control.begin_resume(chosen)
        _resuming = True
    devices = {c.device for c in communicators() if c.id in set(chosen)}  # the one snapshot of a resume

    def work() -> NcclReport:
        global _job_paused, _resuming
        rows = None
        try:
            before = _device_free(devices)
            start = time.perf_counter()
            if job is not None:
                try:
                    job.meet("resume", timeout)
                except NcclPauseError:
                    control.cancel_resume()  # still paused: calls fail again instead of waiting
                    raise
            agreed = time.perf_counter()
            rows = control.resume(chosen, timeout) if chosen else []
            _job_paused = False
        finally:
            with _lock:
                if rows is None:  # it failed: what is still paused
                    still_paused = {c.id for c in communicators(state="paused")}
                else:
                    still_paused = {row["id"] for row in rows if row["state"] == "paused"}
                _paused_ids[:] = [i for i in _paused_ids if i in still_paused]
                _resuming = False
        seconds = time.perf_counter() - agreed
        return NcclReport("resume", seconds, [Communicator(**row) for row in rows], before,
                          _device_free(devices), agreed - start)

    if not async_:
        return work()
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as error:  # noqa: BLE001 - handed to the waiter
            future.set_exception(error)

    threading.Thread(target=run, name="jax_amem-nccl-resume", daemon=True).start()
    return future


class paused(PausedBlock):  # noqa: N801  (used as a context manager, like jax_amem.paused)
    """`with jax_amem.nccl.paused() as p: rollout()` pauses on entry and resumes on exit, both with
    the `timeout` and `agree` given (pause's other arguments are pause's alone). p.info is the
    pause's NcclReport, p.restored the resume's (None when nothing was paused): the same shape as
    `jax_amem.paused` (jax_amem/pause_block.py).

    With no communicator to pause (in the whole job), it does nothing and exits quietly.
    """

    SURFACE = "jax_amem.nccl"

    def __init__(self, strategy: str = "auto", **selection):
        super().__init__(strategy, **selection)
        self._resume_with = {k: v for k, v in selection.items() if k in ("timeout", "agree")}

    def _pause(self, strategy, **selection) -> NcclReport:
        return pause(strategy, **selection)

    def _resume(self) -> NcclReport | None:
        return resume(**self._resume_with) if resume_owed() else None

    def __getattr__(self, name: str):
        # Earlier versions gave the pause's report itself to `with ... as report:`; its fields
        # still read through the block, with a warning naming p.info.
        info = self.__dict__.get("info")
        if info is None or name.startswith("_") or not hasattr(info, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warnings.warn(f"`with jax_amem.nccl.paused() as p:` gives the block, like jax_amem.paused: read "
                      f"the pause's report as p.info.{name} (p.{name} goes away in a later version)",
                      DeprecationWarning, stacklevel=2)
        return getattr(info, name)


def recover(*, timeout: float = 60.0) -> list[Communicator]:
    """Initialises broken communicators again behind the same handles. Collective.

    A communicator is broken when its peers vanished in the middle of a pause (the
    guard then fails every call on it with a message naming recover()). Every process
    of the job calls recover(); they agree over the jax.distributed key-value store on
    which communicators are broken anywhere (one broken on a single rank is broken for
    all its ranks), rank 0 of each makes a fresh unique id, and every rank initialises
    it again. Returns the recovered communicators.
    """
    timeout = _checked_timeout(timeout, "recover")
    control = _require()
    job = _agree.peers()
    with _lock:
        _refuse_while_resuming("recover")
        mine = communicators()
        broken_here = sorted({c.key for c in mine if c.state == "broken"})
        if job is None:
            broken = broken_here
        else:
            everyone = job.exchange("recover", {"broken": broken_here}, timeout)
            broken = sorted({key for entry in everyone for key in entry["broken"]})
        targets = [c for c in mine if c.key in set(broken)]
        fresh = {c.key: control.new_unique_id().hex() for c in targets if c.rank == 0}
        if job is not None and broken:
            everyone = job.exchange("recover_ids", {"ids": fresh}, timeout)
            for entry in everyone:
                fresh.update(entry["ids"])
        missing = [c.key for c in targets if c.key not in fresh]
        if missing:
            raise NcclPauseError(f"cannot recover {missing}: rank 0 of each is in no process of "
                                 "this job (recover needs jax.distributed across every rank)")
        if targets:
            control.recover([c.id for c in targets], [bytes.fromhex(fresh[c.key]) for c in targets],
                            timeout)
    return [c for c in communicators() if c.key in set(broken)]


def keep_suspendable(on: bool = True) -> bool:
    """Opt-in: create no communicator that shares NCCL's memory manager. Before the first collective.

    NCCL gives the children split from a communicator whose config says splitShare=1
    (XLA's do) the parent's resources, and ncclCommSuspend then refuses the parent and
    the children (auto falls back to recreate for them). With this on, the interposer
    rewrites splitShare to 0 in every config given to a creation or a split: splits
    cost more device memory and time (see docs/nccl.md). Same as
    JAX_AMEM_NCCL_KEEP_SUSPENDABLE=1. Returns the setting now in force.
    """
    control = _require()
    existing = [c for c in communicators() if c.split_share]
    if on and existing:
        raise NcclPauseError(
            f"keep_suspendable() must come before the first collective: {len(existing)} "
            f"communicator(s) with splitShare exist already (ids {[c.id for c in existing]}), and "
            "their future splits would still share. Call it right after `import jax_amem`, or set "
            "JAX_AMEM_NCCL_KEEP_SUSPENDABLE=1 in the environment.")
    return control.keep_suspendable(bool(on))


def cost_rates(reset: bool = False) -> dict:
    """The rates `auto` chooses by: suspend and resume seconds per GiB, the slowest
    teardown, the re-initialisation per communicator, and how many measurements each
    holds (0: the starting rate, from JAX_AMEM_NCCL_COST or measured defaults).
    reset=True forgets what this process measured. Raises NcclArgumentError when
    JAX_AMEM_NCCL_COST cannot be read."""
    _check_flag(reset, "cost_rates", "reset")
    return _require().cost_rates(reset)


def nccl_version() -> int:
    """The real NCCL's version (e.g. 23007), 0 when the interposer is not installed."""
    return _control.real_version() if _control is not None else 0


def can_suspend() -> bool:
    """Whether the loaded NCCL has ncclCommSuspend (>= 2.29.7)."""
    return _control.has_suspend() if _control is not None else False


def paused_ids() -> list[int]:
    return list(_paused_ids)


def is_paused() -> bool:
    """Whether a pause is in force here, so resume() has work: the same verb as
    `jax_amem.is_paused()`, for the communicators (resume_owed() under its older name)."""
    return resume_owed()


def resume_owed() -> bool:
    """Whether the next resume() has work: a communicator of this process is paused, or some
    process of the job paused one in the last agreed pause (then this one must take part)."""
    return bool(_paused_ids) or _job_paused


def in_a_job() -> bool:
    """Whether this process has jax.distributed peers to agree with (a collective pause must
    then be called here even with no communicator of its own, or the others wait for it)."""
    return _agree.peers() is not None


__all__ = ["Communicator", "NcclNotInstalledError", "NcclPauseError", "NcclReport", "can_suspend", "cost_rates",
           "communicators", "install", "is_installed", "is_paused", "keep_suspendable", "nccl_version", "pause",
           "paused", "recover", "resume", "status"]
