"""The `edgekit` Typer application and its error boundary."""

from __future__ import annotations

import typer

from edgekit.errors import EdgekitError

from . import api, chat, device, generate, models, plan, predictor, probe, profile, semantic, serve

app = typer.Typer(
    name="edgekit",
    help="Distributed speculative decoding: a draft model on this device, a verifier with the target model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("chat")(chat.chat)
app.command("generate")(generate.generate)
app.command("serve")(serve.serve)
app.command("profile")(profile.profile)
app.command("probe")(probe.probe)
app.command("plan")(plan.plan)
app.command("device")(device.device)
app.command("api")(api.api)
app.add_typer(models.app, name="models")
app.add_typer(predictor.app, name="predictor")
app.add_typer(semantic.app, name="semantic")


def fail(message: str, code: int = 1) -> typer.Exit:
    """One line on stderr, no traceback."""
    typer.echo(f"edgekit: error: {message}", err=True)
    return typer.Exit(code)


def main() -> None:
    try:
        app()
    except EdgekitError as exc:
        raise SystemExit(fail(str(exc)).exit_code) from None
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
