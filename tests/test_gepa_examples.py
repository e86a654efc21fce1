"""Our GEPA's `examples` edit without a model: the inputs the container cited, quoted as
`"input" -> answer` lines (no proposer call), when a turn leads with it, its caps, the
run's earlier failures, the section on the policy's invented answers, and (in a run on a
container that cites nothing) what a turn does when the edit would add nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from algorithms.gepa.edits import LearnedModule, union
from algorithms.gepa.optimizer import GepaParams
from harness.candidates import RolloutResult
from conftest import container_spec, execute, make_run_spec, read_evidence
from servers import ScriptedModelThread
from test_gepa_proposer import LABELS, SEED, SETTINGS, failure


def cited_failure(expected: str, given: str, text: str, cited: dict[str, tuple[str, ...]]) -> RolloutResult:
    return failure(expected, given, text).model_copy(update={"answer_examples": cited})


def test_examples_quote_the_containers_cited_inputs_expected_answers_first() -> None:
    from algorithms.gepa.reflect import cite_examples

    results = [
        cited_failure("card_arrival", "card_delivery_estimate", "my card never came",
                      {"card_arrival": ("my card never came", "card still not here", "where is the card I ordered"),
                       "card_delivery_estimate": ("how long does a card take to arrive",)}),
        RolloutResult(candidate_id="c0", task_id="train:2", reward=1.0, status="ok", output="exchange_rate",
                      answer_examples={"exchange_rate": ("what rate do you use",)}),  # a success: not quoted
        cited_failure("top_up_failed", "card_arrival", "my top up did not go through",
                      {"top_up_failed": ("my top up did not go through", "top up was declined today"),
                       "card_arrival": ("x",)}),  # too short
    ]
    proposal = cite_examples(SEED, results, SETTINGS)
    assert (proposal.status, proposal.edit_format, proposal.added, proposal.prompt) == ("changed", "examples", 3, "")
    module = LearnedModule.parse(proposal.text)
    assert module.base == SEED
    # never the minibatch's own messages: the child would win the very rows it is judged on
    assert module.lines("examples") == (
        '- "card still not here" -> card_arrival',
        '- "top up was declined today" -> top_up_failed',
        '- "how long does a card take to arrive" -> card_delivery_estimate',
    )
    # cited again: the next input the module does not quote yet, else nothing new
    again = cite_examples(proposal.text, results[:1], SETTINGS)
    assert LearnedModule.parse(again.text).lines("examples")[-1] == '- "where is the card I ordered" -> card_arrival'
    assert cite_examples(again.text, results[:1], SETTINGS).status == "unchanged"
    # a container that cites nothing gives nothing to quote
    assert cite_examples(SEED, [failure("card_arrival", "exchange_rate")], SETTINGS).status == "unchanged"


def test_a_full_examples_section_keeps_its_newest_lines() -> None:
    from algorithms.gepa.reflect import cite_examples

    settings = GepaParams(max_new_lines=2, max_example_lines=3).edit_settings()
    old = [f'- "old message number {i}" -> exchange_rate' for i in range(3)]
    module = LearnedModule(base=SEED).with_lines("examples", old).render()
    results = [cited_failure("card_arrival", "exchange_rate", "my card never came",
                             {"card_arrival": ("card still not here",), "exchange_rate": ("what rate is it",)})]
    lines = LearnedModule.parse(cite_examples(module, results, settings).text).lines("examples")
    assert lines == (old[2], '- "card still not here" -> card_arrival', '- "what rate is it" -> exchange_rate')
    # a merge keeps the examples section within its own cap
    other = LearnedModule(base=SEED).with_lines("examples", ['- "a fourth one here" -> top_up_failed']).render()
    assert len(LearnedModule.parse(union(module, other, settings.section_caps)).lines("examples")) == 3
    assert len(LearnedModule.parse(union(module, other, SETTINGS.section_caps)).lines("examples")) == 4


def test_examples_lead_a_turn_only_when_its_failures_cite_inputs() -> None:
    from algorithms.gepa.reflect import format_plan

    formats = ("examples", "rules", "answer_guide")
    uncited = [failure("card_arrival", "exchange_rate")]
    cited = [cited_failure("card_arrival", "exchange_rate", "my card never came",
                           {"card_arrival": ("card still not here",)})]
    # a success's citations do not count: there is nothing to correct
    cited_success = [RolloutResult(candidate_id="c0", task_id="train:2", reward=1.0, status="ok",
                                   output="exchange_rate", answer_examples={"exchange_rate": ("what rate",)})]
    rotation = [["examples", "rules"], ["rules", "answer_guide"], ["answer_guide", "examples"]]
    leading = [["examples", "rules"], ["examples", "rules", "answer_guide"], ["examples", "answer_guide"]]
    for turn in range(6):
        plan = lambda results, first: format_plan(SEED, formats, turn, 2, results, SETTINGS, first)  # noqa: E731
        # a container that cites nothing gets the plain rotation, whatever the setting
        assert plan(uncited, True) == plan(uncited, False) == rotation[turn % 3]
        assert plan(cited_success + uncited, True) == rotation[turn % 3]
        assert plan(cited, False) == rotation[turn % 3]
        assert plan(cited, True) == leading[turn % 3]
        # an idle examples edit (asking_when_uncited, and the edit would add nothing): every
        # attempt is a request, whether the failures cite nothing or only what the module quotes
        idle = lambda results: format_plan(SEED, formats, turn, 2, results, SETTINGS, True, True)  # noqa: E731
        assert idle(uncited) == idle(cited) == [["rules", "answer_guide"], ["answer_guide", "rules"]][turn % 2]
    # only `examples` among the formats: an idle turn keeps it (and asks nothing)
    assert format_plan(SEED, ("examples",), 0, 2, uncited, SETTINGS, True, True) == ["examples", "examples"]
    # without `examples` among the formats there is nothing to lead with
    assert format_plan(SEED, ("rules", "answer_guide"), 0, 2, cited, SETTINGS, True) == ["rules", "answer_guide"]


def test_an_examples_edit_adds_up_to_max_cited_lines() -> None:
    from algorithms.gepa.reflect import cite_examples

    # one line per cited answer of each failure: six in all
    results = [
        cited_failure("card_arrival", "exchange_rate", "my card never came",
                      {"card_arrival": ("card still not here",), "exchange_rate": ("what rate is it today",)}),
        cited_failure("top_up_failed", "card_arrival", "my top up did not go through",
                      {"top_up_failed": ("top up was declined today",), "card_arrival": ("where is the card I ordered",)}),
        cited_failure("refund_not_showing_up", "top_up_failed", "no refund yet",
                      {"refund_not_showing_up": ("my refund is missing",), "top_up_failed": ("the top up bounced back",)}),
    ]
    for max_cited, added in [(None, 2), (3, 3), (16, 6)]:
        settings = GepaParams(max_new_lines=2, max_cited_lines=max_cited).edit_settings()
        proposal = cite_examples(SEED, results, settings)
        assert proposal.added == added
        assert len(LearnedModule.parse(proposal.text).lines("examples")) == added


def test_an_examples_edit_with_room_also_quotes_the_runs_earlier_failures() -> None:
    from algorithms.gepa.reflect import CitationMemory, cite_examples

    first = [cited_failure("card_arrival", "exchange_rate", "my card never came",
                           {"card_arrival": ("card still not here",), "exchange_rate": ("what rate is it today",)})]
    second = [cited_failure("top_up_failed", "card_arrival", "my top up did not go through",
                            {"top_up_failed": ("top up was declined today",),
                             "card_arrival": ("where is the card I ordered",)})]
    memory = CitationMemory(capacity=3)
    memory.remember(first)
    memory.remember(second)
    memory.remember(second)  # known pairs keep their place
    # newest first, the expected answer's before the given one's
    assert [answer for answer, _ in memory.pairs()] == ["top_up_failed", "card_arrival", "card_arrival"]
    assert memory.pairs()[2] == ("card_arrival", ("card still not here",))  # the capacity dropped the oldest
    settings = GepaParams(max_cited_lines=3).edit_settings()
    # the minibatch's own citations first, then the earlier ones while the edit has room
    third = [cited_failure("refund_not_showing_up", "top_up_failed", "no refund yet",
                           {"refund_not_showing_up": ("my refund is missing",)})]
    lines = LearnedModule.parse(cite_examples(SEED, third, settings, memory.pairs()).text).lines("examples")
    assert lines == ('- "my refund is missing" -> refund_not_showing_up', '- "top up was declined today" -> top_up_failed',
                     '- "where is the card I ordered" -> card_arrival')
    # nothing of the minibatch's own rows, even when an earlier failure's citation quotes one
    own = [cited_failure("exchange_rate", "card_arrival", "card still not here", {})]
    assert cite_examples(SEED, own, settings, [("card_arrival", ("card still not here",))]).status == "unchanged"
    assert CitationMemory(capacity=0).pairs() == ()


def test_an_examples_edit_lists_invented_answers_when_asked() -> None:
    """`not_answer_lines`: the failures' answers that are label-shaped but not labels go in
    a section of their own, a near spelling with its label, each once, the newest kept."""
    from algorithms.gepa.reflect import cite_examples

    results = [failure("card_arrival", "card_payment"), failure("exchange_rate", "exchange_rates"),
               failure("top_up_failed", "top_up_failed"),  # a label: not listed
               failure("card_arrival", "I am not sure")]  # not label-shaped: not listed
    assert cite_examples(SEED, results, SETTINGS, labels=LABELS).status == "unchanged"  # off by default
    settings = GepaParams(not_answer_lines=2).edit_settings()
    proposal = cite_examples(SEED, results, settings, labels=LABELS)
    assert (proposal.status, proposal.added) == ("changed", 2)
    assert LearnedModule.parse(proposal.text).lines("not_answers") == (
        "- `card_payment`", "- `exchange_rates` (the label is `exchange_rate`)")
    assert "Not valid answers (never reply with these):\n- `card_payment`" in proposal.text
    assert cite_examples(proposal.text, results, settings, labels=LABELS).status == "unchanged"  # each once
    newer = cite_examples(proposal.text, [failure("card_arrival", "shipping_time")], settings, labels=LABELS)
    assert LearnedModule.parse(newer.text).lines("not_answers") == (
        "- `exchange_rates` (the label is `exchange_rate`)", "- `shipping_time`")
    assert cite_examples(SEED, results, settings, labels=None).status == "unchanged"  # no answer space


def test_the_runs_invented_answers_are_listed_most_frequent_first() -> None:
    from algorithms.gepa.reflect import FailedAnswers, cite_examples

    scored = [failure("card_arrival", "shipping_time"), failure("card_arrival", "card_payment"),
              failure("exchange_rate", "card_payment"),
              RolloutResult(candidate_id="c0", task_id="train:2", reward=1.0, status="ok", output="top_up")]
    memory, unkept = FailedAnswers(), FailedAnswers(kept=False)
    memory.remember(scored)
    unkept.remember(scored)
    assert memory.answers() == ("card_payment", "shipping_time")  # failures only, most frequent first
    assert unkept.answers() == ()  # a run without the section keeps no tally
    settings = GepaParams(not_answer_lines=2).edit_settings()
    proposal = cite_examples(SEED, [failure("top_up_failed", "exchange_rates")], settings, labels=LABELS,
                             failed_answers=memory.answers())
    assert LearnedModule.parse(proposal.text).lines("not_answers") == (
        "- `exchange_rates` (the label is `exchange_rate`)", "- `card_payment`")


def test_the_spell_style_names_the_labels_invented_answers_misspell_and_never_the_answers() -> None:
    from algorithms.gepa.reflect import cite_examples

    results = [failure("exchange_rate", "exchange_rates"), failure("card_arrival", "card_payment")]
    settings = GepaParams(not_answer_lines=4, not_answer_style="spell").edit_settings()
    proposal = cite_examples(SEED, results, settings, labels=LABELS)
    assert LearnedModule.parse(proposal.text).lines("spellings") == ("- `exchange_rate`",)
    assert "exchange_rates" not in proposal.text and "card_payment" not in proposal.text
    assert cite_examples(proposal.text, results, settings, labels=LABELS).status == "unchanged"  # each once
    one = GepaParams(not_answer_lines=1, not_answer_style="spell").edit_settings()
    capped = cite_examples(SEED, [*results, failure("top_up_failed", "top_up_faild")], one, labels=LABELS)
    assert LearnedModule.parse(capped.text).lines("spellings") == ("- `exchange_rate`",)  # the cap


@pytest.mark.parametrize("asking", [False, True])
def test_a_turn_whose_examples_edit_adds_nothing_asks_only_with_asking_when_uncited(
        tmp_path: Path, data_dir: Path, heart_disease_url: str, scripted_policy, asking: bool) -> None:
    """Heart disease cites no inputs, so its `examples` edit always comes back unchanged: by
    default the turn that leads with it ends there, with no proposer call; with
    `asking_when_uncited` the turn asks the proposer instead."""
    params = {"minibatch_size": 4, "edit_formats": ["examples", "rewrite"], "proposal_attempts": 1,
              "proposal_samples": 1, "proposer_max_tokens": 4000, "asking_when_uncited": asking}
    spec = make_run_spec(container_spec("heart_disease", data_dir), tmp_path, train=[f"train:{i}" for i in range(12)],
                         pareto=[f"train:{i}" for i in range(12, 16)], heldout=["test:0"], max_rollouts=60,
                         proposer_script="queue", params=params, max_generations=1)
    with ScriptedModelThread("queue", ["```\nAnswer yes or no.\n```"]) as proposer:
        outcome = execute(spec, heart_disease_url, scripted_policy.base_url, proposer.base_url)
    assert outcome.status == "done", outcome.error
    ev = read_evidence(outcome.evidence_dir)
    turns = ev["proposals"].select("edit_format", "attempts").rows()
    assert turns == ([("rewrite", 1)] if asking else [("examples", 0)])
    assert ev["manifest"]["totals"]["proposer_calls"] == (1 if asking else 0)
