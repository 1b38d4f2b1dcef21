"""Every GGUF header reader in edgekit, fuzzed: it returns, or raises ModelLoadError; never anything else.

GGUF files come from anywhere (a Hub repo, an Ollama store, a path someone typed), and a crafted
header once took `edgekit models list` down with a RecursionError (nested arrays). The cases: headers
built at random (nesting, lengths, counts, value types, magic and version, each sometimes a lie), a
valid header with values of other types (a NaN layer count, a token id past int64), and bit flips,
overwrites and truncations of two small valid headers: one written here, one by the `gguf` package.
A seeded generator, so a failure names the case that reproduces it.
"""

from __future__ import annotations

import json
import logging
import random
import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from _model_files import add_ollama_model
from typer.testing import CliRunner

from edgekit.cli.app import app
from edgekit.errors import ModelLoadError
from edgekit.models.compat import check_pair, tokenizer_of
from edgekit.models.refs import _checked_gguf  # private: every GGUF header reader, fuzzed
from edgekit.runtime import MemoryNeed, model_memory_need, read_metadata

SEED = 66
CASES = 1500  # of each kind: built, and mutated from each valid file

ARCH = "llama"
KEYS = [  # what the readers look for, and some they do not
    "general.architecture", "general.name", f"{ARCH}.block_count", f"{ARCH}.embedding_length",
    f"{ARCH}.attention.head_count", f"{ARCH}.attention.head_count_kv", f"{ARCH}.attention.key_length",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "x.y", "",
]
ITEM_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "x.y")
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
U64 = (1 << 64) - 1


def _string(text: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if length is None else length) + text


class Header:
    """A GGUF header drawn at random: mostly well formed, each field sometimes a lie."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def count(self, true: int) -> int:
        """`true`, or now and then a count the bytes do not hold."""
        r = self.rng.random()
        if r < 0.85:
            return true
        return self.rng.choice([true + 1, true + 1000, 1 << 31, 1 << 40, U64, U64 // 12, max(true - 1, 0)])

    def text(self) -> bytes:
        r = self.rng.random()
        if r < 0.7:
            return self.rng.choice([b"gpt2", b"llama", b"a", b"", b"\xff\xfe", "\u00e9\u4e2d".encode(), b"[PAD3]"])
        return self.rng.randbytes(self.rng.randrange(0, 40))

    def value(self, kind: int, depth: int) -> bytes:
        rng = self.rng
        if kind in SCALARS:
            size = struct.calcsize(SCALARS[kind])
            if kind in (6, 12) and rng.random() < 0.3:
                return struct.pack(SCALARS[kind], rng.choice([float("nan"), float("inf"), -float("inf"), -1.0]))
            if rng.random() < 0.5:
                return rng.randbytes(size)
            return struct.pack(SCALARS[kind], rng.choice([0, 1, 3, 7]))
        if kind == STRING:
            text = self.text()
            return _string(text, self.count(len(text)))
        if kind == ARRAY:
            item = self.kind(depth + 1)
            n = rng.choice([0, 1, 2, 3, 5, 16])
            body = b"".join(self.value(item, depth + 1) for _ in range(n)) if item in (*SCALARS, STRING, ARRAY) else b""
            return struct.pack("<IQ", item, self.count(n)) + body
        return rng.randbytes(rng.randrange(0, 8))  # an unknown type's "value"

    def kind(self, depth: int) -> int:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(list(SCALARS))
        if r < 0.8:
            return STRING
        if r < 0.95 and depth < 4:
            return ARRAY
        return self.rng.choice([13, 255, 1 << 31, (1 << 32) - 1, ARRAY])

    def nested(self, depth: int) -> bytes:
        """An array of an array of ... `depth` deep: what once recursed until RecursionError."""
        return struct.pack("<IQ", ARRAY, 1) * depth + struct.pack("<IQ", 4, 1) + struct.pack("<I", 7)

    def build(self) -> bytes:
        rng = self.rng
        kvs = []
        for _ in range(rng.randrange(0, 10)):
            key = rng.choice(KEYS).encode() if rng.random() < 0.9 else rng.randbytes(rng.randrange(0, 12))
            if rng.random() < 0.03:
                kind, value = ARRAY, self.nested(rng.choice([2, 3, 50, 3000]))
            else:
                kind = self.kind(0)
                value = self.value(kind, 0)
            kvs.append(_string(key, self.count(len(key))) + struct.pack("<I", kind) + value)
        magic = b"GGUF" if rng.random() < 0.95 else rng.choice([b"GGUG", b"FUGG", b"\0\0\0\0", b"GGU"])
        version = 3 if rng.random() < 0.85 else rng.choice([0, 1, 2, 4, 0x03000000, U64 >> 32])
        tensors = rng.choice([0, 0, 1, 2]) if rng.random() < 0.9 else rng.choice([1 << 20, 1 << 60, U64])
        header = magic + struct.pack("<IQQ", version, tensors, self.count(len(kvs))) + b"".join(kvs)
        if rng.random() < 0.2:
            header = header[: rng.randrange(0, len(header) + 1)]
        return header


def valid_kvs() -> list[tuple[str, int, bytes]]:
    """A small valid header's keys, types and values: everything the readers read."""
    tokens = [b"<s>", b"a", b"b", b"ab", b"[PAD4]"]
    return [
        ("general.architecture", STRING, _string(ARCH.encode())),
        (f"{ARCH}.block_count", 4, struct.pack("<I", 2)),
        (f"{ARCH}.embedding_length", 4, struct.pack("<I", 8)),
        (f"{ARCH}.attention.head_count", 4, struct.pack("<I", 2)),
        ("tokenizer.ggml.model", STRING, _string(b"gpt2")),
        ("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, len(tokens)) + b"".join(map(_string, tokens))),
        ("tokenizer.ggml.token_type", ARRAY, struct.pack("<IQ", 5, 5) + struct.pack("<5i", 3, 1, 1, 1, 5)),
        ("tokenizer.ggml.merges", ARRAY, struct.pack("<IQ", STRING, 1) + _string(b"a b")),
        ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 0)),
    ]


def valid_header(kvs: list[tuple[str, int, bytes]] | None = None) -> bytes:
    """`kvs` (by default `valid_kvs()`) as a header, one tensor's info after it."""
    kvs = valid_kvs() if kvs is None else kvs
    body = b"".join(_string(k.encode()) + struct.pack("<I", kind) + v for k, kind, v in kvs)
    tensor = _string(b"t") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<I", 0) + struct.pack("<Q", 0)
    return b"GGUF" + struct.pack("<IQQ", 3, 1, len(kvs)) + body + tensor


def retyped(rng: random.Random) -> bytes:
    """The valid header with a value or two of another type, or of the same type and any bits (a NaN
    layer count, a token id past int64): well formed, and still no model."""
    kvs = valid_kvs()
    header = Header(rng)
    for _ in range(rng.randrange(1, 3)):
        i = rng.randrange(len(kvs))
        kind = kvs[i][1] if rng.random() < 0.3 else rng.choice([*SCALARS, STRING, ARRAY])
        kvs[i] = (kvs[i][0], kind, header.value(kind, 0))
    return valid_header(kvs)


def package_header(folder: Path) -> bytes:
    """A valid GGUF as llama.cpp's converter writes it (the `gguf` package), with a tokenizer and a tensor."""
    path = folder / "package.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_block_count(1)
    w.add_embedding_length(4)
    w.add_head_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["a", "b", "ab", "[PAD3]"])
    w.add_token_types([1, 1, 1, 5])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        r = rng.random()
        if r < 0.45:  # bit flips
            for _ in range(rng.randrange(1, 9)):
                i = rng.randrange(len(out))
                out[i] ^= 1 << rng.randrange(8)
        elif r < 0.65:  # a field overwritten: a length or count turned huge, a type turned unknown
            i = rng.randrange(len(out))
            out[i : i + 8] = rng.choice([b"\xff" * 8, b"\x09\0\0\0", b"\0" * 8, struct.pack("<Q", 1 << 40)])
        elif r < 0.85:  # cut short
            del out[rng.randrange(len(out)) :]
        else:  # bytes dropped from the middle
            i = rng.randrange(len(out))
            del out[i : i + rng.randrange(1, 16)]
        if not out:
            break
    return bytes(out)


READERS: list[tuple[str, Callable[[Path], object]]] = [
    ("read_metadata", lambda p: read_metadata(p)),
    ("read_metadata items", lambda p: read_metadata(p, items=ITEM_KEYS)),
    ("read_metadata until", lambda p: read_metadata(p, until="tokenizer.")),
    ("read_metadata keys", lambda p: read_metadata(p, ["general.architecture", "x.y"], items=("x.y",))),
    ("tokenizer_of", tokenizer_of),
    ("check_pair", lambda p: check_pair(p, p)),
    ("_checked_gguf", lambda p: _checked_gguf(p, str(p))),
]


def read_every_way(path: Path, case: str) -> None:
    for name, reader in READERS:
        try:
            reader(path)
        except ModelLoadError:
            pass
        except Exception as exc:  # anything else is the failure this test looks for
            raise AssertionError(f"{name} on {case}: {type(exc).__name__}: {exc}") from exc
    need = model_memory_need(path, 4096, case)  # None where the file cannot be sized, never an error
    assert need is None or isinstance(need, MemoryNeed), case


def test_random_headers(tmp_path):
    rng = random.Random(SEED)
    path = tmp_path / "case.gguf"
    header = Header(rng)
    for case in range(CASES):
        path.write_bytes(header.build())
        read_every_way(path, f"built header {case} (seed {SEED})")


def test_valid_headers_with_values_of_other_types(tmp_path):
    rng = random.Random(SEED)
    path = tmp_path / "case.gguf"
    for case in range(CASES):
        path.write_bytes(retyped(rng))
        read_every_way(path, f"retyped header {case} (seed {SEED})")


@pytest.mark.parametrize("base", ["edgekit", "gguf package"])
def test_mutations_of_a_valid_header(tmp_path, base):
    data = valid_header() if base == "edgekit" else package_header(tmp_path)
    path = tmp_path / "case.gguf"
    path.write_bytes(data)
    assert tokenizer_of(path).vocab_size in (4, 5)  # the base itself reads
    rng = random.Random(SEED)
    for case in range(CASES):
        path.write_bytes(mutate(rng, data))
        read_every_way(path, f"mutation {case} of the {base} header (seed {SEED})")


def test_deeply_nested_arrays_are_refused_not_recursed(tmp_path):
    path = tmp_path / "nested.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string(b"x.y") + struct.pack("<I", ARRAY)
                     + Header(random.Random(0)).nested(100_000))
    with pytest.raises(ModelLoadError, match="damaged GGUF metadata .*nested"):
        read_metadata(path)


@pytest.mark.parametrize(("header", "message"), [
    (b"GGUF" + struct.pack("<IQQ", 3, 0, U64), "keys and .* tensors cannot fit"),
    (b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0), "tensors cannot fit"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string(b"k") + struct.pack("<IIQ", ARRAY, STRING, 1 << 50),
     "an array of .* items cannot fit"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 20) + b"k" * 24, "a key of 1,048,576 bytes"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string(b"k") + struct.pack("<I", 13) + b"\0" * 8,
     "unknown GGUF value type 13"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string(b"k") + struct.pack("<IIQ", ARRAY, 99, 1) + b"\0" * 8,
     "array of unknown GGUF value type 99"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "GGUF version 50331648 is not supported"),  # big-endian
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "GGUF version 1 is not supported"),
    (b"GGUF\x03\0\0\0", "the header is cut short"),
    (b"PK\x03\x04 a zip", "not a GGUF file"),
])
def test_what_is_wrong_is_said(tmp_path, header, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(header)
    with pytest.raises(ModelLoadError, match=message):
        read_metadata(path)


def test_models_list_lists_the_others_and_reports_the_broken_files(tmp_path, monkeypatch, caplog):
    from huggingface_hub import constants

    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "no-hub"))
    store = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    good = tmp_path / "good.gguf"
    good.write_bytes(package_header(tmp_path))
    add_ollama_model(store, good, "good")
    rng = random.Random(SEED)
    broken = {
        "nested": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string(b"general.nested")
        + struct.pack("<I", ARRAY) + Header(rng).nested(5000),
        "counts": b"GGUF" + struct.pack("<IQQ", 3, U64, U64) + b"\0" * 64,
        "cut": good.read_bytes()[:200],
        "flipped": mutate(rng, good.read_bytes()),
        "not-gguf": b"PK\x03\x04" + bytes(100),
    }
    for name, data in broken.items():
        (tmp_path / f"{name}.gguf").write_bytes(data)
        add_ollama_model(store, tmp_path / f"{name}.gguf", name)
    with caplog.at_level(logging.WARNING, logger="edgekit.models"):
        result = CliRunner().invoke(app, ["models", "list", "--json"])
    assert result.exit_code == 0, result.output
    local = {m["ref"]: m for m in json.loads(result.stdout)["local"]}
    assert local["ollama:good:latest"]["tokenizer"] == "3 tokens + 1 padding, BPE model 'gpt2'"
    for name in ("nested", "counts", "cut", "not-gguf"):
        assert local[f"ollama:{name}:latest"]["tokenizer"] == "", name  # listed, as unreadable
        assert any(f"ollama:{name}:latest" in r.getMessage() for r in caplog.records), name
    result = CliRunner().invoke(app, ["models", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "unreadable" in result.stdout, result.output
