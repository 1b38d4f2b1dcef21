"""The committed generated code is what proto/verifier.proto generates."""

from __future__ import annotations

import importlib.util

from _paths import ROOT


def _generator():
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_the_protocol_changes_nothing(tmp_path):
    gen = _generator()
    written = gen.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(gen.GENERATED)
    for path in written:
        committed = ROOT / "edgekit" / "protocol" / "_pb" / path.name
        assert path.read_text() == committed.read_text(), f"{committed} is stale: run python proto/generate.py"


def test_the_service_names_every_rpc():
    from edgekit.protocol import pb

    service = pb.DESCRIPTOR.services_by_name["Verifier"]
    assert service.full_name == "edgekit.verifier.v1.Verifier"
    assert {m.name for m in service.methods} == {
        "Handshake", "Ping", "OpenSession", "ExtendSession", "Verify", "Rounds", "CloseSession", "Generate"
    }
