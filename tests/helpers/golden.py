"""The golden runs' machinery (``tests/integration/test_golden_runs.py`` has the design and the tests):
the runs, what a run leaves for the record, the environment the numbers depend on, the measured spread
between kernel sets and the comparison against the record.

Record (``python -m tests.integration.test_golden_runs --record``): each run is made once per kernel
set this machine can imitate (:data:`KERNEL_SETS`), and with each ``--with-python`` interpreter (another
torch / transformers); the record keeps the native run's numbers, the environment they were taken in, and
per number the largest difference any other set gave (its *spread*).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "tests" / "integration" / "golden_runs.json"

# Every role in float32: a role's `autocast: auto` is bfloat16 where the CPU has it (AVX-512 BF16 / AMX)
# and float32 elsewhere, which made the RLVER runs' simulator a different model on the two kinds of CPU.
FP32 = ["--set", "simulator.autocast=none", "--set", "judge.autocast=none"]
COMMON = [
    "--max-steps", "2", "--set", "train.seed=0", "--set", "train.threads=1",
    "--set", "rollout.max_new_tokens=12", "--set", "train.save_every=2",
    "--set", "logging.tensorboard=false", "--set", "logging.progress=false", *FP32,
]  # fmt: skip


def _analysis(shift: int) -> str:
    """A scripted SAGE analysis (``emotion_readout: text``) with the emotion change ``shift``; the braces
    doubled for the scripted engine's ``str.format``."""
    fields = {"content": "support", "fit": "it depends", "mind": "weighing it", "reaction": "noted"}
    return json.dumps({**fields, "shift": shift}).replace("{", "{{").replace("}", "}}")


# The RLVER runs' simulated user is scripted: its text never comes from sampling, so no kernel's last digit
# can change a word of it, and the emotion follows from the policy's reply by fixed rules (a question
# lifts it by 5, a reply of 40 characters or more by 2, anything else lowers it by 5). The numbers then
# follow from the policy alone (its samples, forward and update), as in the other golden runs.
_REPLY = r"emotion analyst.*Supporter: [^<]*"
SIMULATOR_SCRIPT = {
    "rules": [
        [_REPLY + r"\?[^<]*<<<END DIALOGUE", _analysis(5)],
        [r"emotion analyst.*Supporter: [^<]{40,}<<<END DIALOGUE", _analysis(2)],
        [r"emotion analyst", _analysis(-5)],
    ],
    "default": "I am not sure that helps.",
}
RLVER = [
    "--config", "configs/rlver.yaml", "--set", "rollout.batch_size=1", "--set", "rlver.simulator.max_turns=1",
    "--set", "simulator.engine=scripted", "--set", f"simulator.script={json.dumps(SIMULATOR_SCRIPT)}",
    "--set", "rlver.simulator.emotion_readout=text", "--set", "rlver.simulator.plain_reply=true",
]  # fmt: skip
RUNS = {
    "rapo": ["--config", "configs/quickstart.yaml", *COMMON, "--set", "rollout.batch_size=2",
             "--set", "rollout.group_size=4", "--set", "validation.limit=2",
             "--set", "rapo.sd.autocast=none"],
    "grpo": ["--algo", "grpo", "--reward", "length", *COMMON, "--set", "rollout.batch_size=2",
             "--set", "rollout.group_size=2"],
    "rlver_grpo": [*RLVER, *COMMON, "--set", "rollout.group_size=4"],
    "rlver_ppo": [*RLVER, *COMMON, "--set", "rollout.group_size=1", "--set", "rlver.estimator=ppo"],
}  # fmt: skip
SKIP_PREFIXES = ("time/", "tokens_per_s")

# The kernel sets a machine can imitate: ATen's vectorised kernels, MKL's BLAS and oneDNN, each capped at
# a lower instruction set than the CPU has (capping ATen alone leaves oneDNN's bfloat16 paths on, which
# ATen's AVX2 kernels cannot serve: "pack_vnni2 is only supported when avx512 is supported").
KERNEL_SETS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {
        "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}  # fmt: skip
KERNEL_ENV = (
    "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR",
)  # fmt: skip

# Allowed difference elsewhere than the recording environment, per number: SPREAD_FACTOR times the largest
# difference measured between kernel sets and library versions, and never less than REL_FLOOR of the
# number (about 8 float32 rounding steps) or ABS_FLOOR: a number near 0 that is a mean or difference of
# float32 terms of about 1 (a loss whose advantages sum to 0, an advantage mean) carries their rounding
# (about 1e-7 each), whatever its own size; two kernel sets that happen to agree on it do not make it exact.
SPREAD_FACTOR = 10.0
REL_FLOOR = 1e-6
ABS_FLOOR = 1e-6


def kernel_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment, or with ``env``'s kernel settings in place of its own."""
    if env is None:
        return dict(os.environ)
    return {**{k: v for k, v in os.environ.items() if k not in KERNEL_ENV}, **env}


def train(
    name: str,
    run_dir: Path,
    extra: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    prelude: str = "",
) -> subprocess.CompletedProcess:
    """One golden run in a fresh process; ``prelude`` is Python run before the CLI (a code change)."""
    argv = ["train", *RUNS[name], *extra, "--output", str(run_dir)]
    if prelude:
        main = f"import sys\nfrom rapo_echo.cli import main\nsys.exit(main({argv!r}))"
        cmd = [python, "-c", f"{prelude}\n{main}"]
    else:
        cmd = [python, "-m", "rapo_echo.cli", *argv]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800, env=kernel_env(env))


def _numbers(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not k.startswith(SKIP_PREFIXES)}


def _norm(files: list[Path], base: dict | None = None) -> float:
    """L2 norm of every tensor in ``files`` (minus ``base``'s tensor of the same name, where given), summed
    on one thread: a parallel sum's order follows the thread count, and the recording process (2 threads)
    and the test (one a worker) must give the same last bit."""
    import torch
    from safetensors.torch import load_file

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        total = 0.0
        for f in files:
            for name, t in load_file(str(f)).items():
                t = t.double()
                if base is not None and name in base:
                    t = t - base[name].double()
                total += float((t * t).sum())
    finally:
        torch.set_num_threads(threads)
    return math.sqrt(total)


def summarise(run_dir: Path) -> dict:
    """What the record holds of one run: per-step metrics, validations, weight norms."""
    from safetensors.torch import load_file

    from rapo_echo.models import resolve

    base = load_file(str(Path(resolve("default").path) / "model.safetensors"))
    steps = [_numbers(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = run_dir / "validation.jsonl"
    lines = val.read_text().splitlines() if val.exists() else []
    last = sorted((run_dir / "checkpoints").iterdir())[-1]
    return {
        "steps": steps,
        "validations": [_numbers(json.loads(line)) for line in lines],
        "checkpoint_norm": _norm(sorted(last.rglob("*.safetensors"))),
        "final_update_norm": _norm([run_dir / "final" / "model.safetensors"], base),
    }


def flat(value: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` of a summary, paths as :func:`compare` names them (``steps[0]/grad_norm``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flat(v, f"{where}/{k}" if where else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from flat(v, f"{where}[{i}]")
    else:
        yield where, value


def spread(runs: Sequence[dict], native: dict) -> dict[str, float]:
    """Per number of ``native``, the largest difference any of ``runs`` gives (non-zero ones only)."""
    base = dict(flat(native))
    out: dict[str, float] = {}
    for run in runs:
        for k, v in flat(run):
            if isinstance(v, (int, float)) and isinstance(base.get(k), (int, float)) and v != base[k]:
                out[k] = max(out.get(k, 0.0), abs(float(v) - float(base[k])))
    return out


def tolerances(values: dict, measured: Mapping[str, float]) -> dict[str, float]:
    """The allowed absolute difference of each number outside the recording environment."""
    return {
        k: max(SPREAD_FACTOR * measured.get(k, 0.0), REL_FLOOR * abs(float(v)), ABS_FLOOR)
        for k, v in flat(values)
        if isinstance(v, (int, float))
    }


def compare(got: Any, want: Any, tol: Mapping[str, float] | None, where: str = "") -> list[str]:
    """Every difference between a summary and its record, as readable lines (only the record's keys);
    ``tol`` None compares exactly, else number ``k`` may differ by ``tol[k]``."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{where}: got {got!r}, recorded a mapping"]
        out = []
        for k, v in want.items():
            here = f"{where}/{k}" if where else k
            out.extend([f"{here}: missing"] if k not in got else compare(got[k], v, tol, here))
        return out
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: got {got!r}, recorded {len(want)} items"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in compare(g, w, tol, f"{where}[{i}]")]
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        if tol is None:
            return [] if got == want else [f"{where}: got {got!r}, recorded {want!r} (exact)"]
        allowed = tol.get(where, max(REL_FLOOR * abs(want), ABS_FLOOR))
        if abs(float(got) - float(want)) <= allowed:
            return []
        return [f"{where}: got {got!r}, recorded {want!r} (allowed +-{allowed:.2g})"]
    return [] if got == want else [f"{where}: got {got!r}, recorded {want!r}"]


def cpu_identity() -> str:
    """The CPU's vendor, family / model / stepping and vector instruction flags (what picks kernels)."""
    try:
        text = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    get = {k.strip(): v.strip() for k, v in fields.items()}.get
    flags = sorted(f for f in (get("flags") or "").split() if re.match(r"(avx|amx|fma|f16c)", f))
    ident = " / ".join(str(get(k)) for k in ("vendor_id", "cpu family", "model", "stepping"))
    return f"{ident}; {' '.join(flags)}"


def environment(python: str = sys.executable, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the numbers depend on besides our code: Python, torch, transformers, numpy, the CPU and the
    kernel settings (of ``python`` under ``env``)."""
    code = (
        "import json, platform, numpy, torch, transformers\n"
        "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__,"
        " 'transformers': transformers.__version__, 'numpy': numpy.__version__,"
        " 'cpu_capability': torch.backends.cpu.get_cpu_capability()}))"
    )
    full_env = kernel_env(env)
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=full_env, check=True)
    kernels = {k: full_env[k] for k in KERNEL_ENV if k in full_env}
    return {**json.loads(out.stdout), "cpu": cpu_identity(), "kernel_env": kernels}


def environment_note(recorded: Mapping[str, Any] | None, now: Mapping[str, Any]) -> str:
    """A line naming how ``now`` differs from the record's environment (empty when it does not)."""
    if not recorded:
        return "the record holds no environment"
    keys = sorted(set(now) | set(recorded))
    diff = [f"{k} {recorded.get(k)} -> {now.get(k)}" for k in keys if now.get(k) != recorded.get(k)]
    return ("environment differs from the record: " + "; ".join(diff)) if diff else ""
