"""Profiling the engine for the verification-time estimator (WISP appendix C).

`profile_batches` runs batches of the three kinds a verifier meets on the
engine itself, each timed as the engine core times it (`run_batch`): cold
prefill chunks (nothing cached), warm follow-up rounds (a few new tokens on a
long cached prefix, several sessions to a batch) and mixes of both. Sequences
are filled to spread cached lengths first; every trial's feed starts at its
sequence's cached length, so the next trial cuts what the last one added. Runs
before the engine serves (or on an engine of its own): it uses the sequences
freely and empties them at the end.

`calibrated_estimator` loads a calibration measured on the same model,
numerics, threads, CPU and llama.cpp, or measures and caches one.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..__version__ import __version__
from ._estimator import VerifyTimeEstimator, batch_features
from .engine import Engine, Feed, cpu_name, default_calibration_dir

__all__ = [
    "DECODE_STEP_CONTEXT",
    "calibrated_estimator",
    "calibration_key",
    "default_calibration_dir",
    "profile_batches",
    "time_decode_step",
]

log = logging.getLogger("edgekit.verifier")

KINDS = ("cold", "warm", "mixed")
DECODE_STEP_CONTEXT = 64  # cached tokens of the step a verifier says it takes (a short chat's)


def calibration_key(engine: Engine, threads: int | None) -> dict[str, object]:
    """What a calibration holds for: another model, numerics, thread count or CPU needs its own."""
    return {
        "engine": engine.identity,
        "exact": engine.exact,
        "invariant_batch": engine.invariant_batch,
        "threads": threads or 0,
        "cpu": cpu_name(),
        "edgekit": __version__,
    }


def profile_batches(
    engine: Engine,
    *,
    n_seq: int,
    max_context: int,
    max_block: int,
    prefill_chunk: int,
    trials: int = 60,
    seed: int = 0,
    kinds: tuple[str, ...] = KINDS,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Times `trials` random batches; returns their features [n, 5], milliseconds [n] and kinds."""
    if n_seq < 3:
        raise ValueError("profiling needs at least three sequences (two cold, one warm)")
    rng = np.random.default_rng(seed)
    cold = [0, 1]
    warm = list(range(2, min(n_seq, 10)))
    top = max(8, min(max_context - max_block - 2, 2048))
    levels = np.linspace(min(32, top), top, len(warm)).astype(int)

    def tokens(n: int) -> tuple[int, ...]:
        return _random_tokens(rng, engine.n_vocab, n)

    try:
        for seq, level in zip(warm, levels):
            for lo in range(0, int(level), 512):  # fill in chunks, as a served prompt is
                engine.run_batch([Feed(seq, lo, tokens(min(512, int(level) - lo)), 0)])
        engine.run_batch([Feed(warm[0], int(levels[0]), tokens(4), 4)])  # warm-up, not timed
        feats, ms, kind_of = [], [], []
        for i in range(trials):
            kind = kinds[i % len(kinds)]
            feeds: list[Feed] = []
            if kind in ("cold", "mixed"):
                for seq in cold[: 1 if kind == "mixed" else int(rng.integers(1, 3))]:
                    feeds.append(Feed(seq, 0, tokens(int(rng.integers(8, prefill_chunk + 1))), 0))
            if kind in ("warm", "mixed"):
                chosen = rng.choice(len(warm), size=int(rng.integers(1, len(warm) + 1)), replace=False)
                for j in sorted(chosen):
                    n_new = int(rng.integers(1, min(max_block, 16) + 2))
                    feeds.append(Feed(warm[j], int(levels[j]), tokens(n_new), n_new))
            t0 = time.perf_counter()
            engine.run_batch(feeds)
            ms.append((time.perf_counter() - t0) * 1e3)
            feats.append(batch_features(feeds))
            kind_of.append(kind)
            if progress is not None:
                progress(i + 1, trials)
        return np.array(feats), np.array(ms), kind_of
    finally:
        for seq in cold + warm:
            engine.release(seq)


def _random_tokens(rng: np.random.Generator, n_vocab: int, n: int) -> tuple[int, ...]:
    """`n` token ids past the first ten (control tokens, in most vocabularies) where there are more."""
    return tuple(int(t) for t in rng.integers(min(10, n_vocab - 1), n_vocab, n))


def time_decode_step(engine: Engine, *, context: int = DECODE_STEP_CONTEXT, tries: int = 3, seed: int = 0) -> float:
    """What one target step of one sequence takes (ms): the least of `tries` one-token steps with
    logits after `context` cached tokens, after one that pays for what the engine sets up once.
    Runs before the engine serves, on sequence 0, emptied at the end."""
    tokens = _random_tokens(np.random.default_rng(seed), engine.n_vocab, context + tries + 1)
    try:
        engine.run_batch([Feed(0, 0, tuple(tokens[:context]), 0)])
        engine.run_batch([Feed(0, context, (tokens[context],), 1)])
        best = float("inf")
        for i in range(1, tries + 1):
            t0 = time.perf_counter()
            engine.run_batch([Feed(0, context + i, (tokens[context + i],), 1)])
            best = min(best, time.perf_counter() - t0)
    finally:
        engine.release(0)
    return 1e3 * best


def calibrated_estimator(
    engine: Engine,
    *,
    n_seq: int,
    max_context: int,
    max_block: int,
    prefill_chunk: int,
    threads: int | None,
    cache_dir: Path,
    measure: bool = True,
    force: bool = False,
    trials: int = 60,
) -> VerifyTimeEstimator:
    """The estimator for `engine`, from the cached calibration for this machine or a new one
    (`measure`; `force` measures again). Without either, it starts empty and learns online."""
    key = calibration_key(engine, threads)
    digest = hashlib.sha256(repr(sorted(key.items())).encode()).hexdigest()[:16]
    path = cache_dir / f"estimator-{digest}.json"
    samples = None if force else VerifyTimeEstimator.load_samples(path, key)
    if samples is None and measure and n_seq < 3:
        log.warning("%d sequences are too few to calibrate the verification-time estimator (it needs 3); "
                    "it learns from the live batches", n_seq)
    elif samples is None and measure:
        log.info(
            "calibrating the verification-time estimator on %s (%d batches, cached in %s)",
            engine.name,
            trials,
            path,
        )
        t0 = time.perf_counter()
        feats, ms, _ = profile_batches(
            engine,
            n_seq=n_seq,
            max_context=max_context,
            max_block=max_block,
            prefill_chunk=prefill_chunk,
            trials=trials,
        )
        samples = (feats, ms)
        estimator = VerifyTimeEstimator(prior=samples)
        try:
            estimator.save(path, feats, ms, key)
        except OSError as exc:  # a read-only or full disk: the calibration still serves this run
            log.warning("could not cache the estimator's calibration at %s: %s", path, exc)
        log.info("calibrated in %.1f s: %s", time.perf_counter() - t0, estimator.coefficients)
        return estimator
    return VerifyTimeEstimator(prior=samples)
