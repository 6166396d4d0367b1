"""The ``vllm`` and ``openrlhf`` extras resolve to a working set with our own requirements: pip's resolver
in a dry run (nothing is installed; ``--report`` lists what would be) into an empty environment, against the
package index. Both dry runs start in the background when collection finishes (conftest.py: mostly network
time, spent while the vLLM tests run). Skipped, with the reason, when the index cannot be reached."""

from __future__ import annotations

import pytest

from tests.vllm.resolve import RESOLVE_RUNS, result

pytestmark = pytest.mark.vllm

OPENRLHF = "0.11.2"  # the OpenRLHF release our exporter targets (integrations/openrlhf)


def release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("+")[0].split(".")[:3])


def test_the_vllm_extra_resolves_with_our_requirements() -> None:
    got = result("vllm")
    print("rapo-echo[vllm]:", {k: got[k] for k in ("vllm", "torch", "transformers")})
    assert release(got["vllm"]) >= (0, 10, 2) and release(got["transformers"]) >= (5, 0)


def test_the_openrlhf_extra_resolves_with_openrlhfs_own_vllm() -> None:
    """OpenRLHF pins transformers and (through its own ``[vllm]`` extra) vLLM; ours must take those pins."""
    got = result("openrlhf")
    print("rapo-echo[openrlhf]:", {k: got.get(k) for k in ("openrlhf", "vllm", "torch", "transformers")})
    assert got["openrlhf"] == OPENRLHF and "vllm" in got
    assert set(RESOLVE_RUNS) == {"vllm", "openrlhf"}
