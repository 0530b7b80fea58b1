"""The configuration schema, deploy/bksim.toml and the table in docs/configuration.md agree; loading rejects
bad input."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import tomllib

import pytest

from bksim.cli import config as loader
from bksim.model import config as schema
from bksim.model.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TOML_PATH = os.path.join(REPO, "deploy", "bksim.toml")


def _render():
    spec = importlib.util.spec_from_file_location("render_config", os.path.join(REPO, "deploy", "render_config.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _defaults() -> dict[str, dict[str, object]]:
    return {section: {f.name: f.default for f in dataclasses.fields(cls)} for section, cls in schema.SECTIONS.items()}


def test_deploy_file_holds_every_option_with_its_schema_default():
    with open(TOML_PATH, "rb") as f:
        data = tomllib.load(f)
    assert data == _defaults()
    for section, values in data.items():  # same types too (2.0 is not 2; "3" is not 3)
        for name, value in values.items():
            assert type(value) is type(_defaults()[section][name]), f"{section}.{name}"


def test_deploy_file_documents_every_option_on_the_line_above_it():
    lines = open(TOML_PATH).read().splitlines()
    for section, name, _, doc in schema.describe():
        start = lines.index(f"[{section}]")
        index = next(i for i in range(start, len(lines)) if lines[i].startswith(f"{name} = "))
        assert lines[index - 1].startswith(f"# {doc}"), f"{section}.{name}: doc comment missing above it"


def test_deploy_file_and_docs_table_are_up_to_date():
    render = _render()
    assert open(TOML_PATH).read() == render.toml_text(), "run .venv/bin/python deploy/render_config.py --write"
    doc = open(os.path.join(REPO, "docs", "configuration.md")).read()
    assert render.doc_table() in doc, "docs/configuration.md's table is stale: run deploy/render_config.py --write"
    for section, name, _, _ in schema.describe():
        assert f"| `{section}` | `{name}` |" in doc


def test_loading_the_deploy_file_gives_the_defaults():
    assert loader.load(TOML_PATH, env={}) == schema.Config()


def test_environment_overrides_the_file():
    config = loader.load(TOML_PATH, env={"BKSIM_BOOKIE_GROUP_WAIT_MS_MAX": "5", "BKSIM_CLUSTER_BOOKIES": "0",
                                         "BKSIM_BOOKIE_JOURNAL_FLUSH_WHEN_IDLE": "true"})
    assert config.bookie.group_wait_ms_max == 5.0
    assert config.cluster.bookies == 0
    assert config.bookie.journal_flush_when_idle is True
    assert config.bookie.port == 3181  # untouched options keep their defaults


def test_file_overrides_defaults(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[zookeeper]\nport = 2999\n[bookie]\nentry_bytes_max = 1024\n")
    config = loader.load(str(path), env={})
    assert config.zookeeper.port == 2999 and config.bookie.entry_bytes_max == 1024


@pytest.mark.parametrize("env, option", [
    ({"BKSIM_BOOKIE_PORT": "not-a-port"}, "bookie.port"),
    ({"BKSIM_BOOKIE_JOURNAL_FLUSH_WHEN_IDLE": "maybe"}, "bookie.journal_flush_when_idle"),
    ({"BKSIM_BOOKIE_GROUP_BYTES_MAX": "0"}, "bookie.group_bytes_max"),
    ({"BKSIM_BOOKIE_ENTRY_BYTES_MAX": str(64 * 1024 * 1024)}, "bookie.entry_bytes_max"),
    ({"BKSIM_CLUSTER_BOOKIES": "-1"}, "cluster.bookies"),
    ({"BKSIM_BOOKIE_DISK_USAGE_LWM_THRESHOLD": "0.99"}, "bookie.disk_usage_lwm_threshold"),
    ({"BKSIM_BOOKIE_WRITE_CACHE_ENTRY_OVERHEAD_BYTES": "-1"}, "bookie.write_cache_entry_overhead_bytes"),
    ({"BKSIM_BOOKIE_ENTRY_LOG_PAGE_CACHE_BYTES": "-2"}, "bookie.entry_log_page_cache_bytes"),
    ({"BKSIM_BROKER_ADD_REQUESTS_PER_BOOKIE_MAX": "-1"}, "broker.add_requests_per_bookie_max"),
    ({"BKSIM_BOOKIE_WRITE_CACHE_BYTES_MAX": "1000", "BKSIM_BOOKIE_WRITE_CACHE_ENTRY_OVERHEAD_BYTES": "500"},
     "bookie.write_cache_entry_overhead_bytes"),
])
def test_bad_values_name_the_option(env, option):
    with pytest.raises(ConfigError) as e:
        loader.load(TOML_PATH, env=env)
    assert option in str(e.value)


def test_bad_value_in_file_names_file_and_option(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[bookie]\nwrite_cache_bytes_max = "lots"\n')
    with pytest.raises(ConfigError) as e:
        loader.load(str(path), env={})
    assert "bookie.write_cache_bytes_max" in str(e.value) and str(path) in str(e.value)


def test_unknown_options_and_sections_are_rejected(tmp_path):
    path = tmp_path / "unknown.toml"
    path.write_text("[bookie]\njournal_dirz = \"/x\"\n")
    with pytest.raises(ConfigError, match="unknown option bookie.journal_dirz"):
        loader.load(str(path), env={})
    path.write_text("[bokie]\nport = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[bokie\]"):
        loader.load(str(path), env={})
    with pytest.raises(ConfigError, match="unknown option bookie.nonsense"):
        loader.load(TOML_PATH, env={"BKSIM_BOOKIE_NONSENSE": "1"})


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        loader.load(str(tmp_path / "absent.toml"), env={})


def test_a_throttled_add_is_answered_before_the_broker_gives_up_on_the_bookie(tmp_path):
    """An add the write cache holds back waits up to bookie.write_cache_throttle_ms_max and then still needs its
    journal sync; a broker that stops waiting first (broker.bookie_timeout_ms) replaces a healthy, busy bookie.
    The relation is checked for the combined configuration every process loads."""
    defaults = schema.Config()
    assert 2 * defaults.bookie.write_cache_throttle_ms_max <= defaults.broker.bookie_timeout_ms
    timeout = defaults.broker.bookie_timeout_ms
    for env in ({"BKSIM_BOOKIE_WRITE_CACHE_THROTTLE_MS_MAX": "10000"},  # BookKeeper's dbStorage_maxThrottleTimeMs
                {"BKSIM_BOOKIE_WRITE_CACHE_THROTTLE_MS_MAX": str(timeout)},
                {"BKSIM_BROKER_BOOKIE_TIMEOUT_MS": str(defaults.bookie.write_cache_throttle_ms_max)}):
        with pytest.raises(ConfigError) as e:
            loader.load(TOML_PATH, env=env)
        assert "bookie.write_cache_throttle_ms_max" in str(e.value) and "broker.bookie_timeout_ms" in str(e.value)
    path = tmp_path / "c.toml"  # lowering both together is fine
    path.write_text("[bookie]\nwrite_cache_throttle_ms_max = 500\n[broker]\nbookie_timeout_ms = 1000\n")
    config = loader.load(str(path), env={})
    assert (config.bookie.write_cache_throttle_ms_max, config.broker.bookie_timeout_ms) == (500, 1000)


def test_frame_limits_are_checked_against_each_other_naming_both():
    """An entry travels in one bookie frame, and a bookie's frame must fit what its clients receive
    (schema.FRAME_BYTES_MAX, the default frame, which the bookie clients import)."""
    from bksim.adapters.bookie_client import FRAME_BYTES_MAX as client_frame
    assert client_frame == schema.FRAME_BYTES_MAX == schema.BookieConfig().frame_bytes_max
    too_big = schema.FRAME_BYTES_MAX + 1
    with pytest.raises(ConfigError) as e:
        loader.load(TOML_PATH, env={"BKSIM_BOOKIE_FRAME_BYTES_MAX": str(too_big)})
    assert f"bookie.frame_bytes_max ({too_big})" in str(e.value) and f"({schema.FRAME_BYTES_MAX}," in str(e.value)
    with pytest.raises(ConfigError) as e:
        loader.load(TOML_PATH, env={"BKSIM_BOOKIE_ENTRY_BYTES_MAX": "4096", "BKSIM_BOOKIE_FRAME_BYTES_MAX": "4096"})
    assert "bookie.entry_bytes_max (4096)" in str(e.value) and "bookie.frame_bytes_max (4096)" in str(e.value)
    smaller = loader.load(TOML_PATH, env={"BKSIM_BOOKIE_ENTRY_BYTES_MAX": "4096", "BKSIM_BOOKIE_FRAME_BYTES_MAX": "8192"})
    assert (smaller.bookie.entry_bytes_max, smaller.bookie.frame_bytes_max) == (4096, 8192)
