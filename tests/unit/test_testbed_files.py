"""respawn.testbed.files: files replaced whole."""

from __future__ import annotations

from pathlib import Path

from respawn.testbed.files import replace_atomically


def test_a_file_is_replaced_whole_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    target = tmp_path / "tls.crt"
    replace_atomically(target, b"first")
    replace_atomically(target, "second")
    assert target.read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["tls.crt"]
