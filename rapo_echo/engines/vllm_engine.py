"""``vllm`` engine: an in-process vLLM ``LLM`` (GPU) as a :class:`~rapo_echo.engines.base.ChatEngine`.

vLLM is an optional extra (``pip install 'rapo-echo[vllm]'``, CUDA GPU required) and is imported
only when an engine is built. Prompts are tokenised by our own tokenizer through its chat template
(the same ids as the ``hf`` engine) and sent as token prompts, so the ids the trainer sees are
exactly the ids vLLM sampled from.

Log-probabilities. The trainer wants each sampled token's log-prob under the temperature-scaled,
untruncated distribution ``log_softmax(logits / T)``. vLLM's engine argument ``logprobs_mode``
(vLLM >= 0.10.2) decides what it returns: ``raw_logprobs`` (its default) is ``log_softmax(logits)``
before temperature, ``processed_logprobs`` is taken after temperature *and* top-k / top-p (then
renormalised over the kept tokens). This engine asks for ``processed_logprobs``: it equals the
trainer's quantity exactly whenever ``top_k == 0`` and ``top_p == 1`` (rapo-echo's defaults) and for
greedy decoding; with top-k / top-p on, the returned values are those of the truncated distribution
(a warning says so once). No vLLM mode gives the temperature-scaled untruncated value in that case.
Older vLLM without ``logprobs_mode`` returns its own (pre-V1: processed, pre-top-k) values.

Structured output. A call's :attr:`SamplingParams.answer_format` becomes vLLM's own constrained decoding
(:func:`structured_kwargs`): ``SamplingParams(structured_outputs=StructuredOutputsParams(json= | choice= |
regex=))`` where ``vllm.sampling_params`` has ``StructuredOutputsParams`` (vLLM >= 0.10.2), else
``SamplingParams(guided_decoding=GuidedDecodingParams(...))`` (older vLLM); an integer format is sent as its
regular expression. ``structured_output`` is ``grammar`` when one of the two exists (``none`` otherwise:
formats are then only parsed, with a warning once).

``choice_logprobs`` appends each option's tokens to the prompt and reads their prompt log-probs
(``prompt_logprobs``, temperature 1), the same teacher-forced quantity as the ``hf`` engine; all
prompts x options go through one ``LLM.generate`` call.

Weights: :meth:`load_weights` / :meth:`sync_from` push a trained policy's tensors into the engine
through ``LLM.apply_model`` (vLLM's public API for running a function on the model in every
worker). With vLLM's default multi-process engine core the function and tensors cross a process
boundary, which vLLM only allows with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``; building the engine
with ``in_process=True`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) keeps the model in this process
instead. vLLM versions without ``apply_model`` are served through the old
``llm_engine.model_executor.driver_worker.model_runner.model`` path; anything else is a clear error.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rapo_echo.engines.base import split_continuation
from rapo_echo.errors import EngineError
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, Generation, SamplingParams

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'rapo-echo[vllm]'"
LOGPROBS_MODE = "processed_logprobs"
_LOGPROBS_MODE_SINCE = (0, 10, 2)


def import_vllm() -> Any:
    """The ``vllm`` module, or an :class:`EngineError` telling how to install it."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise EngineError(
            f"the 'vllm' engine needs the optional package vLLM, which is not importable here ({exc}). "
            f"Install it with: {INSTALL_HINT} (vLLM runs on a CUDA GPU; on a CPU-only machine use the "
            "'hf' engine, or the 'openai' engine pointed at a 'vllm serve' replica)"
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


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments for ours, asking for the sampled tokens' log-probs.

    ``top_k == 0`` (ours: off) becomes ``-1``, which every vLLM version reads as "off"; ``logprobs=0``
    returns only the sampled token's log-prob."""
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


def structured_api(vllm: Any) -> tuple[str, Any] | None:
    """vLLM's structured-output parameters: ``("structured_outputs", StructuredOutputsParams)`` in recent
    versions, ``("guided_decoding", GuidedDecodingParams)`` in older ones, None when it has neither."""
    try:
        module = getattr(vllm, "sampling_params", None) or importlib.import_module("vllm.sampling_params")
    except ImportError:
        module = None
    names = (("structured_outputs", "StructuredOutputsParams"), ("guided_decoding", "GuidedDecodingParams"))
    for field, cls_name in names:
        cls = getattr(module, cls_name, None) or getattr(vllm, cls_name, None)
        if cls is not None:
            return field, cls
    return None


def structured_kwargs(fmt: AnswerFormat | None, api: tuple[str, Any] | None) -> dict[str, Any]:
    """The vLLM ``SamplingParams`` keyword that constrains decoding to ``fmt`` (``{}`` without a format or
    without the API): ``json`` (the schema), ``choice`` (the labels) or ``regex`` (a regex, or an integer's
    regular expression)."""
    if fmt is None or api is None:
        return {}
    field, cls = api
    if fmt.kind == "json":
        spec = {"json": fmt.schema}
    elif fmt.kind == "choice":
        spec = {"choice": list(fmt.choices)}
    else:
        spec = {"regex": fmt.as_regex()}
    return {field: cls(**spec)}


def token_logprob(position: Any, token_id: int, where: str) -> float:
    """The log-prob of ``token_id`` in one position's ``{token_id: Logprob}`` mapping."""
    entry = position.get(token_id) if position is not None else None
    if entry is None:
        raise EngineError(f"{where}: vLLM returned no log-prob for token {token_id}")
    return float(getattr(entry, "logprob", entry))


class VLLMEngine:
    """An in-process vLLM model behind the :class:`ChatEngine` protocol (GPU only, optional extra)."""

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
        in_process: bool = False,
        **llm_kwargs: Any,
    ) -> None:
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
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        version = version_tuple(getattr(vllm, "__version__", "0"))
        if version >= _LOGPROBS_MODE_SINCE:
            kwargs["logprobs_mode"] = LOGPROBS_MODE
        kwargs.update(llm_kwargs)
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as exc:  # vLLM raises many kinds; name the model and the usual fixes
            raise EngineError(
                f"{name}: vLLM could not load {resolved.source or resolved.path}: "
                f"{type(exc).__name__}: {exc} "
                "(vLLM needs a CUDA GPU; lower gpu_memory_utilization or max_model_len if memory is short)"
            ) from exc
        self.logprobs_mode = kwargs.get("logprobs_mode", "vllm default")
        self._structured = structured_api(vllm)
        self._warned_unstructured = False

    @property
    def structured_output(self) -> str:
        """``grammar``: vLLM constrains decoding to a call's answer format (``none`` on a vLLM without
        structured-output parameters)."""
        return "grammar" if self._structured is not None else "none"

    # ------------------------------------------------------------------ prompts
    def encode(self, prompt: Conversation) -> list[int]:
        """Token ids of a prompt through the chat template (an assistant last message is continued)."""
        conv, prefix = split_continuation(prompt)
        text = self.tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        if prefix:
            text += prefix
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _run(self, prompt_ids: Sequence[Sequence[int]], sampling: Any) -> list[Any]:
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
        if (params.top_k > 0 or params.top_p < 1.0) and params.temperature > 0 and not self._warned_truncated:
            log.warning(
                "%s: top_k/top_p are on, so vLLM's sampled-token log-probs are those of the truncated "
                "distribution, not the temperature-scaled full one the trainer computes",
                self.name,
            )
            self._warned_truncated = True
        if params.answer_format is not None and self._structured is None and not self._warned_unstructured:
            log.warning(
                "%s: this vLLM (%s) has no structured-output parameters; answer formats are only parsed",
                self.name,
                getattr(self._vllm, "__version__", "?"),
            )
            self._warned_unstructured = True
        kwargs = {**sampling_kwargs(params), **structured_kwargs(params.answer_format, self._structured)}
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
        flat = [base + opt for base in bases for opt in encoded]
        sampling = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=1)
        results = self._run(flat, sampling)
        out: list[dict[str, float]] = []
        k = len(options)
        for i, base in enumerate(bases):
            row: dict[str, float] = {}
            for j, (option, opt_ids) in enumerate(zip(options, encoded)):
                res = results[i * k + j]
                where = f"{self.name}: prompt {i}, option {option!r}"
                plp = res.prompt_logprobs
                if plp is None or len(plp) != len(base) + len(opt_ids):
                    raise EngineError(f"{where}: vLLM returned no prompt log-probs for the option tokens")
                row[option] = sum(token_logprob(plp[len(base) + m], t, where) for m, t in enumerate(opt_ids))
            out.append(row)
        return out

    # ------------------------------------------------------------------ weights
    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy ``(name, tensor)`` pairs (Hugging Face parameter names) into the engine's model, then drop
        the prefix cache (its KV entries were computed with the old weights)."""
        weights = [(str(n), t.detach()) for n, t in named_tensors]
        if not weights:
            raise ValueError("load_weights: no tensors given")
        if hasattr(self.llm, "apply_model"):
            try:
                self.llm.apply_model(functools.partial(_load_into_model, weights))
            except Exception as exc:
                raise EngineError(
                    f"{self.name}: LLM.apply_model failed while loading {len(weights)} tensors: "
                    f"{type(exc).__name__}: {exc}. With vLLM's multi-process engine core, set "
                    "VLLM_ALLOW_INSECURE_SERIALIZATION=1, or build the engine with in_process=True "
                    "(VLLM_ENABLE_V1_MULTIPROCESSING=0)"
                ) from exc
        else:
            model = _legacy_model(self.llm)
            if model is None:
                raise EngineError(
                    f"{self.name}: this vLLM version ({getattr(self._vllm, '__version__', '?')}) has neither "
                    "LLM.apply_model nor llm_engine.model_executor.driver_worker.model_runner.model; "
                    f"upgrade vLLM ({INSTALL_HINT})"
                )
            model.load_weights(weights)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()

    def sync_from(self, model: Any) -> int:
        """Push a transformers model's current weights into the engine (a PEFT model's adapter is merged
        in while they are copied, then unmerged); returns the number of tensors sent."""
        with merged_adapter(model):
            weights = list(named_weights_for_vllm(model))
            self.load_weights(weights)
        return len(weights)


def is_peft_model(model: Any) -> bool:
    """True for a PEFT model (it can merge and unmerge its adapter)."""
    return hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")


@contextlib.contextmanager
def merged_adapter(model: Any) -> Iterator[None]:
    """Merge a PEFT model's adapter into its base weights for the block (no-op for other models)."""
    if not is_peft_model(model):
        yield
        return
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()


def named_weights_for_vllm(model: Any) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` pairs under the names vLLM's ``load_weights`` expects (Hugging Face checkpoint
    names). For a PEFT model (merge it first, see :func:`merged_adapter`) the ``base_model.model.`` and
    ``.base_layer`` name parts are removed and the adapter's own tensors skipped."""
    if not is_peft_model(model):
        for name, param in model.named_parameters():
            yield name, param.data
        return
    prefix = getattr(model, "prefix", "lora_")
    for name, param in model.named_parameters():
        if prefix in name or "original_module" in name:
            continue
        clean = name.removeprefix("base_model.model.").replace(".base_layer", "")
        yield clean.replace("modules_to_save.default.", ""), param.data


def _load_into_model(weights: list[tuple[str, Any]], model: Any) -> int:
    """Runs inside each vLLM worker: load the tensors into the worker's model."""
    model.load_weights(weights=weights)
    return len(weights)


def _legacy_model(llm: Any) -> Any:
    """The model object of old (V0) vLLM, or None."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        return None
