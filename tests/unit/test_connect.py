"""`claw-stream connect`: our provider merged into a coding agent's own config file, nothing
else changed, twice the same as once, a broken file left alone (no gateway needed: --model).
The real agents read what it writes in the e2e lane (tests/e2e/test_agents_read_connect.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from claw_stream.agents.codex import CODEX_KEY_ENV
from claw_stream.agents.connect import BACKUP_SUFFIX
from claw_stream.cli import main

from ..support.agent_configs import (
    HERMES_CONFIG,
    OPENCLAW_CONFIG,
    OPENCODE_JSONC,
    OPENCODE_OURS,
    connect_file,
)

CODEX_CONFIG = """# my own settings
model = "gpt-5"  # the usual one
approval_policy = "on-request"

[model_providers.azure]
name = "Azure"
base_url = "https://example.openai.azure.com/openai"
env_key = "AZURE_OPENAI_API_KEY"

[profiles.fast]
model = "o4-mini"
"""
CLAUDE_SETTINGS = {"permissions": {"allow": ["Bash(ls:*)"]}, "env": {"HTTPS_PROXY": "http://p"}}
FLAGS = ["--base-url", "http://127.0.0.1:8000/v1", "--model", "smollm2-135m", "--context", "8192"]


def connect(agent: str, path: Path, *more: str) -> str:
    return connect_file(agent, path, *FLAGS, *more)


def test_codex_gets_our_provider_and_keeps_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CODEX_CONFIG)
    connect("codex", path, "--key", "claw-key")
    config = tomllib.loads(path.read_text())
    assert config["model_providers"]["claw-stream"] == {
        "name": "claw-stream",
        "base_url": "http://127.0.0.1:8000/v1",
        "env_key": CODEX_KEY_ENV,
        "wire_api": "responses",
    }
    assert (config["model"], config["model_provider"], config["model_context_window"]) == (
        "smollm2-135m",
        "claw-stream",
        8192,
    )
    # the rest as it was, comments included; the file as it was kept beside it
    assert config["model_providers"]["azure"]["env_key"] == "AZURE_OPENAI_API_KEY"
    assert config["profiles"]["fast"] == {"model": "o4-mini"}
    assert config["approval_policy"] == "on-request"
    assert "# my own settings" in path.read_text() and "# the usual one" in path.read_text()
    assert (tmp_path / f"config.toml{BACKUP_SUFFIX}").read_text() == CODEX_CONFIG
    # twice: one entry, nothing written
    after = path.read_text()
    assert "nothing changed" in connect("codex", path, "--key", "claw-key")
    assert path.read_text() == after
    assert after.count("[model_providers.claw-stream]") == 1


def test_claude_code_gets_our_endpoint_in_its_env(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(CLAUDE_SETTINGS))
    out = connect("claude-code", path, "--key", "claw-key")
    settings = json.loads(path.read_text())
    assert settings["permissions"] == CLAUDE_SETTINGS["permissions"]
    env = settings["env"]
    assert env["HTTPS_PROXY"] == "http://p"
    # the root: Claude Code appends /v1/messages itself
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8000"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "claw-key"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "smollm2-135m"
    assert "wrote" in out
    assert "nothing changed" in connect("claude-code", path, "--key", "claw-key")


def test_print_shows_only_our_change_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CODEX_CONFIG)
    out = connect("codex", path, "--print")
    added = [line for line in out.splitlines() if line.startswith("+") and line[1:2] != "+"]
    assert "+[model_providers.claw-stream]" in added
    assert not any("azure" in line.lower() or "o4-mini" in line for line in added)
    assert path.read_text() == CODEX_CONFIG
    assert not (tmp_path / f"config.toml{BACKUP_SUFFIX}").exists()
    # a new file: created, with no backup
    fresh = tmp_path / "new" / "settings.json"
    connect("claude-code", fresh)
    assert json.loads(fresh.read_text())["env"]["ANTHROPIC_AUTH_TOKEN"] == "claw-stream"


@pytest.mark.parametrize(
    ("agent", "broken"),
    [
        ("codex", 'model = "x\n[model_providers'),
        ("claude-code", '{"env": ['),
        ("claude-code", "[1]"),
        ("openclaw", "{models: {providers: {a: {},, }}}"),
        ("openclaw", "[1]"),
        ("openclaw", '{models: {providers: {"claw-stream": "x"}}}'),
        ("zeroclaw", "schema_version = 3\n[providers"),
        ("zeroclaw", "schema_version = 4\n"),
        # its old schema, which ZeroClaw migrates only in memory: `zeroclaw config migrate` first
        ("zeroclaw", 'default_provider = "openai"\n[model_providers.openai]\nname = "openai"\n'),
        ("opencode", '{"provider": {"a": {},, }}'),
        ("opencode", "[1]"),
        ("opencode", '{"provider": {"claw-stream": "x"}}'),
        ("aider", "model: [openai/x\n"),
        ("aider", "- a list\n"),
        ("hermes", "model: [1, 2]\n"),
        ("hermes", "model:\n  default: x\n bad indent: 1\n"),
    ],
)
def test_a_broken_file_gets_one_line_and_is_left_untouched(
    tmp_path: Path, agent: str, broken: str
) -> None:
    path = tmp_path / "config"
    path.write_text(broken)
    result = CliRunner().invoke(main, ["connect", agent, "--file", str(path), *FLAGS])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {path}: ") and line.endswith("(left untouched)")
    assert path.read_text() == broken
    assert list(tmp_path.iterdir()) == [path]


OPENCLAW_JSON5 = """// my OpenClaw
{
  models: {
    providers: {
      anthropic: { apiKey: "sk-ant-1", models: [], },  // the usual
    },
  },
  agents: { defaults: { model: "anthropic/claude-opus-4-6" } },
}
"""
OURS = {
    "baseUrl": "http://127.0.0.1:8000/v1",
    "apiKey": "claw-key",
    "api": "openai-completions",
    "models": [
        {
            "id": "smollm2-135m",
            "name": "smollm2-135m via claw-stream",
            "contextWindow": 8192,
            "maxTokens": 2048,
            "compat": {"sendSessionAffinityHeaders": True},
        }
    ],
}
SMALL = {"tools": {"profile": "minimal"}, "contextInjection": "never", "skipBootstrap": True}
ZEROCLAW_CONFIG = """schema_version = 3

# Ollama on this machine
[providers.models.ollama.default]
model = "llama3.2"
uri = "http://127.0.0.1:11434"  # local

[agents.default]
model_provider = "ollama.default"
risk_profile = "default"

[risk_profiles.default]
level = "supervised"
"""


def added_and_removed(out: str) -> tuple[list[str], list[str]]:
    lines = out.splitlines()
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    return added, removed


def test_openclaw_print_shows_only_our_provider_added(tmp_path: Path) -> None:
    path = tmp_path / "openclaw.json"
    text = json.dumps(OPENCLAW_CONFIG, indent=2) + "\n"
    path.write_text(text)
    out = connect("openclaw", path, "--key", "claw-key", "--print")
    added, removed = added_and_removed(out)
    assert '      "claw-stream": {' in added
    assert '        "apiKey": "claw-key",' in added
    assert '        "primary": "claw-stream/smollm2-135m",' in added
    # what goes: the old primary; the other lines only gain a comma before what is added
    assert [r for r in removed if f"{r}," not in added] == [
        '        "primary": "anthropic/claude-opus-4-6",'
    ]
    assert not any("sk-ant-1" in a or "11434" in a or "llama" in a for a in added)
    assert "small-model profile" in out and "(--print:" in out
    assert path.read_text() == text
    assert list(tmp_path.iterdir()) == [path]


def test_openclaw_gets_our_provider_once_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "openclaw.json"
    text = json.dumps(OPENCLAW_CONFIG, indent=2) + "\n"
    path.write_text(text)
    out = connect("openclaw", path, "--key", "claw-key")
    config = json.loads(path.read_text())
    providers = config["models"]["providers"]
    assert list(providers) == ["anthropic", "local", "claw-stream"]
    assert providers["claw-stream"] == OURS
    for name in ("anthropic", "local"):
        assert providers[name] == OPENCLAW_CONFIG["models"]["providers"][name]
    defaults = config["agents"]["defaults"]
    assert defaults["model"] == {
        "primary": "claw-stream/smollm2-135m",
        "fallbacks": ["local/llama"],  # the user's fallbacks stay
    }
    assert defaults["workspace"] == "~/work" and config["gateway"] == {"port": 18789}
    assert (tmp_path / f"openclaw.json{BACKUP_SUFFIX}").read_text() == text
    assert "openclaw now uses smollm2-135m" in out
    # twice: nothing written, one entry
    after = path.read_text()
    assert "nothing changed" in connect("openclaw", path, "--key", "claw-key")
    assert path.read_text() == after
    assert after.count('"claw-stream": {') == 1
    # without --key, the key already there is kept
    assert "nothing changed" in connect("openclaw", path)


def test_openclaw_profile_follows_the_context(tmp_path: Path) -> None:
    path = tmp_path / "openclaw.json"
    out = connect("openclaw", path)  # 8192
    config = json.loads(path.read_text())
    assert config["tools"] == SMALL["tools"]
    defaults = config["agents"]["defaults"]
    assert (defaults["contextInjection"], defaults["skipBootstrap"]) == ("never", True)
    assert "below 32,768: OpenClaw's small-model profile" in out
    # the same gateway with a 32k model: the full profile, our small one taken out again
    out = connect("openclaw", path, "--context", "32768")
    config = json.loads(path.read_text())
    assert "tools" not in config
    assert not {"contextInjection", "skipBootstrap"} & set(config["agents"]["defaults"])
    assert config["models"]["providers"]["claw-stream"]["models"][0]["contextWindow"] == 32768
    assert "its full profile" in out and "small-model" not in out
    # a profile the user chose is theirs: the full profile leaves it, the small one must set it
    config["tools"] = {"profile": "coding"}
    path.write_text(json.dumps(config, indent=2))
    assert "nothing changed" in connect("openclaw", path, "--context", "32768")
    connect("openclaw", path, "--context", "16384")
    assert json.loads(path.read_text())["tools"] == {"profile": "minimal"}


def test_openclaw_reads_json5_and_says_its_comments_go(tmp_path: Path) -> None:
    path = tmp_path / "openclaw.json"
    path.write_text(OPENCLAW_JSON5)
    out = connect("openclaw", path, "--context", "65536")
    config = json.loads(path.read_text())  # written back as plain JSON
    assert config["models"]["providers"]["anthropic"] == {"apiKey": "sk-ant-1", "models": []}
    assert config["agents"]["defaults"]["model"] == "claw-stream/smollm2-135m"  # a string stays one
    assert "comments are not kept" in out
    assert (tmp_path / f"openclaw.json{BACKUP_SUFFIX}").read_text() == OPENCLAW_JSON5
    assert "nothing changed" in connect("openclaw", path, "--context", "65536")
    # a JSON5 file that needs nothing keeps its comments
    connected = "// mine\n" + path.read_text().replace('"api":', '// ours\n"api":', 1)
    path.write_text(connected)
    assert "nothing changed" in connect("openclaw", path, "--context", "65536")
    assert path.read_text() == connected


def test_openclaw_config_path_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENCLAW_CONFIG_PATH", str(tmp_path / "elsewhere" / "oc.json"))
    result = CliRunner().invoke(main, ["connect", "openclaw", *FLAGS])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "elsewhere" / "oc.json").read_text())
    assert config["models"]["providers"]["claw-stream"]["apiKey"] == "claw-stream"
    assert not (tmp_path / "home").exists()


def test_zeroclaw_gets_its_current_schema_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(ZEROCLAW_CONFIG)
    out = connect("zeroclaw", path, "--key", "claw-sk-1", "--print")
    added, removed = added_and_removed(out)
    assert "[providers.models.custom.claw_stream]" in added
    assert "[agents.claw_stream]" in added and not removed
    assert path.read_text() == ZEROCLAW_CONFIG
    out = connect("zeroclaw", path, "--key", "claw-sk-1")
    config = tomllib.loads(path.read_text())
    assert config["providers"]["models"]["custom"]["claw_stream"] == {
        "uri": "http://127.0.0.1:8000/v1",
        "api_key": "claw-sk-1",
        "model": "smollm2-135m",
        "context_window": 8192,
        "max_tokens": 2048,
    }
    assert config["agents"]["claw_stream"] == {
        "model_provider": "custom.claw_stream",
        "risk_profile": "default",
    }
    # the rest as it was, comments included
    assert config["providers"]["models"]["ollama"]["default"]["model"] == "llama3.2"
    assert config["agents"]["default"]["model_provider"] == "ollama.default"
    assert config["risk_profiles"] == {"default": {"level": "supervised"}}
    assert "# Ollama on this machine" in path.read_text() and "# local" in path.read_text()
    assert (tmp_path / f"config.toml{BACKUP_SUFFIX}").read_text() == ZEROCLAW_CONFIG
    assert "zeroclaw agent -a claw_stream" in out
    assert "nothing changed" in connect("zeroclaw", path)  # its key kept
    # a new file: the schema version, and the risk profile an agent must name
    fresh = tmp_path / "new" / "config.toml"
    connect("zeroclaw", fresh, "--key", "claw-sk-2")
    config = tomllib.loads(fresh.read_text())
    assert config["schema_version"] == 3 and config["risk_profiles"] == {"default": {}}


AIDER_CONF = """##########################################################
# Sample .aider.conf.yml
##########################################################

## Use a dark colour scheme
dark-mode: true

## Specify the model to use for the main chat
#model: xxx
model: gpt-4o  # the usual
read: [CONVENTIONS.md]
"""
# each agent's file as a user keeps it: comments, their order, no newline at the end
ORIGINALS = {
    "codex": ("config.toml", CODEX_CONFIG.rstrip("\n")),
    "claude-code": ("settings.json", json.dumps(CLAUDE_SETTINGS, indent=4)),
    "openclaw": ("openclaw.json", OPENCLAW_JSON5),
    "zeroclaw": ("config.toml", ZEROCLAW_CONFIG + "\n\n"),
    "opencode": ("opencode.jsonc", OPENCODE_JSONC),
    "aider": (".aider.conf.yml", AIDER_CONF),
    "hermes": ("config.yaml", HERMES_CONFIG),
}


@pytest.mark.parametrize("agent", sorted(ORIGINALS))
def test_undo_puts_the_file_back_as_it_was_before_the_first_connect(
    tmp_path: Path, agent: str
) -> None:
    name, text = ORIGINALS[agent]
    path = tmp_path / name
    path.write_bytes(text.encode())
    path.chmod(0o600)
    connect(agent, path, "--key", "claw-key-1")
    connect(agent, path, "--key", "claw-key-2", "--model", "other", "--context", "131072")
    assert path.read_bytes() != text.encode()
    # --print shows what goes back, and writes nothing
    shown = connect(agent, path, "--undo", "--print")
    assert f"{path} (before connect)" in shown and "not written" in shown
    assert path.read_bytes() != text.encode()
    out = connect(agent, path, "--undo")
    assert "put" in out and "back as it was before connect" in out
    assert path.read_bytes() == text.encode()  # byte for byte, after two connects
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing left beside it
    # connected again, undone again: the same bytes
    connect(agent, path, "--key", "claw-key-3")
    connect(agent, path, "--undo")
    assert path.read_bytes() == text.encode()


def test_undo_removes_a_file_connect_created_and_refuses_one_it_never_changed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "claude" / "settings.json"
    connect("claude-code", path, "--key", "claw-key")
    assert path.exists()
    out = connect("claude-code", path, "--undo")
    assert "removed" in out and not path.exists()
    assert list(path.parent.iterdir()) == []
    # a file connect never wrote: a one-line error, the file untouched
    mine = tmp_path / "config.toml"
    mine.write_text(CODEX_CONFIG)
    result = CliRunner().invoke(main, ["connect", "codex", "--file", str(mine), "--undo"])
    assert result.exit_code == 1
    assert "nothing to undo" in result.output and str(mine) in result.output
    assert mine.read_text() == CODEX_CONFIG


class Answer:
    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload

    def raise_for_status(self) -> None:
        pass

    def json(self) -> dict[str, Any]:
        return self.payload


def test_zeroclaw_gets_a_fresh_session_key_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAW_ADMIN_KEY", "claw-admin-test")
    asked: list[tuple[str, str]] = []

    def start_session(url: str, headers: dict[str, str], **_: Any) -> Answer:
        asked.append((url, headers["authorization"]))
        return Answer({"session_id": "s-1", "api_key": f"claw-sk-{len(asked)}"})

    monkeypatch.setattr(httpx, "post", start_session)
    path = tmp_path / "config.toml"
    out = connect("zeroclaw", path, "--print")  # shows the change, starts nothing
    assert "<a fresh session key>" in out and not asked and not path.exists()
    out = connect("zeroclaw", path)
    assert asked == [("http://127.0.0.1:8000/rl/start_session", "Bearer claw-admin-test")]
    assert "session s-1" in out
    config = tomllib.loads(path.read_text())
    assert config["providers"]["models"]["custom"]["claw_stream"]["api_key"] == "claw-sk-1"
    assert "nothing changed" in connect("zeroclaw", path)  # the key it has is kept
    assert len(asked) == 1


def test_connect_for_a_tenant_uses_its_key_or_starts_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--tenant`: an agent that names its own sessions calls with the tenant's key (from
    tenants.keys), zeroclaw with a session key started for the tenant; a tenant without a key
    is told how to give it one."""
    monkeypatch.setenv("CLAW_ADMIN_KEY", "claw-admin-test")
    monkeypatch.setenv("CLAW_TENANTS__KEYS", '{"alice-key-1": "alice"}')
    bodies: list[dict[str, Any]] = []

    def start_session(url: str, headers: dict[str, str], json: dict[str, Any], **_: Any) -> Answer:
        bodies.append(json)
        return Answer({"session_id": "s-2", "api_key": "claw-sk-alice"})

    monkeypatch.setattr(httpx, "post", start_session)
    out = connect("codex", tmp_path / "config.toml", "--tenant", "alice")
    assert "CLAW_STREAM_API_KEY=alice-key-1" in out  # codex reads its key from there
    zeroclaw = tmp_path / "zeroclaw.toml"
    connect("zeroclaw", zeroclaw, "--tenant", "alice")
    assert bodies == [{"tenant": "alice"}]
    config = tomllib.loads(zeroclaw.read_text())
    assert config["providers"]["models"]["custom"]["claw_stream"]["api_key"] == "claw-sk-alice"
    result = CliRunner().invoke(
        main, ["connect", "codex", "--file", str(tmp_path / "c2.toml"), *FLAGS, "--tenant", "bob"]
    )
    assert result.exit_code == 1
    assert "no key of tenant bob" in result.output and "tenants.keys" in result.output


def test_opencode_gets_our_provider_once_and_keeps_comments_and_order(tmp_path: Path) -> None:
    import json5

    from claw_stream.agents.opencode import SMALL_PROFILE

    path = tmp_path / "opencode.jsonc"
    path.write_text(OPENCODE_JSONC)
    out = connect("opencode", path, "--key", "claw-key")
    text = path.read_text()
    config = json5.loads(text)
    assert config["provider"]["claw-stream"] == OPENCODE_OURS
    assert config["model"] == config["small_model"] == "claw-stream/smollm2-135m"
    # below 32k its small-model profile: four tools off, the user's own setting kept
    assert config["tools"] == {"bash": True, **dict.fromkeys(SMALL_PROFILE, False)}
    assert "small-model profile" in out
    # the rest as it was: comments, the other provider, the order of the keys
    assert "// my opencode" in text and "// the usual" in text
    assert config["provider"]["ollama"]["models"] == {"llama3.2": {}}
    assert list(config) == ["$schema", "theme", "model", "provider", "tools", "small_model"]
    assert text.startswith(OPENCODE_JSONC.split('"model"')[0])  # untouched up to our edit
    # twice: nothing written; a key already there kept without --key
    assert "nothing changed" in connect("opencode", path, "--key", "claw-key")
    assert "nothing changed" in connect("opencode", path)
    assert path.read_text() == text
    assert (tmp_path / f"opencode.jsonc{BACKUP_SUFFIX}").read_text() == OPENCODE_JSONC


def test_opencode_profile_follows_the_context(tmp_path: Path) -> None:
    import json5

    path = tmp_path / "opencode.json"
    connect("opencode", path, "--key", "claw-key")
    assert json5.loads(path.read_text())["$schema"] == "https://opencode.ai/config.json"
    out = connect("opencode", path, "--context", "131072")
    config = json5.loads(path.read_text())
    assert "tools" not in config and "full prompt" in out  # the small profile taken out
    limit = config["provider"]["claw-stream"]["models"]["smollm2-135m"]["limit"]
    assert limit == {"context": 131072, "output": 8192}
    # a tool the user turned off stays off
    path.write_text(
        path.read_text().replace('"small_model"', '"tools": {"task": false},\n  "small_model"')
    )
    connect("opencode", path, "--context", "131072")
    assert json5.loads(path.read_text())["tools"] == {"task": False}


def test_opencode_config_path_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from claw_stream.agents.opencode import config_path

    monkeypatch.delenv("OPENCODE_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert config_path() == tmp_path / ".config" / "opencode" / "opencode.json"
    (tmp_path / ".config" / "opencode").mkdir(parents=True)
    (tmp_path / ".config" / "opencode" / "opencode.jsonc").write_text("{}")
    assert config_path() == tmp_path / ".config" / "opencode" / "opencode.jsonc"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "opencode" / "opencode.json"
    monkeypatch.setenv("OPENCODE_CONFIG", str(tmp_path / "mine.json"))
    assert config_path() == tmp_path / "mine.json"


@pytest.mark.parametrize(
    ("before", "path", "value", "after"),
    [
        ("", ("a",), 1, '{\n  "a": 1\n}\n'),
        ("{}", ("a", "b"), True, '{\n  "a": {\n    "b": true\n  }\n}'),
        ("{\n  // only this\n}", ("a",), 1, '{\n  // only this\n  "a": 1\n}'),
        ('{\n    "a": 1, // one\n}', ("b",), 2, '{\n    "a": 1, // one\n    "b": 2\n}'),
        ('{\n  "a": 1 // one\n}', ("b",), [2], '{\n  "a": 1, // one\n  "b": [\n    2\n  ]\n}'),
        (
            '{\n  "a": {"x": "}"}, /* c */\n  "b": 2\n}',
            ("a", "x"),
            "y",
            '{\n  "a": {"x": "y"}, /* c */\n  "b": 2\n}',
        ),
    ],
)
def test_jsonc_set_member_keeps_the_rest_of_the_text(
    before: str, path: tuple[str, ...], value: Any, after: str
) -> None:
    from claw_stream.agents import jsonc

    assert jsonc.set_member(before, path, value) == after


def test_jsonc_remove_member_takes_its_line_and_its_comma() -> None:
    from claw_stream.agents import jsonc

    text = '{\n  "a": 1, // one\n  "b": {"c": 2},\n  "d": 3\n}\n'
    assert jsonc.remove_member(text, ("b",)) == '{\n  "a": 1, // one\n  "d": 3\n}\n'
    assert jsonc.remove_member(text, ("d",)) == '{\n  "a": 1, // one\n  "b": {"c": 2}\n}\n'
    assert jsonc.remove_member(text, ("b", "c")) == '{\n  "a": 1, // one\n  "b": {},\n  "d": 3\n}\n'
    assert jsonc.remove_member(text, ("x",)) == text


def test_aider_gets_the_gateway_a_session_key_and_its_context_beside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    monkeypatch.setenv("CLAW_ADMIN_KEY", "claw-admin-test")
    asked: list[str] = []

    def start_session(url: str, headers: dict[str, str], **_: Any) -> Answer:
        asked.append(url)
        return Answer({"session_id": "s-7", "api_key": "claw-sk-7"})

    monkeypatch.setattr(httpx, "post", start_session)
    path = tmp_path / ".aider.conf.yml"
    path.write_text(AIDER_CONF)
    out = connect("aider", path)  # it names no session: a fresh session key
    assert asked == ["http://127.0.0.1:8000/rl/start_session"] and "session s-7" in out
    text = path.read_text()
    assert yaml.safe_load(text) == {
        "dark-mode": True,
        "model": "openai/smollm2-135m",
        "read": ["CONVENTIONS.md"],
        "openai-api-base": "http://127.0.0.1:8000/v1",
        "openai-api-key": "claw-sk-7",
        "weak-model": "openai/smollm2-135m",
        "editor-model": "openai/smollm2-135m",
    }
    assert text.startswith(AIDER_CONF.split("model: gpt-4o")[0])  # comments and order kept
    assert "# the usual" in text
    metadata = json.loads((tmp_path / ".aider.model.metadata.json").read_text())
    assert metadata["openai/smollm2-135m"]["max_input_tokens"] == 8192
    assert metadata["openai/smollm2-135m"]["max_output_tokens"] == 2048
    # twice: its key kept, nothing written, no other session started
    assert "nothing changed" in connect("aider", path)
    assert path.read_text() == text and len(asked) == 1


def test_hermes_gets_its_custom_endpoint_and_hears_of_its_minimum_context(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(HERMES_CONFIG)
    out = connect("hermes", path, "--key", "claw-key")
    config = yaml.safe_load(path.read_text())
    assert config["model"] == {
        "default": "smollm2-135m",
        "provider": "custom",
        "base_url": "http://127.0.0.1:8000/v1",
        "api_key": "claw-key",
        "context_length": 8192,
        "max_tokens": 2048,
    }
    assert config["toolsets"] == ["hermes-cli"] and config["agent"] == {"max_turns": 60}
    assert "# Hermes Agent" in path.read_text() and "# enough" in path.read_text()
    assert "below the 64,000 Hermes Agent requires" in out  # it would refuse to start
    text = path.read_text()
    assert "nothing changed" in connect("hermes", path)  # its key kept
    assert path.read_text() == text
    out = connect("hermes", path, "--context", "131072")
    assert "requires" not in out and yaml.safe_load(path.read_text())["model"]["max_tokens"] == 8192


def test_aider_and_hermes_config_paths_are_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from claw_stream.agents import aider, hermes

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HERMES_HOME", raising=False)
    assert aider.config_path() == tmp_path / ".aider.conf.yml"
    assert hermes.config_path() == tmp_path / ".hermes" / "config.yaml"
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "h"))
    assert hermes.config_path() == tmp_path / "h" / "config.yaml"


@pytest.mark.parametrize(
    ("context", "said"),
    [
        ("8192", "does not hold Claude Code's first prompt (~12,200 tokens)"),
        ("16384", "minutes a call; a GPU engine answers in seconds"),
        ("131072", None),
    ],
)
def test_connect_says_what_to_expect_of_the_served_context(
    tmp_path: Path, context: str, said: str | None
) -> None:
    """Claude Code's 12k-token first prompt on SmolLM2 took 12.6 minutes (16k window): connect
    says so before the user finds out, and points to a model that holds it."""
    result = CliRunner().invoke(
        main,
        [
            "connect",
            "claude-code",
            "--file",
            str(tmp_path / "settings.json"),
            "--base-url",
            "http://127.0.0.1:8000",
            "--model",
            "m",
            "--context",
            context,
            "--print",
        ],
    )
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line[:1] not in "+- @{}("]
    out = " ".join(" ".join(notes).split())
    if said is None:
        assert notes == [], notes  # a context that holds it: nothing to say
    else:
        assert said in out and "claw-stream up --model" in out, out
