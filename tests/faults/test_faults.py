"""Fault injection with real processes, sockets and file systems (``pytest -m faults``): a faulty
OpenAI-compatible server on 127.0.0.1 (hangs, trickles, 5xx, garbage, closed connections), kill -9
during checkpoint writes, a full disk (a small tmpfs; skipped where mounting is not allowed), and a
``serve`` client that hangs up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rapo_echo.checkpoint import latest_checkpoint, list_checkpoints, load_torch, load_trainer_state
from rapo_echo.engines.openai_engine import EndpointError, OpenAIEngine
from rapo_echo.types import SamplingParams

pytestmark = pytest.mark.faults

USER = [{"role": "user", "content": "I lost my job today."}]
REPLY = json.dumps(
    {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "I am sorry."}, "finish_reason": "stop"}
        ]
    }
).encode()


class FaultyServer:
    """A raw-socket HTTP server on 127.0.0.1 that answers every request with one kind of fault."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0
        self.answered = 0  # trickled answers sent whole (the client waited for all of it)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = next(
            (
                int(ln.split(b":")[1])
                for ln in head.split(b"\r\n")
                if ln.lower().startswith(b"content-length")
            ),
            0,
        )
        while len(body) < length:
            body += conn.recv(65536)

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._read_request(conn)
            self.requests += 1
            if self.mode == "hang":
                self.stop.wait(30)
            elif self.mode == "trickle":  # a valid answer, one byte every 20 ms (8+ s in all)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                conn.sendall(b"Content-Length: %d\r\n\r\n" % len(REPLY))
                for i in range(len(REPLY)):
                    if self.stop.wait(0.02):
                        return
                    conn.sendall(REPLY[i : i + 1])
                self.answered += 1
            elif self.mode == "500":
                body = b'{"error": {"message": "engine overloaded"}}'
                conn.sendall(
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                )
            elif self.mode == "garbage":
                body = b"<html>502 bad gateway</html>"
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            elif self.mode == "close":
                conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def faulty(request) -> Iterator[FaultyServer]:
    server = FaultyServer(request.param)
    yield server
    server.close()


def engine(url: str) -> OpenAIEngine:
    return OpenAIEngine(url, "m", api_key_env=None, timeout_s=0.5, max_retries=1, backoff_s=0.01)


@pytest.mark.parametrize(
    ("faulty", "needle", "requests"),
    [
        ("hang", r"timed out after 0\.5 s .*gave up after 2 attempts", 2),
        ("trickle", r"timed out after 0\.5 s .*gave up after 2 attempts", 2),
        ("500", r"HTTP 500: engine overloaded \(gave up after 2 attempts\)", 3),  # + one health request
        ("garbage", r"response is not JSON: '<html>502", 1),
        ("close", r"connection failed .*gave up after 2 attempts", 2),
    ],
    indirect=["faulty"],
)
def test_openai_engine_against_a_faulty_server(faulty: FaultyServer, needle: str, requests: int) -> None:
    eng = engine(faulty.url)
    with pytest.raises(EndpointError, match=needle) as exc:
        eng.generate([USER], SamplingParams(max_new_tokens=8))
    assert faulty.url in str(exc.value) and faulty.requests == requests
    # each attempt was cut at its deadline: none waited for the whole trickled answer (8 s per attempt)
    assert faulty.answered == 0


def test_a_trickling_server_is_cut_at_the_deadline() -> None:
    server = FaultyServer("trickle")
    try:
        eng = OpenAIEngine(server.url, "m", api_key_env=None, timeout_s=1.0, max_retries=0)
        t0 = time.monotonic()
        with pytest.raises(EndpointError, match="timed out after 1 s"):
            eng.generate([USER], SamplingParams(max_new_tokens=8))
        # not before the deadline, and before the answer (8 s to trickle in) was whole
        assert time.monotonic() - t0 >= 0.9 and server.answered == 0
    finally:
        server.close()


CHECKPOINT_LOOP = """
import sys, time, torch
from rapo_echo.checkpoint import save_checkpoint

saved = []

def save_model(folder):
    saved.append(folder)
    folder.mkdir()
    with open(folder / "weights.bin", "wb") as fh:
        for piece in range(8):
            fh.write(b"w" * (1 << 20))  # 8 MiB, written in pieces
            fh.flush()
            if len(saved) == 3 and piece == 3:  # half of the third: wait there for the kill
                (folder / "half-written").touch()
                time.sleep(120)

param = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.SGD([param], lr=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
for step in range(1, 10_000):
    save_checkpoint(sys.argv[1], step, save_model=save_model, optimizer=opt, scheduler=sched,
                    trainer_state={"data": {"position": step}}, keep=2)
"""


def test_kill_9_during_checkpoint_writes_leaves_only_complete_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", CHECKPOINT_LOOP, str(run)])
    try:
        deadline = time.monotonic() + 120
        # wait until two checkpoints exist and the third is half written (the child then holds still: a
        # kill timed by polling alone could land after the write, on a loaded machine)
        while time.monotonic() < deadline:
            if list((run / "checkpoints").glob(".tmp-step-*/model/half-written")):
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert list((run / "checkpoints").glob(".tmp-step-*")), "the kill did not land mid-write"
    found = list_checkpoints(run)
    assert found
    for step, path in found:  # every checkpoint that counts is whole and loads
        assert (path / "model" / "weights.bin").stat().st_size == 8 << 20
        assert load_trainer_state(path)["data"]["position"] == step
        load_torch(path / "optimizer.pt")
    assert latest_checkpoint(run) == found[-1][1]


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only; skipped with the reason elsewhere)."""
    mount = shutil.which("mount")
    if os.geteuid() != 0 or mount is None:
        pytest.skip("a full disk needs a small tmpfs, and mounting one needs root")
    where = tmp_path / "small"
    where.mkdir()
    res = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_full_disk_loses_nothing(full_disk: Path) -> None:
    from rapo_echo.checkpoint import save_checkpoint
    from rapo_echo.jsonl import FileWriteError, append_jsonl, read_jsonl

    def weights(size: int):
        def save_model(folder: Path) -> None:
            folder.mkdir()
            (folder / "weights.bin").write_bytes(b"w" * size)

        return save_model

    import torch

    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([param], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    run = full_disk / "run"
    kw = {"optimizer": opt, "scheduler": sched, "trainer_state": {"data": {}}}
    save_checkpoint(run, 1, save_model=weights(100_000), **kw)
    with pytest.raises(FileWriteError, match=r"step-2: the disk is full .*checkpoint is .*step-1.*--resume"):
        save_checkpoint(run, 2, save_model=weights(2_000_000), **kw)
    assert latest_checkpoint(run) == run / "checkpoints" / "step-1"
    assert not list((run / "checkpoints").glob(".tmp-*"))  # the half checkpoint was removed
    metrics = full_disk / "metrics.jsonl"
    append_jsonl(metrics, [{"step": 1}])
    with pytest.raises(FileWriteError, match=r"metrics\.jsonl: the disk is full"):
        append_jsonl(metrics, [{"step": 2, "blob": "x" * 2_000_000}])
    assert [r for _, r in read_jsonl(metrics)] == [{"step": 1}]  # the torn part of step 2 is dropped


def test_serve_cancels_a_request_whose_client_hung_up(smol_tokenizer) -> None:
    pytest.importorskip("fastapi")
    import httpx
    import uvicorn

    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.serve import bind_socket, create_app
    from tests.conftest import make_tiny_model

    model = make_tiny_model(smol_tokenizer)
    model.config.max_position_embeddings = 100_000
    engine = HFEngine(model, smol_tokenizer, name="serve")
    engine.eos_ids = set()  # the random model must not end its reply by chance
    forwards = {"n": 0}
    model.register_forward_pre_hook(lambda *_: forwards.__setitem__("n", forwards["n"] + 1))
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/chat/completions"
    server = uvicorn.Server(uvicorn.Config(create_app(engine, "m"), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        long = {"messages": USER, "max_tokens": 50_000, "seed": 1}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
            httpx.post(url, json=long, timeout=1.0)
        # the abandoned reply (50k tokens, minutes) was cancelled, so the model lock is free again
        res = httpx.post(url, json={"messages": USER, "max_tokens": 1}, timeout=30)
        assert res.status_code == 200
        # nothing runs any more: the forward count settles (the 50k-token reply would run for minutes)
        deadline, n = time.monotonic() + 120, -1
        while forwards["n"] != n and time.monotonic() < deadline:
            n = forwards["n"]
            time.sleep(1.0)
        assert forwards["n"] == n
    finally:
        server.should_exit = True
        thread.join(10)
