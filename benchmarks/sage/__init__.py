"""SAGE benchmark: the policy supports a SAGE-style simulated user (:mod:`rapo_echo.simulators.sage`, the
one training talks to) whose final emotion is the score (:mod:`.run`)."""
