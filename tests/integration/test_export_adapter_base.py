"""An exported LoRA adapter loads with plain peft from any working folder (issue 49, item 2): peft reads a
relative ``base_model_name_or_path`` against the working folder and looks ``default`` up on the Hub, so the
export names a local base by its absolute path and materialises rapo-echo's embedded model beside the
adapter. The model card's "Use" snippet is run as written, from another folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rapo_echo import export
from tests.conftest import make_tiny_model


def lora_run(root: Path, base_model, tokenizer, base_name: str) -> Path:
    """A run folder whose one checkpoint is a LoRA adapter over ``base_model`` naming its base
    ``base_name``, as a run saves it."""
    from peft import LoraConfig, get_peft_model

    run = root / "runs" / "r"
    model_dir = run / "checkpoints" / "step-1" / "model"
    peft_model = get_peft_model(base_model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    peft_model.peft_config["default"].base_model_name_or_path = base_name
    peft_model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    config = {"algo": "grpo", "model": {"name": base_name, "lora": {"enabled": True}}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def use_snippet(card: str, path: Path) -> str:
    """The Python block of the card's "Use" section, with PATH filled in."""
    use = card.split("## Use", 1)[1]
    code = re.search(r"```python\n(.*?)```", use, re.S).group(1)
    return code.replace('"PATH"', repr(str(path))) + "\nprint(type(model).__name__)\n"


def run_elsewhere(code: str, cwd: Path) -> str:
    """Run ``code`` in a fresh interpreter from ``cwd``, offline (no Hub to fall back on)."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_an_adapter_on_a_local_base_loads_from_any_folder(tmp_path: Path, smol_tokenizer) -> None:
    base = make_tiny_model(smol_tokenizer)
    base.save_pretrained(tmp_path / "tiny")
    smol_tokenizer.save_pretrained(tmp_path / "tiny")
    run = lora_run(tmp_path, base, smol_tokenizer, "../../tiny")  # relative to the run, as a run names it
    out = export.export_run(run, tmp_path / "exports" / "adapter")
    said = run_elsewhere(use_snippet((out / "README.md").read_text(), out), tmp_path / "elsewhere")
    assert said.split()[0] == "PeftModelForCausalLM"
    named = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert named == str((tmp_path / "tiny").resolve())


@pytest.mark.integration
def test_an_adapter_on_the_embedded_model_gets_its_base_beside_it(tmp_path: Path, smol_path: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(smol_path)
    run = lora_run(tmp_path, base, AutoTokenizer.from_pretrained(smol_path), "default")
    out = export.export_run(run, tmp_path / "exports" / "adapter")
    card = (out / "README.md").read_text()
    said = run_elsewhere(use_snippet(card, out), tmp_path / "elsewhere")
    assert said.split()[0] == "PeftModelForCausalLM"
    named = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert named == str((out / "base-model").resolve()) and (out / "base-model" / "config.json").is_file()
    assert "rapo-echo's embedded model, converted to a plain model folder in `base-model/`" in card
