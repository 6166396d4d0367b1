"""The group judge's settings (:class:`rapo_echo.judges.group.GroupJudge`): one section, which RAPO's
``rapo.judge`` extends and the judge takes whole."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rapo_echo.config.base import ClosedShare, LogprobMode, Strict


class GroupJudgeConfig(Strict):
    """The group judge (GRM): ranks each group's reply -> reaction pairs and critiques the weak ones."""

    use_logprobs: LogprobMode = Field(
        "auto",
        description="Read the ranking from label-token probabilities (`auto`: when the engine has them).",
    )
    max_retries: int = Field(
        2, ge=0, le=10, description="Retries of an unparseable ranking, then the group is masked."
    )
    reverse_pass: bool = Field(
        False, description="Rank a second time in reversed order and average (position bias)."
    )
    shuffle: bool = Field(True, description="Shuffle the candidates before showing them.")
    orders: Literal["both", "random", "auto"] = Field(
        "both",
        description="Position bias: `both` ranks each group in its G cyclic shifts (every reply once in "
        "every slot) and averages; `random` one shuffled order; `auto` both until `auto_probe` decisions "
        "are measured, then both only while the first slot's share of rank 1 exceeds "
        "`auto_threshold` x 2 x chance.",
    )
    auto_probe: int = Field(32, ge=1, description="`orders: auto`: decisions measured in every order first.")
    auto_threshold: ClosedShare = Field(
        0.6, description="`orders: auto`: the bias above which every order is kept."
    )
    tie_eps: ClosedShare = Field(0.02, description="Label probabilities closer than this tie.")
    ties: Literal["chained", "leader", "none", "sequential", "pairwise"] = Field(
        "chained",
        description="How P(best) becomes ranks: `chained` (neighbours within `tie_eps` tie), `leader` (ties "
        "with a block's best only), `none`, `sequential` (G - 1 calls), `pairwise` (every pair,"
        " both orders).",
    )
    show_profile: bool = Field(True, description="Show the judge the person's hidden profile.")
    addressed: Literal["lower", "floor", "invalid", "strip", "flag"] = Field(
        "lower",
        description="A reply that addresses the judge (docs/judges.md): `lower` (ranked as written and with "
        "its suspect spans set aside, the worse rank kept), `floor` (the group's last rank without judging "
        "it), `invalid` (the group is masked), `strip` (rank the rest), `flag` (rank as is).",
    )
    addressed_context: Literal["lower", "strip", "invalid", "flag"] = Field(
        "lower",
        description="A dialogue turn, profile or reaction that addresses the judge: `lower` (shown as "
        "written; each reply keeps the worse of its ranks there and with the suspect spans set aside), "
        "`strip` it, mask the group (`invalid`), or `flag` it only.",
    )
    max_new_tokens: int = Field(384, ge=16, description="Tokens of a generated ranking.")
    critique_tokens: int = Field(64, ge=8, description="Tokens per critique.")
