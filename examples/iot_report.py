"""An asyncio loop on an IoT device: sensor readings in, a short report out, via the verifier.

The readings here are simulated; replace `read_sensors` with your driver. The
event loop keeps sampling while the model drafts and the verifier checks.

    python examples/iot_report.py --verifier 10.0.0.5:50551 --cycles 3
"""

import argparse
import asyncio
import random
import time

from edgekit import AsyncEdgeClient, EdgekitError, GenerationConfig


async def read_sensors(rng: random.Random) -> dict:
    await asyncio.sleep(0.05)  # an I/O-bound driver call
    return {"temperature_c": round(rng.gauss(21.5, 1.5), 1), "humidity_pct": round(rng.uniform(35, 60)),
            "co2_ppm": rng.randint(420, 1400)}


def prompt_for(readings: list[dict]) -> list[dict]:
    lines = "\n".join(f"- t+{i * 10}s: {r}" for i, r in enumerate(readings))
    return [
        {"role": "system", "content": "You write one-paragraph status reports for a room sensor. Be brief."},
        {"role": "user", "content": f"Readings:\n{lines}\nWrite the report; flag anything unusual."},
    ]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--verifier", default=None)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=80)
    args = parser.parse_args()
    rng = random.Random(7)
    gen = GenerationConfig(max_tokens=args.max_tokens)
    async with AsyncEdgeClient(args.verifier, pair=args.pair, generation=gen) as client:
        for cycle in range(args.cycles):
            readings = [await read_sensors(rng) for _ in range(3)]
            t0 = time.perf_counter()
            try:
                final = await client.chat(prompt_for(readings)).until_done()
            except EdgekitError as exc:  # a dead verifier must not kill the device loop
                print(f"[cycle {cycle}] no report: {exc}")
                continue
            print(f"[cycle {cycle}] {final.text.strip()}")
            print(f"[cycle {cycle}] {final.stats.completion_tokens} tokens in {time.perf_counter() - t0:.1f} s, "
                  f"acceptance {final.stats.acceptance_rate:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
