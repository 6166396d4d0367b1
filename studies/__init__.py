"""Research studies (learning proofs, judge studies, sweeps): scripts run from a checkout, not shipped in
the wheel. Each module's docstring gives its command and what it measured."""
