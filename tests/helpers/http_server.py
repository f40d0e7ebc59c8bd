"""Runs an OpenAI-compatible server command for a test (`vllm serve`,
`keras-vllm serve`) and waits until it answers."""

import contextlib
import socket
import subprocess
import time

import pytest
import requests


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(command, log_path, timeout, cwd=None):
    """Starts `command` on a free loopback port; yields its base URL.

    Output goes to `log_path`; the command runs in `cwd` (default: here). Fails the test, with the log's tail, if the
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
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + timeout
        try:
            while True:
                if process.poll() is not None:
                    log.seek(0)
                    pytest.fail("The server exited:\n" + log.read()[-5000:])
                try:
                    if requests.get(url + "/health", timeout=2).ok:
                        break
                except requests.ConnectionError:
                    pass
                if time.time() > deadline:
                    log.seek(0)
                    pytest.fail(
                        "The server did not start:\n" + log.read()[-5000:]
                    )
                time.sleep(2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
