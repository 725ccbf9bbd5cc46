"""Every process agrees on a collective change (pause, resume, recover) before any NCCL call.

Over the jax.distributed key-value store: each process publishes what it is about
to do, all meet at a barrier bounded by the timeout, then each reads everyone's
entry. A process that never comes makes the barrier time out on every process that
did come; they raise NcclPauseError having touched nothing, so every communicator
stays active and usable. Without jax.distributed (one process, or a program that
does not use it) there is nobody to agree with, and each process decides alone.

Agreements are numbered in the order a process makes them: every process must make
the same sequence (pause, resume, ...), as with any collective. After a timed-out
agreement the processes' numbers differ; the program has a bug to fix (a process
did not take part), not a state to repair.
"""

from __future__ import annotations

import json

from ._control import NcclPauseError

_round = 0


class Peers:
    """The jax.distributed job this process belongs to."""

    def __init__(self, client, process_id: int, num_processes: int):
        self.client, self.process_id, self.num_processes = client, process_id, num_processes

    def exchange(self, kind: str, payload: dict, timeout: float) -> list[dict]:
        """Publishes `payload`, waits for every process, returns every payload by process id."""
        global _round
        _round += 1
        prefix = f"jax_amem/nccl/{_round}/{kind}"
        self.client.key_value_set(f"{prefix}/{self.process_id}", json.dumps(payload))
        try:
            self.client.wait_at_barrier(f"jax_amem_nccl_{_round}_{kind}", max(1, int(timeout * 1000)))
        except Exception as error:  # noqa: BLE001 - the store's timeout or failure, reworded
            missing = [p for p in range(self.num_processes) if self._get(f"{prefix}/{p}") is None]
            raise NcclPauseError(
                f"jax_amem.nccl.{kind}() timed out after {timeout:g} s waiting for every process "
                f"to join (agreement {_round}; not seen: process(es) {missing or '?'}): "
                f"{kind} is collective, every process must call it. Nothing was changed: every "
                f"communicator is as it was. ({type(error).__name__}: {str(error)[:200]})") from None
        return [json.loads(self._get(f"{prefix}/{p}", wait=True)) for p in range(self.num_processes)]

    def meet(self, kind: str, timeout: float) -> None:
        """Waits for every process (nothing to read): resume's agreement."""
        self.exchange(kind, {}, timeout)

    def _get(self, key: str, wait: bool = False) -> str | None:
        try:
            if wait:
                value = self.client.blocking_key_value_get(key, 60_000)
            elif hasattr(self.client, "key_value_try_get"):
                value = self.client.key_value_try_get(key)  # no wait: absent raises at once
            else:
                # A 1 ms wait missed keys that were there (jax 0.12 saw none after a barrier timeout).
                value = self.client.blocking_key_value_get(key, 500)
        except Exception:  # noqa: BLE001 - absent
            if wait:
                raise
            return None
        return value.decode() if isinstance(value, bytes) else value


def peers() -> Peers | None:
    """The job's processes when jax.distributed is initialised with more than one, else None."""
    try:
        from jax._src import distributed
    except ImportError:
        return None
    state = distributed.global_state
    if state.client is None or (state.num_processes or 1) <= 1:
        return None
    return Peers(state.client, state.process_id, state.num_processes)


def merge_plans(local: list[dict], everyone: list[dict]) -> list[str]:
    """Per local communicator, the strategy every rank of it will run.

    `everyone`: each process's payload, {"plan": [its plan entries]}.
    By key: `recreate` if any rank chose it (a split can leave the parent shared on
    some ranks only); a refusal anywhere stops every process before anything is touched.
    """
    chosen: dict[str, set] = {}
    refusals: dict[str, str] = {}
    for process, payload in enumerate(everyone):
        for entry in payload["plan"]:
            chosen.setdefault(entry["key"], set()).add(entry["strategy"])
            if entry["refused"] and entry["key"] not in refusals:
                refusals[entry["key"]] = f"process {process}: {entry['why']}"
    if refusals:
        raise NcclPauseError(f"nothing was paused: {refusals[min(refusals)]}")
    return ["recreate" if "recreate" in chosen[e["key"]] else e["strategy"] for e in local]
