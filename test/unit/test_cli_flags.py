"""The server's and the simulator's flags are SGLang's names: generating them from the config
fields must not rename, drop or re-default any. ``data/cli_flags_before.json`` is the parsers'
option set dumped before the flags were generated (option strings, dest, default, choices,
action, nargs), and every entry must still be there, the same."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from sglang_pd.server_args import ServerArgs, parse_server_args
from sglang_pd.sim.cli import add_common

BEFORE = json.loads((Path(__file__).parent / "data" / "cli_flags_before.json").read_text())
FIELDS = ("dest", "default", "const", "nargs", "required", "choices", "type", "action")
# the one default that changed form, not value: the field's 256 (an int) instead of the text
# "256" (server) or None meaning PolicyConfig's 256 (simulator); "N" and "auto" still parse
CHANGED_DEFAULTS = {("server", "--short-prefill-threshold"): ("256", 256),
                    ("sim", "--short-prefill-threshold"): (None, 256)}


def _actions(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        row = {"option_strings": list(a.option_strings), "dest": a.dest, "default": a.default,
               "const": a.const, "nargs": a.nargs, "required": a.required,
               "choices": sorted(a.choices) if a.choices is not None else None,
               "type": getattr(a.type, "__name__", None), "action": type(a).__name__}
        row = json.loads(json.dumps(row, default=str))  # as the dump wrote it
        for opt in a.option_strings:
            out[opt] = row
    return out


def _server_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return p


def _sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_common(p)
    return p


@pytest.mark.parametrize("name,build", [("server", _server_parser), ("sim", _sim_parser)])
def test_every_flag_kept_with_its_dest_default_and_choices(name: str, build: Any) -> None:
    now = _actions(build())
    for old in BEFORE[name]:
        for opt in old["option_strings"]:
            assert opt in now, f"{name}: flag {opt} is gone"
            new = now[opt]
            assert set(old["option_strings"]) <= set(new["option_strings"]), (opt, new["option_strings"])
            for key in FIELDS:
                if key == "default" and (name, opt) in CHANGED_DEFAULTS:
                    assert (old[key], new[key]) == CHANGED_DEFAULTS[name, opt]
                    continue
                if key == "choices" and old[key] is not None and new[key] is not None:
                    # a registry may grow (a new policy); none of the old names may go
                    assert set(old[key]) <= set(new[key]), f"{name} {opt}: choices lost {old[key]!r}"
                    continue
                assert new[key] == old[key], f"{name} {opt}: {key} {old[key]!r} -> {new[key]!r}"


def test_server_flags_parse_into_the_policy_config() -> None:
    args = parse_server_args(["--model", "m", "--prefill-policy", "kairos+", "--awd-sigma-ms", "7",
                              "--short-prefill-threshold", "auto", "--prefill-queues", "dual",
                              "--mode", "prefill", "--slo-ttft-ms", "900"])
    cfg = args.policy_config()
    assert args.schedule_policy == "kairos+" and args.disaggregation_mode == "prefill"
    assert (cfg.awd_sigma_ms, cfg.short_prefill_threshold, cfg.prefill_queues, cfg.role, cfg.slo_ttft_ms) == \
        (7.0, None, "dual", "prefill", 900.0)


def test_the_simulator_gets_every_policy_flag_of_the_server() -> None:
    """One definition: each PolicyConfig flag is a flag of both CLIs (the simulator's
    --prefill-role is per instance, its own)."""
    server, sim = _actions(_server_parser()), _actions(_sim_parser())
    from sglang_pd.scheduling.config import PolicyConfig
    from sglang_pd.utils.flags import flag_fields
    for f in flag_fields(PolicyConfig):
        opt = f.metadata["flag"].names[0]
        assert server[opt]["dest"] == f.name
        if f.name != "prefill_role":
            assert sim[opt]["dest"] == f.name and sim[opt]["default"] == server[opt]["default"]


def test_sim_flags_build_the_same_policy_config_as_the_server() -> None:
    from sglang_pd.sim.cli import policy_config
    argv = ["--prefill-queues", "dual", "--short-prefill-threshold", "auto", "--awd-t-max-ms", "50",
            "--slo-tpot-ms", "40", "--chunked-prefill-size", "512"]
    sim = policy_config(_sim_parser().parse_args(argv))
    server = parse_server_args(["--model", "m", *argv]).policy_config()
    assert sim == server and sim.short_prefill_threshold is None and sim.awd_t_max_ms == 50.0


def test_bad_threshold_text_is_refused_with_the_flag_name() -> None:
    with pytest.raises(ValueError, match="--short-prefill-threshold must be a token count or 'auto'"):
        parse_server_args(["--model", "m", "--short-prefill-threshold", "lots"])
