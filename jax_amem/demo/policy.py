"""The trainer's policy: a Llama-style decoder in Flax, layers stacked by `nn.scan`.

Parameter names follow `jax_amem.reshard.rules.hf_llama(stacked=True)`:
`embed/embedding` (V, D), `layers/attn/q/kernel` (L, D, H*hd), ...,
`layers/input_norm/scale` (L, D), `final_norm/scale`, `lm_head/kernel` (D, V).
Kernels are stored (in, out) as Flax does; the swap transposes them into
PyTorch's (out, in). The arithmetic mirrors transformers' LlamaForCausalLM
(rotate-half rotary embeddings, key/value heads repeated consecutively, RMSNorm
in float32) so that the two give the same logits from the same weights.
Family "qwen3" adds `layers/attn/q_norm/scale` and `k_norm/scale` (L, hd): RMSNorm on
each head before the rotary embedding, as Qwen3ForCausalLM (the names
`jax_amem.reshard.rules.qwen3` expects); `tie_embeddings` drops `lm_head` and reads
the logits off `embed/embedding`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from .config import PolicyConfig


def _dense(features: int, name: str, std: float) -> nn.Dense:
    return nn.Dense(features, use_bias=False, name=name, kernel_init=nn.initializers.normal(std))


class RMSNorm(nn.Module):
    eps: float

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return scale * normed.astype(x.dtype)


def rotary_tables(positions, head_dim: int, theta: float):
    """(cos, sin) of shape (T, head_dim): the frequencies repeated twice, as transformers does."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x, cos, sin):
    """x: (B, T, heads, hd). Rotate-half form: x*cos + [-x2, x1]*sin."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


class Attention(nn.Module):
    config: PolicyConfig

    @nn.compact
    def __call__(self, x, cos, sin):
        c = self.config
        batch, length, _ = x.shape
        q = _dense(c.num_heads * c.head_dim, "q", c.init_std)(x).reshape(batch, length, c.num_heads, c.head_dim)
        k = _dense(c.num_kv_heads * c.head_dim, "k", c.init_std)(x).reshape(batch, length, c.num_kv_heads, c.head_dim)
        v = _dense(c.num_kv_heads * c.head_dim, "v", c.init_std)(x).reshape(batch, length, c.num_kv_heads, c.head_dim)
        if c.family == "qwen3":  # one RMSNorm over head_dim, shared by every head
            q = RMSNorm(c.rms_norm_eps, name="q_norm")(q)
            k = RMSNorm(c.rms_norm_eps, name="k_norm")(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Query head h reads key/value head h // (H / KV), as transformers' repeat_kv.
        repeat = c.num_heads // c.num_kv_heads
        k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(c.head_dim))
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, c.num_heads * c.head_dim)
        return _dense(c.hidden_size, "o", c.init_std)(out)


class Mlp(nn.Module):
    config: PolicyConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        gate = _dense(c.intermediate_size, "gate", c.init_std)(x)
        up = _dense(c.intermediate_size, "up", c.init_std)(x)
        return _dense(c.hidden_size, "down", c.init_std)(nn.silu(gate) * up)


class Block(nn.Module):
    config: PolicyConfig

    @nn.compact
    def __call__(self, x, rope):
        cos, sin = rope
        eps = self.config.rms_norm_eps
        x = x + Attention(self.config, name="attn")(RMSNorm(eps, name="input_norm")(x), cos, sin)
        x = x + Mlp(self.config, name="mlp")(RMSNorm(eps, name="post_attn_norm")(x))
        return x, None


class Policy(nn.Module):
    """tokens (B, T) int32 -> logits (B, T, V) float32."""

    config: PolicyConfig

    @nn.compact
    def __call__(self, tokens):
        c = self.config
        embed = nn.Embed(c.vocab_size, c.hidden_size, name="embed",
                         embedding_init=nn.initializers.normal(c.init_std))
        x = embed(tokens)
        rope = rotary_tables(jnp.arange(tokens.shape[1]), c.head_dim, c.rope_theta)
        layers = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                         in_axes=nn.broadcast, length=c.num_layers)
        x, _ = layers(c, name="layers")(x, rope)
        x = RMSNorm(c.rms_norm_eps, name="final_norm")(x)
        if c.tie_embeddings:
            return embed.attend(x)
        return _dense(c.vocab_size, "lm_head", c.init_std)(x)


def init_params(config: PolicyConfig, seed: int, shardings=None):
    """The policy's parameters (a dict tree, float32), created in place with `shardings`
    (a function of the abstract tree, e.g. `sharding.fsdp_shardings`) or on the default device.

    Jitted: one compilation instead of Flax's op-by-op initialisation (seconds on CPU).
    """
    tokens = jnp.zeros((1, 4), jnp.int32)
    init = lambda key: Policy(config).init(key, tokens)["params"]  # noqa: E731
    key = jax.random.PRNGKey(seed)
    out_shardings = shardings(jax.eval_shape(init, key)) if shardings is not None else None
    return jax.jit(init, out_shardings=out_shardings)(key)


def logits_fn(config: PolicyConfig):
    """params, tokens -> logits, for jit."""
    model = Policy(config)
    return lambda params, tokens: model.apply({"params": params}, tokens)


def exact_logits_fn(config: PolicyConfig):
    """A jitted params, tokens -> logits with float32 matmuls at full precision: JAX's default
    on a GPU lets XLA use TF32 (about 1e-3 relative), PyTorch's does not, and the logits check
    compares the two at 1e-4."""
    forward = logits_fn(config)

    def exact(params, tokens):
        with jax.default_matmul_precision("highest"):
            return forward(params, tokens)

    return jax.jit(exact)
