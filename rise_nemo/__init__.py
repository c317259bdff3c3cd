"""rise_nemo: exploration-oriented RL post-training of LLMs (RISE-RL, RRL, ExpRL) for NeMo-RL.

The packages form layers, imports pointing downwards only: the order and why each package sits where it
does are declared once, in docs/CONTRACTS.md ("Layers"), and checked over every module by
tests/test_layers.py.
"""

__version__ = "0.1.0"
