"""Load the configuration: defaults (model.config) <- TOML file <- environment (BKSIM_<SECTION>_<OPTION>)."""
from __future__ import annotations

import os
import sys
import tomllib
from typing import Mapping

from bksim.model import config as schema
from bksim.model.errors import ConfigError

ENV_PREFIX = "BKSIM_"
CONFIG_ENV = "BKSIM_CONFIG"  # path of the TOML file when --config is not given
DEFAULT_FILE = "deploy/bksim.toml"


def load(path: str | None = None, env: Mapping[str, str] | None = None) -> schema.Config:
    """Return the effective, validated configuration. Raises ConfigError with a precise message."""
    env = os.environ if env is None else env
    values: dict[str, dict[str, object]] = {s: {} for s in schema.SECTIONS}
    path = path or env.get(CONFIG_ENV) or (DEFAULT_FILE if os.path.exists(DEFAULT_FILE) else None)
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: {e}") from None
        for section, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a table like [{section}]")
            for name, raw in table.items():
                values.setdefault(section, {})[name] = schema.coerce(section, name, raw, path)
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or key == CONFIG_ENV:
            continue
        section, _, name = key[len(ENV_PREFIX):].lower().partition("_")
        if section in schema.SECTIONS:
            values[section][name] = schema.coerce(section, name, raw, f"environment {key}")
    return schema.build(values)


def dump(config: schema.Config) -> str:
    """The effective configuration as TOML text (printed at start-up)."""
    lines = []
    for section in schema.SECTIONS:
        lines.append(f"[{section}]")
        part = getattr(config, section)
        for s, name, _, _ in schema.describe():
            if s == section:
                lines.append(f"{name} = {toml_value(getattr(part, name))}")
        lines.append("")
    return "\n".join(lines)


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def print_effective(config: schema.Config, title: str) -> None:
    print(f"# effective configuration ({title})", file=sys.stderr)
    print(dump(config), file=sys.stderr, flush=True)
