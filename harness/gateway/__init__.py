"""The inference gateway: one OpenAI-compatible proxy per machine between every model
call (policy, proposer, grader, user simulator) and its provider. It adds the provider key
from its own environment, attributes and meters every call, enforces USD budgets and
rate limits, and caches or replays responses. See app.py for the routes."""
