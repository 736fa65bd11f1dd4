"""``paths.replace_file``: the one atomic write (the model file, the offline view, the state
directory's marker, the refit's and the what-if's results, a submitted job's script)."""
from __future__ import annotations

import stat

import pytest

from iadeep_cli.paths import replace_file


def test_the_new_text_replaces_the_old_whole_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "view.json"
    target.write_text("old")
    old_inode = target.stat().st_ino
    replace_file(target, "new ünïcode", mode=0o644, durable=True)
    assert target.read_text(encoding="utf-8") == "new ünïcode"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.stat().st_ino != old_inode   # renamed over, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.json"]


def test_bytes_are_written_as_they_are(tmp_path):
    target = tmp_path / "job.sh"   # a submitted script: any bytes, not only UTF-8
    replace_file(target, b"#!/bin/sh\r\necho \xff\n", mode=0o700, durable=True)
    assert target.read_bytes() == b"#!/bin/sh\r\necho \xff\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]


def test_a_reader_holding_the_old_file_keeps_reading_it_whole(tmp_path):
    target = tmp_path / "model.json"
    target.write_text("old model")
    with open(target, encoding="utf-8") as held:
        replace_file(target, "new model")
        assert held.read() == "old model"
    assert target.read_text() == "new model"


def test_a_failed_write_raises_oserror_and_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "model.json"   # a folder where the file should be: the rename fails
    target.mkdir()
    (target / "kept").write_text("old")
    with pytest.raises(OSError):
        replace_file(target, "new")
    assert (target / "kept").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]
    with pytest.raises(OSError):   # no folder to write in at all
        replace_file(tmp_path / "gone" / "model.json", "new")
