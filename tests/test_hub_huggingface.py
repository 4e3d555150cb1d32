"""ember.hub and Hugging Face: ORG/REPO[:QUANT] through huggingface_hub against a loopback hub
(tests/fake_hub.py) serving tiny GGUF models written by ember's own writer. No network."""

from __future__ import annotations

import os

import pytest

from ember import hub
from ember.cli.main import main
from ember.errors import EmberError, ModelNotFound
from ember.gguf import open_gguf
from ember.gguf.split import split_name
from fake_hub import COMMIT, FakeHub
from tiny_gguf import write_split_model, write_tiny_model

REPO = "org/Tiny-GGUF"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A repository as a bartowski-style GGUF repo looks: several quantizations, a split one, a
    projector and a README."""
    folder = tmp_path_factory.mktemp("repo")
    one = write_tiny_model(folder / "one.gguf").read_bytes()
    parts = write_split_model(folder, "Tiny-Q8_0", 3)
    return {
        "README.md": b"# tiny",
        "Tiny-Q4_K_M.gguf": one,
        "Tiny-Q5_K_M.gguf": one,
        "Tiny-F16.gguf": one,
        "mmproj-Tiny-F16.gguf": b"not a model",
        **{f"Q8_0/{p.name}": p.read_bytes() for p in parts},
    }


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty Hugging Face cache (HF_HOME) and ember cache; no token, not offline."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "ember"))
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hf" / "hub"


@pytest.fixture
def fake(files, hf_home, monkeypatch):
    with FakeHub({REPO: files, "org/private-GGUF": {"p-Q4_K_M.gguf": files["Tiny-Q4_K_M.gguf"]}},
                 private={"org/private-GGUF": "hf_secret"}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def snapshot(hf_home, repo=REPO):
    return hf_home / f"models--{repo.replace('/', '--')}" / "snapshots" / COMMIT


# -- names --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, parsed", [
    ("org/repo", ("org/repo", None)),
    ("org/Repo-GGUF:Q8_0", ("org/Repo-GGUF", "Q8_0")),
    ("org/repo:model-f16.gguf", ("org/repo", "model-f16.gguf")),
    ("hf.co/org/repo:q4_k_m", ("org/repo", "q4_k_m")),
    ("hf://org/repo", ("org/repo", None)),
    ("models/missing.gguf", None),
    ("smollm2-135m", None),
    ("a/b/c", None),
])
def test_hugging_face_names(name, parsed):
    assert hub.hf_name(name) == parsed


# -- choosing the file ----------------------------------------------------------------------------------

def test_without_a_tag_q4_k_m_is_chosen_as_llama_cpp_does(files):
    assert hub.choose_files(REPO, dict.fromkeys(files, 1)) == ["Tiny-Q4_K_M.gguf"]


def test_then_q8_0_and_a_split_model_is_all_its_parts(files):
    without_q4 = {f: 1 for f in files if "Q4_K_M" not in f}
    assert hub.choose_files(REPO, without_q4) == [f"Q8_0/{split_name('Tiny-Q8_0', i, 3)}" for i in range(3)]


def test_a_tag_is_matched_without_regard_to_case(files):
    assert hub.choose_files(REPO, dict.fromkeys(files, 1), "q5_k_m") == ["Tiny-Q5_K_M.gguf"]
    assert hub.choose_files(REPO, dict.fromkeys(files, 1), "F16") == ["Tiny-F16.gguf"]  # not the projector


def test_a_file_name_or_a_pattern_names_the_file(files):
    assert hub.choose_files(REPO, dict.fromkeys(files, 1), "Tiny-F16.gguf") == ["Tiny-F16.gguf"]
    assert hub.choose_files(REPO, dict.fromkeys(files, 1), pattern="*Q5_K_M.gguf") == ["Tiny-Q5_K_M.gguf"]


def test_a_missing_tag_lists_the_models(files):
    with pytest.raises(ModelNotFound) as caught:
        hub.choose_files(REPO, dict.fromkeys(files, 1), "Q2_K")
    assert str(caught.value) == (f"{REPO} has no GGUF model tagged Q2_K; its GGUF models: "
                                 "Q8_0/Tiny-Q8_0-00001-of-00003.gguf, Tiny-F16.gguf, Tiny-Q4_K_M.gguf, Tiny-Q5_K_M.gguf")


def test_an_ambiguous_name_lists_the_candidates():
    files = {"a-Q6_K.gguf": 1, "b-Q6_K.gguf": 1}
    with pytest.raises(EmberError, match=r"2 GGUF models are tagged Q6_K: a-Q6_K.gguf, b-Q6_K.gguf; name one"):
        hub.choose_files(REPO, files, "Q6_K")
    with pytest.raises(EmberError, match=r"2 GGUF models are tagged Q4_K_M or Q8_0: a-Q6_K.gguf, b-Q6_K.gguf"):
        hub.choose_files(REPO, files)
    assert hub.choose_files(REPO, {"only-IQ4_XS.gguf": 1}) == ["only-IQ4_XS.gguf"]


def test_a_split_model_missing_a_part_is_refused():
    files = {split_name("M-Q4_K_M", 0, 2): 1}
    with pytest.raises(ModelNotFound, match=r"has 2 parts, but M-Q4_K_M-00002-of-00002.gguf is not in the repository"):
        hub.choose_files(REPO, files)


# -- downloads --------------------------------------------------------------------------------------

def test_a_repository_resolves_to_its_q4_k_m_file_in_the_hf_cache(fake, hf_home, files):
    path = hub.resolve_model(REPO)
    assert path == snapshot(hf_home) / "Tiny-Q4_K_M.gguf"
    assert path.read_bytes() == files["Tiny-Q4_K_M.gguf"]
    assert fake.downloads() == ["Tiny-Q4_K_M.gguf"]


def test_a_second_resolve_downloads_nothing(fake, hf_home):
    hub.resolve_model(f"{REPO}:Q5_K_M")
    hub.resolve_model(f"{REPO}:Q5_K_M")
    assert fake.downloads() == ["Tiny-Q5_K_M.gguf"]


def test_a_split_model_downloads_every_part_and_opens_as_one(fake, hf_home):
    path = hub.resolve_model(f"{REPO}:Q8_0")
    assert path == snapshot(hf_home) / "Q8_0" / "Tiny-Q8_0-00001-of-00003.gguf"
    assert sorted(fake.downloads()) == [f"Q8_0/Tiny-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with open_gguf(path) as f, open_gguf(hub.resolve_model(REPO)) as single:
        assert len(f.parts) == 3 and list(f.tensors) == list(single.tensors)


def test_the_download_draws_a_byte_progress_bar(fake, capsys, monkeypatch):
    monkeypatch.setenv("TQDM_POSITION", "-1")  # huggingface_hub draws its bars on terminals; this forces them
    hub.resolve_model(f"{REPO}:F16")
    err = capsys.readouterr().err
    size = len(fake.repos[REPO]["Tiny-F16.gguf"])
    assert f"ember: {REPO}: Tiny-F16.gguf, {size / 1e6:.1f} MB" in err
    assert "100%" in err and f"{size / 1000:.0f}k/{size / 1000:.0f}k" in err.replace(".0k", "k")


def test_hf_home_decides_the_cache(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    assert hub.resolve_model(REPO).is_relative_to(tmp_path / "elsewhere" / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    assert hub.resolve_model(REPO).is_relative_to(tmp_path / "hub-cache")


def test_a_private_repository_needs_hf_token(fake, monkeypatch):
    with pytest.raises(ModelNotFound, match=r"there is no Hugging Face repository org/private-GGUF \(for a private "
                                            r"repository, set HF_TOKEN\)"):
        hub.resolve_model("org/private-GGUF")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert hub.resolve_model("org/private-GGUF").name == "p-Q4_K_M.gguf"
    assert {auth for method, path, auth in fake.requests if "private" in path} >= {"Bearer hf_secret"}


def test_an_unknown_repository_is_one_line(fake, capsys):
    assert main(["run", "-m", "org/no-such-repo", "hi"]) == 2
    assert capsys.readouterr().err == ("ember: error: there is no Hugging Face repository org/no-such-repo "
                                       "(for a private repository, set HF_TOKEN)\n")


def test_offline_the_cache_is_used_and_the_hub_is_not_asked(fake, monkeypatch):
    path = hub.resolve_model(REPO)
    n_requests = len(fake.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.resolve_model(REPO) == path
    assert hub.resolve_model(f"{REPO}:Q4_K_M") == path
    assert len(fake.requests) == n_requests
    with pytest.raises(ModelNotFound, match=rf"{REPO} has no GGUF model tagged Q5_K_M; its GGUF models: Tiny-Q4_K_M.gguf"):
        hub.resolve_model(f"{REPO}:Q5_K_M")
    with pytest.raises(ModelNotFound, match=r"org/other is not in the Hugging Face cache .* and HF_HUB_OFFLINE is set"):
        hub.resolve_model("org/other")


def test_an_unreachable_hub_falls_back_to_the_cache(fake, monkeypatch, capsys):
    path = hub.resolve_model(REPO)

    def unreachable(repo):
        raise hub.DownloadError("cannot reach the Hugging Face Hub")

    monkeypatch.setattr(hub, "_hf_repo_files", unreachable)
    assert hub.resolve_model(REPO) == path
    assert "the Hub cannot be reached; using the Hugging Face cache" in capsys.readouterr().err


# -- the command line ---------------------------------------------------------------------------------

def test_run_with_m_and_hf(fake, capsys):
    for argv in (["-m", f"{REPO}:Q4_K_M"], ["-hf", REPO], ["-hf", REPO, "-hff", "Tiny-F16.gguf"]):
        assert main(["run", *argv, "-c", "32", "-t", "1", "-n", "3", "--temp", "0", "the"]) == 0, argv
        assert "ember: load time" in capsys.readouterr().err


def test_pull_list_and_rm(fake, hf_home, capsys):
    assert main(["pull", f"{REPO}:Q8_0"]) == 0
    assert main(["pull", REPO]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [str(snapshot(hf_home) / "Q8_0" / "Tiny-Q8_0-00001-of-00003.gguf"),
                                str(snapshot(hf_home) / "Tiny-Q4_K_M.gguf")]
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    rows = {line.split()[0]: line for line in listing.splitlines()}
    assert f"{REPO}:Q8_0" in rows and f"{REPO}:Q4_K_M" in rows
    assert "3 parts" in rows[f"{REPO}:Q8_0"]
    q4_size = os.path.getsize(snapshot(hf_home) / "Tiny-Q4_K_M.gguf")
    assert f"{q4_size / 1e6:.1f} MB" in rows[f"{REPO}:Q4_K_M"]
    assert main(["rm", f"{REPO}:Q8_0"]) == 0
    assert not (snapshot(hf_home) / "Q8_0").exists() or not any((snapshot(hf_home) / "Q8_0").iterdir())
    blobs = list((hf_home / f"models--{REPO.replace('/', '--')}" / "blobs").iterdir())
    assert len(blobs) == 1  # the Q4_K_M file's blob stays
    assert main(["rm", REPO]) == 0
    assert not (hf_home / f"models--{REPO.replace('/', '--')}").exists()
    capsys.readouterr()
    assert main(["rm", REPO]) == 2
    assert "has no model in the Hugging Face cache" in capsys.readouterr().err


def test_list_shows_registry_models_with_their_sizes(hf_home, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name, entry in hub.REGISTRY.items():
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert f"{entry.size / 1e6:.0f} MB" in line and " no " in line


def test_rm_a_registry_model(hf_home, capsys):
    path = hub.model_path("smollm2-135m")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF")
    assert main(["rm", "smollm2-135m"]) == 0
    assert not path.exists()
    assert main(["rm", "smollm2-135m"]) == 2
    assert capsys.readouterr().err.endswith("ember: error: smollm2-135m is not in the cache "
                                            f"({hub.cache_dir() / 'models'})\n")


def test_info_describes_a_hugging_face_split_model(fake, capsys):
    assert main(["info", "-hf", f"{REPO}:Q8_0"]) == 0
    out = capsys.readouterr().out
    assert "split          3 files:" in out and "Tiny-Q8_0-00001-of-00003.gguf" in out
