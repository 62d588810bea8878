"""Start `python -m minillm serve` in a child process, wait until it answers, stop it.

What the tests and chapter 10 use: a real server in its own process (its own
GIL, as in production), bound to 127.0.0.1 on a free port.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`with ServerProcess(["--model", "tiny"]) as server: server.url` (SIGTERM on exit)."""

    def __init__(self, args=(), port: int | None = None, startup_timeout_s: float = 120.0, quiet: bool = True):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--host", "127.0.0.1", "--port", str(self.port), *map(str, args)]
        self.startup_timeout_s = startup_timeout_s
        self.quiet = quiet
        self.process: subprocess.Popen | None = None
        self.startup_s: float | None = None      # launch to /health answering 200

    def start(self) -> "ServerProcess":
        return self.launch().wait_ready()

    def launch(self) -> "ServerProcess":
        """Start the process and return at once (wait_ready() waits for /health): several
        servers, or a server and other work, can then start side by side."""
        self._launched_at = time.perf_counter()
        out = subprocess.DEVNULL if self.quiet else None
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen([sys.executable, "-m", "minillm", "serve", *self.args],
                                        stdout=out, stderr=subprocess.PIPE if self.quiet else None, env=env)
        return self

    def wait_ready(self) -> "ServerProcess":
        start = self._launched_at
        while time.perf_counter() - start < self.startup_timeout_s:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"the server exited with {self.process.returncode} before answering:\n{err[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        self.startup_s = time.perf_counter() - start
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the server did not answer /health within {self.startup_timeout_s} s")

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then wait; returns the exit code (SIGKILL and None if it hangs)."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
