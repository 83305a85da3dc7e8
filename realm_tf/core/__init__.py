"""The training core every task runs on: the Task protocol, ``run_experiment``, the training loop, evaluation,
distribution strategies, the optimizer, precision policies, tracing and warm starts (in the manner of tf-models'
``official/core``)."""
