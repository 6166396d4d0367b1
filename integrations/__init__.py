"""Bridges to other training frameworks (``rapo_echo.integrations``), above the loop and the algorithms:
:mod:`.openrlhf` exports a run's config as an OpenRLHF job (``rapo-echo openrlhf``); :mod:`.trl_rewards`
(our rewards as TRL reward functions) and :mod:`.trl_sage` (the SAGE-style user as TRL's ``rollout_func``)
plug into TRL's ``GRPOTrainer``; :mod:`.verifiers_sage` is the SAGE-style user as a verifiers environment
(docs/integrations.md). The framework a bridge drives is never a dependency: it is imported where used."""
