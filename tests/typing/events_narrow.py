"""Checked by mypy (`make typecheck`), never run: a check on `event.type` narrows an `Event`."""

from edgekit import Event


def text_of(event: Event) -> str:
    if event.type == "text":
        return event.text  # a TextDelta: mypy knows it has `text`
    if event.type == "final":
        return str(event.stats.finish_reason)  # FinalStats
    if event.type == "round":
        return str(event.stats.drafted)  # RoundEvent
    return ""
