"""bench.codec measures every kind of message in every encoding, each read back as it was."""

from __future__ import annotations

from bench import codec


def test_every_kind_in_every_encoding_with_its_sizes() -> None:
    results = codec.run(rounds=2)
    assert set(results) == {m.KIND for m in codec.samples().values()}
    for kind, by_encoding in results.items():
        assert set(by_encoding) == {"msgpack", "json", "cloudevents"}, kind
        msgpack, as_json, cloudevents = (by_encoding[e] for e in ("msgpack", "json", "cloudevents"))
        assert msgpack["payload_bytes"] < as_json["payload_bytes"] == cloudevents["payload_bytes"]
        assert msgpack["header_bytes"] == 0 < as_json["header_bytes"] < cloudevents["header_bytes"]
        assert all(r["encode_us"] > 0 and r["decode_us"] > 0 for r in by_encoding.values())
    assert "| `verdict` | json |" in codec.table(results)
