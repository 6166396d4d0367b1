"""The training loop's speed against TRL's GRPOTrainer on the fixed shared workload (``make bench``)."""
