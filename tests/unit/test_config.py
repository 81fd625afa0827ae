"""The stack configuration: defaults, validation messages that name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from luftpause.config import (
    ConfigError,
    EndpointKind,
    KvRetention,
    load_config,
    load_secrets,
    parse_config,
)
from luftpause.scheduler.core.types import Params


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "stack.toml"
    path.write_text(text)
    return path


def test_packaged_default_describes_the_fake_stack() -> None:
    """X3: the default config runs the whole stack on fake engines."""
    config, path = load_config()
    assert path.name == "stack.toml"
    names = {e.name for e in config.endpoints}
    assert {"engine-a", "engine-b", "classifier"} <= names
    assert config.endpoint("classifier") is not None
    assert config.endpoint("classifier").kind is EndpointKind.SINGLE_PASS  # type: ignore[union-attr]
    assert config.scheduler.grpc_port == 5000 and config.scheduler.http_port == 5001
    assert config.dataplane.port == 8080 and config.runtime.port == 7000
    assert {e.port for e in config.fakes.engines} == {8001, 8002, 8003}


def test_constants_default_to_the_spec() -> None:
    """Constants table: probe 2 s, tick 1 s, turn timeout 10 min, idle expiry 30 min."""
    config = parse_config({}, "x.toml")
    s = config.scheduler
    assert (s.probe_period_s, s.clock_tick_s, s.turn_timeout_s, s.run_idle_expiry_s) == (
        2.0,
        1.0,
        600.0,
        1800.0,
    )
    d = config.dataplane
    assert (d.engine_connect_timeout_s, d.tool_call_id_memory_s, d.caller_max_bytes) == (
        2.0,
        1800.0,
        128,
    )
    r = config.runtime
    assert (
        r.default_max_tokens,
        r.default_max_tool_calls,
        r.await_timeout_s,
        r.await_max_s,
        r.turn_timeout_s,
        r.state_dir,
    ) == (256, 8, 60.0, 600.0, 600.0, "./state")


def test_bad_kind_names_file_field_and_problem(tmp_path: Path) -> None:
    """Config errors name the file, the dotted field path and the problem."""
    path = write(
        tmp_path,
        """
[[endpoints]]
name = "a"
url = "http://x:1"
models = ["m"]

[[endpoints]]
name = "b"
url = "http://x:2"
models = ["m"]
kind = "generator"
""",
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    msg = str(exc.value)
    assert str(path) in msg and "endpoints[1].kind" in msg and "generative" in msg


@pytest.mark.parametrize(
    ("toml", "field", "problem"),
    [
        ('[[endpoints]]\nname="a"\nurl="ftp://x"\nmodels=["m"]', "endpoints[0].url", "http"),
        ('[[endpoints]]\nname="a"\nurl="http://x"\nmodels=[]', "endpoints[0].models", "at least 1"),
        ("[scheduler]\ngrpc_port=70000", "scheduler.grpc_port", "65535"),
        ("[scheduler]\nprobe_period_s=0", "scheduler.probe_period_s", "greater than 0"),
        ("[dataplane]\nprot=1", "dataplane.prot", "unknown field"),
        (
            '[scheduler]\nstatus_runtimes=["http://x:7000/status?u=1"]',
            "scheduler.status_runtimes[0]",
            "match",
        ),
        ('[[runtime.tool_servers]]\nname="t"', "runtime.tool_servers[0]", "exactly one"),
        ('[[endpoints]]\nname="a b"\nurl="http://x"\nmodels=["m"]', "endpoints[0].name", "match"),
        (
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\n'
            "class_priority={interactive=1, batch=1}",
            "endpoints[0].class_priority",
            "must differ",
        ),
        (
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nclass_priority={interactive=1}',
            "endpoints[0].class_priority.batch",
            "required",
        ),
        (
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nkind="single_pass"\n'
            "class_priority={interactive=1, batch=0}",
            "endpoints[0]",
            "generative endpoints only",
        ),
        (
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nkind="single_pass"\nvision=true',
            "endpoints[0]",
            "vision applies to generative endpoints only",
        ),
        (
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nvision="maybe"',
            "endpoints[0].vision",
            "valid boolean",
        ),
        (
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nnative_apis=["grpc"]',
            "endpoints[0].native_apis[0]",
            "'messages' or 'responses'",
        ),
        (
            '[dataplane]\nsession_headers=["x session"]',
            "dataplane.session_headers",
            "not an HTTP header name",
        ),
        (
            '[dataplane]\nsession_headers=["X-Api-Key"]',
            "dataplane.session_headers",
            "carries credentials",
        ),
        (
            '[runtime.class_headers]\nfast={"x-a"="b"}',
            "runtime.class_headers.fast",
            "'interactive' or 'batch'",
        ),
        (
            '[runtime.class_headers]\ninteractive={"x-luftpause-class"="batch"}',
            "runtime.class_headers",
            "set by the runtime itself",
        ),
        (
            '[runtime.class_headers]\nbatch={"x-a"="b\\nc"}',
            "runtime.class_headers",
            "printable ASCII",
        ),
        (
            "[scheduler]\nlink_hello_timeout_s=0",
            "scheduler.link_hello_timeout_s",
            "greater than or equal to 0.01",
        ),
        (
            "[scheduler]\nlink_hello_timeout_s=1e9",
            "scheduler.link_hello_timeout_s",
            "less than or equal to 3600",
        ),
        (
            "[scheduler]\ntool_lease_min_s=0",
            "scheduler.tool_lease_min_s",
            "greater than 0",
        ),
        (
            "[scheduler]\ntool_lease_factor=0.5",
            "scheduler.tool_lease_factor",
            "greater than or equal to 1",
        ),
        (
            "[scheduler]\nlink_max_unauthenticated=0",
            "scheduler.link_max_unauthenticated",
            "greater than or equal to 1",
        ),
        ('[scheduler]\nfairness="token"', "scheduler.fairness", "'in_flight' or 'tokens'"),
        ('[scheduler]\nbatch_order="las"', "scheduler.batch_order", "'arrival' or 'attained'"),
        (
            '[scheduler]\nattained_measure="seconds"',
            "scheduler.attained_measure",
            "'tokens' or 'time'",
        ),
        ("[scheduler]\nprompt_weight=-1", "scheduler.prompt_weight", "greater than or equal to 0"),
        ("[scheduler]\ncompletion_weight=nan", "scheduler.completion_weight", "finite number"),
        (
            "[scheduler]\nprompt_weight=0\ncompletion_weight=0",
            "scheduler",
            "prompt_weight and completion_weight are both 0",
        ),
        ('[runtime]\nrun_id_headers=["Authorization"]', "runtime.run_id_headers", "itself"),
        ('[runtime]\nrun_id_headers=["Host"]', "runtime.run_id_headers", "request itself"),
        ('[runtime]\nclass_priority={batch="low"}', "runtime.class_priority.batch", "integer"),
        (
            '[dataplane.model_aliases]\n"claude-*"="qwen"\n'
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]',
            "dataplane.model_aliases['claude-*']",
            "no generative endpoint serves 'qwen'",
        ),
    ],
)
def test_field_errors(tmp_path: Path, toml: str, field: str, problem: str) -> None:
    """Every field is validated once at start; the message says which and why."""
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, toml))
    assert field in str(exc.value) and problem in str(exc.value)


def test_duplicate_endpoint_names_are_refused(tmp_path: Path) -> None:
    toml = '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\n' * 2
    with pytest.raises(ConfigError, match="duplicate endpoint name 'a'"):
        load_config(write(tmp_path, toml))


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[[endpoints"))
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(tmp_path / "absent.toml")


def test_secrets_come_from_the_environment_only() -> None:
    """S8, D9: api keys by named variable; a named but unset variable is an error."""
    config = parse_config(
        {"endpoints": [{"name": "h", "url": "https://h", "models": ["m"], "api_key_env": "HK"}]},
        "x.toml",
    )
    secrets = load_secrets(
        config,
        {"HK": "sk", "LUFTPAUSE_TOKEN": "t", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317"},
    )
    assert secrets.api_keys == {"h": "sk"} and secrets.token == "t"
    assert secrets.otel_endpoint == "http://otel:4317"
    with pytest.raises(ConfigError, match="'HK'"):
        load_secrets(config, {})


def test_class_priority_reaches_the_scheduler_as_engine_ordering(tmp_path: Path) -> None:
    """S4: an endpoint with class_priority is one whose engine orders classes."""
    from luftpause.scheduler.service.main import replica_specs

    config, _ = load_config(
        write(
            tmp_path,
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\n'
            "class_priority={interactive=10, batch=0}\n"
            '[[endpoints]]\nname="b"\nurl="http://y"\nmodels=["m"]\n',
        )
    )
    a = config.endpoints[0]
    assert a.class_priority is not None and a.class_priority.for_class("interactive") == 10
    assert a.class_priority.for_class("batch") == 0
    assert [s.orders_classes for s in replica_specs(config)] == [True, False]


def test_kv_retention_turns_retention_times_on_in_the_core(tmp_path: Path) -> None:
    """B8: an endpoint's ``kv_retention`` names a mechanism; any endpoint with one turns
    the core's retention times on; the default is none, off; another name is refused."""
    from luftpause.scheduler.service.main import core_params

    config, _ = load_config(
        write(
            tmp_path,
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nkv_retention="fake"\n'
            '[[endpoints]]\nname="b"\nurl="http://y"\nmodels=["m"]\n',
        )
    )
    assert [e.kv_retention for e in config.endpoints] == [KvRetention.FAKE, KvRetention.NONE]
    assert core_params(config.scheduler, config.endpoints).kv_retention
    assert not core_params(config.scheduler, config.endpoints[1:]).kv_retention
    assert not core_params(config.scheduler).kv_retention
    with pytest.raises(ConfigError) as exc:
        load_config(
            write(
                tmp_path,
                '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nkv_retention="pin"\n',
            )
        )
    assert "endpoints[0].kv_retention" in str(exc.value) and "vllm-router" in str(exc.value)


def test_scheduler_table_reaches_the_core_and_zero_turns_a_limit_off(tmp_path: Path) -> None:
    """S2, decode pace: ``initial_cap`` and ``interactive_pace_ms`` reach the core's
    params (milliseconds to seconds); 0 turns either off; a negative pace or a minimum
    under 2 tokens is refused, naming the field."""
    from luftpause.scheduler.service.main import core_params

    on, _ = load_config(
        write(tmp_path, "[scheduler]\ninteractive_pace_ms = 150\npace_min_tokens = 8\n")
    )
    params = core_params(on.scheduler)
    assert params.interactive_pace_s == 0.15 and params.pace_min_tokens == 8
    assert params.initial_cap == 16
    off, _ = load_config(write(tmp_path, "[scheduler]\ninteractive_pace_ms = 0\ninitial_cap = 0\n"))
    assert core_params(off.scheduler).interactive_pace_s is None
    assert core_params(off.scheduler).initial_cap is None
    for bad, field in (("interactive_pace_ms = -1", "interactive_pace_ms"),
                       ("pace_min_tokens = 1", "pace_min_tokens")):  # fmt: skip
        with pytest.raises(ConfigError, match=field):
            load_config(write(tmp_path, f"[scheduler]\n{bad}\n"))


def test_interactive_target_names_a_slowdown_a_pace_or_off(tmp_path: Path) -> None:
    """B7: ``interactive_target = "1.3x"`` sets the core's slowdown over the floor (and no
    absolute pace), ``"80ms"`` the absolute pace, ``"off"`` neither; unset, the
    ``interactive_pace_ms`` default governs. A slowdown of 1 or less, a pace of 0, a
    value without its unit, or both keys at once are refused with the reason.
    ``target_packing`` (off by default) reaches the core's params."""
    from luftpause.scheduler.service.main import core_params

    def params(text: str) -> Params:
        config, _ = load_config(write(tmp_path, f"[scheduler]\n{text}\n"))
        return core_params(config.scheduler)

    relative = params('interactive_target = "1.3x"')
    assert (relative.interactive_slowdown, relative.interactive_pace_s) == (1.3, None)
    absolute = params('interactive_target = " 80MS "')
    assert (absolute.interactive_slowdown, absolute.interactive_pace_s) == (None, 0.08)
    off = params('interactive_target = "off"')
    assert (off.interactive_slowdown, off.interactive_pace_s) == (None, None)
    default = params("")
    assert (default.interactive_slowdown, default.interactive_pace_s) == (None, 0.1)
    assert not relative.target_packing and not default.target_packing
    packed = params('interactive_target = "1.3x"\ntarget_packing = true')
    assert packed.interactive_slowdown == 1.3 and packed.target_packing
    for bad, reason in (
        ('target_packing = "yes please"', "target_packing"),
        ('interactive_target = "1x"', "must be above 1"),
        ('interactive_target = "0.5x"', "must be above 1"),
        ('interactive_target = "0ms"', "above 0 ms"),
        ('interactive_target = "1.3"', "expected a slowdown"),
        ('interactive_target = "nanx"', "expected a slowdown"),
        ('interactive_target = "fast"', "expected a slowdown"),
        ('interactive_target = "1.3x"\ninteractive_pace_ms = 100', "not both"),
    ):
        with pytest.raises(ConfigError, match=reason):
            params(bad)


def test_working_set_settings_reach_the_core_and_bad_ones_are_named(tmp_path: Path) -> None:
    """B5: ``[scheduler] working_set`` (off, replace, both), its share and KV-usage
    threshold (0: none) reach the core's params; ``[[endpoints]] kv_tokens`` is the
    endpoint's pool; a bad value is refused, naming the field and the problem."""
    from luftpause.scheduler.core import WorkingSet
    from luftpause.scheduler.service.main import core_params

    on, _ = load_config(
        write(
            tmp_path,
            '[scheduler]\nworking_set = "replace"\nworking_set_share = 0.8\n'
            "working_set_kv_usage = 0.95\n"
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nkv_tokens=65536\n',
        )
    )
    params = core_params(on.scheduler)
    assert params.working_set is WorkingSet.REPLACE
    assert (params.working_set_share, params.working_set_kv_usage) == (0.8, 0.95)
    assert on.endpoints[0].kv_tokens == 65536
    assert core_params(load_config(write(tmp_path, ""))[0].scheduler).working_set_kv_usage is None
    for bad, field, problem in (
        ('working_set = "always"', "scheduler.working_set", "'off', 'replace' or 'both'"),
        ("working_set_share = 0", "scheduler.working_set_share", "greater than 0"),
        ("working_set_share = 1.5", "scheduler.working_set_share", "less than or equal to 1"),
        ("working_set_kv_usage = 2", "scheduler.working_set_kv_usage", "less than or equal"),
    ):
        with pytest.raises(ConfigError) as exc:
            load_config(write(tmp_path, f"[scheduler]\n{bad}\n"))
        assert field in str(exc.value) and problem in str(exc.value), str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load_config(
            write(tmp_path, '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["m"]\nkv_tokens=0\n')
        )
    assert "kv_tokens" in str(exc.value) and "greater than or equal to 1" in str(exc.value)


def test_held_turn_order_options_reach_the_core(tmp_path: Path) -> None:
    """B2, B3: the held-turn order's keys reach the core's params; by default the order
    is S5's (fewest turns in flight) and arrival within the batch class."""
    from luftpause.scheduler.service.main import core_params

    plain, _ = load_config(write(tmp_path, "[scheduler]\n"))
    assert core_params(plain.scheduler).fairness == "in_flight"
    assert core_params(plain.scheduler).batch_order == "arrival"
    on, _ = load_config(
        write(
            tmp_path,
            '[scheduler]\nfairness = "tokens"\nprompt_weight = 0.5\ncompletion_weight = 4\n'
            'batch_order = "attained"\nattained_measure = "time"\n',
        )
    )
    params = core_params(on.scheduler)
    assert (params.fairness, params.prompt_weight, params.completion_weight) == ("tokens", 0.5, 4)
    assert (params.batch_order, params.attained_measure) == ("attained", "time")


def test_strings_name_environment_variables(tmp_path: Path) -> None:
    """X3: `${NAME}`, `${NAME:-default}` and `$$` in string values are expanded from the
    environment passed in, where the file is loaded; keys, numbers and the process's own
    environment are left alone."""
    path = write(
        tmp_path,
        """
[dataplane]
port = "${PORT:-8090}"

[[endpoints]]
name = "pod"
url = "https://${POD_ID}-8000.proxy.example.net"
models = ["${MODEL:-m-default}", "cost$$", "${EMPTY:-fallback}"]
api_key_env = "POD_KEY"
""",
    )
    env = {"POD_ID": "abc", "EMPTY": ""}
    config, _ = load_config(path, env)
    (pod,) = config.endpoints
    assert pod.url == "https://abc-8000.proxy.example.net"
    assert pod.models == ("m-default", "cost$", "fallback")
    assert pod.api_key_env == "POD_KEY"  # a variable's name, not expanded
    assert config.dataplane.port == 8090  # a string of digits validates as a number
    config, _ = load_config(path, {**env, "MODEL": "llama", "PORT": "9000"})
    assert config.endpoints[0].models[0] == "llama" and config.dataplane.port == 9000


def test_an_unset_variable_names_itself_and_every_field(tmp_path: Path) -> None:
    """X3: every `${NAME}` without default whose variable is unset is reported at once,
    with the file, the field and the variable; a set but empty variable is used as is."""
    path = write(
        tmp_path,
        """
[runtime]
default_model = "${MODEL}"

[[endpoints]]
name = "pod"
url = "https://${POD_ID}.example.net"
models = ["${MODEL}"]
""",
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path, {})
    lines = str(exc.value).splitlines()
    assert len(lines) == 3
    assert f"{path}: runtime.default_model: environment variable MODEL is not set" in lines[0]
    assert "endpoints[0].url: environment variable POD_ID is not set" in lines[1]
    assert "endpoints[0].models[0]: environment variable MODEL is not set" in lines[2]
    assert "${MODEL:-default}" in lines[0]  # how to give a default
    config, _ = load_config(
        write(tmp_path, '[runtime]\ndefault_model = "${MODEL}"\n'), {"MODEL": ""}
    )
    assert config.runtime.default_model == ""


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("$MODEL", "must start ${NAME}"),
        ("a $ b", "must start ${NAME}"),
        ("${MODEL", "not closed"),
        ("${1ABC}", "is not ${NAME}"),
        ("${A B}", "is not ${NAME}"),
        ("${MODEL:-${OTHER}}", "literal text"),
    ],
)
def test_a_malformed_reference_is_an_error(tmp_path: Path, value: str, problem: str) -> None:
    """X3: a `$` that is not `${NAME}`, `${NAME:-default}` or `$$` is refused, so a typo
    never reaches a service as a literal."""
    path = write(tmp_path, f'[runtime]\ndefault_model = "{value}"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path, {"MODEL": "m", "OTHER": "o"})
    assert "runtime.default_model" in str(exc.value) and problem in str(exc.value)


def test_the_environment_defaults_to_the_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entry points call load_config without an environment: the process's is used."""
    monkeypatch.setenv("LUFTPAUSE_TEST_MODEL", "from-process")
    path = write(tmp_path, '[runtime]\ndefault_model = "${LUFTPAUSE_TEST_MODEL}"\n')
    config, _ = load_config(path)
    assert config.runtime.default_model == "from-process"
    config, _ = load_config(path, {"LUFTPAUSE_TEST_MODEL": "passed-in"})
    assert config.runtime.default_model == "passed-in"


def test_harness_settings(tmp_path: Path) -> None:
    """B9, B4: model aliases keep their order (the first that matches wins), session
    header names are matched without regard to case, native APIs and vision are per
    endpoint (vision off unless set)."""
    config, _ = load_config(
        write(
            tmp_path,
            '[dataplane]\nsession_headers=["X-Session-Affinity"]\n'
            '[dataplane.model_aliases]\n"claude-haiku-*"="small"\n"claude-*"="big"\n'
            '[[endpoints]]\nname="a"\nurl="http://x"\nmodels=["big", "small"]\n'
            'native_apis=["messages"]\nvision=true\n'
            '[[endpoints]]\nname="b"\nurl="http://y"\nmodels=["big"]',
        )
    )
    assert [e.vision for e in config.endpoints] == [True, False]
    assert list(config.dataplane.model_aliases.items()) == [
        ("claude-haiku-*", "small"),
        ("claude-*", "big"),
    ]
    assert config.dataplane.session_headers == ("x-session-affinity",)
    assert [a.value for a in config.endpoints[0].native_apis] == ["messages"]


def test_link_limits_reach_the_link_and_default_alike(tmp_path: Path) -> None:
    """X2 (the Link port): ``link_hello_timeout_s`` and ``link_max_unauthenticated``
    reach the Link's limits; unset, the file's defaults are the library's."""
    from luftpause.scheduler.service.main import link_limits
    from luftpause.scheduler.service.tcp_link import LinkLimits

    assert link_limits(parse_config({}, "x.toml").scheduler) == LinkLimits()
    config, _ = load_config(
        write(tmp_path, "[scheduler]\nlink_hello_timeout_s = 0.5\nlink_max_unauthenticated = 3\n")
    )
    assert link_limits(config.scheduler) == LinkLimits(hello_timeout_s=0.5, max_unauthenticated=3)


def test_dns_servers_are_addresses_with_an_optional_port(tmp_path: Path) -> None:
    """B11: ``[scheduler] dns_servers`` for DNS pools: IP addresses, IPv6 in brackets with a
    port; a name or a bad port is an error naming the entry."""
    from luftpause.config import dns_server

    assert dns_server("127.0.0.1:8600") == ("127.0.0.1", 8600)
    assert dns_server("[::1]:5353") == ("::1", 5353) and dns_server("10.0.0.2") == ("10.0.0.2", 53)
    path = write(tmp_path, '[scheduler]\ndns_servers = ["dns.example:53"]\n')
    with pytest.raises(ConfigError, match=r"scheduler.dns_servers.*IP address"):
        load_config(path, {})
