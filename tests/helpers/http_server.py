"""Runs an OpenAI-compatible server command for a test (`vllm serve`,
`keras-vllm serve`) and waits until it answers."""

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests

from helpers import costs


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerUrl(str):
    """The server's base URL; `.process` is its `subprocess.Popen`."""

    process = None


@contextlib.contextmanager
def running_server(command, log_path, timeout, cwd=None):
    """Starts `command` on a free loopback port; yields its base URL.

    Output goes to `log_path`; the command runs in `cwd` (default: here).
    The yielded URL's `.process` is the server process. Fails the test,
    with the log's tail, if the
    server exits or is not healthy within `timeout` seconds; stops it on
    exit.
    """
    port = _free_port()
    with open(log_path, "w+") as log:
        process = subprocess.Popen(
            list(command) + ["--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )
        url = ServerUrl(f"http://127.0.0.1:{port}")
        url.process = process
        deadline = time.time() + timeout
        started = time.perf_counter()
        try:
            while True:
                if process.poll() is not None:
                    log.seek(0)
                    pytest.fail("The server exited:\n" + log.read()[-5000:])
                try:
                    if requests.get(url + "/health", timeout=2).ok:
                        break
                except (requests.ConnectionError, requests.Timeout):
                    # Not listening yet, or listening but too busy to
                    # answer in 2 s (engine start on 2 loaded cores): the
                    # deadline, not one slow poll, decides.
                    pass
                if time.time() > deadline:
                    log.seek(0)
                    pytest.fail(
                        "The server did not start:\n" + log.read()[-5000:]
                    )
                time.sleep(0.2)
            costs.record("server", time.perf_counter() - started)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def _stream_end(url, model, prompt, max_tokens, started, read_timeout):
    """Streams one completion; returns how it ended: its last
    `finish_reason`, "done" after `[DONE]` without one, "cut" when the
    connection closed first, "hung" on a read timeout."""
    reason = None
    try:
        with requests.post(
            url + "/v1/completions",
            json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                  "ignore_eos": True, "stream": True},
            stream=True,
            timeout=(10, read_timeout),
        ) as response:
            for number, line in enumerate(response.iter_lines()):
                if number == 0:
                    started.release()
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    return reason or "done"
                for choice in json.loads(line[6:]).get("choices", ()):
                    reason = choice.get("finish_reason") or reason
    except requests.exceptions.ReadTimeout:
        return "hung"
    except requests.exceptions.RequestException:
        pass
    return reason or "cut"


def terminate_while_streaming(
    url, model, prompts, max_tokens, running=8, read_timeout=90
):
    """Streams one completion per prompt, sends the server SIGTERM once
    `running` streams have a first chunk (the rest run or wait), and
    returns how each stream ended (see `_stream_end`) and the seconds the
    server took to exit (None: it did not)."""
    started = threading.Semaphore(0)
    ends = [None] * len(prompts)

    def run(i):
        ends[i] = _stream_end(
            url, model, prompts[i], max_tokens, started, read_timeout
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for _ in range(min(running, len(prompts))):
        if not started.acquire(timeout=120):
            break
    stop = time.monotonic()
    url.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(read_timeout + 30)
    try:
        url.process.wait(read_timeout)
    except subprocess.TimeoutExpired:
        pass
    exited = url.process.poll() is not None
    return ends, (time.monotonic() - stop) if exited else None
