"""The decision head (WISV eqs. 23-27): training data, training, threshold, export.

Input (eq. 23): [h_draft, h_target, CSI features], the draft's and the target's
final-layer hidden rows at a mismatch and `csi_features` of the link; a head trained
`target_features=True` also reads the target's confidence there
(`confidence.TARGET_FEATURES`, between the hidden rows and the CSI). Output:
P(reject), the probability that the mismatch should be repaired. A mismatch is
rejected when P(reject) > threshold (eq. 27): threshold 0 rejects every
mismatch (greedy speculative decoding), threshold 1 none.

Training instances (sec. V-B): for each labelled episode, `draws` link states
are sampled (`csi.sample_links`), each gives a channel quality q, the episode's
relabeled actions under q (`relabel`, eqs. 28-31) are the targets, and every
mismatch becomes one instance with that link's CSI. The ablation without CSI
(WISV Fig. 5) trains on the base labels and the hidden rows alone.

Episodes are split by task (never a task in two parts); the held-out HumanEval
problems may not be in the traces at all (`make_dataset`'s callers refuse them). The model
is a two-layer MLP (linear, ReLU, dropout, linear, sigmoid; eqs. 24-25), trained
with Adam on class-weighted BCE (eq. 26) with weight decay, keeping the weights
of the best validation loss (`edgekit.predictors.train.train_mlp`).

The operating threshold is the largest at which the head, on the calibration
mismatches at a perfect link (q = 1), still rejects at least `critical_recall`
of the critical ones: the most permissive head that keeps the repairs a
strict verifier would need. Episodes are split by task three ways: training,
early stopping, and calibration (the threshold and the card's figures).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgekit.predictors.export import export_onnx
from edgekit.predictors.train import Mlp, auc, standardiser, train_mlp
from edgekit.protocol import LinkState
from edgekit.verifier import CSI_FEATURES, TARGET_FEATURES, SemanticHead, channel_quality, csi_features

from .collect import TraceSet
from .csi import sample_links
from .relabel import RelabelConfig, relabel_episode, sample_actions

__all__ = [
    "GOOD_LINK",
    "PERFECT_LINK",
    "POOR_LINK",
    "HeadData",
    "Projection",
    "evaluate",
    "export_head",
    "labelled_episodes",
    "link_only_head",
    "make_dataset",
    "pick_threshold",
    "split_episodes",
    "train_head",
]

# A link that costs nothing (q = 1): where the threshold is chosen.
PERFECT_LINK = LinkState()
# The two ends of the link testbed: the head must be more permissive on the second.
GOOD_LINK = LinkState(rtt_ms=5.0, uplink_mbps=500.0, downlink_mbps=500.0, samples=8)
POOR_LINK = LinkState(rtt_ms=50.0, uplink_mbps=20.0, downlink_mbps=20.0, samples=8)


@dataclass
class _Episode:
    index: int
    task_id: str
    positions: np.ndarray
    critical: np.ndarray
    h_draft: np.ndarray
    h_target: np.ndarray
    target_features: np.ndarray | None = None  # [m, len(TARGET_FEATURES)], where the traces have them


def labelled_episodes(traces: TraceSet) -> list[_Episode]:
    """The episodes whose every mismatch has its task-outcome label (relabeling needs whole episodes)."""
    labels = traces.labels()
    out = []
    for ep in traces.episodes:
        rows = traces.rows(ep["index"])
        pos = rows["positions"]
        if not len(pos) or any((ep["index"], int(p)) not in labels for p in pos):
            continue
        crit = np.array([labels[(ep["index"], int(p))]["critical"] for p in pos], dtype=bool)
        out.append(
            _Episode(ep["index"], ep["task_id"], pos, crit, rows["h_draft"].astype(np.float32),
                     rows["h_target"].astype(np.float32), rows.get("target_features"))
        )
    return out


def split_episodes(
    episodes: list[_Episode], shares: tuple[float, ...] = (0.6, 0.2, 0.2), seed: int = 0
) -> list[list[_Episode]]:
    """Episodes split by task id into parts of about these shares (a seeded hash, stable as traces
    grow): by default training, early stopping, and calibration (the threshold and the card's
    figures). No part is left empty while there are episodes enough to fill them all."""
    bounds = np.cumsum(shares) / sum(shares)
    parts: list[list[_Episode]] = [[] for _ in shares]
    for e in episodes:
        h = int.from_bytes(hashlib.sha256(f"{seed}:{e.task_id}".encode()).digest()[:4], "little") / 2**32
        parts[min(int(np.searchsorted(bounds, h, side="right")), len(parts) - 1)].append(e)
    for part in parts:  # an empty part takes an episode from the largest
        if not part and len(episodes) >= len(parts):
            largest = max(range(len(parts)), key=lambda j: len(parts[j]))
            part.append(parts[largest].pop())
    return parts


@dataclass
class HeadData:
    x: np.ndarray  # [n, features]
    y: np.ndarray  # 1: reject (repair)
    critical: np.ndarray  # the base label of each instance's mismatch
    quality: np.ndarray  # q of the instance's link (1 without CSI)
    episode: np.ndarray


def _inputs(e: _Episode, target_features: bool) -> np.ndarray:
    """An episode's per-mismatch inputs before the CSI: the hidden rows (and the target's confidence)."""
    if not target_features:
        return np.hstack([e.h_draft, e.h_target])
    if e.target_features is None:
        raise ValueError(f"episode {e.index} ({e.task_id}) has no target confidence features: run "
                         "`edgekit semantic collect` on its trace directory again to add them")
    return np.hstack([e.h_draft, e.h_target, e.target_features])


def make_dataset(
    episodes: list[_Episode],
    *,
    csi: bool,
    target_features: bool = False,
    draws: int = 8,
    config: RelabelConfig = RelabelConfig(),
    seed: int = 0,
    links: list[LinkState] | None = None,
) -> HeadData:
    """Instances of the episodes: with `csi`, `draws` sampled links per episode (or each of
    `links`), relabeled (eq. 31); without, the base labels. With `target_features`, the target's
    confidence follows the hidden rows."""
    rng = np.random.default_rng(seed)
    xs, ys, cs, qs, es = [], [], [], [], []
    for e in episodes:
        hid = _inputs(e, target_features)
        if not csi:
            xs.append(hid)
            ys.append(e.critical.astype(np.float64))
            cs.append(e.critical)
            qs.append(np.ones(len(hid)))
            es.append(np.full(len(hid), e.index))
            continue
        for link in links if links is not None else sample_links(draws, rng):
            q = channel_quality(link)
            pi = relabel_episode(e.positions, e.critical, q, config)
            feats = np.broadcast_to(csi_features(link), (len(hid), len(CSI_FEATURES)))
            xs.append(np.hstack([hid, feats]))
            ys.append(sample_actions(pi, rng) if links is None else pi)
            cs.append(e.critical)
            qs.append(np.full(len(hid), q))
            es.append(np.full(len(hid), e.index))
    if not xs:
        raise ValueError("no labelled episodes to build a dataset from")
    return HeadData(
        np.vstack(xs).astype(np.float32), np.concatenate(ys), np.concatenate(cs), np.concatenate(qs),
        np.concatenate(es),
    )


@dataclass
class Projection:
    """The first `rank` principal directions of the standardised hidden rows (the first
    `n_hidden` columns); the columns after them (the target's confidence, the CSI) pass
    through as they are."""

    n_hidden: int
    mean: np.ndarray
    scale: np.ndarray
    basis: np.ndarray  # [n_hidden, rank]

    @classmethod
    def fit(cls, x: np.ndarray, n_hidden: int, rank: int) -> Projection:
        h = np.asarray(x[:, :n_hidden], dtype=np.float64)
        mean, scale = standardiser(h)
        _, _, vt = np.linalg.svd((h - mean) / scale, full_matrices=False)
        return cls(n_hidden, mean, scale, vt[: min(rank, len(vt))].T.copy())

    def apply(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return np.hstack([((x[:, : self.n_hidden] - self.mean) / self.scale) @ self.basis, x[:, self.n_hidden :]])

    def fold(self, model: Mlp) -> Mlp:
        """The same function as `model` over `apply`'s output, as one MLP over the raw
        input: the projection is linear, so it folds into the first layer's weights
        (a rank-limited first layer) and the exported head keeps eqs. 24-25's shape."""
        k = self.basis.shape[1]
        w0, b0 = model.weights[0], model.biases[0]
        m_z, s_z = model.mean[:k], model.scale[:k]  # the MLP's own standardiser over the projection
        w_hid = self.basis @ (w0[:k] / s_z[:, None])
        return Mlp(
            np.concatenate([self.mean, model.mean[k:]]), np.concatenate([self.scale, model.scale[k:]]),
            [np.vstack([w_hid, w0[k:]]), *model.weights[1:]], [b0 - (m_z / s_z) @ w0[:k], *model.biases[1:]],
        )


def train_head(train: HeadData, val: HeadData, *, n_hidden: int, rank: int | None = 16, hidden: int = 32,
               dropout: float = 0.3, l2: float = 3e-3, seed: int = 0) -> Mlp:
    """Eqs. 24-26: linear, ReLU, dropout, linear, sigmoid; class-weighted BCE with weight decay.

    With `rank`, the MLP learns on the first `rank` principal directions of the hidden rows
    (fitted on the training instances) beside the CSI, and the projection is folded into its
    first layer. Thousands of hidden columns against four CSI ones and a few hundred labelled
    mismatches let the full-width MLP fit the rows and ignore the link (measured: the same
    P(reject) on the good and the poor link); the low-rank head does not."""
    x, xv = train.x.astype(np.float64), val.x.astype(np.float64)
    proj = Projection.fit(x, n_hidden, rank) if rank else None
    if proj is not None:
        x, xv = proj.apply(x), proj.apply(xv)
    model = train_mlp(
        x, train.y, xv, (val.y >= 0.5).astype(np.float64),
        hidden=(hidden,), lr=1e-3, batch=64, epochs=400, patience=40, l2=l2, seed=seed, dropout=dropout,
    )
    return proj.fold(model) if proj is not None else model


def features_for(
    episodes: list[_Episode], link: LinkState | None, *, target_features: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Every mismatch of the episodes under one link (None: no CSI input), and their base labels."""
    data = make_dataset(episodes, csi=link is not None, target_features=target_features,
                        links=[link] if link is not None else None)
    return data.x.astype(np.float64), data.critical.astype(np.float64)


def pick_threshold(p_reject: np.ndarray, critical: np.ndarray, critical_recall: float) -> float:
    """The largest threshold that still rejects `critical_recall` of the critical mismatches.
    It travels and is compared in float32 (the wire, the ONNX head): it sits a margin of 1e-6
    under the deciding score, rounded down to a float32."""
    crit = np.sort(p_reject[critical == 1])
    if not len(crit):
        return 0.5
    # reject when p > threshold: a threshold just under the k-th largest critical score rejects k of them
    k = int(np.ceil(critical_recall * len(crit)))
    if k == 0:
        return 1.0  # nothing need be rejected
    kth = float(crit[len(crit) - k]) - 1e-6
    return max(0.0, float(np.nextafter(np.float32(kth), np.float32(-1.0))))


def evaluate(model: Mlp, episodes: list[_Episode], threshold: float, *, csi: bool,
             target_features: bool = False) -> dict:
    """Validation figures: AUC of P(reject) for the base labels, and at the threshold on
    the good and the poor link the confusion and the share of mismatches accepted."""
    out: dict = {}
    for name, link in (("good_link", GOOD_LINK), ("poor_link", POOR_LINK)):
        x, crit = features_for(episodes, link if csi else None, target_features=target_features)
        p = model.predict(x)
        reject = p > threshold
        pos = crit == 1
        out[name] = {
            "quality": channel_quality(link),
            "auc": auc(crit, p),
            "mismatches": len(crit),
            "accepted_share": float((~reject).mean()) if len(crit) else 0.0,
            "confusion": {  # positive = critical
                "tp": int((reject & pos).sum()), "fn": int((~reject & pos).sum()),
                "tn": int((~reject & ~pos).sum()), "fp": int((reject & ~pos).sum()),
            },
        }
    return out


def export_head(
    model: Mlp,
    path: str | os.PathLike[str],
    *,
    draft_hidden: int,
    target_hidden: int,
    csi: bool,
    threshold: float,
    target_features: bool = False,
    metadata: dict[str, str] | None = None,
) -> Path:
    """ONNX with input `features` [N, draft + target hidden (+ target confidence) (+ CSI)] and
    output `p_reject` [N, 1]."""
    described = ",".join(
        [f"h_draft[{draft_hidden}]", f"h_target[{target_hidden}]", *(TARGET_FEATURES if target_features else ()),
         *(CSI_FEATURES if csi else ())]
    )
    meta = {
        "edgekit.kind": "semantic-head",
        "edgekit.draft_hidden": str(draft_hidden),
        "edgekit.target_hidden": str(target_hidden),
        "edgekit.target_features": ",".join(TARGET_FEATURES) if target_features else "",
        "edgekit.csi": ",".join(CSI_FEATURES) if csi else "",
    }
    meta.update(metadata or {})
    return export_onnx(
        model, path, feature_names=described, threshold=threshold, metadata=meta,
        output_name="p_reject", graph_name="edgekit-semantic-head",
    )


def link_only_head(
    path: str | os.PathLike[str],
    *,
    draft_hidden: int,
    target_hidden: int,
    slope: float = 10.0,
    bias: float = -5.0,
    threshold: float = 0.5,
    csi: bool = True,
    pair: str = "test",
) -> SemanticHead:
    """A semantic decision head (ONNX, `edgekit.verifier.SemanticHead`), for tests, whose P(reject) is
    sigmoid(slope * q + bias), q the link's channel quality: by default strict on a good link
    (q ~ 0.9: P ~ 0.98) and lenient on a poor one (q ~ 0.33: P ~ 0.15), whatever the hidden
    states. Without `csi`, P = sigmoid(bias) everywhere. Needs the `onnx` package."""
    width = draft_hidden + target_hidden + (len(CSI_FEATURES) if csi else 0)
    w0 = np.zeros((width, 2))
    if csi:
        w0[draft_hidden + target_hidden, 0] = slope  # the quality feature
    b0 = np.array([0.0, 1.0])  # unit 1 is the constant 1
    model = Mlp(np.zeros(width), np.ones(width), [w0, np.array([[1.0], [bias]])], [b0, np.zeros(1)])
    export_head(model, path, draft_hidden=draft_hidden, target_hidden=target_hidden, csi=csi,
                threshold=threshold, metadata={"edgekit.pair": pair})
    return SemanticHead(path)
