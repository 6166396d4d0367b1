"""Building blocks of every config section: the strict base model and the ``auto``-or-number types."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


def _auto_size(value: Any) -> int | str:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("must be a whole number >= 1 or 'auto'")


# A batch size, or ``auto``: sized from free device memory and the model on a GPU, the CPU default on a
# CPU (rapo_echo.autosize; the resolved value is written to the run directory).
AutoSize = Annotated[int | Literal["auto"], PlainValidator(_auto_size)]


def _auto_lr(value: Any) -> float | str:
    if value == "auto":
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < float(value) <= 1.0:
        return float(value)
    raise ValueError("must be a number greater than 0 and at most 1, or 'auto'")


# A learning rate, or ``auto``: from the model's size and LoRA (rapo_echo.auto_lr; 1e-4 full / 1e-3 LoRA
# for the embedded model; the resolved value is written to the run directory).
AutoLR = Annotated[float | Literal["auto"], PlainValidator(_auto_lr)]

# Where a role's forwards run in lower precision: auto (bfloat16 where the hardware has it), none, a dtype.
Autocast = Literal["auto", "none", "bfloat16", "float16"]
Dtype = Literal["float32", "bfloat16", "float16", "auto"]
LogprobMode = Literal["auto", "always", "never"]
ScenarioFormat = Literal["auto", "scenarios", "esconv", "ppdpp", "hf_esconv", "sage"]

# A share of a whole, by the ends it may take: (0, 1], [0, 1], (0, 1).
Share = Annotated[float, Field(gt=0.0, le=1.0)]
ClosedShare = Annotated[float, Field(ge=0.0, le=1.0)]
OpenShare = Annotated[float, Field(gt=0.0, lt=1.0)]

# A text where an empty one means none (``--system-prompt ''``: no system prompt).
OptionalText = Annotated[str | None, BeforeValidator(lambda v: None if v == "" else v)]


def _device(value: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", value):
        raise ValueError("must be auto, cpu, cuda, cuda:N or mps")
    return value


# Where a local model runs: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (whether this machine has it
# is checked where the model loads: rapo_echo.config.check_device).
Device = Annotated[str, AfterValidator(_device)]
