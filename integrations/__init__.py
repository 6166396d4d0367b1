"""Bridges to other training frameworks (``rapo_echo.integrations``), above the loop and the algorithms:
:mod:`.openrlhf` exports a run's config as an OpenRLHF job (``rapo-echo openrlhf``). Each bridge is a
subpackage of its own; the framework it drives is an optional extra, never a dependency."""
