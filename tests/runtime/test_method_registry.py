"""The drafting-method registry (runtime/methods.py, runtime/proposers/method.py): a new drafter is one module and one
registration, and then requests, load_engine(drafters=...), the command lines' flags and the server's messages take it;
the round asks the draft length of one policy (runtime/draft_policy.py) and nothing else."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import click
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import spec_pair
from engine_runs import run_until_done

from specdec.cli.common import method_configs, method_options
from specdec.formats.config_strings import NGramConfig
from specdec.formats.errors import RequestError
from specdec.runtime import methods
from specdec.runtime.draft_policy import FixedDraftPolicy
from specdec.runtime.loading import load_engine, method_draft_lens
from specdec.runtime.methods import TARGET_ONLY, method_names, register_method
from specdec.runtime.proposers.base import Draft, Proposer
from specdec.runtime.proposers.method import Flag, Method, get_method
from specdec.runtime.request import GenerationConfig

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13, 14], [20, 21, 22, 20, 21, 22, 20]]


@dataclass(frozen=True)
class RepeatConfig:
    """The toy method's config: draft the request's last ``period`` tokens again, ``max_draft_len`` at most."""

    period: int = 2
    max_draft_len: int = 3


class RepeatProposer(Proposer):
    """Drafts what came ``period`` tokens back (a copy of the text's own rhythm): deterministic, no model."""

    name = "repeat"
    label = "repeat-last"

    def __init__(self, config: RepeatConfig):
        self.config, self.default_draft_len = config, config.max_draft_len
        self.seqs: dict[str, list[int]] = {}

    def add(self, requests):
        for r in requests:
            self.seqs[r.request_id] = [*r.prompt_ids, *r.output_ids]

    def remove(self, request_id):
        del self.seqs[request_id]

    def room(self, request):
        return self.config.max_draft_len

    def propose(self, requests, draft_lens):
        out = []
        for r, k in zip(requests, draft_lens, strict=True):
            seq, p = self.seqs[r.request_id], self.config.period
            out.append(Draft(np.array([seq[len(seq) - p + (j % p)] for j in range(int(k))] if len(seq) >= p else [], np.int64)))
        return out

    def observe(self, request, draft, target):
        self.seqs[request.request_id] += target.emitted


def toy_module() -> types.ModuleType:
    """What a new drafter's file holds: its proposer, its config, its METHOD."""
    module = types.ModuleType("toy_repeat_method")
    module.METHOD = Method(
        name="repeat", config=RepeatConfig, proposer=RepeatProposer, open=lambda config, context: RepeatProposer(config),
        flag="--repeat_period", flags=(Flag("repeat_period", "Draft what came this many tokens back.", int),),
        from_flags=lambda values: RepeatConfig(values["repeat_period"]) if values.get("repeat_period") else None)
    return module


@pytest.fixture
def toy_method(monkeypatch):
    monkeypatch.setitem(sys.modules, "toy_repeat_method", toy_module())
    monkeypatch.setattr(methods, "_METHODS", dict(methods._METHODS))  # registered for this test only
    register_method("repeat", "toy_repeat_method")
    return get_method("repeat")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return spec_pair(tmp_path_factory.mktemp("registry"), max_draft_len=3)


def greedy(engine, prompts=PROMPTS, method=None):
    ids = [engine.add_request(p, GenerationConfig(max_output_len=12, method=method)) for p in prompts]
    done = run_until_done(engine)
    return [done[i].output_ids for i in ids], engine.stats


def test_a_registered_method_is_one_module_and_one_line(pair, toy_method):
    target = pair["target"]
    assert "repeat" in method_names() and GenerationConfig(method="repeat").method == "repeat"
    engine = load_engine(target.engine, drafters=[RepeatConfig(period=4)], target_executor=target)
    assert engine.speculation.method == "repeat" and engine.speculation.draft_len == 3  # its proposer's default
    assert method_draft_lens(engine) == {"repeat": 3}
    got, stats = greedy(engine)
    want, _ = greedy(load_engine(target.engine, target_executor=target))
    assert got == want and stats.drafted > 0  # drafts verified, output the target's own
    # beside a built-in method, in the registry's order: ngram was registered first, so it is the default
    both = load_engine(target.engine, drafters=[RepeatConfig(), NGramConfig(2, 2, [0])], target_executor=target)
    assert list(both.proposers) == ["ngram", "repeat"] and both.speculation.method == "ngram"
    assert greedy(both, method="repeat")[0] == want


def test_a_method_nobody_registered_is_refused_by_name_and_by_config(pair):
    with pytest.raises(RequestError, match="unknown speculation method 'repeat'"):
        GenerationConfig(method="repeat")
    with pytest.raises(TypeError, match="RepeatConfig is not the config of a drafting method"):
        load_engine(pair["target"].engine, drafters=[RepeatConfig()], target_executor=pair["target"])


def test_the_command_lines_take_a_registered_methods_flags(toy_method):
    seen = []

    @click.command()
    @method_options
    def cli(**flags):
        seen.append([(m.name, c) for m, c in method_configs(flags)])
        assert flags == {}  # every method flag was taken

    result = CliRunner().invoke(cli, ["--repeat_period", "3", "--ngram_config", "[4,2,[0]]", "--ngram_keep_newest"])
    assert result.exit_code == 0, result.output
    assert seen == [[("ngram", NGramConfig(4, 2, [0], is_keep_all=False)), ("repeat", RepeatConfig(3))]]
    assert "--repeat-period" in CliRunner().invoke(cli, ["--help"]).output


def test_configs_for_another_targets_drafter_or_twice_the_same_method_are_refused(pair):
    from specdec.runtime.proposers.medusa import MedusaConfig

    with pytest.raises(RequestError, match="--medusa_choices needs a target engine built with --speculative_decoding_mode medusa"):
        load_engine(pair["target"].engine, drafters=[MedusaConfig("[[0]]")], target_executor=pair["target"])
    with pytest.raises(RequestError, match="two configs for the drafting method 'ngram'"):
        load_engine(pair["target"].engine, drafters=[NGramConfig(2, 2, [0]), NGramConfig(3, 2, [0])], target_executor=pair["target"])


def test_the_server_names_how_a_method_is_loaded():
    assert [get_method(m).loaded_by for m in method_names() if m != TARGET_ONLY] == [
        "--draft_engine_dir", "--ngram_config", "a target engine built with --speculative_decoding_mode medusa",
        "a target engine built with --speculative_decoding_mode eagle",
        "a target engine built with --speculative_decoding_mode peagle", "--suffix_config"]


class Recording(FixedDraftPolicy):
    """The fixed policy, with every call the round makes to it written down."""

    def __init__(self, cap: int | None = None):
        self.calls: list[str] = []
        self.cap = cap
        self.granted: list[int] = []  # each draft_len answer

    def begin(self, reqs, round_index):
        self.calls.append("begin")

    def draft_len(self, r, proposer, limit, running):
        self.calls.append("draft_len")
        k = super().draft_len(r, proposer, limit, running)
        self.granted.append(k if self.cap is None else min(k, self.cap))
        return self.granted[-1]

    def fit(self, reqs, drafts):
        self.calls.append("fit")
        return drafts

    def proposed(self, method, rows, steps, seconds, fed, catch_up_seconds, refined=(0, 0.0)):
        self.calls.append("proposed")

    def verified(self, rows, width, seconds):
        self.calls.append(f"verified {rows}x{width}")

    def observed(self, r, draft, accepted, path=(), emitted=()):
        self.calls.append("observed")


@pytest.mark.parametrize("cap", [None, 0])
def test_the_round_asks_its_policy_at_the_named_points(pair, cap):
    target = pair["target"]
    engine = load_engine(target.engine, ngram=NGramConfig(3, 2, [0]), target_executor=target)
    policy = engine.round.policy = Recording(cap)
    got, stats = greedy(engine, PROMPTS[:1])
    assert got == greedy(load_engine(target.engine, target_executor=target), PROMPTS[:1])[0]
    rounds = policy.calls.count("begin")
    assert rounds == stats.rounds
    assert policy.calls.count("draft_len") == rounds - 1  # asked when there is room: the last round has none (max_output_len)
    assert policy.calls.count("fit") == sum(k > 0 for k in policy.granted)  # fit where a request may draft (one request here)
    assert policy.calls.count("observed") == rounds - stats.no_draft_rounds  # observed where it drafted: n-gram matched
    widths = [c for c in policy.calls if c.startswith("verified")]
    assert len(widths) == rounds
    if cap == 0:  # a policy that grants no drafts: one-token calls, no proposer called
        assert stats.drafted == 0 and set(widths) == {"verified 1x1"} and "proposed" not in policy.calls
    else:
        assert stats.drafted > 0 and "proposed" in policy.calls
