"""Warm starts of the embedded tasks (the tasks themselves, generated in code with a seed, live in data/).

``rise_nemo.tasks.reasoning``: the supervised warm start of the chained-arithmetic task
(rise_nemo.data.chain_task), the CPU stand-in for math reasoning used by the reasoning methods (PPO, sparse
GRPO, RRL, ExpRL; docs/DESIGN.md §7). Warm starts are cached under
``rise_nemo.cache.cache_dir("warm_start")`` like the persistent-criteria task's.
``rise_nemo.tasks.persistent_warm_start``: the supervised warm start of the persistent-criteria task
(rise_nemo.data.persistent_task) and its rule-judge rate measurement.
``rise_nemo.tasks.sft``: the SFT batch and loss both warm starts train with.
"""
