"""Versioned price table, USD per million tokens. Local and scripted models cost 0; a
hosted model missing here has unknown cost (None), never a silent zero."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

PRICE_TABLE_VERSION = "2026-11-29"


class Price(BaseModel):
    model_config = ConfigDict(frozen=True)
    input_per_mtok: float
    output_per_mtok: float


# Public list prices of OpenAI models at the table's date.
HOSTED_PRICES: dict[str, Price] = {
    "gpt-4.1-nano": Price(input_per_mtok=0.10, output_per_mtok=0.40),
    "gpt-4.1-mini": Price(input_per_mtok=0.40, output_per_mtok=1.60),
    "gpt-4.1": Price(input_per_mtok=2.00, output_per_mtok=8.00),
    "gpt-4o-mini": Price(input_per_mtok=0.15, output_per_mtok=0.60),
    "gpt-5-nano": Price(input_per_mtok=0.05, output_per_mtok=0.40),
    "gpt-5-mini": Price(input_per_mtok=0.25, output_per_mtok=2.00),
    "gpt-5": Price(input_per_mtok=1.25, output_per_mtok=10.00),
    # the GPT-5.4 family (March 2026), the published experiment's proposers
    "gpt-5.4-nano": Price(input_per_mtok=0.20, output_per_mtok=1.25),
    "gpt-5.4-mini": Price(input_per_mtok=0.75, output_per_mtok=4.50),
    "gpt-5.4": Price(input_per_mtok=2.50, output_per_mtok=15.00),
}

FREE_PROVIDERS = frozenset({"local", "scripted"})


def cost_usd(provider: str, model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    if provider in FREE_PROVIDERS:
        return 0.0
    price = HOSTED_PRICES.get(model)
    if price is None:
        return None
    return (prompt_tokens * price.input_per_mtok + completion_tokens * price.output_per_mtok) / 1e6
