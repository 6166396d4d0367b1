"""Atomic file and folder writes: the old content stays until the new one is complete."""

import os

import pytest

from rapo_echo.atomic import replace_dir, write_text_atomic


def test_write_text_atomic_replaces_and_leaves_no_temp(tmp_path) -> None:
    path = tmp_path / "sub" / "a.txt"
    write_text_atomic(path, "one")
    write_text_atomic(path, "two")
    assert path.read_text() == "two" and os.listdir(path.parent) == ["a.txt"]


def test_replace_dir_swaps_in_the_staged_folder(tmp_path) -> None:
    final, staged = tmp_path / "final", tmp_path / "staged"
    final.mkdir()
    (final / "old.txt").write_text("old")
    staged.mkdir()
    (staged / "new.txt").write_text("new")
    replace_dir(staged, final)
    assert sorted(os.listdir(final)) == ["new.txt"] and not staged.exists()


def test_replace_dir_removes_the_staged_folder_when_the_move_fails(tmp_path, monkeypatch) -> None:
    final, staged = tmp_path / "final", tmp_path / "staged"
    staged.mkdir()

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        replace_dir(staged, final)
    assert not staged.exists() and not final.exists()


def test_replace_dir_keeps_the_old_folder_when_the_move_fails(tmp_path, monkeypatch) -> None:
    final, staged = tmp_path / "final", tmp_path / "staged"
    final.mkdir()
    (final / "old.txt").write_text("old")
    staged.mkdir()
    real = os.replace

    def refuse_staged(src, dst):
        if os.fspath(src) == os.fspath(staged):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(os, "replace", refuse_staged)
    with pytest.raises(OSError, match="disk full"):
        replace_dir(staged, final)
    assert os.listdir(final) == ["old.txt"] and not staged.exists()
    assert sorted(os.listdir(tmp_path)) == ["final"]
