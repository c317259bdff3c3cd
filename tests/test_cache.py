"""One cache location (issue 14, item 13): $RISE_NEMO_CACHE, else ~/.cache/rise_nemo — never the cwd."""

from __future__ import annotations

from pathlib import Path

from rise_nemo.cache import cache_dir
from rise_nemo.config import config_from_dict
from rise_nemo.orchestration.data import warm_start_cache_dir


def test_cache_dir_honours_the_environment_and_defaults_to_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RISE_NEMO_CACHE", str(tmp_path / "c"))
    assert cache_dir("warm_start") == (tmp_path / "c" / "warm_start").resolve()
    monkeypatch.delenv("RISE_NEMO_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == (tmp_path / "home" / ".cache" / "rise_nemo").resolve()


def test_the_warm_start_cache_does_not_depend_on_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("RISE_NEMO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cfg = config_from_dict({})
    places = set()
    for cwd in (tmp_path / "a", tmp_path / "b"):
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        places.add(warm_start_cache_dir(cfg))
    assert places == {(tmp_path / "xdg" / "rise_nemo" / "warm_start").resolve()}
    assert warm_start_cache_dir(config_from_dict({"data": {"warm_start_cache": None}})) is None
    assert warm_start_cache_dir(config_from_dict({"data": {"warm_start_cache": "x/y"}})) == Path("x/y")
