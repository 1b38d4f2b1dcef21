"""The smallest useful edgekit program: stream a completion, then print its figures.

    python examples/minimal.py                         # qwen-coder, local verifier
    python examples/minimal.py --pair gemma-270m --verifier 127.0.0.1:50551
"""

import argparse

from edgekit import EdgeClient, GenerationConfig

parser = argparse.ArgumentParser()
parser.add_argument("--pair", default="qwen-coder")
parser.add_argument("--verifier", default=None, help="HOST:PORT; omitted: start one on loopback")
parser.add_argument("--prompt", default="def is_prime(n):")
args = parser.parse_args()

with EdgeClient(args.verifier, pair=args.pair, generation=GenerationConfig(max_tokens=64)) as client:
    with client.generate(args.prompt) as stream:
        for event in stream:
            if event.type == "text":
                print(event.text, end="", flush=True)
    stats = stream.final.stats
    if stats.drafting == "target-only":  # "auto" found the verifier's own stream faster than drafting here
        print(f"\n\n{stats.completion_tokens} tokens streamed by the verifier's target, "
              f"{stats.tokens_per_second:.1f} tokens/s")
    else:
        print(f"\n\n{stats.completion_tokens} tokens in {stats.rounds} rounds, "
              f"acceptance {stats.acceptance_rate:.2f}, {stats.tokens_per_second:.1f} tokens/s")
