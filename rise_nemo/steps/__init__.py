"""The training steps of every method and what they are made of, written only against rise_nemo.interfaces
(Policy / Generator / Critic / Judge / Verifier), so the local and NeMo-RL backends share them unchanged.

Submodules are imported on demand (``from rise_nemo.steps.reasoning import ...``); rise_nemo.loop imports
them all before a run, which registers their behaviour (rise_nemo.methods).
"""
