"""Echo-N1's data pipelines (``rapo-echo data ...``): Critique-Rewrite preference pairs for the empathy
judge, score-3 reference replies, hard-prompt selection and three-agent dialogue synthesis for the SFT
warm start. Each is a resumable command (:mod:`rapo_echo.datagen.runner`) whose dataset
the next one reads as it is; docs/algorithms/echo_n1.md shows the chain."""
