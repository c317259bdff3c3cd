"""Orchestration: one training step per method (``step``), the loop with checkpoints/resume/signals
(``trainer``), guidance-free evaluation (``evaluate``), run assembly (``run``) and run reports (``report``).

It is written only against rise_nemo.interfaces (Policy / Generator / Judge), so the local and NeMo-RL
backends share it unchanged. Submodules are imported on demand (``from rise_nemo.orchestration.trainer
import Trainer``) so that light users (the report) do not pay for torch-heavy imports.
"""
