"""The training loop around a method's step: run assembly and its checks (``run``), the trainer with
checkpoints, resume and graceful stop (``trainer``, ``checkpoint``, ``rundir``, ``signals``), the run's
data (``data``), multi-stage pipelines (``pipeline``) and the embedded reasoning task's warm start
(``warm_start``)."""
