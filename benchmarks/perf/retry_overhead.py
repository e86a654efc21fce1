"""Retry-loop overhead (not a test): what running a call under `harness.retry.RetryPolicy`
adds to a call that succeeds at once, the hot path of every rollout and model call,
against awaiting the attempt bare and against the same policy run by tenacity's
`AsyncRetrying` (when tenacity is installed). No network: the attempt is an empty
coroutine, so each figure is the loop's own cost.

    python -m benchmarks.perf.retry_overhead [--calls 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from harness.retry import AttemptFailed, RetryPolicy

POLICY = RetryPolicy()


async def _answer() -> int:
    return 1


async def _bare() -> int:
    return await _answer()


async def _ours() -> int:
    return await POLICY.run(_answer)


async def _tenacity() -> int:
    from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

    retrying = AsyncRetrying(stop=stop_after_attempt(POLICY.attempts),
                             wait=lambda state: POLICY.delay(state.attempt_number - 1, None),
                             retry=retry_if_exception(lambda e: isinstance(e, AttemptFailed) and POLICY.retries(e)),
                             reraise=True)
    return await retrying(_answer)


async def _per_call_us(calls: int, run: Callable[[], Awaitable[int]]) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await run()
    return (time.perf_counter() - started) / calls * 1e6


async def measure(calls: int, repeats: int) -> dict[str, float]:
    """The best of `repeats` per-call times (microseconds) for each loop: the least disturbed."""
    loops: dict[str, Callable[[], Awaitable[int]]] = {"bare await": _bare, "RetryPolicy.run": _ours}
    try:
        import tenacity  # noqa: F401
    except ImportError:
        pass
    else:
        loops["tenacity AsyncRetrying"] = _tenacity
    return {name: min([await _per_call_us(calls, run) for _ in range(repeats)]) for name, run in loops.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    for name, per_call in asyncio.run(measure(args.calls, args.repeats)).items():
        print(f"{name:>24}: {per_call:8.2f} us per call")


if __name__ == "__main__":
    main()
