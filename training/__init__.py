"""The training loop and the run (``rapo_echo.training``), above the algorithms it drives.

* :mod:`.run` -- the run: the roles, rewards, step hooks, validator and logs, and the step loop of every
  algorithm.
* :mod:`.learner` -- the Learner: the update engine (optimizer, log-probs, micro-batches, checkpoints).
* :mod:`.run_config` -- a run's config read from YAML and ``--set`` (the sections live in
  :mod:`rapo_echo.algorithms.run_sections`), with the chosen algorithm's own section.
* :mod:`.run_log` -- the run directory's metrics, samples and summary.
* :mod:`.validation` -- held-out validation and the best checkpoint.
* :mod:`.plan` -- ``train --dry-run``'s memory and request plan.
* :mod:`.api` -- the Python API (``rapo_echo.train``, ``rapo_echo.evaluate``).
* :mod:`.train_cli`, :mod:`.config_cli` -- ``rapo-echo train`` and ``rapo-echo config``.

Modules are imported by name (nothing is re-exported here).
"""
