"""SOTOPIA benchmark: two agents role-play a social scenario and an evaluator scores them (:mod:`.run`)."""
