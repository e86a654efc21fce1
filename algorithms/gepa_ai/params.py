"""Parameters of the `gepa` library arm. Defaults match our GEPA where the concepts
coincide (minibatch 4, strict improvement, skip perfect minibatches, proposer sampling,
stall and proposer-failure limits);
the rest are the library's own defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class GepaLibraryParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    # the library's reflection_minibatch_size (its default is 3; ours is 4), capped at the train pool
    minibatch_size: int = Field(default=4, gt=0)
    candidate_selection_strategy: Literal["pareto", "current_best", "epsilon_greedy", "top_k_pareto"] = "pareto"
    module_selector: Literal["round_robin", "all"] = "round_robin"
    # ours accepts a child when its minibatch mean beats the parent's (margin 0): strict improvement
    acceptance_criterion: Literal["strict_improvement", "improvement_or_equal"] = "strict_improvement"
    skip_perfect_score: bool = True
    perfect_score: float = 1.0
    # None: the proposer model's own settings (configs/proposer/*.yaml), as for our GEPA
    proposer_temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    proposer_max_tokens: int | None = Field(default=None, gt=0)
    # None: the library's default reflection prompt; else a template with <curr_param> and <side_info>
    reflection_prompt_template: str | None = None
    # the container's task context (its description and whole answer space) heads the
    # reflection prompt, as our proposer shows it: same information for both arms
    use_task_info: bool = True
    # stop when this many iterations in a row spent no rollouts (the library would spin on cache hits)
    max_idle_iterations: int = Field(default=25, gt=0)
    # consecutive failed proposer calls (after the client's retries) that fail the run, as ours;
    # the library retries a failed reflection once, so that is two calls
    max_proposer_errors: int = Field(default=3, gt=0)

    @field_validator("reflection_prompt_template")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        if value is not None:
            missing = [p for p in ("<curr_param>", "<side_info>") if p not in value]
            if missing:
                raise ValueError(f"reflection_prompt_template lacks placeholder(s) {missing}")
        return value
