"""Upload payloads: their sizes against WISV eqs. 3-9, and what the encodings lose.

Sizes: for each pair's hidden width and vocabulary, blocks of K = 1..16 real
draft tokens with real hidden states, as the client serializes them (FH's
message, SH's tokens-only first message, SH's second message with m rows, the
verifier's request for m positions and its verdict), against the formulas with
our encoding's b_tok, b_pos and b_h and the fixed fields of each message
measured once on empty messages (O_ul, O_dl). What is left is protobuf framing:
the tags and length prefixes of fields that empty messages leave out.

Errors: every drafting step's final-layer hidden state (what FH and SH upload),
fp16 and int8 (one float32 scale per row) against the float32 original: worst
absolute error, relative RMS error, lowest cosine similarity, bytes per row.
Writes benchmarks/results/payloads.json.
"""

from __future__ import annotations

import numpy as np

from benchmarks import harness as C
from edgekit import LlamaDraftModel
from edgekit.link import Overheads, PayloadModel, varint_bits
from edgekit.models import get_model, get_pair, model_path
from edgekit.protocol import (
    BlockRequest,
    LinkState,
    encode_hidden,
    encoding_error,
    hidden_answer_to_pb,
    pb,
    verify_request_to_pb,
)


def states(draft: LlamaDraftModel, prompt: str, steps: int) -> np.ndarray:
    tokens = draft.tokenize(prompt)
    draft.truncate(0)
    draft.prefill(tokens[:-1])
    feed, rows = [tokens[-1]], []
    for _ in range(steps):
        out = draft.eval(feed, hidden=True)
        rows.append(np.array(out.hidden, dtype=np.float32))
        feed = [int(np.argmax(out.logits))]
    return np.stack(rows)


def sizes(pair: str, rows: np.ndarray, tokens: list[int], encoding: str) -> list[dict]:
    """Measured bytes of each message against its formula, for K = 1..16 (m = ceil(K/2) mismatches)."""
    spec = get_model(get_pair(pair).draft)
    pm = PayloadModel.for_models(spec.hidden_size, spec.vocab_size, encoding, Overheads(0, 0))

    def block(k: int, upload: str) -> BlockRequest:
        return BlockRequest(
            session_id="s-" + "0" * 22, base_position=1234, draft_tokens=tokens[:k],
            link=LinkState(23.4, 3.2, 87.5, 312.0, 0.004, 120), round_index=57, upload=upload,
            hidden=rows[:k], hidden_encoding=encoding,
        )

    o_ul = 8 * verify_request_to_pb(block(0, "tokens")).ByteSize()
    o_dl = 8 * pb.VerifyResponse(verdict=pb.Verdict(committed_length=1300)).ByteSize()
    o_req = 8 * pb.VerifyResponse(hidden_request=pb.HiddenRequest(encoding=1)).ByteSize()
    out = []
    for k in (1, 2, 4, 8, 16):
        m = (k + 1) // 2
        positions = tuple(range(0, k, 2))[:m]
        tok_bits = sum(varint_bits(t) for t in tokens[:k])  # b_tok, id by id (the model's 24 bounds it)
        measured = {
            "fh": 8 * verify_request_to_pb(block(k, "fh")).ByteSize(),
            "sh_tokens": 8 * verify_request_to_pb(block(k, "sh")).ByteSize(),
            "sh_hidden": 8 * hidden_answer_to_pb(
                block(k, "sh"), encode_hidden(rows[list(positions)], encoding, positions)
            ).ByteSize(),
            "sh_request": 8 * pb.VerifyResponse(
                hidden_request=pb.HiddenRequest(positions=positions, encoding=1)
            ).ByteSize(),
            "feedback": 8 * pb.VerifyResponse(
                verdict=pb.Verdict(accepted=k - 1, next_token=tokens[k], committed_length=1300)
            ).ByteSize(),
        }
        o_ul2 = 8 * hidden_answer_to_pb(block(0, "sh"), encode_hidden(rows[:0], encoding)).ByteSize()
        formula = {
            "fh": tok_bits + k * pm.hidden_row() + o_ul,  # (5)
            "sh_tokens": tok_bits + o_ul,  # (7)
            "sh_hidden": m * pm.hidden_row() + o_ul2,  # (9)
            "sh_request": m * pm.position_bits + o_req,  # (8)
            "feedback": pm.position_bits + varint_bits(tokens[k]) + o_dl,  # (4)
        }
        out.append({"k": k, "m": m, "measured_bits": measured, "formula_bits": formula})
    return out


def main() -> None:
    ap = C.arguments(__doc__, pairs="gemma-270m,qwen-coder", prompts=8)
    ap.add_argument("--steps", type=int, default=32)
    args = C.parse(ap)
    prompts = C.load_prompts("eval", args.prompts)
    out, rows_out, size_rows = {}, [], []
    for pair in C.csv_list(args.pairs):
        spec = get_pair(pair)
        draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_ctx=1024)
        rows = np.concatenate([states(draft, p["prompt"], args.steps) for p in prompts])
        tokens = draft.tokenize(prompts[0]["prompt"] * 3, add_special=False)[:17]
        draft.close()
        out[pair] = {"rows": len(rows), "dim": rows.shape[1], "max_abs_value": float(np.abs(rows).max())}
        for enc in ("fp16", "int8"):
            err = encoding_error(rows, enc) | {"bytes_per_row": encode_hidden(rows[:1], enc).nbytes}
            out[pair][enc] = err
            rows_out.append([pair, enc, err["bytes_per_row"], err["max_abs"], err["rel_rms"], err["min_cosine"]])
            out[pair][enc]["sizes"] = sizes(pair, rows, tokens, enc)
            for r in out[pair][enc]["sizes"]:
                size_rows.append([pair, enc, r["k"], r["m"]] + [
                    f"{r['measured_bits'][key] // 8}/{r['formula_bits'][key] / 8:.0f}"
                    for key in ("fh", "sh_tokens", "sh_request", "sh_hidden", "feedback")
                ])
    print(C.table(["pair", "encoding", "bytes/row", "max abs error", "relative RMS", "min cosine"], rows_out, digits=6))
    print("\nmessage bytes, measured/formula (eqs. 5, 7, 8, 9, 4; the rest is protobuf framing)")
    print(C.table(["pair", "enc", "K", "m", "FH (5)", "SH tokens (7)", "SH request (8)", "SH rows (9)", "verdict (4)"],
                  size_rows))
    print(f"wrote {C.write_result('payloads', {'settings': vars(args), 'pairs': out})}")


if __name__ == "__main__":
    main()
