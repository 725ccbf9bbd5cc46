"""The learner: GRPO-style policy gradient on sampled sequences, one optax step per iteration.

Advantages are group-relative: each prompt is sampled `group_size` times and a
sample's advantage is its reward minus its group's mean, over the group's
standard deviation. The loss is -advantage * log-probability of the sampled
answer tokens (on-policy, so no importance ratio), averaged over tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .config import PolicyConfig
from .policy import logits_fn


def group_advantages(rewards: np.ndarray, group_size: int, eps: float = 1e-6) -> np.ndarray:
    """(B,) rewards laid out group after group -> (B,) normalised advantages (0 for a flat group)."""
    rewards = np.asarray(rewards, np.float32)
    if rewards.ndim != 1 or group_size < 1 or rewards.size % group_size:
        raise ValueError(f"rewards (shape {rewards.shape}) must be one row of whole groups of "
                         f"group_size={group_size} samples each, laid out group after group")
    grouped = rewards.reshape(-1, group_size)
    centred = grouped - grouped.mean(axis=1, keepdims=True)
    return (centred / (grouped.std(axis=1, keepdims=True) + eps)).reshape(-1)


def make_optimizer(learning_rate: float) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate))


def policy_loss(config: PolicyConfig, prompt_length: int):
    """(params, tokens (B, T), advantages (B,)) -> (loss, mean answer-token log-prob)."""
    forward = logits_fn(config)

    def loss(params, tokens, advantages):
        logits = forward(params, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        taken = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        answer = taken[:, prompt_length - 1:]          # log p of each generated token
        per_sample = answer.mean(axis=1)
        return -(advantages * per_sample).mean(), per_sample.mean()

    return loss


def make_train_step(config: PolicyConfig, prompt_length: int, optimizer, param_shardings,
                    opt_shardings, batch_sharding):
    """A jitted step: (params, opt_state, tokens, advantages) -> (params, opt_state, metrics).

    Parameters and optimizer state keep their shardings (the same ones after a
    pause/resume, so the step never recompiles); the batch is split over the
    same devices. params and opt_state are donated.
    """
    loss = policy_loss(config, prompt_length)

    def step(params, opt_state, tokens, advantages):
        (value, logp), grads = jax.value_and_grad(loss, has_aux=True)(params, tokens, advantages)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        return params, opt_state, {"loss": value, "logp": logp, "grad_norm": grad_norm}

    return jax.jit(step, donate_argnums=(0, 1),
                   in_shardings=(param_shardings, opt_shardings, batch_sharding, batch_sharding),
                   out_shardings=(param_shardings, opt_shardings, None))
