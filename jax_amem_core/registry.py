"""Worker engines of this process by session name: how a trainer in the same process (vLLM
with VLLM_ENABLE_V1_MULTIPROCESSING=0) finds the engine its `init_weight_transfer_engine` call
made, without vLLM having to carry objects back through `collective_rpc`."""

from __future__ import annotations

import weakref

_engines: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()


def publish(session: str, engine) -> None:
    _engines[session] = engine


def lookup(session: str):
    """The engine published under `session` in this process, or None."""
    return _engines.get(session)
