"""Our GEPA's proposer without a model: the request it builds, the free screen of replies,
how replies change a module (append, answer guide, consolidate, rewrite), merges, and the
minibatch sampler."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from algorithms.gepa.edits import LearnedModule, named_labels, union
from algorithms.gepa.optimizer import GepaParams, MinibatchSampler
from algorithms.gepa.propose import ProposerHealth, TurnInputs, at_once, one_by_one
from algorithms.gepa.proposer import build_messages, task_context
from algorithms.gepa.reflect import EditSettings, Proposal, Rotation, apply, choose_format
from harness.candidates import RolloutResult
from harness.errors import FailureKind, ServiceError
from harness.llm import ChatResult

SEED = "Classify the message.\nReply with the label only."
SETTINGS = GepaParams().edit_settings()
LABELS = ["card_arrival", "card_delivery_estimate", "exchange_rate", "top_up_failed", "refund_not_showing_up"]


def reply(text: str, finish: str = "stop") -> ChatResult:
    return ChatResult(text=text, prompt_tokens=0, completion_tokens=0, latency_s=0.0, finish_reason=finish)


def propose(module: str, replies: list[str] | str, edit_format: str, *, labels: list[str] | None = None,
            finish: str = "stop", results: list[RolloutResult] | None = None,
            settings: EditSettings = SETTINGS) -> Proposal:
    texts = [replies] if isinstance(replies, str) else replies
    info = {"description": "classify", "labels": labels} if labels else None
    return apply(module, [], [reply(t, finish) for t in texts], edit_format, results or [], info, settings)


def failure(expected: str, given: str, inputs: str = "where is my card") -> RolloutResult:
    return RolloutResult(candidate_id="c0", task_id="train:1", reward=0.0, status="ok", output=given,
                         feedback=f"Wrong: expected intent `{expected}`, the answer was `{given}`.",
                         task={"text": inputs, "label": expected}, inputs=inputs)


# ---------------------------------------------------------------- module text


@pytest.mark.parametrize("text, new, status", [
    ("```\nNew instruction.\n```", "New instruction.", "changed"),
    ("Sure! Here it is:\n```text\nNew instruction.\nLine two.\n```\nGood luck.", "New instruction.\nLine two.", "changed"),
    ("  New instruction, no fence.  ", "New instruction, no fence.", "changed"),
    (f"```\n{SEED}\n```", SEED, "unchanged"),
    (f"\n{SEED}\n\n", SEED, "unchanged"),
])
def test_rewrite_takes_the_fenced_block_or_the_whole_reply(text: str, new: str, status: str) -> None:
    proposal = propose(SEED, text, "rewrite")
    assert (proposal.text, proposal.status) == (new, status)


def test_a_truncated_rewrite_is_not_taken_and_the_next_sample_is() -> None:
    cut = propose(SEED, "```\nNew instruction that was cut o", "rewrite", finish="length")
    assert cut.status == "unchanged" and cut.dropped == {"truncated": 1} and cut.truncated_replies == 1
    second = apply(SEED, [], [reply("```\nCut", "length"), reply("```\nWhole one.\n```")], "rewrite", [], None,
                   SETTINGS)
    assert (second.text, second.status) == ("Whole one.", "changed")


@pytest.mark.parametrize("text", ["", "   \n ", "```\n```"])
def test_empty_reply_keeps_the_module(text: str) -> None:
    for edit_format in ("rewrite", "rules", "answer_guide"):
        proposal = propose(SEED, text, edit_format)
        assert proposal.text == SEED and proposal.status in ("empty", "unchanged")
    assert propose(SEED, "", "rules").status == "empty"


def test_rules_append_new_list_lines_under_one_heading() -> None:
    text = "Here are rules:\n```\n- If refund, answer: refund\n* If card, answer: card\n1. If pin, answer: pin\nprose\n```"
    first = propose(SEED, text, "rules")
    assert first.status == "changed"
    assert first.text == (f"{SEED}\n\nRules learned from mistakes:\n- If refund, answer: refund\n"
                          "- If card, answer: card\n- If pin, answer: pin")
    # a second edit adds only lines not already present, under the same heading
    second = propose(first.text, "- If card, answer: card\n- If cash, answer: cash\n- if CASH, answer: cash", "rules")
    assert second.text == first.text + "\n- If cash, answer: cash" and second.text.count("Rules learned") == 1
    assert propose(second.text, "- If card, answer: card", "rules").status == "unchanged"
    many = propose(SEED, "\n".join(f"- rule number {i} is long" for i in range(20)), "rules",
                   settings=SETTINGS.model_copy(update={"max_new_lines": 3}))
    assert many.text.count("- rule number") == 3


def test_answer_guide_takes_plain_label_lines() -> None:
    """The request asks for `label: description` lines; they are what the reply has."""
    text = ("card_arrival: the customer asks where a card they ordered is\n"
            "`exchange_rate`: questions about the rate used to convert currencies\n"
            "not_a_label: something else entirely here\n"
            "Here you go!")
    proposal = propose(SEED, text, "answer_guide", labels=LABELS,
                       results=[failure("card_arrival", "exchange_rate"), failure("exchange_rate", "card_arrival")])
    assert proposal.status == "changed"
    assert LearnedModule.parse(proposal.text).lines("answer_guide") == (
        "- card_arrival: the customer asks where a card they ordered is",
        "- `exchange_rate`: questions about the rate used to convert currencies")
    assert proposal.dropped == {"no_valid_answer": 1}


def test_a_cut_off_last_line_is_dropped() -> None:
    text = "- If the input asks where a card is, answer `card_arrival`.\n- If the input asks about rates, answer `exch"
    proposal = propose(SEED, text, "rules", labels=LABELS, finish="length")
    assert LearnedModule.parse(proposal.text).lines("rules") == (
        "- If the input asks where a card is, answer `card_arrival`.",)
    assert proposal.truncated_replies == 1
    # the same reply, complete: an answer that is not a label is dropped by the screen instead
    whole = propose(SEED, text, "rules", labels=LABELS)
    assert whole.dropped == {"no_valid_answer": 1}


def test_the_screen_drops_invalid_and_several_answers() -> None:
    text = "\n".join([
        "- If the input is about topping up, answer `top_up`.",  # not a label
        "- If the input mentions a fee, answer `card_arrival` or `exchange_rate`.",  # two
        "- If the input asks about a rate, answer exchange_rate.",  # kept
        "- Be careful and think step by step.",  # names no answer
    ])
    proposal = propose(SEED, text, "rules", labels=LABELS, results=[failure("exchange_rate", "card_arrival")])
    assert LearnedModule.parse(proposal.text).lines("rules") == (
        "- If the input asks about a rate, answer exchange_rate.",)
    assert proposal.dropped == {"invalid_answer": 1, "several_answers": 1, "no_valid_answer": 1}


def test_lines_about_the_minibatch_failures_come_first() -> None:
    lines = [f"- If the input mentions {word}, answer `{label}`." for word, label in [
        ("parcels", "card_delivery_estimate"), ("money back", "refund_not_showing_up"),
        ("where my card is", "card_arrival"), ("rates", "exchange_rate")]]
    proposal = propose(SEED, "\n".join(lines), "rules", labels=LABELS,
                       results=[failure("card_arrival", "exchange_rate"), failure("exchange_rate", "card_arrival")],
                       settings=SETTINGS.model_copy(update={"max_new_lines": 2}))
    assert LearnedModule.parse(proposal.text).lines("rules") == tuple(lines[2:])


def test_open_ended_lines_that_copy_an_example_are_dropped() -> None:
    row = RolloutResult(candidate_id="c0", task_id="train:3", reward=0.0, status="ok", output="12",
                        feedback="Wrong: expected 18. Janet sells 16 eggs a day and eats three for breakfast.",
                        inputs="Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning.")
    text = ("- If Janet's ducks lay 16 eggs per day and she eats three, the answer is 18.\n"
            "- Subtract what is used before multiplying by the price.")
    proposal = propose(SEED, text, "rules", results=[row])
    assert LearnedModule.parse(proposal.text).lines("rules") == (
        "- Subtract what is used before multiplying by the price.",)
    assert proposal.dropped == {"copies_an_example": 1}


def test_samples_are_pooled_and_deduplicated() -> None:
    a = "- If the input asks where a card is, answer `card_arrival`."
    b = "- If the input asks about a rate, answer `exchange_rate`."
    proposal = propose(SEED, [a, f"{a}\n{b}"], "rules", labels=LABELS,
                       results=[failure("card_arrival", "exchange_rate"), failure("exchange_rate", "card_arrival")])
    assert LearnedModule.parse(proposal.text).lines("rules") == (a, b)
    assert len(proposal.replies) == 2 and proposal.dropped == {"duplicate": 1}


def test_a_full_rules_section_is_consolidated_not_grown() -> None:
    settings = SETTINGS.model_copy(update={"max_learned_lines": 4})
    rules = [f"- If the input mentions thing {i}, answer `card_arrival`." for i in range(4)]
    full = LearnedModule(base=SEED).with_lines("rules", rules).render()
    assert choose_format(full, ("rules", "answer_guide"), 0, settings) == "consolidate"
    assert choose_format(full, ("rules", "answer_guide"), 1, settings) == "answer_guide"
    assert choose_format(SEED, ("rules", "answer_guide"), 0, settings) == "rules"
    merged = propose(full, "- If the input mentions any of the things, answer `card_arrival`.", "consolidate",
                     labels=LABELS, settings=settings)
    assert merged.status == "changed"
    assert LearnedModule.parse(merged.text).lines("rules") == (
        "- If the input mentions any of the things, answer `card_arrival`.",)
    assert LearnedModule.parse(merged.text).base == SEED


def test_union_merges_learned_lines_of_two_candidates() -> None:
    one = LearnedModule(base=SEED).with_lines("rules", ["- a rule about cards"]).render()
    two = LearnedModule(base=SEED).with_lines("rules", ["- a rule about rates", "- a rule about cards"]) \
        .with_lines("answer_guide", ["- exchange_rate: rates"]).render()
    merged = LearnedModule.parse(union(one, two, SETTINGS.section_caps))
    assert merged.lines("rules") == ("- a rule about cards", "- a rule about rates")
    assert merged.lines("answer_guide") == ("- exchange_rate: rates",)
    assert union(one, one, SETTINGS.section_caps) == one


def test_named_labels_reads_backticks_snake_case_and_the_word_after_answer() -> None:
    labels = {label: label for label in LABELS} | {"yes": "yes", "no": "no"}
    assert named_labels("- If so, answer `card_arrival`.", labels) == ({"card_arrival"}, set())
    assert named_labels("- Reversible defect with no angina: answer yes", labels) == ({"yes"}, set())
    assert named_labels("- Use top_up_pending here", labels) == (set(), {"top_up_pending"})


# ---------------------------------------------------------------- the request


def test_the_request_carries_the_whole_answer_space_and_what_the_policy_saw() -> None:
    labels = [f"label_number_{i}" for i in range(77)]
    context = task_context({"description": "Classify a message.", "labels": labels})
    assert context is not None and all(label in context for label in labels)
    messages = build_messages(SEED, [failure("label_number_3", "label_number_9", inputs="I want my money")],
                              "rules", {"description": "Classify a message.", "labels": labels})
    user = messages[1].content
    assert all(label in user for label in labels)
    assert "Input:\nI want my money\nOutput:\nlabel_number_9" in user
    assert '"label"' not in user  # the raw row (with its answer) is not shown when the container says what was seen


def test_proposer_settings_default_to_the_proposer_models_own() -> None:
    params = GepaParams()
    assert params.proposer_temperature is None and params.proposer_max_tokens is None


def test_minibatches_cover_every_train_row_once_per_epoch() -> None:
    rows = tuple(f"train:{i}" for i in range(10))
    sampler = MinibatchSampler(rows, random.Random(0))
    epoch = [row for _ in range(5) for row in sampler.next(2)]
    assert sorted(epoch) == sorted(rows)
    counts = Counter(row for _ in range(50) for row in sampler.next(3))
    assert set(counts) == set(rows) and max(counts.values()) - min(counts.values()) <= 1
    assert all(len(set(batch)) == len(batch) for batch in (sampler.next(4) for _ in range(20)))


def test_each_module_gets_every_edit_format() -> None:
    rotation = Rotation(["system", "user"])
    formats = ("rules", "answer_guide")
    seen: dict[str, set[str]] = {"system": set(), "user": set()}
    for iteration in range(8):
        module, turn = rotation.next(iteration)
        seen[module].add(choose_format(SEED, formats, turn, SETTINGS))
    assert seen == {"system": set(formats), "user": set(formats)}


def test_yes_no_rules_keep_backticked_feature_words() -> None:
    text = "- If the input shows `Thallium stress test: reversible defect` or `asymptomatic` chest pain, answer `yes`."
    proposal = propose(SEED, text, "rules", labels=["no", "yes"],
                       results=[failure("yes", "no", inputs="Chest pain type: asymptomatic")])
    assert proposal.status == "changed" and proposal.dropped == {}


def test_a_rule_that_teaches_the_wrong_answer_given_is_dropped() -> None:
    """Seen with the local 1.5B proposer: the rule names the answer the policy gave, not the
    expected one the feedback names."""
    text = ("- If the input asks about fees for topping up, the answer is `exchange_rate`.\n"
            "- If the input asks where a card is, the answer is `card_arrival`.")
    proposal = propose(SEED, text, "rules", labels=LABELS, results=[failure("card_arrival", "exchange_rate")])
    assert LearnedModule.parse(proposal.text).lines("rules") == (
        "- If the input asks where a card is, the answer is `card_arrival`.",)
    assert proposal.dropped == {"repeats_a_wrong_answer": 1}


def test_answer_guide_joins_a_label_line_with_its_description_below() -> None:
    """Small models often put `label:` on its own line and the description under it."""
    text = ("card_arrival:\nMessages asking where an ordered card is\n\n"
            "exchange_rate:\nQuestions about the rate used to convert money\n"
            "top_up_failed:")
    proposal = propose(SEED, text, "answer_guide", labels=LABELS,
                       results=[failure("card_arrival", "top_up_failed"), failure("exchange_rate", "top_up_failed")])
    assert LearnedModule.parse(proposal.text).lines("answer_guide") == (
        "- card_arrival: Messages asking where an ordered card is",
        "- exchange_rate: Questions about the rate used to convert money")
    assert proposal.added == 2


@pytest.mark.parametrize("replies, wanted, enough", [
    (["- If the input asks where a card is, answer `card_arrival`."], 2, False),
    (["- If the input asks where a card is, answer `card_arrival`.\n"
      "- If the input asks about a rate, answer `exchange_rate`."], 2, True),
    (["- If the input asks where a card is, answer `card_arrival`."], 1, True),
    (["- Nothing that names a label here at all."], 1, False),
])
def test_sampling_stops_once_enough_lines_survive(replies: list[str], wanted: int, enough: bool) -> None:
    proposal = propose(SEED, replies, "rules", labels=LABELS,
                       results=[failure("card_arrival", "top_up_failed"), failure("exchange_rate", "top_up_failed")])
    assert proposal.enough(wanted) is enough


def test_lines_conditioned_on_the_feedback_or_saying_nothing_are_junk() -> None:
    """The policy never sees the feedback, so a rule that tests it cannot fire; an answer
    guide line whose description is only another label describes nothing."""
    rules = ('- If the input is "I need a Visa card" and the feedback says "Visa", the intent should be '
             '`card_arrival`.\n- If the input asks where an ordered card is, answer `card_arrival`.')
    proposal = propose(SEED, rules, "rules", labels=LABELS, results=[failure("card_arrival", "exchange_rate")])
    assert LearnedModule.parse(proposal.text).lines("rules") == (
        "- If the input asks where an ordered card is, answer `card_arrival`.",)
    assert proposal.dropped == {"junk": 1}
    guide = "exchange_rate: top_up_failed?\ncard_arrival: the customer asks where the ordered card is"
    proposal = propose(SEED, guide, "answer_guide", labels=LABELS,
                       results=[failure("card_arrival", "top_up_failed"), failure("exchange_rate", "top_up_failed")])
    assert LearnedModule.parse(proposal.text).lines("answer_guide") == (
        "- card_arrival: the customer asks where the ordered card is",)
    assert proposal.dropped == {"junk": 1}


def test_a_line_quoting_inputs_cited_for_another_answer_is_dropped() -> None:
    """Seen with the local 1.5B proposer: an answer guide line pairs the expected intent with
    the example messages the feedback gave for the intent the policy answered."""
    shown = [failure("card_arrival", "exchange_rate", inputs="Where is my new card?"),
             failure("card_delivery_estimate", "top_up_failed", inputs="When will the card get here")]
    shown[0] = shown[0].model_copy(update={"answer_examples": {
        "card_arrival": ("Where is my new card?", "My card has not arrived yet"), "exchange_rate": ("What rate do you use",)}})
    shown[1] = shown[1].model_copy(update={"answer_examples": {
        "card_delivery_estimate": ("When will the card get here", "How long does card delivery take?")}})
    text = "\n".join([
        'card_delivery_estimate: messages like "My card has not arrived yet"',  # the other intent's message
        'card_arrival: messages like "How long does card delivery take?"',  # idem, the other way round
        'card_arrival: asks where an ordered card is, e.g. "has not arrived yet" or "Where is my new card?"',
        "card_delivery_estimate: asks how long delivery takes in general",  # quotes nothing: kept
    ])
    proposal = propose(SEED, text, "answer_guide", labels=LABELS, results=shown)
    assert LearnedModule.parse(proposal.text).lines("answer_guide") == (
        '- card_arrival: asks where an ordered card is, e.g. "has not arrived yet" or "Where is my new card?"',
        "- card_delivery_estimate: asks how long delivery takes in general")
    assert proposal.dropped == {"quotes_another_answers_input": 2}
    # a rule citing the row's own message unquoted, under another answer, goes the same way
    rule = propose(SEED, "- If the input is like Where is my new card, answer `refund_not_showing_up`.", "rules",
                   labels=LABELS, results=shown)
    assert rule.status == "unchanged" and rule.dropped == {"quotes_another_answers_input": 1}
    # screen_cited_inputs=false: the screen before containers cited inputs
    off = propose(SEED, text, "answer_guide", labels=LABELS, results=shown,
                  settings=SETTINGS.model_copy(update={"screen_cited_inputs": False}))
    assert off.dropped == {} and len(LearnedModule.parse(off.text).lines("answer_guide")) == 4


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


class QueuedProposer:
    """The one part of a RunView a reflection turn uses: `propose`, answering from a queue
    (a ServiceError in it is raised, as the proposer client raises a failed call)."""

    def __init__(self, answers: list[str | ServiceError]):
        self.answers = list(answers)

    async def propose(self, messages: list[Any], *, temperature: float, max_tokens: int,
                      scopes: list[str] | None = None) -> ChatResult:
        answer = self.answers.pop(0)
        if isinstance(answer, ServiceError):
            raise answer
        return reply(answer)


@pytest.mark.parametrize("turn_of", [one_by_one, at_once])
def test_a_format_whose_call_fails_is_recorded_as_failed_not_with_the_earlier_formats_result(turn_of) -> None:
    # `rules` comes back unchanged, then the `answer_guide` call fails: the turn is that
    # format's failure, not the unchanged rules reply under the answer guide's name
    failed = ServiceError("proposer: HTTP 503", FailureKind.TRANSIENT)
    inputs = TurnInputs(current=SEED, results=[failure("card_arrival", "exchange_rate")], task_info=None,
                        settings=SETTINGS, samples=1, lines_wanted=1, sampling={"temperature": 0.0, "max_tokens": 50})
    turn = asyncio.run(turn_of(QueuedProposer([f"```\n{SEED}\n```", failed]), ["rules", "answer_guide"], inputs,
                               ProposerHealth(max_errors=3), []))
    assert turn.edit_format == "answer_guide" and turn.error is not None and "503" in turn.error
    assert turn.proposal is None and turn.calls == 1
