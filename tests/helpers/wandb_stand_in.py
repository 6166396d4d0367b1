"""A stand-in for the ``wandb`` module at the one boundary the library uses (``init`` -> a run with
``log`` / ``finish``, ``Table``), recording every call."""

from __future__ import annotations

import types


class StandIn:
    """Records what the code asks of the wandb module (init, log, Table, finish)."""

    def __init__(self) -> None:
        self.inits: list[dict] = []
        self.logged: list[tuple[dict, int]] = []
        self.finished = 0
        stand_in = self

        class Run:
            def log(self, data, step=None):
                stand_in.logged.append((data, step))

            def finish(self):
                stand_in.finished += 1

        class Table:
            def __init__(self, columns, data):
                self.columns, self.data = columns, data

        self.module = types.SimpleNamespace(init=lambda **kw: self.inits.append(kw) or Run(), Table=Table)
