"""`jax_amem.vllm.connect` with hostile options, without vLLM: a stand-in engine records every
call into its workers and stops at the first one. Every bad option (timeout, family, source,
cast, rules, session, params, rendezvous, staging budget, an object that is not an engine) is refused by name
before the engine is touched: no worker set up a staging buffer or was handed a bad value.
The good forms (an IPv6 rendezvous in brackets among them) reach the workers."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the vLLM backend's staging is PyTorch's")
pytest.importorskip("torch.distributed")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_amem  # noqa: E402
from jax_amem.vllm import VllmBackendError, VllmPlanError, connect  # noqa: E402
from jax_amem.vllm.nccl import checked_rendezvous  # noqa: E402
from jax_amem_core import wire  # noqa: E402
import vllm_models as vm  # noqa: E402


class Engine:
    """What connect reads of a vllm.LLM. Each call into the workers is recorded and refused;
    with a store address, the stand-in worker first connects to it, as the real one does."""

    def __init__(self, tp=1):
        parallel = types.SimpleNamespace(pipeline_parallel_size=1, data_parallel_size=1, tensor_parallel_size=tp)
        config = types.SimpleNamespace(weight_transfer_config=types.SimpleNamespace(backend="jax_amem"),
                                       parallel_config=parallel)
        self.llm_engine = types.SimpleNamespace(vllm_config=config)
        self.calls, self.reached = [], []

    def collective_rpc(self, method, timeout=None, kwargs=None):
        self.calls.append((method, timeout, kwargs))
        store = ((kwargs or {}).get("init_info") or {}).get("store")
        if store:
            host, _, port = store.rpartition(":")
            wire.TorchStore.connect(host, int(port), timeout=10)   # raises unless the trainer's store is there
            self.reached.append(host)
        raise RuntimeError("the stand-in engine stops here")


PARAMS = jax.tree.map(jnp.asarray, vm.flax_tree("llama", 3))


def _refused(error, match, **options):
    engine = Engine()
    kwargs = {"family": "llama", **options}
    with pytest.raises(error, match=match):
        connect(engine, kwargs.pop("params", PARAMS), **kwargs)
    assert engine.calls == [], "the engine was touched before the option was refused"


@pytest.mark.parametrize("timeout", [-1, 0, -0.0, "300", None, math.nan, math.inf, -math.inf, True, [1], 1e300,
                                     366 * 24 * 3600])
def test_a_bad_timeout_is_refused_before_the_engine_is_touched(timeout):
    """Each was handed to the workers' calls as it was (a string, None, NaN, a negative number)."""
    _refused(VllmBackendError, r"timeout=.*: give the seconds any one call into the engine's workers may take "
                               r"\(a number > 0 and at most 31536000.*nothing was started", timeout=timeout)


@pytest.mark.parametrize("options,match", [
    (dict(family="llamaa"), r"family='llamaa' is not a preset family: give one of llama, .*or rules="),
    (dict(family=3), r"family=3 is not a preset family"),
    (dict(source="hf"), r"source='hf': give the trainer tree's naming, one of \('flax', 'maxtext'\)"),
    (dict(source=None), r"source=None: give the trainer tree's naming"),
    (dict(cast="nope"), r"cast='nope' is not a dtype a weight is sent in: give a floating dtype"),
    (dict(cast="int8"), r"cast='int8' \(int8\) is not a dtype a weight is sent in"),
    (dict(family=None, rules="abc"), r"rules='abc' is not a list of rules"),
    (dict(family=None, rules={"a": 1}), r"rules=\{'a': 1\} is not a list of rules"),
    (dict(family=None, rules=[1, 2]), r"rules holds 1 \(int\), not a Rule or Piece"),
    (dict(family=None, rules=[]), r"rules= is empty: it would write none of the engine's tensors"),
    (dict(family=None, rules=[jax_amem.rules.Rule.copy("w")], cast="bfloat16"),
     r"cast='bfloat16' applies to family=; with rules= each rule says its own cast"),
    (dict(params=None), r"params cannot be planned: "),
    (dict(params={"w": np.zeros(3)}), r"params cannot be planned: "),
])
def test_bad_rules_options_are_refused_before_the_engine_is_touched(options, match):
    """Each was refused only after every worker had set up its staging buffer."""
    _refused(VllmPlanError, match + r".*nothing was started", **options)


@pytest.mark.parametrize("session", ["../../tmp/x", "a/b", "", "..", "a b", 3, "x" * 65, "ü"])
def test_a_session_that_cannot_name_a_file_is_refused(session):
    """The session names the workers' notes in /dev/shm: '../../tmp/x' put them elsewhere."""
    _refused(VllmBackendError, r"session=.*: give None .*it names files in /dev/shm.*nothing was started",
             session=session)


@pytest.mark.parametrize("staging_bytes", [-1, -2**70, 1.0, 1e9, "1024", True, False, [1], math.nan, np.float32(8)])
def test_a_bad_staging_budget_is_refused_before_the_engine_is_touched(staging_bytes):
    """-1 is the wire's own "default" value: a caller's -1 is refused, not taken as it."""
    _refused(VllmBackendError, r"staging_bytes=.*: give None \(the default, 512 MiB\), 0 \(one layer group at a "
                               r"time\) or the bytes each worker may stage at once.*nothing was started",
             staging_bytes=staging_bytes)


@pytest.mark.parametrize("staging_bytes, sent", [(None, -1), (0, 0), (np.int64(4096), 4096), (2**80, 2**62)])
def test_a_good_staging_budget_reaches_the_workers(staging_bytes, sent):
    engine = Engine()
    with pytest.raises(VllmBackendError, match="could not set up the jax_amem backend: the stand-in engine stops"):
        connect(engine, PARAMS, family="llama", staging_bytes=staging_bytes)
    (method, _, kwargs), = engine.calls
    assert method == "init_weight_transfer_engine"
    assert kwargs["init_info"]["staging_bytes"] == sent and type(kwargs["init_info"]["staging_bytes"]) is int


@pytest.mark.parametrize("rendezvous", [
    "::1",          # was read as host ':' and port 1
    "::1:29500",    # an IPv6 address without brackets: which ':' ends it?
    "[::1]", "[]:80", "[::zz]:80", "[1.2.3.4]:80",
    " host:80", "host :80", "a b:80", "h\n:80", "hóst:80",   # spaces, control and non-ASCII characters
    "-:80", ".:80", "a..b:80", "-a.b:80", "a.-b:80", "x" * 254 + ":80",  # not a host name
    "host:", ":80", "host:-0", "host:+80", "host:80 ", "host:65536", "host:70000",
    "host:\uff11\uff12\uff13", "\u0661\u0662\u0663", "host:\u00b2",
    b"host:80", 5000, ("host", 80),
])
def test_a_bad_rendezvous_is_refused_before_the_engine_is_touched(rendezvous):
    _refused(VllmBackendError, r"rendezvous=.*give 'host:port'.*an IPv6 address in brackets as '\[::1\]:29500'.*"
                               r"nothing was started", transport="nccl", rendezvous=rendezvous)


@pytest.mark.parametrize("rendezvous,want", [
    ("127.0.0.1:0", ("127.0.0.1", 0)), ("host-a.example_1:0080", ("host-a.example_1", 80)),
    ("trainer.cluster.local.:29500", ("trainer.cluster.local.", 29500)), ("h:65535", ("h", 65535)),
    ("[::1]:29500", ("::1", 29500)), ("[0:0::1]:0", ("::1", 0)), (None, None),
])
def test_the_good_rendezvous_forms(rendezvous, want):
    got = checked_rendezvous(rendezvous)
    assert got == want if want else got[1] == 0


def test_an_ipv6_rendezvous_reaches_the_workers():
    """"[::1]:0": the workers are given '::1:<port>' (they split at the last ':') and reach the
    trainer's store there."""
    engine = Engine()
    with pytest.raises(VllmBackendError, match="could not set up the jax_amem backend: the stand-in engine stops"):
        connect(engine, PARAMS, family="llama", transport="nccl", rendezvous="[::1]:0", timeout=20)
    (method, timeout, kwargs), = engine.calls
    assert method == "init_weight_transfer_engine" and timeout == 20.0
    assert kwargs["init_info"]["store"].startswith("::1:") and engine.reached == ["::1"]


@pytest.mark.parametrize("llm", [None, object(), types.SimpleNamespace(llm_engine=types.SimpleNamespace()),
                                 types.SimpleNamespace(llm_engine=types.SimpleNamespace(vllm_config=types.SimpleNamespace(
                                     weight_transfer_config=types.SimpleNamespace(backend="jax_amem"))))])
def test_an_object_that_is_not_an_engine_is_refused(llm):
    """The last (a config without parallel_config) raised AttributeError."""
    with pytest.raises(VllmBackendError, match=r"connect takes a vllm.LLM"):
        connect(llm, PARAMS, family="llama")


def test_good_options_reach_the_workers_as_given():
    engine = Engine()
    with pytest.raises(VllmBackendError, match="the stand-in engine stops"):
        connect(engine, PARAMS, family="llama", source="flax", cast="bfloat16", timeout=np.float32(7.5),
                session="run-1.a_b")
    (method, timeout, kwargs), = engine.calls
    assert timeout == 7.5 and type(timeout) is float and kwargs["init_info"]["session"] == "run-1.a_b"


@pytest.mark.parametrize("version", ["3", -1, 1.5, True, [1], np.float32(2)])
def test_update_refuses_a_version_that_is_not_a_number_before_anything_runs(version):
    """'3' was sent as the NCCL handshake's version and then kept, so the next update's
    version + 1 raised TypeError; -1 and 1.5 were numbered as given."""
    from jax_amem.vllm.trainer import VllmEngine

    engine = VllmEngine.__new__(VllmEngine)   # nothing set: the check runs before anything is read
    with pytest.raises(VllmPlanError, match=r"version=.* is not a version number: give an int >= 0, or None.*"
                                            r"nothing was written"):
        engine.update(PARAMS, version=version)
