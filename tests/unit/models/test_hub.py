"""Models from the Hugging Face Hub: llama.cpp's rules for which GGUF of a repo to load, and
downloads by the real huggingface_hub client from a hub served on loopback (tests/hub_fake.py),
into a cache of the test's own."""

from __future__ import annotations

import errno
import hashlib
import random
from pathlib import Path
from typing import BinaryIO, cast

import gguf
import pytest
from hub_fake import HUGE, ORG

from edgekit.errors import ConfigError, ModelFetchError, ModelIntegrityError, ModelNotFoundError
from edgekit.models._gguf_pick import pick_gguf
from edgekit.models.hub import hub_gguf, list_hub_cache

# -- which file: llama.cpp's rules on file lists ---------------------------------------------------

BARTOWSKI = [  # as a quantizer's repo lists them, with the sidecars llama.cpp passes over
    "README.md", "Model-7B-IQ4_XS.gguf", "Model-7B-Q2_K.gguf", "Model-7B-Q4_0_4_4.gguf", "Model-7B-Q4_K_M.gguf",
    "Model-7B-Q8_0.gguf", "Model-7B-f16.gguf", "Model-7B.imatrix", "imatrix-Model-7B.gguf", "mmproj-Model-7B-f16.gguf",
]
FOLDERS = [  # a repo that keeps each quant of a split model in a folder of its own
    "Q4_K_M/Model-Q4_K_M-00002-of-00002.gguf", "Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf",
    "Q8_0/Model-Q8_0-00001-of-00002.gguf", "Q8_0/Model-Q8_0-00002-of-00002.gguf",
]


@pytest.mark.parametrize(("files", "quant", "file", "picked"), [
    (BARTOWSKI, None, None, ["Model-7B-Q4_K_M.gguf"]),  # the default: Q4_K_M first
    ([f for f in BARTOWSKI if "Q4_K_M" not in f], None, None, ["Model-7B-Q8_0.gguf"]),  # then Q8_0
    (["mmproj-x-Q4_K_M.gguf", "x-Q5_K_S.gguf", "x-Q3_K_L.gguf"], None, None, ["x-Q5_K_S.gguf"]),  # then the first model
    (BARTOWSKI, "q4_k_m", None, ["Model-7B-Q4_K_M.gguf"]),  # a quant, in any case
    (BARTOWSKI, "IQ4_XS", None, ["Model-7B-IQ4_XS.gguf"]),
    (BARTOWSKI, "F16", None, ["Model-7B-f16.gguf"]),  # not the projector's f16, listed after it
    (BARTOWSKI, "Q4_0", None, []),  # a quant is followed by "." or "-": Q4_0_4_4 is another
    (BARTOWSKI, "Q4_0_4_4", None, ["Model-7B-Q4_0_4_4.gguf"]),
    (["a-Q8_0.gguf", "b-Q8_0.gguf"], "Q8_0", None, ["a-Q8_0.gguf"]),  # the first in the Hub's order
    (FOLDERS, None, None, FOLDERS[1::-1]),  # a split GGUF from its first part, in folders
    (FOLDERS, "q8_0", None, FOLDERS[2:]),
    (BARTOWSKI, None, "model-7b-q2_k.GGUF", ["Model-7B-Q2_K.gguf"]),  # a file by its path, in any case
    (FOLDERS, None, "Q4_K_M/Model-Q4_K_M-00002-of-00002.gguf", FOLDERS[1::-1]),  # a later part: the first loads
    (FOLDERS, None, "Model-Q4_K_M-00001-of-00002.gguf", []),  # a file in a folder is named with its folder
])
def test_the_gguf_picked_is_llama_cpps(files, quant, file, picked):
    if picked:
        assert pick_gguf(files, quant=quant, file=file) == picked
    else:
        with pytest.raises(ModelNotFoundError):
            pick_gguf(files, quant=quant, file=file)


def test_a_quant_the_repo_lacks_is_refused_with_the_quants_it_has():
    with pytest.raises(ModelNotFoundError) as refused:
        pick_gguf(BARTOWSKI, quant="Q5_K_M", where="org/Model-7B-GGUF")
    assert str(refused.value) == (
        "org/Model-7B-GGUF has no GGUF of quant Q5_K_M; it has: IQ4_XS, Q2_K, Q4_0_4_4, Q4_K_M, Q8_0, F16"
    )
    with pytest.raises(ModelNotFoundError, match=r"no file 'x\.gguf'; its GGUF files: Model-7B-IQ4_XS\.gguf, "):
        pick_gguf(BARTOWSKI, file="x.gguf")
    with pytest.raises(ModelNotFoundError, match="has no GGUF model file; it holds: README.md, model.safetensors"):
        pick_gguf(["README.md", "model.safetensors", "mmproj-f16.gguf"])


def test_a_split_gguf_without_all_its_parts_is_refused():
    with pytest.raises(ModelNotFoundError, match="split GGUF Q4_K_M/Model-Q4_K_M of 2 parts without part"):
        pick_gguf(FOLDERS[1:])


# -- downloads from a hub on loopback ------------------------------------------------------------









def test_a_quant_downloads_into_huggingface_hubs_cache(hub, tiny, tmp_path):
    path = hub_gguf(f"{ORG}/tiny-GGUF", quant="q8_0")
    assert path.read_bytes() == tiny["tiny-Q8_0.gguf"]
    commit = hub.repos[f"{ORG}/tiny-GGUF"].commit
    assert path == tmp_path / f"hf/hub/models--{ORG}--tiny-GGUF/snapshots/{commit}/tiny-Q8_0.gguf"
    assert path.resolve().parent.name == "blobs" and path.resolve().name == hub.repos[f"{ORG}/tiny-GGUF"].files[
        "tiny-Q8_0.gguf"].sha256  # the blob is named by its sha256, as every tool sharing the cache expects
    assert [(r.method, r.kind) for r in hub.requests if r.kind != "api" or "/models/" in r.path] == [
        ("GET", "api"), ("HEAD", "resolve"), ("GET", "cdn")]
    # With no quant, llama.cpp's default; a revision pins a commit.
    assert hub_gguf(f"{ORG}/tiny-GGUF").name == "tiny-Q4_K_M.gguf"
    assert hub_gguf(f"{ORG}/tiny-GGUF", quant="F16", revision=commit).read_bytes() == tiny["tiny-F16.gguf"]
    # The Hub finds a repo named in any case; its own spelling names the folder in the cache.
    assert hub_gguf("EDGEKIT-test/TINY-gguf", quant="Q8_0") == path
    assert hub_gguf("EDGEKIT-test/TINY-gguf", quant="Q8_0", download=False) == path


def test_a_second_call_finds_the_file_in_the_cache_and_downloads_nothing(hub):
    first = hub_gguf(f"{ORG}/tiny-GGUF", quant="Q4_K_M")
    before = len(hub.seen("GET", "cdn"))
    assert hub_gguf(f"{ORG}/tiny-GGUF", quant="Q4_K_M") == first
    assert len(hub.seen("GET", "cdn")) == before == 1
    assert len(hub.seen("HEAD", "resolve")) == 2  # huggingface_hub asks whether the branch moved


def test_a_file_in_a_folder_and_a_split_gguf_come_whole(hub, tiny):
    path = hub_gguf(f"{ORG}/tiny-GGUF", file="IQ4_XS/tiny-IQ4_XS-00002-of-00003.gguf")
    assert path.name == "tiny-IQ4_XS-00001-of-00003.gguf"  # the part llama.cpp loads the others from
    assert sorted(p.name for p in path.parent.iterdir()) == [f"tiny-IQ4_XS-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for part in path.parent.iterdir():
        assert part.read_bytes() == tiny[part.name]
    split = gguf.GGUFReader(path).fields
    assert (split["split.no"].contents(), split["split.count"].contents()) == (0, 3)
    assert hub_gguf(f"{ORG}/tiny-GGUF", quant="iq4_xs") == path


def test_a_push_between_the_listing_and_the_download_is_checked_against_its_own_commit(hub, tiny):
    before = hub.repos[f"{ORG}/tiny-GGUF"]
    pushed = {"tiny-Q8_0.gguf": tiny["tiny-F16.gguf"]}  # new bytes under the old name
    hub.after_listing = lambda: hub.add_repo(f"{ORG}/tiny-GGUF", pushed)
    path = hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0")
    assert path.read_bytes() == tiny["tiny-F16.gguf"] and path.parent.name == hub.repos[f"{ORG}/tiny-GGUF"].commit
    assert [r.path.split("?")[0] for r in hub.seen(kind="api") if "/models/" in r.path] == [
        f"/api/models/{ORG}/tiny-GGUF/revision/main", f"/api/models/{ORG}/tiny-GGUF/revision/{path.parent.name}"]
    assert path.parent.name != before.commit


def test_download_false_uses_the_cache_only(hub, tiny):
    with pytest.raises(ModelNotFoundError) as absent:
        hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0", download=False)
    assert "run `edgekit models pull hf:edgekit-test/tiny-GGUF:Q8_0`" in str(absent.value)
    assert hub.seen(kind="resolve") == hub.seen(kind="cdn") == []
    fetched = hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0")
    seen = len(hub.requests)
    assert hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0", download=False) == fetched
    # With no quant, the pick among the cached files, as llama.cpp's offline: Q4_K_M is not there, Q8_0 is.
    assert hub_gguf(f"{ORG}/tiny-GGUF", download=False) == fetched
    # The picking is llama.cpp's on the cached files: the split model, by its quant or a later part.
    hub_gguf(f"{ORG}/tiny-GGUF", quant="IQ4_XS")
    seen = len(hub.requests)
    assert hub_gguf(f"{ORG}/tiny-GGUF", file="IQ4_XS/tiny-IQ4_XS-00003-of-00003.gguf", download=False).name == (
        "tiny-IQ4_XS-00001-of-00003.gguf")
    assert len(hub.requests) == seen


def test_hf_hub_offline_uses_the_cache_only(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotFoundError, match=f"HF_HUB_OFFLINE is set: unset it to download hf:{ORG}/tiny-GGUF"):
        hub_gguf(f"{ORG}/tiny-GGUF")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    fetched = hub_gguf(f"{ORG}/tiny-GGUF")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    seen = len(hub.requests)
    assert hub_gguf(f"{ORG}/tiny-GGUF") == fetched
    assert len(hub.requests) == seen


def test_a_hub_out_of_reach_is_said_and_the_cache_serves_what_it_has(hub, monkeypatch, tmp_path):
    fetched = hub_gguf(f"{ORG}/tiny-GGUF")
    hub.__exit__(None, None, None)  # the hub goes away (for good: the fixture's exit does nothing more)
    assert hub_gguf(f"{ORG}/tiny-GGUF") == fetched
    with pytest.raises(ModelFetchError, match=r"cannot reach the Hub at http://127\.0\.0\.1:\d+ .*HF_ENDPOINT"):
        hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0")


def test_every_call_to_the_hub_has_a_deadline(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)
    hub.stall_api = True  # the hub accepts the request and never answers
    with pytest.raises(ModelFetchError, match="stopped answering while fetching the file list .*HF_HUB_ETAG_TIMEOUT=1"):
        hub_gguf(f"{ORG}/tiny-GGUF")


def test_a_private_repo_needs_a_token_that_reads_it(hub, tiny, monkeypatch, tmp_path):
    hub.add_repo(f"{ORG}/private-GGUF", {"p-Q4_K_M.gguf": tiny["tiny-Q4_K_M.gguf"]}, token="hf_" + "a" * 34)
    hub.add_repo(f"{ORG}/other-GGUF", {"o-Q4_K_M.gguf": tiny["tiny-Q8_0.gguf"]}, token="hf_" + "b" * 34)
    with pytest.raises(ModelFetchError) as refused:
        hub_gguf(f"{ORG}/private-GGUF")
    assert str(refused.value) == (
        f"{ORG}/private-GGUF is not on {hub.url}, or it is private and no token was sent: check the repo's name; "
        "for a private repo, set HF_TOKEN to a token that can read it, or log in with `hf auth login` "
        "(`huggingface-cli login`)")
    monkeypatch.setenv("HF_TOKEN", "hf_" + "b" * 34)  # another user's
    with pytest.raises(ModelFetchError, match=r"or the token in use \(HF_TOKEN\) cannot read it"):
        hub_gguf(f"{ORG}/private-GGUF")
    monkeypatch.setenv("HF_TOKEN", "hf_" + "c" * 34)  # no one's
    with pytest.raises(ModelFetchError, match=r"refused the token in use \(HF_TOKEN\): it is invalid or expired"):
        hub_gguf(f"{ORG}/private-GGUF")
    monkeypatch.setenv("HF_TOKEN", "hf_" + "a" * 34)
    assert hub_gguf(f"{ORG}/private-GGUF").read_bytes() == tiny["tiny-Q4_K_M.gguf"]
    sent = {(r.kind, r.headers.get("authorization")) for r in hub.requests if "private" in r.path or r.kind == "cdn"}
    assert sent >= {("api", "Bearer hf_" + "a" * 34), ("resolve", "Bearer hf_" + "a" * 34), ("cdn", None)}
    # The stored login (`hf auth login` writes it under HF_HOME) serves as well.
    monkeypatch.delenv("HF_TOKEN")
    (tmp_path / "hf/token").write_text("hf_" + "b" * 34)
    assert hub_gguf(f"{ORG}/other-GGUF").read_bytes() == tiny["tiny-Q8_0.gguf"]


def test_a_gated_repo_says_how_to_get_in(hub, tiny):
    hub.add_repo(f"{ORG}/gated-GGUF", {"g-Q4_K_M.gguf": tiny["tiny-Q4_K_M.gguf"]}, gated=True)
    with pytest.raises(ModelFetchError, match=f"gated on {hub.url}: accept its conditions at {hub.url}/{ORG}/gated"):
        hub_gguf(f"{ORG}/gated-GGUF")


def test_what_the_hub_lacks_is_named(hub):
    with pytest.raises(ModelFetchError, match=f"{ORG}/no-such-GGUF is not on"):
        hub_gguf(f"{ORG}/no-such-GGUF")
    with pytest.raises(ModelNotFoundError, match=rf"{ORG}/tiny-GGUF on {hub.url} has no GGUF of quant Q2_K; "
                                                 r"it has: Q8_0, Q4_K_M, F16, IQ4_XS"):
        hub_gguf(f"{ORG}/tiny-GGUF", quant="Q2_K")
    with pytest.raises(ModelNotFoundError, match=r"has no file 'tiny-Q3_K_S\.gguf'; its GGUF files: tiny-Q8_0\.gguf"):
        hub_gguf(f"{ORG}/tiny-GGUF", file="tiny-Q3_K_S.gguf")
    with pytest.raises(ModelNotFoundError, match=f"{ORG}/tiny-GGUF has no revision 'v9' on"):
        hub_gguf(f"{ORG}/tiny-GGUF", revision="v9")
    assert hub.seen(kind="cdn") == []


@pytest.mark.parametrize(("args", "message"), [
    (("tiny-GGUF",), "a Hugging Face repo is named ORG/NAME"),
    ((f"{ORG}/tiny-GGUF", "Q4_K_M", "tiny-Q4_K_M.gguf"), "name a quant or a file"),
    ((f"{ORG}/tiny-GGUF", "Q4.K"), "not a quant name"),
    ((f"{ORG}/tiny-GGUF", None, "README.md"), "not a GGUF file"),
])
def test_a_malformed_request_is_refused_before_any_call(hub, args, message):
    repo, quant, file = (*args, None, None)[:3]
    with pytest.raises(ConfigError, match=message):
        hub_gguf(repo, quant=quant, file=file)
    assert hub.requests == []


# -- downloads that go wrong ---------------------------------------------------------------------

BIG = 24 << 20  # more than two of huggingface_hub's 10 MB reads: a cut after the first is resumed from it


@pytest.fixture()
def big(hub) -> bytes:
    data = random.Random(34).randbytes(BIG)
    hub.add_repo(f"{ORG}/big-GGUF", {"big-Q4_K_M.gguf": data})
    return data


def _leftovers(cache: Path) -> list[str]:
    """Files of the repo's cache that hold data (blobs, snapshots, temporary files)."""
    return sorted(p.name for p in cache.rglob("*") if p.is_file() and p.parent.name not in ("refs", ".locks"))


def test_a_cut_transfer_resumes_where_it_stopped(hub, big):
    hub.faults["big-Q4_K_M.gguf"] = "cut"  # the connection closes halfway through the first download
    path = hub_gguf(f"{ORG}/big-GGUF")
    assert path.read_bytes() == big
    first, again = hub.seen("GET", "cdn")
    assert "range" not in {k.lower() for k in first.headers}
    resumed = {k.lower(): v for k, v in again.headers.items()}["range"]
    assert resumed.startswith("bytes=") and 0 < int(resumed[6:].rstrip("-")) <= BIG // 2


def test_a_transfer_that_fails_leaves_nothing_and_the_next_call_starts_over(hub, big, tmp_path):
    hub.faults["big-Q4_K_M.gguf"] = "cut-then-503"  # cut, and the resumed request finds the CDN down
    with pytest.raises(ModelFetchError, match=r"answered 503 fetching big-Q4_K_M\.gguf of .*: try again later; "
                                              "nothing half-written was kept; run it again"):
        hub_gguf(f"{ORG}/big-GGUF")
    repo_cache = tmp_path / f"hf/hub/models--{ORG}--big-GGUF"
    assert _leftovers(repo_cache) == []
    del hub.faults["big-Q4_K_M.gguf"]
    assert hub_gguf(f"{ORG}/big-GGUF").read_bytes() == big
    assert "range" not in {k.lower() for k in hub.seen("GET", "cdn")[-1].headers}


def test_a_corrupt_download_is_refused_with_both_hashes_and_removed(hub, tiny, tmp_path):
    hub.faults["tiny-Q8_0.gguf"] = "corrupt"  # other bytes than the sha256 the hub announces
    expected = hub.repos[f"{ORG}/tiny-GGUF"].files["tiny-Q8_0.gguf"].sha256
    bad = bytearray(tiny["tiny-Q8_0.gguf"])
    bad[0] ^= 0xFF
    with pytest.raises(ModelIntegrityError) as refused:
        hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0")
    assert str(refused.value) == (
        f"tiny-Q8_0.gguf of {ORG}/tiny-GGUF, downloaded from {hub.url}, has sha256 {hashlib.sha256(bad).hexdigest()}, "
        f"but the Hub lists {expected}: it was removed from the cache. Run it again; if it recurs, what serves "
        "HF_ENDPOINT (a mirror, a proxy) hands out other bytes than the Hub lists")
    assert _leftovers(tmp_path / f"hf/hub/models--{ORG}--tiny-GGUF") == []
    with pytest.raises(ModelNotFoundError):
        hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0", download=False)
    del hub.faults["tiny-Q8_0.gguf"]
    assert hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0").read_bytes() == tiny["tiny-Q8_0.gguf"]


def test_a_file_kept_in_git_is_checked_by_its_blob_id(hub, tiny):
    hub.add_repo(f"{ORG}/git-GGUF", {"g-Q4_K_M.gguf": tiny["tiny-Q4_K_M.gguf"]}, lfs=False)
    assert hub_gguf(f"{ORG}/git-GGUF").read_bytes() == tiny["tiny-Q4_K_M.gguf"]
    hub.add_repo(f"{ORG}/git-bad-GGUF", {"g-Q4_K_M.gguf": tiny["tiny-Q4_K_M.gguf"]}, lfs=False)
    hub.faults["g-Q4_K_M.gguf"] = "corrupt"
    with pytest.raises(ModelIntegrityError, match="has git blob id [0-9a-f]{40}, but the Hub lists"):
        hub_gguf(f"{ORG}/git-bad-GGUF")


def test_a_download_the_disk_cannot_hold_is_refused_before_it_starts(hub):
    hub.faults["tiny-Q4_K_M.gguf"] = "huge"
    with pytest.raises(ModelFetchError, match=rf"no room for tiny-Q4_K_M\.gguf \({HUGE // 10**12:,}[\d,]+ MB\): "
                                              "the Hugging Face cache .* MB free; free some space there"):
        hub_gguf(f"{ORG}/tiny-GGUF")
    assert hub.seen(kind="cdn") == []


def test_a_disk_that_fills_during_the_download_leaves_nothing(hub, big, monkeypatch, tmp_path):
    """No small filesystem can be mounted here, so the disk fills where huggingface_hub writes: the
    file it downloads into refuses bytes past 16 MB with ENOSPC, as a full disk does."""
    import huggingface_hub.file_download as fd

    real_http_get = fd.http_get

    class FullDisk:
        def __init__(self, f):
            self.f, self.room = f, 16 << 20

        def write(self, data: bytes) -> int:
            if len(data) > self.room:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.room -= len(data)
            return self.f.write(data)

        def __getattr__(self, name: str):
            return getattr(self.f, name)

    def http_get(url: str, temp_file: BinaryIO, **kw) -> None:
        real_http_get(url, cast(BinaryIO, FullDisk(temp_file)), **kw)

    monkeypatch.setattr(fd, "http_get", http_get)
    with pytest.raises(ModelFetchError, match=r"no room for big-Q4_K_M\.gguf: the Hugging Face cache .* MB free; "
                                              r"free some space there, or set HF_HUB_CACHE to a disk with room"):
        hub_gguf(f"{ORG}/big-GGUF")
    assert _leftovers(tmp_path / f"hf/hub/models--{ORG}--big-GGUF") == []


# -- what the cache holds --------------------------------------------------------------------------


def test_the_cache_lists_its_gguf_models(hub, tiny):
    assert list_hub_cache() == []
    single = hub_gguf(f"{ORG}/tiny-GGUF", quant="Q8_0")
    split = hub_gguf(f"{ORG}/tiny-GGUF", quant="IQ4_XS")
    commit = hub.repos[f"{ORG}/tiny-GGUF"].commit
    listed = list_hub_cache()
    assert [(g.repo, g.file, g.path, g.quant, g.commit, g.refs, g.parts, g.complete) for g in listed] == [
        (f"{ORG}/tiny-GGUF", "IQ4_XS/tiny-IQ4_XS-00001-of-00003.gguf", split, "IQ4_XS", commit, ("main",), 3, True),
        (f"{ORG}/tiny-GGUF", "tiny-Q8_0.gguf", single, "Q8_0", commit, ("main",), 1, True),
    ]
    assert listed[0].size == sum(len(tiny[f"tiny-IQ4_XS-0000{i}-of-00003.gguf"]) for i in (1, 2, 3))
    assert listed[1].size == len(tiny["tiny-Q8_0.gguf"])
    (split.parent / "tiny-IQ4_XS-00002-of-00003.gguf").unlink()
    assert [g.complete for g in list_hub_cache()] == [False, True]
    with pytest.raises(ModelNotFoundError, match="without part.s. 2"):
        hub_gguf(f"{ORG}/tiny-GGUF", quant="IQ4_XS", download=False)
