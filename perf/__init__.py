"""Every speed and size measurement in one place (``rapo_echo.perf``; ``make bench``, ``make gpu-check``):
the training loop against TRL's GRPOTrainer on the fixed shared workload, decode, constrained decoding,
served roles, checkpoint sizes, the fidelity summary, and the one-call GPU check (``gpu_check.sh``).
Each writes JSON; docs/benchmarks.md says how to run them."""
