"""The files in deploy/ agree with each other and with the command line."""
from __future__ import annotations

import configparser
import os
import shlex

from queueserver.cli import build_config, build_parser

DEPLOY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy")


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(os.path.join(DEPLOY, "systemd", "queueserver.service"))
    return unit


def test_the_unit_user_and_runtime_directory_match_the_config(tmp_path):
    unit = _unit()
    service = unit["Service"]
    with open(os.path.join(DEPLOY, "systemd", "queueserver.service")) as f:
        text = f.read()
    # The user the unit runs as is the one its install notes create.
    assert f"useradd --system --no-create-home --shell /usr/sbin/nologin {service['User']}" in text
    assert service["Group"] == service["User"]
    argv = shlex.split(service["ExecStart"])
    runtime_dir = argv[argv.index("--runtime-dir") + 1]
    assert runtime_dir == f"/run/{service['RuntimeDirectory']}"
    assert service["RuntimeDirectoryMode"] == "0700"
    # The shards' logs live in the unit's state directory, private to the service.
    assert service["StateDirectoryMode"] == "0700"
    # The example config names the same directory, and the unit's flags are valid.
    local = tmp_path / "queueserver.toml"
    with open(os.path.join(DEPLOY, "queueserver.toml")) as f:
        example = f.read()
    assert f'runtime_dir = "{runtime_dir}"' in example
    assert f'data_dir = "/var/lib/{service["StateDirectory"]}"' in example
    local.write_text(example)
    assert argv[0].endswith("/queueserver")
    flags = [arg if arg != "/etc/queueserver/queueserver.toml" else str(local) for arg in argv[1:]]
    config = build_config(build_parser().parse_args(flags))
    assert config.runtime_dir == runtime_dir
