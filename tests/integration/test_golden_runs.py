"""Golden runs: two fixed-seed training steps of each algorithm on the embedded model (CPU, float32 in
every role, one thread) give the per-step metrics, validations and weight norms recorded in
``golden_runs.json``; a change that means to alter training re-records it on purpose::

    python -m tests.integration.test_golden_runs --record [--kernel-sets SETS] [--with-python PY] [NAME ...]

Only the record's keys are compared (a new metric does not fail the test; a changed or missing one does).

The numbers depend on the CPU's kernels and on torch / transformers, not only on our code. Three rules make
the record hold on any machine CI may get while it still catches a change of ours:

* No role depends on the CPU's precision: every role runs in float32 (``autocast: none``). With
  ``autocast: auto`` the RLVER runs' simulator ran in bfloat16 on CPUs with AVX-512 BF16 and in float32
  elsewhere, and the record of an AVX2 machine failed on AVX-512 ones.
* No text the numbers depend on is sampled from a model but the policy's own replies: the RLVER runs'
  simulated user is the ``scripted`` engine (``SIMULATOR_SCRIPT``: fixed replies, and an emotion change
  that follows from the policy's reply by rules). Its text was sampled from the embedded model, and a
  kernel's last digit could change a word of it and every number after.
* In the environment the record was taken in (the same Python, torch, transformers, numpy, CPU model and
  kernel settings) every number must be identical, to the last bit: a refactor that changes any number
  fails. Anywhere else a number may differ by ``SPREAD_FACTOR`` (10) times the largest difference measured
  when recording, between the kernel sets the recording machine can imitate (native, AVX2, none: ATen's,
  MKL's and oneDNN's instruction sets capped, ``tests/helpers/golden.py``) and other torch / transformers
  installs (``--with-python``), and never less than 1e-6 of the number or 1e-6 (float32 rounding). A
  failure names the environment's difference from the record and each number's allowed difference.

What remains discrete is the policy's sampled text: a kernel's last-digit difference changes a sampled
token only when the random draw falls within about 1e-6 of a boundary between two tokens (none did in the
measured kernel sets). ``test_a_real_change_fails_its_golden_run`` (``make test-all``) shows that the
comparison still catches real changes: a changed default (``loss.beta``) in every run, a changed prompt.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers.golden import (
    KERNEL_SETS,
    RECORD,
    RUNS,
    SPREAD_FACTOR,
    compare,
    environment,
    environment_note,
    spread,
    summarise,
    tolerances,
    train,
)

ENVIRONMENT_KEY, SETS_KEY = "_environment", "_measured"

# Real changes each golden run must catch (judged as on any other machine: within the measured spread):
# a changed default (loss.beta, the KL term's weight; in rlver_ppo the value loss's weight: its KL term,
# of a policy two steps of lr 1e-6 from the reference, is below float32 rounding) and a changed prompt.
POLICY_PROMPT_CHANGE = """
import rapo_echo.algorithms.rlver as rlver
rlver.RLVER_SYSTEM_PROMPT = rlver.RLVER_SYSTEM_PROMPT.replace("a friend", "a pal")
"""
CHANGES = {
    **{
        f"{name}: loss.beta -> 0.02": (name, ["--set", "loss.beta=0.02"], "")
        for name in RUNS
        if name != "rlver_ppo"
    },
    "rlver_ppo: the value loss weight 0.5 -> 0.25": ("rlver_ppo", ["--set", "rlver.ppo.vf_coef=0.25"], ""),
    "rlver_grpo: one word of the policy's system prompt": ("rlver_grpo", [], POLICY_PROMPT_CHANGE),
}


def load_record() -> dict:
    return json.loads(RECORD.read_text())


def run_summary(name: str, work: Path, *args, **kwargs) -> dict:
    proc = train(name, work / name, *args, **kwargs)
    if proc.returncode:
        raise AssertionError(f"{name} failed:\n{proc.stderr[-3000:]}")
    out = summarise(work / name)
    shutil.rmtree(work / name, ignore_errors=True)
    return out


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_run_matches_the_record(name: str, tmp_path: Path) -> None:
    record = load_record()
    got = run_summary(name, tmp_path)
    now, then = environment(), record[ENVIRONMENT_KEY]
    if now == then:
        diffs, how = compare(got, record[name]["values"], None), "exact (the recording environment)"
    else:
        tol = tolerances(record[name]["values"], record[name]["spread"])
        diffs = compare(got, record[name]["values"], tol)
        how = f"{environment_note(then, now)}; compared within {SPREAD_FACTOR:g} x the measured spread"
    assert not diffs, "\n".join([how, *diffs[:40]])


@pytest.mark.integration
@pytest.mark.proof
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_real_change_fails_its_golden_run(change: str, tmp_path: Path) -> None:
    name, extra, prelude = CHANGES[change]
    record = load_record()[name]
    got = run_summary(name, tmp_path, extra, prelude=prelude)
    diffs = compare(got, record["values"], tolerances(record["values"], record["spread"]))
    assert diffs, f"{change}: the golden run {name} still matches its record within the measured spread"
    print(f"{change}: {len(diffs)} numbers beyond the allowed difference, e.g.", *diffs[:3], sep="\n  ")


def _config(name: str):
    """The run config a golden run's command line gives (its file, ``--algo`` and ``--set`` values)."""
    from rapo_echo.training.run_config import load_config

    args = RUNS[name]
    value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--config", "--algo")}
    sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
    return load_config(value.get("--config"), algo=value.get("--algo"), overrides=sets)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_role_of_a_golden_run_is_float32_whatever_the_cpu(name: str) -> None:
    """``autocast: auto`` is bfloat16 on CPUs with AVX-512 BF16 or AMX and float32 elsewhere; a golden run
    pins every role to float32 so that its numbers mean the same on both."""
    from rapo_echo.models import autocast_dtype

    cfg = _config(name)
    roles = [cfg.simulator.autocast, cfg.judge.autocast] + ([cfg.rapo.sd.autocast] if name == "rapo" else [])
    assert roles == ["none"] * len(roles)
    assert {autocast_dtype(r, "cpu") for r in roles} == {None}
    assert cfg.model.dtype in ("float32", "auto") and cfg.train.threads == 1


def test_the_exact_comparison_catches_a_last_bit_difference() -> None:
    want = {"steps": [{"loss/total": 0.25, "items": 8}], "final_update_norm": 1.5}
    nudged = {"steps": [{"loss/total": math.nextafter(0.25, 1.0), "items": 8}], "final_update_norm": 1.5}
    assert compare(want, want, None) == []
    assert compare(nudged, want, None) == [
        "steps[0]/loss/total: got 0.25000000000000006, recorded 0.25 (exact)"
    ]
    assert compare({"steps": [{}], "final_update_norm": 1.5}, want, None) == [
        "steps[0]/loss/total: missing",
        "steps[0]/items: missing",
    ]


def test_tolerance_is_ten_times_the_measured_spread_with_a_floor() -> None:
    values = {"steps": [{"grad_norm": 2.0, "items": 8, "adv/mean": 0.0}]}
    measured = spread([{"steps": [{"grad_norm": 2.0 + 3e-6, "items": 8, "adv/mean": -4e-15}]}], values)
    assert measured == {"steps[0]/grad_norm": pytest.approx(3e-6), "steps[0]/adv/mean": 4e-15}
    tol = tolerances(values, measured)
    # 10 x 3e-6; 1e-6 of 8 (no spread measured); the 1e-6 floor (10 x 4e-15 is below it)
    want = {"steps[0]/grad_norm": pytest.approx(3e-5), "steps[0]/items": 8e-6, "steps[0]/adv/mean": 1e-6}
    assert tol == want
    assert compare({"steps": [{"grad_norm": 2.0 + 2.9e-5, "items": 8, "adv/mean": 0.0}]}, values, tol) == []
    out = compare({"steps": [{"grad_norm": 2.0 + 3.1e-5, "items": 8, "adv/mean": 0.0}]}, values, tol)
    assert len(out) == 1 and out[0].startswith("steps[0]/grad_norm:") and "allowed +-3e-05" in out[0]


def test_the_note_names_what_differs_from_the_recording_environment() -> None:
    then = {"torch": "2.13.0+cpu", "cpu_capability": "AVX2", "kernel_env": {}}
    now = {"torch": "2.13.0+cpu", "cpu_capability": "AVX512", "kernel_env": {}}
    assert environment_note(then, now) == "environment differs from the record: cpu_capability AVX2 -> AVX512"
    assert environment_note(then, then) == ""


def test_the_imitated_avx2_set_is_what_an_avx2_cpu_gives() -> None:
    """Capping ATen's kernels alone leaves oneDNN's bfloat16 on (a role's ``autocast: auto`` then runs ATen's
    AVX2 attention in bfloat16, which stops at "pack_vnni2 is only supported when avx512 is supported");
    with MKL and oneDNN capped too, the process sees what an AVX2 CPU without bfloat16 gives."""
    import subprocess

    from tests.helpers.golden import kernel_env

    code = (
        "import torch; from rapo_echo.models import autocast_dtype; "
        "print(torch.backends.cpu.get_cpu_capability(), autocast_dtype('auto', 'cpu'))"
    )
    env = kernel_env(KERNEL_SETS["avx2"])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["AVX2", "None"]


def record(names: list[str], work: Path, pythons: list[str], kernel_sets: list[str]) -> None:
    """Re-run the golden runs in each of ``kernel_sets`` (and interpreter) and write the record, after each
    run; a run's entry names the sets its spread was measured in."""
    out = load_record() if RECORD.exists() else {}
    sets = {label: (sys.executable, KERNEL_SETS[label]) for label in ["native", *kernel_sets]}
    sets.update({f"python {p}": (p, None) for p in pythons})
    measured = {label: environment(python, env) for label, (python, env) in sets.items()}
    if out.get(ENVIRONMENT_KEY) != measured["native"]:
        out = {}  # a record from another environment: every run is taken again here
    for name in names:
        runs = {label: run_summary(name, work, env=e, python=py) for label, (py, e) in sets.items()}
        native = runs.pop("native")
        measured_spread = dict(sorted(spread(list(runs.values()), native).items()))
        out[name] = {"values": native, "spread": measured_spread, "measured_in": sorted(sets)}
        print(f"{name}: {len(measured_spread)} numbers differ between {sorted(sets)}", file=sys.stderr)
        out[ENVIRONMENT_KEY] = measured["native"]
        out[SETS_KEY] = {**out.get(SETS_KEY, {}), **measured}
        RECORD.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="re-run and rewrite golden_runs.json")
    ap.add_argument(
        "--with-python",
        action="append",
        default=[],
        metavar="PYTHON",
        help="also measure the spread under this interpreter (another torch / transformers)",
    )
    others = [k for k in KERNEL_SETS if k != "native"]
    ap.add_argument(
        "--kernel-sets",
        type=lambda text: text.split(","),
        default=others,
        help=f"the imitated kernel sets (of {','.join(others)}; comma-separated) the spread is measured in, "
        "beside the native one (default: all)",
    )
    ap.add_argument("names", nargs="*", default=sorted(RUNS))
    args = ap.parse_args()
    if args.record:
        if set(args.kernel_sets) - set(others):
            ap.error(f"--kernel-sets: {args.kernel_sets}; each one of {others}")
        with tempfile.TemporaryDirectory() as tmp:
            record(args.names, Path(tmp), args.with_python, args.kernel_sets)
