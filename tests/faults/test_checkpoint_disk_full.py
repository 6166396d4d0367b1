"""A full disk while a checkpoint is written (issue 31, item 17): the message says the disk is full and
how to go on, the previous checkpoint is kept and the partial one removed, whichever writer hits it.

safetensors reports a full disk as ``SafetensorError('... No space left on device (os error 28)')`` and
``torch.save`` as ``RuntimeError('[enforce fail at inline_container.cc] ... unexpected pos')``, neither
an ``OSError``; both used to escape as tracebacks. The first tests inject those failures (anywhere);
the last ones fill a real small tmpfs (root only, the fixture of test_faults.py) for full fine-tuning
and LoRA weights and for the optimizer state.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from rapo_echo.checkpoint import latest_checkpoint, load_torch, save_checkpoint
from rapo_echo.jsonl import FileWriteError
from tests.faults.test_faults import full_disk  # noqa: F401 (the fixture)

MESSAGE = r"step-2: the disk is full .*the last complete checkpoint is .*step-1.*Free space.*--resume"


def tiny_model(vocab: int = 256, hidden: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def optimizer_of(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, object]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    opt.step()  # Adam's moments exist: the optimizer file is twice the trained weights
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def saver(model):
    return lambda folder: model.save_pretrained(folder, safe_serialization=True)


def assert_nothing_lost(run: Path) -> None:
    assert latest_checkpoint(run) == run / "checkpoints" / "step-1"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]  # the partial one is gone
    load_torch(run / "checkpoints" / "step-1" / "optimizer.pt")


def safetensors_full(folder: Path) -> None:
    from safetensors import SafetensorError

    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"partial")
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def torch_save_full(obj, f, *args, **kwargs) -> None:
    """What torch.save does on a full disk (measured on a small tmpfs): given a path, a RuntimeError of
    its C++ writer and nothing else; given a Python file object, the same RuntimeError raised while the
    file's ``OSError(ENOSPC)`` is being handled."""
    failure = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    if isinstance(f, (str, os.PathLike)):
        Path(f).write_bytes(b"PK partial")
        raise failure
    try:
        f.write(b"PK partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError:
        raise failure  # noqa: B904 (torch raises it in the handler, chaining the OSError as context)


def test_safetensors_disk_full_is_a_message(tmp_path):
    model = tiny_model()
    opt, sched = optimizer_of(model)
    run = tmp_path / "run"
    kw = {"optimizer": opt, "scheduler": sched, "trainer_state": {"data": {}}}
    save_checkpoint(run, 1, save_model=saver(model), **kw)
    with pytest.raises(FileWriteError, match=MESSAGE):
        save_checkpoint(run, 2, save_model=safetensors_full, **kw)
    assert_nothing_lost(run)


def test_torch_save_disk_full_is_a_message(tmp_path, monkeypatch):
    model = tiny_model()
    opt, sched = optimizer_of(model)
    run = tmp_path / "run"
    kw = {"optimizer": opt, "scheduler": sched, "trainer_state": {"data": {}}}
    save_checkpoint(run, 1, save_model=saver(model), **kw)
    real_save = torch.save
    monkeypatch.setattr(torch, "save", torch_save_full)
    with pytest.raises(FileWriteError, match=MESSAGE):
        save_checkpoint(run, 2, save_model=saver(model), **kw)
    monkeypatch.setattr(torch, "save", real_save)
    assert_nothing_lost(run)


def test_other_failures_still_raise_as_they_are(tmp_path):
    model = tiny_model()
    opt, sched = optimizer_of(model)

    def broken(folder: Path) -> None:
        raise RuntimeError("a bug, not the disk")

    with pytest.raises(RuntimeError, match="a bug, not the disk"):
        save_checkpoint(tmp_path / "run", 1, save_model=broken, optimizer=opt, scheduler=sched,
                        trainer_state={})
    assert not list((tmp_path / "run" / "checkpoints").iterdir())


# ---------------------------------------------------------------------------- a real full disk


def fill(disk: Path, leave: int) -> None:
    """Write a ballast file so that about ``leave`` bytes stay free on ``disk``."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    (disk / f"ballast-{len(list(disk.glob('ballast-*')))}").write_bytes(b"b" * max(0, free - leave))


def lora_model():
    from peft import LoraConfig, get_peft_model

    model = tiny_model(hidden=64)
    config = LoraConfig(r=32, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return get_peft_model(model, config)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_a_real_full_disk_while_writing_weights(full_disk, kind):  # noqa: F811
    model = tiny_model() if kind == "full" else lora_model()
    opt, sched = optimizer_of(model)
    run = full_disk / "run"
    kw = {"optimizer": opt, "scheduler": sched, "trainer_state": {"data": {}}}
    save_checkpoint(run, 1, save_model=saver(model), **kw)
    weights = next((run / "checkpoints" / "step-1" / "model").glob("*.safetensors")).stat().st_size
    fill(full_disk, leave=min(weights // 2, 64 << 10))  # room for the JSON files, not for the weights
    with pytest.raises(FileWriteError, match=MESSAGE):
        save_checkpoint(run, 2, save_model=saver(model), **kw)
    assert_nothing_lost(run)


def test_a_real_full_disk_while_writing_the_optimizer(full_disk):  # noqa: F811
    model = tiny_model()
    opt, sched = optimizer_of(model)
    run = full_disk / "run"
    kw = {"optimizer": opt, "scheduler": sched, "trainer_state": {"data": {}}}
    save_checkpoint(run, 1, save_model=saver(model), **kw)
    step1 = run / "checkpoints" / "step-1"
    weights = (step1 / "model" / "model.safetensors").stat().st_size
    assert (step1 / "optimizer.pt").stat().st_size > 1.5 * weights
    fill(full_disk, leave=weights + (weights // 4) + (16 << 10))  # the weights fit, Adam's moments do not
    with pytest.raises(FileWriteError, match=MESSAGE):
        save_checkpoint(run, 2, save_model=saver(model), **kw)
    assert_nothing_lost(run)
