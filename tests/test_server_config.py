"""ServerConfig: validated once, one flag per field on ``serve``, handed down as an object.

And the server's place: a package above the engine that the engine never imports.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from server_helpers import make_llm, tiny

from paged_np.cli import serve as serve_cli
from paged_np.cli.options import flag
from paged_np.errors import DTypeError, IndexOutOfRange, InvalidArgument, PagedNPError
from paged_np.server import ServerConfig

ROOT = Path(__file__).resolve().parents[1]

#: The serve command's server flags before ServerConfig made them: each must still parse.
OLD_FLAGS = {"--served-model-name": "served_model_name", "--host": "host", "--port": "port",
             "--drain-timeout": "drain_s", "--log-level": "log_level", "--api-key": "api_key",
             "--open": "open_browser", "--dashboard-show-text": "show_text"}


@pytest.mark.parametrize("field, value, error", [
    ("port", -1, IndexOutOfRange),
    ("port", 65536, IndexOutOfRange),
    ("port", "8000", DTypeError),
    ("host", "", InvalidArgument),
    ("host", None, DTypeError),
    ("served_model_name", "  ", InvalidArgument),
    ("served_model_name", 3, DTypeError),
    ("api_key", "", InvalidArgument),
    ("drain_s", -0.5, InvalidArgument),
    ("drain_s", float("nan"), InvalidArgument),
    ("drain_s", "5", DTypeError),
    ("drain_s", True, DTypeError),
    ("log_level", "loud", InvalidArgument),
    ("show_text", "yes", DTypeError),
    ("open_browser", 1, DTypeError),
    ("max_n", 0, InvalidArgument),
    ("max_body_bytes", 0, InvalidArgument),
    ("max_body_bytes", "1MiB", DTypeError),
    ("max_prompt_chars", -1, InvalidArgument),
    ("max_stop", -1, InvalidArgument),
    ("max_stop", 4.0, DTypeError),
    ("max_stop_chars", 0, InvalidArgument),
    ("max_logprob_entries", 0, InvalidArgument),
    ("max_cache_streams", 0, InvalidArgument),
    ("max_cache_streams", True, DTypeError),
    ("dashboard_session_s", 0, InvalidArgument),
    ("dashboard_session_s", float("inf"), InvalidArgument),
    ("max_dashboard_sessions", 0, InvalidArgument),
])
def test_a_bad_value_is_refused_by_its_field_name(field, value, error):
    with pytest.raises(error, match=rf"ServerConfig\.{field}") as e:
        ServerConfig(**{field: value})
    assert isinstance(e.value, PagedNPError)


def test_values_are_normalised():
    cfg = ServerConfig(drain_s=2, port=0, max_n=3)
    assert (cfg.drain_s, type(cfg.drain_s), cfg.port, cfg.max_n) == (2.0, float, 0, 3)
    assert ServerConfig().drain_s == 5.0 and ServerConfig().port == 8000


def test_from_options_replaces_fields_and_refuses_unknown_names():
    base = ServerConfig(port=9000)
    cfg = ServerConfig.from_options(base, api_key="k")
    assert (cfg.port, cfg.api_key, base.api_key) == (9000, "k", None)
    assert ServerConfig.from_options(None, host="0.0.0.0") == ServerConfig(host="0.0.0.0")
    with pytest.raises(InvalidArgument, match=r"unknown server option\(s\) \['drain'\]"):
        ServerConfig.from_options(drain=1.0)
    with pytest.raises(DTypeError, match="config must be a ServerConfig"):
        ServerConfig.from_options({"port": 1})


def test_every_field_is_a_serve_flag_and_every_old_flag_still_parses():
    parser = serve_cli.build_parser()
    dests = {a.dest: a.option_strings for a in parser._actions}
    for f in dataclasses.fields(ServerConfig):
        names = dict(f.metadata).get("flags", [flag(f.name)])
        assert dests[f.name] == [*names, *(["--no-" + n[2:] for n in names]
                                           if isinstance(f.default, bool) else [])]
    argv = ["--served-model-name", "m", "--host", "0.0.0.0", "--port", "9001",
            "--drain-timeout", "0.5", "--log-level", "debug", "--api-key", "k", "--open",
            "--dashboard-show-text", "--model", "tiny-random"]
    args = parser.parse_args(argv)
    assert {dest: getattr(args, dest) for dest in OLD_FLAGS.values()} == dict(
        served_model_name="m", host="0.0.0.0", port=9001, drain_s=0.5, log_level="debug",
        api_key="k", open_browser=True, show_text=True)
    assert serve_cli.server_config(args) == ServerConfig(
        served_model_name="m", host="0.0.0.0", port=9001, drain_s=0.5, log_level="debug",
        api_key="k", open_browser=True, show_text=True)


def test_the_command_defaults_are_the_fields_and_the_name_is_the_model():
    args = serve_cli.build_parser().parse_args(["--model", "tiny-random"])
    assert serve_cli.server_config(args) == ServerConfig(served_model_name="tiny-random")


def test_the_key_comes_from_the_environment_unless_the_flag_gives_one():
    parser = serve_cli.build_parser()
    args = parser.parse_args(["--model", "tiny-random"])
    env = {"PAGED_NP_API_KEY": "from-env"}
    assert serve_cli.server_config(args, environ=env).api_key == "from-env"
    assert serve_cli.server_config(args, environ={}).api_key is None
    flagged = parser.parse_args(["--model", "tiny-random", "--api-key", "from-flag"])
    assert serve_cli.server_config(flagged, environ=env).api_key == "from-flag"
    with pytest.raises(InvalidArgument, match="PAGED_NP_API_KEY is set but empty"):
        serve_cli.server_config(args, environ={"PAGED_NP_API_KEY": ""})
    with pytest.raises(InvalidArgument, match="api_key must not be empty: give a key"):
        ServerConfig(api_key=" ")


def test_the_limits_left_to_the_model_are_sized_from_it():
    from paged_np.server import create_app

    llm = make_llm(*tiny(), num_pages=16, max_num_seqs=4)      # 256 tokens of context
    srv = create_app(llm).state.server
    # the tiny vocabulary's longest entry is "<|endoftext|>", 13 characters
    assert srv.max_prompt_chars == llm.max_model_len * 13
    assert srv.max_body_bytes == (1 << 20) + 6 * srv.max_prompt_chars
    srv = create_app(llm, max_prompt_chars=100, max_body_bytes=5000).state.server
    assert (srv.max_prompt_chars, srv.max_body_bytes) == (100, 5000)
    cfg = ServerConfig()
    assert (cfg.max_stop, cfg.max_stop_chars, cfg.max_logprob_entries,
            cfg.max_cache_streams) == (4, 256, 262_144, 32)


def test_a_refused_server_flag_exits_before_loading(capsys):
    with pytest.raises(SystemExit) as e:
        serve_cli.main(["--model", "tiny-random", "--port", "70000"])
    assert e.value.code == 2
    assert "ServerConfig.port 70000 is outside [0, 65536)" in capsys.readouterr().err


def test_the_server_takes_the_object_and_checks_it_against_the_engine():
    from paged_np.server import ServerThread, create_app

    llm = make_llm(*tiny(), num_pages=16, max_num_seqs=4)
    srv = ServerThread(llm, ServerConfig(port=0, drain_s=0.25, api_key="k"))
    assert (srv.config.drain_s, srv.config.api_key, srv.drain_s) == (0.25, "k", 0.25)
    srv._sock.close()
    assert ServerThread(llm, show_text=True).config == dataclasses.replace(
        ServerThread.DEFAULTS, show_text=True)
    assert create_app(llm, max_n=4).state.server.max_n == 4
    with pytest.raises(InvalidArgument, match=r"ServerConfig\.max_n \(5\).*max_num_seqs \(4\)"):
        create_app(llm, ServerConfig(max_n=5))
    with pytest.raises(InvalidArgument, match="unknown server option"):
        create_app(llm, show_txt=True)


def _imports(path: Path, root: Path = ROOT) -> set:
    """The modules ``path`` imports by name, at any depth (relative ones made absolute)."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)]
            target = ".".join(base + [node.module or ""]) if node.level else node.module
            found.update({target, *(f"{target}.{a.name}" for a in node.names)})
    return found


def test_nothing_below_the_server_imports_it(tmp_path):
    below = [p for sub in ("engine", "cache", "attention", "models", "quant")
             for p in (ROOT / "paged_np" / sub).rglob("*.py")]
    assert len(below) > 30
    bad = {str(p.relative_to(ROOT)) for p in below
           if any(m.startswith("paged_np.server") for m in _imports(p))}
    assert not bad, f"these import the server: {sorted(bad)}"
    # the checker itself sees relative, absolute and in-function imports of it
    probe = tmp_path / "paged_np" / "engine" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from ..server import app\ndef f():\n    import paged_np.server.loop\n")
    assert {"paged_np.server.app", "paged_np.server.loop"} <= _imports(probe, tmp_path)


def test_the_config_and_the_help_need_no_fastapi():
    code = ("import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None\n"
            "from paged_np.server import ServerConfig\n"
            "from paged_np.cli import serve\n"
            "assert ServerConfig(port=1).port == 1\n"
            "serve.build_parser().format_help()\n"
            "try:\n"
            "    from paged_np.server import create_app\n"
            "except ImportError:\n"
            "    print('app needs fastapi')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "app needs fastapi"
