"""`JaxAmemWeightTransferEngine`: the worker side of the `jax_amem` backend (vLLM builds one per
worker when the engine is started with weight_transfer_config={"backend": "jax_amem"}).

The protocol is vLLM's (`init_weight_transfer_engine`, `start_weight_update`, `update_weights`,
`finish_weight_update`); what travels in it:

* init  {"session": name, "directory": dir, "staging_bytes": n}: the worker describes its model
  (layout.describe: every parameter in its loaded form, per layer group, TP rank and size; the
  groups packed into batches of at most n bytes), allocates one staging buffer the size of the
  largest batch (staging.py: a shared file on CPU, CUDA IPC on a GPU), writes a note saying
  where both are (`dir/jax_amem-<session>-rank<r>.json`), and publishes itself under `session`
  for a trainer in this process.
* init with {"store": "host:port"} as well (a trainer that may write this worker over NCCL,
  nccl.py): the note goes to the trainer's store instead of a file, and the worker keeps a
  client of that store. At start_weight_update it reads the transport the trainer chose for
  its rank and, for NCCL, joins the trainer's link (once).
* after each update {"group"...}: the trainer reads each worker's failure (answers.py
  `failures_of`): the worker keeps it rather than raising (see `update_weights`).
* before an update, a trainer whose workers run in other processes reads each worker's setup
  id (answers.py `setup_of`: a fresh one per init, carried by the note): another connect sets
  the worker up again, and an older trainer would write where the worker no longer stages.
* update {"group": g} or {"groups": [g, ...]} (groups of one batch): the trainer has written
  the groups' new values into the staging buffer (jax_amem.swap, by address), or sends them now
  over NCCL, which the worker receives into the staging buffer first, every group of the call
  before any is committed (nccl.Receiver); the worker commits them in order: plain parameters
  copied in, processed modules written through vLLM's processing (reprocess.py).

Versions. Until the first commit of an update nothing served has changed: an update that stops
there (refused, failed, never finished) leaves the old version serving. From the first commit
to the last, the model holds two versions, so the model refuses to run (a forward pre-hook that
raises) until an update commits every group; `finish_weight_update` then lifts it. An update
that finishes with groups missing keeps refusing: the next complete update recovers it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from . import staging as staging_buffer
from .layout import DEFAULT_STAGING_BYTES, describe, repacked
from .copies import copy_all
from .in_place import writable_in_place
from jax_amem_core.registry import publish
from .reprocess import reprocess
from .sleep import asleep_tags
from .versions import check_supported


@dataclass
class JaxAmemInitInfo(WeightTransferInitInfo):
    session: str
    directory: str = ""   # where the note goes (staging.py); default /dev/shm
    store: str = ""       # "host:port" of the trainer's TCPStore: the note goes there (nccl.py)
    timeout: float = 300.0  # seconds any wait on that store may take
    staging_bytes: int = -1  # the staging budget: groups packed into batches of at most this; -1: the default


@dataclass
class JaxAmemUpdateInfo(WeightTransferUpdateInfo):
    group: int | None = None          # one group
    groups: list[int] | None = None   # or several groups of one batch, committed in this order

    def chosen(self) -> list:
        if (self.group is None) == (self.groups is None):
            raise ValueError("jax_amem: update_weights takes exactly one of update_info['group'] and "
                             "update_info['groups']")
        if self.groups is None:
            return [self.group]
        if not isinstance(self.groups, (list, tuple)) or not self.groups:
            raise ValueError(f"jax_amem: update_info['groups'] must be a non-empty list of group numbers, "
                             f"not {self.groups!r:.80}")
        return list(self.groups)


def head_size(vllm_config) -> int | None:
    """The model's attention head size as vLLM sizes it, None for a model vLLM gives none: the
    trainer's presets need it to split heads over ranks when its tree merges heads with head_dim."""
    try:
        return int(vllm_config.model_config.get_head_size())
    except (AttributeError, TypeError, ValueError):
        return None


class MixedVersionsError(RuntimeError):
    """Raised by the model's forward while it holds parts of two weight versions."""


class JaxAmemWeightTransferEngine(WeightTransferEngine[JaxAmemInitInfo, JaxAmemUpdateInfo]):
    init_info_cls = JaxAmemInitInfo
    update_info_cls = JaxAmemUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        check_supported()   # an engine on an untested vLLM fails at start, naming the range
        super().__init__(config, vllm_config, device, model)
        self.layout = None
        self.tp_rank = 0
        self.staging: torch.Tensor | None = None
        self.views: dict = {}                    # (group, whole) -> its staged views (staged())
        self.placed: dict = {}                   # name -> (module, attr, address) of each in-place view
        self.caches: list | None = None          # where its KV caches start (_own_addresses)
        self.place: dict | None = None            # where another process finds the staging buffer
        self.files: tuple[str, ...] = ()         # the note and the shared file, until the trainer takes them
        self.committed: set[int] | None = None   # None: no update in flight
        self.refusal = None                      # the forward pre-hook while versions are mixed
        self.refusal_reason = ""
        self.updates = 0                         # complete updates so far
        self.receiver = None                     # nccl.Receiver when the trainer gave a store
        self.timeout = 300.0
        self.setup = ""                          # this setup's own id (a fresh one per init), "" when none
        self.failure = ""                        # the last update_weights' failure, until taken
        self.in_place = False                    # as-loaded parameters written by address (in_place.py)
        self.in_place_names: frozenset = frozenset()   # their names: no place in staging (layout.repacked)
        self.nothing_to_commit: frozenset = frozenset()   # groups all in place, nothing to process
        self.views_made = 0                      # how many times the views were made anew (a trainer's cue)

    @staticmethod
    def trainer_send_weights(iterator, trainer_args) -> None:
        """vLLM's trainer-side entry of a backend (abstract in vLLM 0.26). A jax-amem trainer
        writes the workers' buffers itself, planned from their description: there is no
        stream of (name, tensor) pairs to send."""
        raise NotImplementedError("jax_amem: a trainer updates the engine with jax_amem.vllm.connect(llm, params, "
                                  "...).update(params), not trainer_send_weights (docs/vllm.md)")

    # --- what the trainer reads (same process) ---------------------------------------------
    def description(self, setup: str | None = None) -> dict[str, Any]:
        """`setup`: the id the note carries (the one being set up; default this setup's)."""
        return {"tp_size": self.parallel_config.tensor_parallel_size, "tp_rank": self.tp_rank,
                "setup": self.setup if setup is None else setup,
                "head_dim": head_size(self.vllm_config), "device": str(self.device), "groups": self.layout.wire(),
                "staging_bytes": self.layout.staging_bytes, "batches": self.layout.batches, "staging": self.place}

    def staged(self, group: int, whole: bool = False) -> dict[str, torch.Tensor]:
        """Group `group`'s tensors in the staging buffer, in their loaded form (same addresses on
        every update, so the trainer's swap program is built once per group). The trainer's view
        leaves out a vocabulary's padding rows (the commit zeroes them); `whole` includes them.
        With `in_place` on, a parameter vLLM serves as loaded is given as itself (in_place.py)."""
        key = (group, whole, self.in_place)
        if key not in self.views:   # made once per buffer: a commit makes no views
            out = {}
            for t in self.layout.groups[group]:
                dtype = getattr(torch, t.dtype)
                nbytes = torch.Size(t.shape).numel() * dtype.itemsize
                tensor = self.served_as_loaded(t) if self.in_place else None
                if tensor is None and t.name in self.in_place_names:
                    # Its place in staging was given up when it went in place (layout.repacked).
                    raise RuntimeError(f"jax_amem: parameter {t.name} no longer holds the form vLLM loaded it in "
                                       "(re-laid out since connect): connect again")
                if tensor is None:
                    tensor = self.staging[t.offset:t.offset + nbytes].view(dtype).view(t.shape)
                else:
                    module, attr = self.layout.owners[t.name]
                    self.placed[t.name] = (module, attr, tensor.data_ptr())
                out[t.name] = tensor if whole or t.rows is None else tensor[:t.rows]
            self.views[key] = out
        return dict(self.views[key])   # the same tensors; the caller's dict its own

    def served_as_loaded(self, t) -> torch.Tensor | None:
        """The parameter itself when the trainer may write it by address, else None."""
        return writable_in_place(t, getattr(*self.layout.owners[t.name]).data) if t.name in self.layout.owners else None

    def _follow_parameters(self) -> None:
        """vLLM's own reload (`reload_weights`) may give a parameter new storage: views of the old
        one would have the trainer write freed memory. Checked before each update; views made
        anew (and `views_made` counted, which the trainer's destinations follow) where any moved.
        One address read per parameter: this runs at every update's start, so each read skips
        what costs most there (a Qwen3-0.6B has 226 such parameters: about 0.43 ms of host time
        the plain way, 0.035 ms this way, on a 2-core CPU): Module.__getattr__ (a parameter is
        read from the module's own table) and vLLM's parameter classes' __torch_function__ (an
        address is the same without it)."""
        with torch._C.DisableTorchFunctionSubclass():
            for module, attr, address in self.placed.values():
                tensor = module._parameters.get(attr) if attr in module._parameters else getattr(module, attr)
                if tensor.data_ptr() != address:
                    self._drop_views(made_anew=True)
                    return

    def _drop_views(self, made_anew: bool) -> None:
        """Forgets the staged views and the in-place parameters' addresses; `made_anew`: counted
        in `views_made`, which a trainer in this process follows (transports.InProcess)."""
        self.views, self.placed, self.caches = {}, {}, None
        self.views_made += made_anew

    def write_in_place(self) -> bool:
        """Called by a trainer in this process at connect: from now on the as-loaded parameters
        are written by address (no staging copy, no commit copy); True where that holds (a GPU
        worker), False where the worker keeps staging everything (vLLM-CPU repacks its linear
        layers; its norms and embeddings stay staged too, so an update stopped before its first
        commit keeps serving the old version there)."""
        self.in_place = self.device.type == "cuda" and self.layout is not None
        if self.in_place:
            # Staging is left to what is not written in place: the groups repacked into fewer
            # batches (one for an unquantized model), the buffer cut to what they need.
            written = {t.name for group in self.layout.groups for t in group if self.served_as_loaded(t) is not None}
            self.layout = repacked(self.layout, lambda t: t.name not in written)
            self.in_place_names = frozenset(written)
            layout = self.layout
            # Groups written whole in place with nothing vLLM processes: their commit has nothing to do.
            self.nothing_to_commit = frozenset(
                g for g, group in enumerate(layout.groups)
                if all(t.name in written and t.rows is None for t in group)
                and not (layout.group_modules[g] or layout.followers.get(g) or layout.derivers.get(g)))
            if self.layout.staging_bytes < self.staging.numel():
                self.staging = torch.zeros(self.layout.staging_bytes, dtype=torch.uint8, device=self.device)
                self.place = staging_buffer.cuda_ipc_place(self.staging)
        self._drop_views(made_anew=True)
        return self.in_place

    def asleep(self) -> list[str]:
        """The memory tags of this engine's memory in vLLM's pool that sleep now (sleep.py)."""
        return asleep_tags(self._own_addresses)

    def _own_addresses(self) -> dict[str, list[int]]:
        """Where this engine's memory of each sleep-mode tag starts: its parameters (read each
        time: vLLM's own reload may give them new storage), and its KV caches where its attention
        layers hold them (`kv_cache`; found once per setup, a walk of every module)."""
        if self.caches is None:
            self.caches = []
            for module in self.model.modules():
                held = getattr(module, "kv_cache", None)
                self.caches += [c.data_ptr() for c in (held if isinstance(held, (list, tuple)) else [held])
                                if isinstance(c, torch.Tensor) and c.numel()]
        own = {"weights": [p.data_ptr() for p in self.model.parameters()]}
        if self.caches:
            own["kv_cache"] = self.caches
        return own

    def refuse_until_update(self, why: str) -> None:
        """Refuses to serve (`why` in the refusal) until an update commits every group: weights
        that hold nothing yet (woken after vLLM's sleep level 2, which discards them)."""
        self._refuse(why, what="no version yet")

    def serving_state(self) -> str:
        return "refusing" if self.refusal is not None else ("updating" if self.committed is not None else "serving")

    # --- vLLM's protocol ----------------------------------------------------------------------
    def init_transfer_engine(self, init_info: JaxAmemInitInfo) -> None:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized

        # vLLM's parallel groups are per process, not per engine (another engine of this process
        # shut down removes them); with one rank there is only rank 0.
        if self.parallel_config.tensor_parallel_size > 1 or model_parallel_is_initialized():
            self.tp_rank = get_tensor_model_parallel_rank()
        budget = init_info.staging_bytes
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < -1:
            raise ValueError(f"jax_amem: staging_bytes={budget!r:.60} must be a byte count >= 0 (0: one group "
                             "at a time), or -1 for the default")
        self.shutdown()   # a trainer connecting again: the previous session's buffer and files go
        # until a trainer here asks (write_in_place)
        self.in_place, self.in_place_names, self.nothing_to_commit = False, frozenset(), frozenset()
        setup = uuid.uuid4().hex   # published with the note, taken by the worker once init succeeds
        self.layout = describe(self.model, DEFAULT_STAGING_BYTES if budget == -1 else budget)
        directory = init_info.directory or staging_buffer.default_directory()
        self._drop_views(made_anew=False)
        self.staging, self.place = staging_buffer.allocate(self.layout.staging_bytes, self.device, directory,
                                                           init_info.session, self.tp_rank)
        note = staging_buffer.note_path(directory, init_info.session, self.tp_rank)
        self.files = (note, self.place.get("path"))
        if init_info.store:
            # A trainer that may be on another host: the note travels through its store.
            from jax_amem_core import wire

            from . import nccl

            host, _, port = init_info.store.rpartition(":")
            store = wire.TorchStore.connect(host, int(port), timeout=init_info.timeout)
            store.set(nccl.note_key(init_info.session, self.tp_rank),
                      json.dumps(staging_buffer.stamped(self.description(setup))).encode())
            self.files = (self.place.get("path"),)
            self.receiver, self.timeout = nccl.Receiver(store, init_info.session, self.tp_rank,
                                                        self.device), init_info.timeout
        else:
            staging_buffer.write_note(note, self.description(setup))
        self.setup = setup
        publish(init_info.session, self)

    def start_weight_update(self) -> None:
        if self.layout is None:
            raise RuntimeError("jax_amem: init_weight_transfer_engine must come before an update")
        if "weights" in self.asleep():
            # Its parameters are unmapped: a write would fault the GPU. Refused before anything.
            raise RuntimeError("jax_amem: the engine sleeps and its weights are not mapped: call "
                               "llm.wake_up(tags=['weights']) before an update; nothing was written")
        # vLLM refuses a start while its own update is active, so an update of ours still open
        # here is one that never reached finish_weight_update (a trainer that stopped, a start
        # that failed): end it (refusing if it wrote).
        self.abandon()
        self.failure = ""   # a failure the last trainer never read is not this update's
        if self.in_place:
            self._follow_parameters()
            # The trainer writes served parameters from now on: refuse until every group is in.
            self._refuse("an update is writing its parameters in place")
        if self.receiver is not None and self.receiver.transport(self.timeout) is not None:
            self.receiver.join()   # collective with the trainer, once: it joins during this call
        self.committed = set()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """A failure is kept for the trainer's next `failures_of`, not raised: after one rank
        raises, vLLM 0.32's multiprocess executor leaves the other ranks' answers unread, and
        every later call would read them out of step (returning before those ranks finish)."""
        self.failure = ""
        try:
            info = self.parse_update_info(update_info)
            self.receive_weights(info)
            # Where the commit queued device work, it is done (and its errors seen) before the
            # answer. Groups written whole in place queue none: a trainer in this process may
            # still be copying into them on PyTorch's stream, and waits for that itself.
            if self.device.type == "cuda" and not set(info.chosen()) <= self.nothing_to_commit:
                torch.cuda.synchronize(self.device)
        except Exception as error:  # noqa: BLE001 - answered through failures_of
            self.failure = f"{type(error).__name__}: {error}"

    def take_failure(self) -> str:
        """The failure of the last update_weights since the last call ("" if none)."""
        failure, self.failure = self.failure, ""
        return failure

    def receive_weights(self, update_info: JaxAmemUpdateInfo) -> None:
        if self.committed is None:
            raise RuntimeError("jax_amem: update_weights outside an update (start_weight_update first)")
        groups = self._left_to_commit(update_info.chosen())
        if self.receiver is not None and self.receiver.active:
            # Received before anything is committed: a refusal or a failure here leaves the
            # groups as they were (and the old version served when no group was committed yet).
            for group in groups:
                self.receiver.receive(group, self.staged(group))
        for group in groups:
            self._refuse(f"an update is writing it ({len(self.committed)} of {len(self.layout.groups)} "
                         "groups committed)")
            self.committed.add(group)   # counted before the write: a failure inside leaves a mix
            self._commit(group)

    def _left_to_commit(self, groups: list) -> list[int]:
        """`groups` checked before anything is written: group numbers not committed yet, each
        once, all of one batch (the groups of two batches share places in the staging buffer)."""
        total = len(self.layout.groups)
        for group in groups:
            if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < total \
                    or group in self.committed or groups.count(group) > 1:
                raise ValueError(f"jax_amem: group {group!r:.40} is not a group left to commit "
                                 f"(0..{total - 1}, each once; committed {sorted(self.committed)})")
        batches = {i for i, batch in enumerate(self.layout.batches) for group in groups if group in batch}
        if len(batches) > 1:
            raise ValueError(f"jax_amem: groups {groups} lie in batches {sorted(batches)} of the staging buffer "
                             f"({self.layout.batches}): one update_weights commits the groups of one batch")
        return groups

    def finish_weight_update(self) -> None:
        if self.committed is None:
            raise RuntimeError("jax_amem: finish_weight_update without an update in flight")
        self.abandon()

    def abandon(self) -> None:
        """Ends the update in flight, if any: served again if every group was committed, else
        the old version if none was, else refusing (also where vLLM dropped the update after an
        error, which never reaches finish_weight_update)."""
        if self.committed is None:
            return
        done, total = len(self.committed), len(self.layout.groups)
        self.committed = None
        if done == total:
            self._serve()
            self.updates += 1
        elif done:
            # vLLM's worker keeps its own update flag set if this raised: stay refusing instead,
            # so the next complete update recovers the engine.
            self._refuse(f"an update stopped after committing {done} of {total} groups")

    def shutdown(self) -> None:
        self.setup = ""   # first: a trainer of the setup going away must never find it again
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        staging_buffer.remove(*self.files)
        self.files = ()
        self.staging = None
        self._drop_views(made_anew=False)

    # --- inside -------------------------------------------------------------------------------
    def _commit(self, group: int) -> None:
        if group in self.nothing_to_commit:
            return
        staged = self.staged(group, whole=True)
        layout = self.layout
        with torch.no_grad():
            for t in layout.groups[group]:
                if t.rows is not None:
                    # The trainer writes only a padded vocabulary's real rows, and the staging
                    # buffer is shared by every group: the padding rows hold what the previous
                    # update's later groups left there. vLLM loads zeros into them.
                    staged[t.name][t.rows:].zero_()
            loaded = [t for t in layout.groups[group] if not t.processed]
            # Parameters the trainer wrote in place are there already (their padding rows zeroed
            # above: `staged` gives the parameter itself).
            copied = [t for t in loaded if t.name not in self.in_place_names]
            copy_all([getattr(*layout.owners[t.name]).data for t in copied], [staged[t.name] for t in copied])
            for module in layout.group_modules[group]:
                reprocess(module, {attr: staged[name] for name, (m, attr) in layout.owners.items()
                                   if m is module and name in staged})
            for module, names in layout.followers.get(group, []):
                reprocess(module, {attr: staged[name] for attr, name in names.items()})
            for module in layout.derivers.get(group, []):   # after the modules it reads, as at load
                module.process_weights_after_loading(self.vllm_config.model_config.dtype)

    def _refuse(self, why: str, what: str = "a mix of two versions") -> None:
        """Refuses to serve from now on: the model's forward raises, saying the weights are
        `what` and `why`, until an update commits every group (`_serve`)."""
        self.refusal_reason = f"{what} ({why})"
        if self.refusal is None:
            def refuse(module, args):
                raise MixedVersionsError(
                    f"jax_amem: this engine's weights are {self.refusal_reason}; "
                    "it refuses to serve until an update commits every group")
            self.refusal = self.model.register_forward_pre_hook(refuse)

    def _serve(self) -> None:
        if self.refusal is not None:
            self.refusal.remove()
            self.refusal = None
            self.refusal_reason = ""
