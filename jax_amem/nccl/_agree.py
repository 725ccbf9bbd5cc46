"""Every process agrees on a collective change (pause, resume, recover) before any NCCL call.

Over the jax.distributed key-value store, in the fewest store operations: each process
sets its entry (what it is about to do), all meet at one barrier bounded by the timeout,
then one directory get reads every entry (pause, recover); resume reads nothing (its
set only says "I came", for the timeout's message). So pause costs three store calls
and resume two, whatever the number of processes. A process that never comes makes
the barrier time out on every process that did come; they raise NcclPauseError having
touched nothing, so every communicator stays active and usable, and the message names
the processes whose entry for this agreement is not there. Without jax.distributed (one
process, or a program that does not use it) there is nobody to agree with, and each
process decides alone.

Agreements are numbered in the order a process makes them: every process must make
the same sequence (pause, resume, ...), as with any collective. After a timed-out
agreement, the late process's call fails at once (the store remembers that barrier
failed); if the others made no other agreement before it came, the job is in step
again, else it is out of step for good (the barrier's uses are counted by the store),
which the next agreement reports. Bounded store:
the entries live in two slots (agreement number mod 2) and are overwritten, and every
agreement meets at the same barrier id (the client numbers its uses). Slot reuse is
safe: a process sets its entry for agreement n+2 only after the barrier of n+1, which
every process reaches only after reading agreement n. Each entry carries its number and
kind, so a stale or out-of-step entry is refused, never read as current.
"""

from __future__ import annotations

import json

from ._control import NcclPauseError

_round = 0
_PREFIX = "jax_amem/nccl/agree"
_BARRIER = "jax_amem_nccl_agree"


def _slot(number: int) -> str:
    return f"{_PREFIX}/{number % 2}/"


class Peers:
    """The jax.distributed job this process belongs to."""

    def __init__(self, client, process_id: int, num_processes: int):
        self.client, self.process_id, self.num_processes = client, process_id, num_processes

    def exchange(self, kind: str, payload: dict, timeout: float) -> list[dict]:
        """Publishes `payload`, waits for every process, returns every payload by process id."""
        number = self._arrive(kind, payload, timeout)
        entries = {}
        for key, value in self.client.key_value_dir_get(_slot(number)):
            entries[int(key.rsplit("/", 1)[1])] = json.loads(value)
        out_of_step = {p: entries.get(p) for p in range(self.num_processes)
                       if (entries.get(p) or {}).get("agreement") != [number, kind]}
        if out_of_step:
            seen = "; ".join(f"process {p}: " + ("no entry" if entry is None else
                                                 "agreement {} ({})".format(*entry["agreement"]))
                             for p, entry in sorted(out_of_step.items()))
            raise NcclPauseError(
                f"jax_amem.nccl.{kind}() is agreement {number} of this process, but the job is out "
                f"of step ({seen}): every process must call pause / resume / recover in the same "
                "order. Nothing was changed by this call.")
        return [entries[p]["payload"] for p in range(self.num_processes)]

    def meet(self, kind: str, timeout: float) -> None:
        """Waits for every process (nothing to read): resume's agreement."""
        self._arrive(kind, None, timeout)

    def _arrive(self, kind: str, payload: dict | None, timeout: float) -> int:
        """Sets this process's entry and waits at the barrier; returns the agreement's number."""
        global _round
        _round += 1
        number = _round
        entry = json.dumps({"agreement": [number, kind], "payload": payload})
        self.client.key_value_set(f"{_slot(number)}{self.process_id}", entry, allow_overwrite=True)
        try:
            self.client.wait_at_barrier(_BARRIER, max(1, int(timeout * 1000)))
        except Exception as error:  # noqa: BLE001 - the store's timeout or failure, reworded
            missing = [p for p in range(self.num_processes) if not self._arrived(number, p)]
            seen = (f"not seen: process(es) {missing}" if missing else
                    "every process set its entry: this one came after the others had timed out")
            raise NcclPauseError(
                f"jax_amem.nccl.{kind}() timed out after {timeout:g} s waiting for every process "
                f"to join (agreement {number}; {seen}): {kind} is collective, every process must "
                f"call it. Nothing was changed: every communicator is as it was. "
                f"({type(error).__name__}: {str(error)[:200]})") from None
        return number

    def _arrived(self, number: int, process: int) -> bool:
        """Whether `process` set its entry for agreement `number` (an older one in the slot is not it)."""
        value = self._try_get(f"{_slot(number)}{process}")
        return value is not None and json.loads(value)["agreement"][0] == number

    def _try_get(self, key: str) -> str | None:
        try:
            if hasattr(self.client, "key_value_try_get"):
                value = self.client.key_value_try_get(key)  # no wait: absent raises at once
            else:
                # A 1 ms wait missed keys that were there (jax 0.12 saw none after a barrier timeout).
                value = self.client.blocking_key_value_get(key, 500)
        except Exception:  # noqa: BLE001 - absent
            return None
        return value.decode() if isinstance(value, bytes) else value


def peers() -> Peers | None:
    """The job's processes when jax.distributed is initialised with more than one, else None."""
    from .. import _jax_compat

    client = _jax_compat.distributed_client()
    process_id, num_processes = _jax_compat.distributed_processes()
    if client is None or num_processes <= 1:
        return None
    return Peers(client, process_id, num_processes)


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


def agreed_next_ids(local: list[dict], strategies: list[str], everyone: list[dict]) -> list[bytes | None]:
    """Per local communicator to recreate, its replacement's unique id as rank 0 made it for its plan.

    `everyone`: each process's payload, {"plan": [...]}, this process's own included. None where
    rank 0 made none (it had planned to suspend), and wherever some rank of the communicator is in
    no plan read here (a process outside this agreement: the rollout of a cross-host link, a
    process without jax.distributed): that id then goes over the communicator. Each side decides
    alike: one that read every rank's plan uses the id, and so do all the others, which read the
    same plans; one that misses a rank cannot hand the id to it, and that rank misses this side
    too (rank 0 itself then joins the broadcast instead of tearing the communicator down alone).
    """
    ranks: dict[str, set] = {}
    for payload in everyone:
        for entry in payload["plan"]:
            ranks.setdefault(entry["key"], set()).add(entry["rank"])
    made = {entry["key"]: entry["next_id"] for payload in everyone for entry in payload["plan"]
            if entry["rank"] == 0 and entry.get("next_id") and len(ranks[entry["key"]]) == entry["nranks"]}
    return [bytes.fromhex(made[entry["key"]]) if strategy == "recreate" and entry["key"] in made else None
            for entry, strategy in zip(local, strategies)]
