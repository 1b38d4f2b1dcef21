"""Use your own GGUF file as the draft model.

The draft must share the target's tokenizer; the handshake checks it and names
both models if not.

    python examples/own_draft.py ~/models/my-draft.gguf --verifier 10.0.0.5:50551
    python examples/own_draft.py my-draft.gguf --pair gemma-270m   # local verifier for the pair's target
"""

import argparse

from edgekit import EdgeClient, EdgekitError, GenerationConfig, LlamaDraftModel

parser = argparse.ArgumentParser()
parser.add_argument("draft", help="path to a GGUF draft model")
parser.add_argument("--pair", default="qwen-coder", help="whose target to start locally when --verifier is omitted")
parser.add_argument("--verifier", default=None)
parser.add_argument("--prompt", default="Explain speculative decoding in one sentence:")
args = parser.parse_args()

draft = LlamaDraftModel(args.draft, n_ctx=2048)
try:
    with EdgeClient(
        args.verifier, pair=args.pair, draft_model=draft, generation=GenerationConfig(max_tokens=48)
    ) as client:
        info = client.server_info()  # refuses a draft whose tokenizer differs from the target's
        print(f"draft {draft.name} ({draft.n_embd}-dim) -> target {info.target_model}")
        final = client.generate(args.prompt).until_done()
        print(final.text)
        print(f"acceptance {final.stats.acceptance_rate:.2f}, accepted length {final.stats.accepted_length:.2f}")
except EdgekitError as exc:
    raise SystemExit(f"error: {exc}") from None
finally:
    draft.close()
