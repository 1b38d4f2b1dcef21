"""An ordinary OpenAI-client app, unchanged but for where it points: at `edgekit api` on this
device, which drafts here and verifies on the verifier.

    edgekit api --verifier 10.0.0.5:50551 &          # or without --verifier: a local one
    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=none python examples/openai_app.py

Nothing below knows about edgekit; the speculation figures ride along in the usage.
"""

from __future__ import annotations

import sys

from openai import OpenAI


def main() -> None:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = client.models.list().data[0].id
    print(f"model: {model}")
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": sys.argv[1] if len(sys.argv) > 1 else "Write a haiku about rivers."}],
        max_tokens=64,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        usage = chunk.usage or usage
    print()
    if usage is not None:
        extra = usage.model_extra or {}
        print(f"{usage.completion_tokens} tokens; draft acceptance {extra.get('draft_acceptance_rate', 0):.2f}, "
              f"mean acceptance length {extra.get('mean_acceptance_length', 0):.2f}")


if __name__ == "__main__":
    main()
