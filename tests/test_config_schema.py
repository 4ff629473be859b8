"""One schema per program: defaults, ``--help``, unknown keys and wrong values all come from it.

Each exporter source declares its own section next to its code; the exporter's and the bridge's
schemas compose them. The example configs under deploy/ name every key the schema has (set or
commented out) and no key it lacks.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml

from wandb_infra.bridge import cli as bridge_cli
from wandb_infra.bridge import config as bridge_config
from wandb_infra.bridge.quarantine import actuator
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.schema import Key, Section
from wandb_infra.exporter import cli as exporter_cli
from wandb_infra.exporter import config as exporter_config
from wandb_infra.exporter.sources.files import RegistrationFilesSource
from wandb_infra.exporter.sources.slurm import SlurmSource

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SCHEMAS = {"exporter": exporter_config.SCHEMA, "bridge": bridge_config.SCHEMA}

TOY = Section({
    "port": Key("int", 80, "port", minimum=0, maximum=65535),
    "ratio": Key("number", 0.5, "share", above=0, maximum=1),
    "flag": Key("bool", None, "tri-state", optional=True),
    "secret": Key("str", None, "password", optional=True, secret=True),
    "mode": Key("str", "a", "mode", choices=("a", "b")),
    "inner": Section({"names": Key("list[str]", ["x"], "names")}),
})


def test_defaults_are_fresh_copies_and_resolve_fills_them():
    first = TOY.defaults()
    first["inner"]["names"].append("y")
    assert TOY.defaults() == {"port": 80, "ratio": 0.5, "flag": None, "secret": None,
                              "mode": "a", "inner": {"names": ["x"]}}
    assert TOY.resolve({"port": 8080, "inner": None}) == {**TOY.defaults(), "port": 8080}
    assert TOY.resolve(TOY.resolve({"mode": "b"})) == TOY.resolve({"mode": "b"})


@pytest.mark.parametrize(("raw", "message"), [
    ({"prot": 1}, "prot: unknown key (known: port, ratio, flag, secret, mode, inner)"),
    ({"inner": {"nmes": []}}, "inner.nmes: unknown key (known: names)"),
    ({"port": "x"}, "port: must be an integer 0-65535, not 'x'"),
    ({"port": True}, "port: must be an integer 0-65535, not True"),
    ({"port": 8080.0}, "port: must be an integer 0-65535, not 8080.0"),
    ({"ratio": 0}, "ratio: must be a number > 0 and <= 1, not 0"),
    ({"flag": "yes"}, "flag: must be true, false or unset, not 'yes'"),
    ({"secret": 12345}, "secret: must be a string or unset, not <secret>"),
    ({"mode": "c"}, "mode: must be 'a' or 'b', not 'c'"),
    ({"inner": {"names": ["a", 1]}}, "inner.names: must be a list of strings, not ['a', 1]"),
    ({"inner": []}, "inner: must be a mapping, not a list"),
])
def test_errors_name_the_dotted_path_in_one_line(raw, message):
    with pytest.raises(ConfigError) as err:
        TOY.resolve(raw)
    assert str(err.value) == message


def test_exporter_env_overrides_reach_a_sources_own_section(tmp_path):
    env = {"WANDB_INFRA_EXPORTER__SOURCES__SLURM__INTERVAL_SECONDS": "5",
           "WANDB_INFRA_EXPORTER__SOURCES__SLURM__ENABLED": "true"}
    cfg = exporter_config.load(None, environ=env)
    assert cfg["sources"]["slurm"]["interval_seconds"] == 5
    assert cfg["sources"]["slurm"]["timeout_seconds"] == 10  # the source's own default
    env["WANDB_INFRA_EXPORTER__SOURCES__SLURM__INTERVALL_SECONDS"] = "5"
    with pytest.raises(ConfigError, match=r"^sources\.slurm\.intervall_seconds: unknown key"):
        exporter_config.load(None, environ=env)


def _never_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("building a source runs no command")


def test_a_source_built_directly_is_checked_by_its_own_schema():
    """Before, a constructor read ``cfg.get(key, default)``: a typo was silently ignored."""
    with pytest.raises(ConfigError, match=r"^sources\.slurm\.intervall_seconds: unknown key"):
        SlurmSource({"intervall_seconds": 5}, runner=_never_run)
    assert SlurmSource({}, runner=_never_run).interval == 15
    files = RegistrationFilesSource({"directory": "/tmp"}, 7)
    assert files.max_series == 7 and files.interval == 10


def test_node_state_kubernetes_inherits_connection_keys_it_does_not_set():
    raw = {"sources": {"kubernetes": {"api_server": "https://a", "page_size": 7}},
           "node_state": {"kubernetes": {"page_size": 9}}}
    nodes = exporter_config.resolve(raw)["node_state"]["kubernetes"]
    assert nodes["api_server"] == "https://a" and nodes["page_size"] == 9
    assert nodes["timeout_seconds"] == 15 and nodes["interval_seconds"] == 30


def test_files_max_series_defaults_to_the_registrations_cap(tmp_path):
    cfg = exporter_config.resolve({"registrations": {"max_series": 1234},
                                   "sources": {"files": {"enabled": True,
                                                         "directory": str(tmp_path)}}})
    [source] = exporter_cli.build_sources(cfg, [])
    assert isinstance(source, RegistrationFilesSource) and source.max_series == 1234


def test_bridge_secrets_from_files_and_cross_key_checks(tmp_path):
    token = tmp_path / "token"
    token.write_text("from-a-file-0123456789\n")
    env = {"WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN_FILE": str(token),
           "WANDB_INFRA_BRIDGE__LISTEN__PORT": "9999"}
    cfg = bridge_config.load(None, environ=env)
    assert cfg.secrets.bearer_token == "from-a-file-0123456789" and cfg.port == 9999
    assert cfg.raw["endings"]["step_seconds"] == 30.0 and cfg.policy.endings is not None
    with pytest.raises(ConfigError, match=r"^listen\.port: must be an integer 0-65535, not 'x'"):
        bridge_config.load(None, environ={**env, "WANDB_INFRA_BRIDGE__LISTEN__PORT": "x"})
    with pytest.raises(ConfigError, match=r"at least endings\.step_seconds"):
        bridge_config.load(None, environ={**env, "WANDB_INFRA_BRIDGE__ENDINGS__GRACE_SECONDS": "5"})
    with pytest.raises(ConfigError, match=r"^quarantine\.kubernetes\.tokn: unknown key"):
        actuator.check({"kubernetes": {"tokn": "x"}})


def _help_lists_every_key(text: str, schema: Section) -> None:
    for path in schema.paths():
        assert re.search(rf"^  {re.escape(path)} \(default .*\)$", text, re.M), path


def test_exporter_help_lists_every_key_with_its_default(capsys):
    with pytest.raises(SystemExit):
        exporter_cli.main(["--help"])
    out = capsys.readouterr().out
    _help_lists_every_key(out, exporter_config.SCHEMA)
    assert "  sources.slurm.interval_seconds (default 15)" in out


def test_bridge_help_lists_every_key_with_its_default(capsys):
    with pytest.raises(SystemExit):
        bridge_cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    _help_lists_every_key(out, bridge_config.SCHEMA)
    assert "  endings.step_seconds (default 30.0)" in out
    assert "  auth.bearer_token (default unset)" in out


_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<comment># ?)?(?P<key>[a-z_]+):(?: |$)")


def _example_keys(text: str) -> tuple[set[str], set[str]]:
    """Dotted paths of the keys an example sets, and of those it shows commented out (a
    commented key's level is where its '#' stands)."""
    active, commented, stack = set(), set(), []
    for line in text.splitlines():
        match = _KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([name for _, name in stack] + [match["key"]])
        (commented if match["comment"] else active).add(path)
        if not match["comment"]:
            stack.append((indent, match["key"]))
    return active, commented


def _leaves_and_open(schema: Section, prefix: str = "") -> tuple[set[str], set[str]]:
    """Every key's path, and the paths below which any key is allowed (free mappings)."""
    leaves, open_ = set(), set()
    for name, item in schema.keys.items():
        path = f"{prefix}{name}"
        if isinstance(item, Section):
            inner, inner_open = _leaves_and_open(item, path + ".")
            leaves |= inner | {path}
            open_ |= inner_open
        else:
            leaves.add(path)
            if item.kind in ("mapping", "list"):
                open_.add(path)
    return leaves, open_


@pytest.mark.parametrize("program", sorted(SCHEMAS))
def test_example_config_names_every_key_and_no_other(program):
    text = (DEPLOY / f"{program}.example.yaml").read_text()
    active, commented = _example_keys(text)
    keys, open_ = _leaves_and_open(SCHEMAS[program])
    unknown = {p for p in active if p not in keys
               and not any(p.startswith(o + ".") for o in open_)}
    assert not unknown, f"deploy/{program}.example.yaml sets keys the schema lacks: {unknown}"
    leaves = set(SCHEMAS[program].paths())
    missing = sorted(leaves - active - commented)
    assert not missing, f"deploy/{program}.example.yaml does not show: {missing}"
    assert SCHEMAS[program].resolve(yaml.safe_load(text))  # and the values are valid


def test_no_help_text_contains_a_secret(tmp_path, monkeypatch, capsys):
    """Every console script's ``--help`` (and each subcommand's), with secrets in the
    environment and in a config file named on the command line, prints none of them. The
    scripts are the package's own entry points, called in this process (a process each took
    20 s on the shared machine for the same text)."""
    for name in ("WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN", "WANDB_INFRA_BRIDGE__AUTH__PAGES_TOKEN",
                 "WANDB_INFRA_BRIDGE__AUTH__BASIC_PASSWORD", "WANDB_INFRA_BRIDGE__WANDB__API_KEY",
                 "WANDB_INFRA_EXPORTER__AUTH__TOKEN", "WANDB_API_KEY"):
        monkeypatch.setenv(name, f"s3cret-{name.lower()}-0123456789")
    (tmp_path / "token").write_text("s3cret-from-a-file-0123456789\n")
    monkeypatch.setenv("WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN_FILE", str(tmp_path / "token"))
    config = tmp_path / "config.yaml"
    config.write_text("auth: {bearer_token: s3cret-in-the-config-0123456789}\n"
                      "wandb: {api_key: s3cret-key-in-the-config-0123456789}\n")
    scripts = {e.name: e.load() for e in entry_points(group="console_scripts")
               if e.value.startswith("wandb_infra.")}
    assert set(scripts) == {"wandb-infra-bridge", "wandb-infra-exporter"}
    calls = [("wandb-infra-bridge", []), ("wandb-infra-exporter", []),
             ("wandb-infra-exporter", ["--config", str(config)]),
             *(("wandb-infra-bridge", [sub, "--config", str(config)]) for sub in (
                 "serve", "explain", "quarantine", "view", "selftest"))]
    for script, args in calls:
        monkeypatch.setattr(sys, "argv", [script, *args, "--help"])
        with pytest.raises(SystemExit) as exited:
            scripts[script]()
        out = capsys.readouterr()
        assert exited.value.code == 0 and "usage:" in out.out, (script, args, out)
        assert "s3cret" not in out.out + out.err, (script, args)
