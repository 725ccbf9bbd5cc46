"""The RL loop: PyTorch samples, a script rewards, JAX trains, the weights swap back in place.

One iteration, in order:
  pause    the trainer's parameters and optimizer state leave the device
           (`jax_amem.paused(keep=...)`: host copies, allocator pool and NCCL freed)
  rollout  PyTorch samples answers from the weights the last swap wrote
  resume   the trainer's arrays come back bit-identical, same shardings
  reward   the task scores the answers; group-relative advantages
  train    one jitted policy-gradient step on the FSDP-sharded parameters
  swap     the new parameters are written into the rollout model's own tensors
  check    every `check_every` iterations and at the end: both models' logits agree
The same code runs on a GPU and on XLA CPU devices (where the pause copies to host
memory and has no device memory to give back).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

import jax_amem

from . import rollout, sharding
from .config import LoopConfig, PolicyConfig
from .policy import exact_logits_fn, init_params
from .task import SortTask
from .train import group_advantages, make_optimizer, make_train_step
from .weights import swap_rules, swap_weights

PHASES = ("pause", "rollout", "resume", "reward", "train", "swap", "check")
LOGITS_TOLERANCE = 1e-4  # max |jax - torch| over max |jax|, float32


@dataclasses.dataclass(frozen=True)
class LogitsCheck:
    iteration: int
    max_abs_diff: float
    relative: float        # max_abs_diff / max |logit|
    tolerance: float = LOGITS_TOLERANCE

    @property
    def ok(self) -> bool:
        return self.relative <= self.tolerance


@dataclasses.dataclass
class LoopResult:
    policy: PolicyConfig
    loop: LoopConfig
    task: SortTask
    platform: str                    # "gpu" / "cpu" and the device kind
    devices: int
    rollout_device: str              # where PyTorch holds the rollout model ("cuda:0", "cpu")
    rollout_engine: str = "transformers LlamaForCausalLM"   # what samples (vllm_rollout.py: vLLM)
    rewards: list = dataclasses.field(default_factory=list)        # mean reward per iteration
    losses: list = dataclasses.field(default_factory=list)
    phase_seconds: dict = dataclasses.field(default_factory=lambda: {p: [] for p in PHASES})
    initial_swap: object = None      # the SwapReport of the rollout's first weights
    swaps: list = dataclasses.field(default_factory=list)          # SwapReport per iteration
    pauses: list = dataclasses.field(default_factory=list)         # PauseInfo per iteration
    resumes: list = dataclasses.field(default_factory=list)        # Restored stats (no arrays)
    checks: list = dataclasses.field(default_factory=list)         # LogitsCheck
    memory_before: object = None     # memory_report() before the first pause
    memory_paused: object = None     # memory_report() during the first rollout
    setup_seconds: float = 0.0
    param_bytes: int = 0
    opt_state_bytes: int = 0

    @property
    def checks_ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))


def _platform() -> str:
    device = jax.devices()[0]
    return f"{device.platform} ({device.device_kind})"


class Trainer:
    """The JAX side: FSDP-sharded parameters, optimizer state and the jitted step."""

    def __init__(self, config: PolicyConfig, loop: LoopConfig, task: SortTask):
        mesh = sharding.trainer_mesh()
        if loop.batch_size % mesh.size:
            raise ValueError(f"the batch ({loop.prompts_per_iteration} prompts x {loop.group_size} "
                             f"samples = {loop.batch_size}) must divide evenly over the {mesh.size} "
                             "devices: change prompts_per_iteration or group_size")
        fsdp = lambda tree: sharding.fsdp_shardings(tree, mesh)  # noqa: E731
        self.params = init_params(config, loop.seed, fsdp)
        optimizer = make_optimizer(loop.learning_rate)
        # Adam's moments are split like the parameters, its step count replicated over the mesh.
        opt_shardings = fsdp(jax.eval_shape(optimizer.init, self.params))
        self.opt_state = jax.jit(optimizer.init, out_shardings=opt_shardings)(self.params)
        shardings_of = lambda tree: jax.tree_util.tree_map(lambda x: x.sharding, tree)  # noqa: E731
        self.batch_sharding = sharding.batch_sharding(mesh)
        self.step_fn = make_train_step(config, task.prompt_length, optimizer, shardings_of(self.params),
                                       shardings_of(self.opt_state), self.batch_sharding)
        self.forward = exact_logits_fn(config)

    def step(self, tokens: np.ndarray, advantages: np.ndarray) -> float:
        tokens = jax.device_put(tokens, self.batch_sharding)
        advantages = jax.device_put(advantages, self.batch_sharding)
        self.params, self.opt_state, metrics = self.step_fn(self.params, self.opt_state, tokens, advantages)
        return float(metrics["loss"])  # waits for the step

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        return np.asarray(self.forward(self.params, tokens))


class Rollout:
    """The PyTorch side: a transformers model whose weights only ever come from the swap.
    dtype: the model's torch dtype (float32 by default); rules: the swap's (default:
    `swap_rules(config)`, which the Qwen3 family builds from the trainer's `params`)."""

    def __init__(self, config: PolicyConfig, dtype=None, params=None):
        self.model = rollout.build_rollout_model(config, dtype=dtype)
        self.tensors = rollout.rollout_tensors(self.model)
        self.rules = swap_rules(config, params, cast=_cast_to(self.model))

    def load(self, params):
        """The swap: `params` written into the model's own tensors; returns the SwapReport."""
        return swap_weights(params, self.tensors, self.rules)

    def sample(self, prompts: np.ndarray, new_tokens: int, seed: int) -> np.ndarray:
        out = rollout.generate(self.model, prompts, new_tokens, seed)
        _release_torch_cache()
        return out


def _cast_to(model) -> str | None:
    """The swap's cast into `model`'s dtype ("bfloat16"), None for a float32 model."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return None if dtype == "float32" else dtype


def _release_torch_cache() -> None:
    """PyTorch's caching allocator keeps freed blocks; give them back so JAX can resume."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check_logits(trainer: Trainer, roll: Rollout, tokens: np.ndarray, iteration: int) -> LogitsCheck:
    expected = trainer.logits(tokens)
    got = rollout.logits(roll.model, tokens)
    diff = float(np.abs(expected - got).max())
    return LogitsCheck(iteration, diff, diff / max(float(np.abs(expected).max()), 1e-30))


def _restored_stats(restored) -> dict:
    return {"bytes_reloaded": restored.bytes_reloaded, "reload_seconds": restored.reload_seconds,
            "seconds": restored.seconds}


def run(config: PolicyConfig, loop: LoopConfig, task: SortTask | None = None, *,
        on_start: Callable[[LoopResult], None] | None = None,
        on_iteration: Callable[[int, LoopResult], None] | None = None,
        make_rollout: Callable | None = None) -> LoopResult:
    """Runs `loop.iterations` iterations. `on_start(result)` once both models are built and
    hold the same weights; `on_iteration(i, result)` after each iteration (progress bars).
    `make_rollout(config, params)`: another rollout with Rollout's calls (vllm_rollout.py)."""
    task = task or SortTask()
    if config.vocab_size < 12:
        raise ValueError(f"the sort task needs a vocabulary of at least 12 tokens, got {config.vocab_size}")
    start = time.perf_counter()
    trainer = Trainer(config, loop, task)
    roll = make_rollout(config, trainer.params) if make_rollout is not None else Rollout(config)
    result = LoopResult(config, loop, task, _platform(), len(jax.devices()),
                        str(next(roll.model.parameters()).device),
                        param_bytes=_nbytes(trainer.params), opt_state_bytes=_nbytes(trainer.opt_state))
    result.rollout_engine = getattr(roll, "engine_name", result.rollout_engine)
    result.initial_swap = roll.load(trainer.params)
    rng = np.random.default_rng(loop.seed)
    check_prompts = task.prompts(np.random.default_rng(loop.seed + 1), 8)
    check_tokens = np.concatenate([check_prompts, task.targets(check_prompts)], axis=1)
    # The first pause should cost what later ones do: pin the staging pool and compile resume's
    # program now, in the background, while the loop starts (pause() itself runs no gc.collect()).
    jax_amem.reserve(keep=(trainer.params, trainer.opt_state))
    result.setup_seconds = time.perf_counter() - start
    if on_start is not None:
        on_start(result)

    for iteration in range(loop.iterations):
        times = result.phase_seconds
        prompts = np.repeat(task.prompts(rng, loop.prompts_per_iteration), loop.group_size, axis=0)
        first = iteration == 0
        if first:
            result.memory_before = jax_amem.memory_report(keep=(trainer.params, trainer.opt_state),
                                                          measure_context=False)
        with jax_amem.paused(keep=(trainer.params, trainer.opt_state)) as paused:
            trainer.params = trainer.opt_state = None  # deleted by the pause
            began = time.perf_counter()
            tokens = roll.sample(prompts, task.answer_length, seed=loop.seed * 100_003 + iteration)
            times["rollout"].append(time.perf_counter() - began)
            if first:
                result.memory_paused = jax_amem.memory_report(measure_context=False)
        trainer.params, trainer.opt_state = paused.keep
        times["pause"].append(paused.info.seconds)
        times["resume"].append(paused.restored.seconds)
        result.pauses.append(paused.info)
        result.resumes.append(_restored_stats(paused.restored))

        began = time.perf_counter()
        rewards = task.rewards(prompts, tokens[:, task.prompt_length:])
        advantages = group_advantages(rewards, loop.group_size)
        times["reward"].append(time.perf_counter() - began)

        began = time.perf_counter()
        result.losses.append(trainer.step(tokens, advantages))
        times["train"].append(time.perf_counter() - began)

        swap = roll.load(trainer.params)
        result.swaps.append(swap)
        times["swap"].append(swap.seconds)

        began = time.perf_counter()
        if (iteration + 1) % loop.check_every == 0 or iteration == loop.iterations - 1:
            result.checks.append(check_logits(trainer, roll, check_tokens, iteration))
        times["check"].append(time.perf_counter() - began)
        result.rewards.append(float(rewards.mean()))
        if on_iteration is not None:
            on_iteration(iteration, result)
    return result
