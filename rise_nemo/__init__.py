"""rise_nemo: exploration-oriented RL post-training of LLMs (RISE-RL, RRL, ExpRL) for NeMo-RL.

Layers (dependencies point downwards only):
  rise_nemo.core           pure math and small dataclasses: every formula of the papers, once
  rise_nemo.orchestration  one training step / loop per method, written against rise_nemo.interfaces
  rise_nemo.backends       implementations of the interfaces: ``local`` (transformers) and ``nemo`` (NeMo-RL)
  rise_nemo.judges         rubric judges: rule-based, OpenAI-compatible HTTP, Ray actor
  rise_nemo.data           rubric dataset loaders and the generated persistent-criteria task
"""

__version__ = "0.1.0"
