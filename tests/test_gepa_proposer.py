"""Our GEPA's proposer without a model: the request it builds, the free screen of replies,
how replies change a module (append, answer guide, consolidate, rewrite), merges, the
minibatch sampler, and a turn's record when a call fails (the `examples` edit, which asks
no proposer: test_gepa_examples.py)."""

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
    for _ in range(8):
        module, turn = rotation.next()
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
