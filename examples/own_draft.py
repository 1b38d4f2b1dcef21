"""Use your own model as the draft: a GGUF file, a Hub reference or a model in Ollama's store.

The draft must share the target's tokenizer: with a local verifier both GGUF headers are
checked before any weights load; with a remote one, its handshake checks it. Either way
the error names both models.

    python examples/own_draft.py ~/models/my-draft.gguf --verifier 10.0.0.5:50551
    python examples/own_draft.py hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M --verifier 10.0.0.5:50551
    python examples/own_draft.py ollama:qwen2.5:0.5b --target ~/models/qwen2.5-7b-instruct-q4_k_m.gguf
"""

import argparse

from edgekit import EdgeClient, EdgekitError, GenerationConfig

parser = argparse.ArgumentParser()
parser.add_argument("draft", help="the draft: a GGUF path, hf:ORG/REPO:QUANT, ollama:NAME[:TAG] or a registry name")
parser.add_argument("--verifier", default=None)
parser.add_argument("--target", default=None, help="without --verifier: the target to serve here (a reference)")
parser.add_argument("--pair", default="qwen-coder", help="without --verifier or --target: whose target to serve")
parser.add_argument("--prompt", default="Explain speculative decoding in one sentence:")
args = parser.parse_args()

try:
    with EdgeClient(
        args.verifier, pair=args.pair, draft=args.draft, target=args.target,
        generation=GenerationConfig(max_tokens=48), draft_context=2048,
    ) as client:
        info = client.server_info()  # refuses a draft whose tokenizer differs from the target's
        print(f"draft {client.draft.name} ({client.draft.n_embd}-dim) -> target {info.target_model}")
        final = client.generate(args.prompt).until_done()
        print(final.text)
        print(f"acceptance {final.stats.acceptance_rate:.2f}, accepted length {final.stats.accepted_length:.2f}")
except EdgekitError as exc:
    raise SystemExit(f"error: {exc}") from None
