"""An OpenAI- and Ollama-compatible HTTP endpoint on the device (`edgekit api`): any app that
speaks the OpenAI API (/v1) or Ollama's (/api) drafts here and verifies on the verifier. Needs
the `api` extra (Starlette, uvicorn)."""

from __future__ import annotations

try:
    from ._app import create_app
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from ..errors import DependencyMissingError

    raise DependencyMissingError(exc.name or "starlette", "api") from exc

__all__ = ["create_app"]
