"""An endless, deterministic, resumable stream of scenario batches."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from rapo_echo.errors import DataError
from rapo_echo.types import Scenario


class ScenarioStream:
    """Batches that walk a seeded permutation of the scenarios, one permutation per epoch.

    Epoch ``e`` visits the scenarios in the order ``random.Random(seed + e).shuffle`` gives (in file
    order when ``shuffle`` is off); a batch that runs past the end of an epoch continues with the next
    one. :meth:`state_dict` / :meth:`load_state_dict` save and restore the position, so a resumed run
    draws exactly the batches the interrupted one would have drawn.
    """

    def __init__(self, scenarios: Sequence[Scenario], *, seed: int, shuffle: bool = True) -> None:
        if not scenarios:
            raise DataError("ScenarioStream: no scenarios to draw from")
        self.scenarios = list(scenarios)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def __len__(self) -> int:
        return len(self.scenarios)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.scenarios)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[Scenario]:
        """The next ``n`` scenarios (``n`` may exceed the data size: the stream wraps into new epochs)."""
        if n < 1:
            raise ValueError(f"batch size must be >= 1, got {n}")
        out: list[Scenario] = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            take = min(n - len(out), len(self._order) - self.position)
            out.extend(self.scenarios[i] for i in self._order[self.position : self.position + take])
            self.position += take
        return out

    def fingerprint(self) -> str:
        """A short hash of the scenario ids in order: a resumed stream must be built from the same data."""
        digest = hashlib.sha256("\n".join(s.id for s in self.scenarios).encode("utf-8"))
        return digest.hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position: epoch and position, plus what must match on resume."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "size": len(self.scenarios),
            "fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved :meth:`state_dict`; the data, seed and shuffle must be the same."""
        for key in ("epoch", "position"):
            if not isinstance(state.get(key), int) or state[key] < 0:
                raise DataError(f"stream state: {key}: got {state.get(key)!r}; expected an integer >= 0")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "size", "fingerprint"):
            if key in state and state[key] != mine[key]:
                raise DataError(
                    f"stream state: {key}: saved {state[key]!r}, this stream has {mine[key]!r}; resume with "
                    "the same data, selection config and seed"
                )
        if state["position"] > len(self.scenarios):
            size = len(self.scenarios)
            raise DataError(f"stream state: position {state['position']} is past the {size} scenarios")
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
