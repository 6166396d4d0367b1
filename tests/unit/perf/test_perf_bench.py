"""The performance benchmarks' own logic: where the workload is found, and the decode bandwidth
limit's byte count by hand (timings themselves are never asserted)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import rapo_echo.perf.workload as bench
from rapo_echo.perf.bench_decode import decode_bytes
from tests.conftest import SHARED_DATA

SHARED_BENCH = SHARED_DATA.parent / "bench"


def test_missing_workload_says_how_to_point_at_it(monkeypatch) -> None:
    monkeypatch.delenv(bench.WORKLOAD_ENV, raising=False)
    monkeypatch.setattr(bench, "SHARED_BENCH", None)
    with pytest.raises(SystemExit, match=r"--workload DIR or RAPO_SHARED_BENCH=DIR"):
        bench.workload()


def test_workload_folders(monkeypatch) -> None:
    if not (SHARED_BENCH / "gpu" / "large" / "workload.py").is_file():
        pytest.skip(f"the shared benchmark kit is not at {SHARED_BENCH}")
    monkeypatch.delenv(bench.WORKLOAD_ENV, raising=False)
    monkeypatch.setattr(bench, "SHARED_BENCH", SHARED_BENCH)
    assert (bench.workload().NUM_PROMPTS, bench.workload().GROUP_SIZE) == (8, 4)
    bench.set_workload_dir(SHARED_BENCH / "gpu" / "large")
    large = bench.workload()
    assert (large.NUM_PROMPTS, large.GROUP_SIZE, large.MAX_COMPLETION_TOKENS) == (32, 8, 256)


def test_decode_bytes_by_hand() -> None:
    config = SimpleNamespace(
        num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4
    )
    config.get_text_config = lambda: config
    model = SimpleNamespace(config=config, parameters=lambda: [torch.zeros(10, dtype=torch.bfloat16)])
    # weights 10 x 2 bytes = 20 a step; KV 2 (k, v) x 2 layers x 1 head x 4 x 2 bytes = 32 a token;
    # 3 rows, prompt 5, 2 steps: 2 x 20 + 3 x (5 + 6) x 32 = 40 + 1,056
    assert decode_bytes(model, rows=3, prompt_len=5, steps=2, kv_bytes_per_elem=2) == 1096


def test_checkpoint_parts_are_named_by_what_they_hold(tmp_path) -> None:
    """``perf/checkpoint_sizes.py`` sums a checkpoint's files per part."""
    from rapo_echo.perf.checkpoint_sizes import sizes

    files = {
        "model/adapter_model.safetensors": 100,
        "model/tokenizer.json": 10,
        "model/chat_template.jinja": 1,
        "optimizer.pt": 200,
        "accelerate/pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt": 300,
        "accelerate/pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt": 300,
        "accelerate/pytorch_model/zero_pp_rank_0_mp_rank_00_model_states.pt": 7,
        "accelerate/zero_to_fp32.py": 5,
        "rng_rank0.json": 3,
    }
    for rel, n in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x" * n)
    assert sizes(tmp_path) == {
        "model_weights": 100,
        "model_tokenizer": 11,
        "optimizer": 200,
        "deepspeed_optimizer_shards": 600,
        "deepspeed_model_states": 7,
        "deepspeed_other": 5,
        "other": 3,
    }
