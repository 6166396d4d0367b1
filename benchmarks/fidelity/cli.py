"""``rapo-echo eval --benchmark fidelity``: load the rated points, the engines the named users and rewards
need, and run them through the shared runner (resumable, batched, ``results.jsonl`` + ``summary.json``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rapo_echo.benchmarks.base import Roles
from rapo_echo.benchmarks.fidelity.bench import Fidelity
from rapo_echo.errors import ConfigError

if TYPE_CHECKING:
    from rapo_echo.benchmarks.eval_command import EvalCommand

# rewards that score without an engine (everything else gets the --judge engine)
ENGINE_FREE_REWARDS = ("length", "format", "question", "think_format")


def needed_specs(args: EvalCommand) -> dict[str, str]:
    """Model spec per role the named predictors use (``policy`` is not a role here)."""
    specs: dict[str, str] = {}
    if args.user:
        if args.simulator == "policy":
            raise ConfigError("fidelity: --simulator policy: there is no policy here; name a model")
        specs["simulator"] = args.simulator
    if any(r not in ENGINE_FREE_REWARDS for r in args.reward):
        specs["judge"] = args.simulator if args.judge == "policy" else args.judge
    return specs


def run_fidelity_command(args: EvalCommand) -> int:
    """``eval --benchmark fidelity``."""
    from rapo_echo.benchmarks.runner import run_eval
    from rapo_echo.engines import engines_for_roles
    from rapo_echo.rundir import check_writable

    if args.policy:
        raise ConfigError("fidelity: --policy is not used; name --user / --reward (see --help)")
    benchmark, settings = Fidelity(users=args.user, rewards=args.reward), args.settings()
    cases = benchmark.load_cases(args.data, settings)  # fail on bad data before loading any model
    check_writable(args.output)
    specs = needed_specs(args)
    engines = engines_for_roles(specs, **args.engine_args())
    roles = Roles(
        policy=None,  # type: ignore[arg-type]  # fidelity has no policy
        simulator=engines.get("simulator"),
        judge=engines.get("judge"),
    )
    if not cases:
        print("fidelity: no rated points")
        return 1
    summary = run_eval(
        benchmark, roles, settings, args.output, data=args.data, limit=args.limit, models=specs
    )
    print(json.dumps(summary, indent=2))
    print(f"results: {args.output}/results.jsonl  summary: {args.output}/summary.json")
    return 0
