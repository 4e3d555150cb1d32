"""Running ember and llama.cpp as child processes for the comparison scripts: where the
binaries are, what versions they are, and one measured run (wall time, peak RSS).

llama.cpp's binaries (llama-bench, llama-completion, llama-perplexity) are looked up in the
directory named by $LLAMA_CPP_BIN, else on PATH. ember runs as `python -m ember` with the
interpreter running these scripts, so the same environment is measured.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(fn) -> tuple[float, float]:
    """Wall and CPU seconds of one call of fn() in this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


class MissingBinary(SystemExit):
    pass


def llama_binary(name: str) -> str:
    folder = os.environ.get("LLAMA_CPP_BIN")
    if folder:
        path = Path(folder) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise MissingBinary(f"{name} is not in LLAMA_CPP_BIN={folder}")
    found = shutil.which(name)
    if not found:
        raise MissingBinary(f"{name} not found: put llama.cpp's build/bin on PATH or set LLAMA_CPP_BIN")
    return found


def ember_command() -> list[str]:
    return [sys.executable, "-m", "ember"]


@dataclass
class Run:
    returncode: int
    seconds: float  # wall time from spawn to exit
    peak_rss_bytes: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def error(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return f"exit {self.returncode}: {lines[-1] if lines else 'no message'}"


def run_measured(cmd: list[str], timeout: float = 900) -> Run:
    """Run cmd to completion; its own peak RSS comes from wait4's rusage (no /usr/bin/time)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Run(proc.returncode, seconds, usage.ru_maxrss * 1024, out.read().decode("utf-8", "replace"),
                   err.read().decode("utf-8", "replace"))


def _first_line(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (done.stdout + done.stderr).strip()
    return " / ".join(line.strip() for line in text.splitlines()[:2]) or "unknown"


def llama_version(binary: str) -> str:
    return _first_line([binary, "--version"])


def ember_version() -> str:
    probe = "import ember, ember._core as core; print(ember.__version__, core.isa())"
    version = _first_line([sys.executable, "-c", probe])
    commit = _first_line(["git", "-C", str(REPO), "describe", "--always", "--dirty"])
    return f"{version} (git {commit})"


def machine_summary() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"


def print_and_record(text: str, record: str | None) -> None:
    """Print a script's report, and write it to the file --record names too."""
    print(text)
    if record:
        with open(record, "w") as f:
            f.write(text)


def run_at_once(targets) -> float:
    """Call every function of targets on a thread of its own, all at once; wall seconds until
    the last returns."""
    threads = [threading.Thread(target=target) for target in targets]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start
