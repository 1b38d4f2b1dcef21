"""Models from the Hugging Face Hub: llama.cpp's rules for which GGUF of a repo to load."""

from __future__ import annotations

import pytest

from edgekit.errors import ModelNotFoundError
from edgekit.models._gguf_pick import pick_gguf

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
