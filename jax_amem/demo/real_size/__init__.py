"""The real-size demo (`python -m jax_amem demo --preset qwen3-1.7b`): the train-to-rollout switch
at a size a researcher trains, against its measured bounds and two baselines. docs/demo.md.

    presets.py      qwen3-1.7b (1.72B parameters, 20.6 GB of trainer state) and qwen3-tiny (CPU)
    loop.py         set-up, the paused iterations, the checks, the baselines: `run(preset)`
    conversion.py   the Flax tree as the Hugging Face state dict, by hand in numpy
    checks.py       bit-exact weights against that conversion; logits against the JAX policy
    baselines.py    device_get + numpy + load_state_dict; no pause at all
    bandwidth.py    the pinned and device copy ceilings, measured in the run
    memory_peak.py  peak device memory over a stretch, sampled on a thread
    summary.py      the table; units.py sizes in words

    from jax_amem.demo.real_size import presets, loop, summary
    result = loop.run(presets.QWEN3_TINY)
    print(summary.summary_table(result))
"""
