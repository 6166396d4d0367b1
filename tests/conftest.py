"""Shared fixtures: the real embedded model (converted once per machine) and a tiny random model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# `make test` runs two pytest-xdist workers on CI's two cores: each worker (and the runs it starts, which
# inherit the variable) computes on one torch thread, so that two workers never run four threads on two
# cores (OpenMP's waiting threads then spin against each other).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # after OMP_NUM_THREADS

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_data(*parts: str) -> Path:
    """A file under ../shared/data; the test is skipped with a clear reason when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data file {path} is not present on this machine")
    return path


# warning threshold: a clean-clone run held at most 0.5 GB under /tmp at once (a passing test's
# tmp_path is deleted when it ends), plus 0.5 GB for a first conversion of the model into the cache
SUITE_DISK_GB = 2.0


def pytest_sessionstart(session: pytest.Session) -> None:
    """Say up front when the temporary folder has too little free disk (tests that save models fail)."""
    import shutil
    import tempfile

    free = shutil.disk_usage(tempfile.gettempdir()).free / 1e9
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if free < SUITE_DISK_GB and reporter is not None:
        reporter.write_line(
            f"WARNING: {free:.1f} GB free under {tempfile.gettempdir()}; the suite needs about "
            f"{SUITE_DISK_GB:.0f} GB, and tests that save models will fail with 'No space left on device'",
            yellow=True,
        )


@pytest.fixture(scope="session")
def smol_path() -> str:
    """Folder of the embedded SmolLM2-135M-Instruct (GGUF converted once into the cache)."""
    from rapo_echo.models import resolve

    return resolve("default").path


@pytest.fixture(scope="session")
def smol_engine(smol_path: str):
    """The real embedded model behind the ``hf`` engine (shared by the whole session)."""
    from rapo_echo.engines.hf import HFEngine

    torch.manual_seed(0)
    return HFEngine.from_spec(smol_path, device="cpu")


def model_dims(
    hidden: int, layers: int, heads: int = 4, kv_heads: int = 2, intermediate: int | None = None
) -> dict[str, int]:
    """A transformer config's sizes; the MLP is twice the hidden size unless ``intermediate``."""
    return {
        "hidden_size": hidden,
        "intermediate_size": intermediate or 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
    }


def make_tiny_model(tokenizer, seed: int = 0, layers: int = 2, hidden: int = 64):
    """A randomly initialised small Llama that shares the embedded model's tokenizer."""
    from rapo_echo.models import tiny_llama

    return tiny_llama(tokenizer, seed, layers, hidden).eval()


@pytest.fixture(scope="session")
def smol_tokenizer(smol_path: str):
    from rapo_echo.models import load_tokenizer

    return load_tokenizer(smol_path)


def save_tiny(out: Path, tokenizer) -> Path:
    """A tiny random model saved as a Hugging Face folder (config, safetensors, tokenizer)."""
    make_tiny_model(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def tiny_folder(tmp_path: Path, smol_tokenizer) -> Path:
    return save_tiny(tmp_path / "tiny", smol_tokenizer)


@pytest.fixture(scope="module")
def tiny_module_folder(tmp_path_factory, smol_tokenizer) -> Path:
    """``tiny_folder`` shared by a module's tests."""
    return save_tiny(tmp_path_factory.mktemp("tiny") / "tiny", smol_tokenizer)


@pytest.fixture(autouse=True)
def _progress_display_off():
    """A training run in the test process turns the progress display on for the process
    (``rapo_echo.progress.enable``); each test starts with it off, as a fresh process does."""
    from rapo_echo import progress

    progress.enable(False)
    yield
    progress.enable(False)
