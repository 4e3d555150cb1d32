"""A real `ember serve` process on 127.0.0.1 and a port it picks, for the server tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import httpx


class ServerProcess:
    """`python -m ember serve FLAGS --port 0`; `url` (the port it picked) once `wait_ready` returned."""

    def __init__(self, *flags: str):
        self.url: str | None = None
        self._log = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "ember", "serve", "--port", "0", *flags]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ember serve exited with {self.process.returncode}:\n{self.output()}")
            found = re.search(r"serving \S+ on (http://\S+)", self.output())
            if found:
                self.url = found.group(1)
                try:
                    if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ember serve did not answer /health within {timeout} s:\n{self.output()}")

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def metric(server_url: str, name: str, headers: dict | None = None) -> float:
    """The value of an unlabelled metric on /metrics."""
    text = httpx.get(f"{server_url}/metrics", headers=headers or {}, timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(f"{name} is not in /metrics")


def without_ids(events: bytes) -> bytes:
    """Server-sent events with each answer's own id and creation time put as `ID` and `0`, so
    that two servers' streams of the same answer compare equal."""
    return re.sub(rb'"created": [0-9]+', b'"created": 0', re.sub(rb'"id": "[^"]*"', b'"id": "ID"', events))
