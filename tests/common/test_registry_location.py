"""Where the registry is: a relative SQLite path means the repo folder to featurectl but the current folder to
Feast, so featurectl warns once; `${HOME}` means the same to both; the SQLite file's folder is made."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from common.config import ConfigError, load_config


def _repo(folder: Path, registry_path: str) -> Path:
    repo = folder / "repo"
    repo.mkdir()
    (repo / "feature_store.yaml").write_text(f"project: where\nregistry:\n  registry_type: sql\n"
                                             f"  path: {registry_path}\n")
    return repo


def test_a_relative_sqlite_path_is_the_repo_folders_with_one_warning(tmp_path, caplog):
    repo = _repo(tmp_path, "sqlite:///../state/registry.db")
    with caplog.at_level(logging.WARNING, logger="common.config"):
        first, second = load_config(repo), load_config(repo)
    assert first.registry_url == second.registry_url == f"sqlite:///{tmp_path / 'state' / 'registry.db'}"
    assert (tmp_path / "state").is_dir()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert "registry.path sqlite:///../state/registry.db is relative" in warnings[0]
    assert "Feast's own CLI and SDK against the current folder" in warnings[0]
    assert "sqlite:///${HOME}/.featurectl/registry.db" in warnings[0]


def test_home_in_the_path_is_expanded_and_overrides_neither_warn_nor_change(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = _repo(tmp_path, "sqlite:///${HOME}/.featurectl/registry.db")
    with caplog.at_level(logging.WARNING, logger="common.config"):
        assert load_config(repo).registry_url == f"sqlite:///{tmp_path / 'home' / '.featurectl' / 'registry.db'}"
        assert (tmp_path / "home" / ".featurectl").is_dir()
        override = load_config(repo, registry_override="sqlite:///other.db").registry_url
        assert override == f"sqlite:///{repo / 'other.db'}"
        monkeypatch.setenv("FEATURECTL_REGISTRY", "postgresql://u@127.0.0.1:1/db")
        assert load_config(repo).registry_url == "postgresql+psycopg://u@127.0.0.1:1/db"
    assert caplog.records == []


def test_a_registry_folder_that_cannot_be_made_says_where_to_point_it(tmp_path):
    (tmp_path / "afile").write_text("")
    repo = _repo(tmp_path, f"sqlite:///{tmp_path / 'afile' / 'registry.db'}")
    with pytest.raises(ConfigError, match=r"cannot make the registry's folder .*afile \(.*\): point `registry.path` "
                                          r"at a writable place, e.g. sqlite:///\$\{HOME\}/.featurectl/registry.db"):
        load_config(repo)


def test_the_word_postgres_is_the_local_postgresql_as_option_and_as_environment_variable(tmp_path, monkeypatch):
    repo = _repo(tmp_path, "sqlite:///registry.db")
    local = load_config(repo).postgres_url()
    assert local.startswith("postgresql+psycopg://") and ":15432/" in local
    assert load_config(repo, registry_override="postgres").registry_url == local
    monkeypatch.setenv("FEATURECTL_REGISTRY", "postgres")
    assert load_config(repo).registry_url == local
