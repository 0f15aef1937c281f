"""How the bench prints its figures: each contender's timings, and ratios of medians with their
range round by round."""

from __future__ import annotations

from bench.measure import Timing


def show(timings: dict[str, Timing], *, per: int = 1, unit: str = "s") -> None:
    """One line per contender: median, min and max (divided by ``per``)."""
    scale = 1000.0 if unit == "ms" else 1.0
    width = max(len(label) for label in timings)
    for label, t in timings.items():
        med, lo, hi = (v * scale / per for v in (t.median, min(t.seconds), max(t.seconds)))
        print(f"  {label:<{width}}  {med:9.3f} {unit}  (min {lo:.3f}, max {hi:.3f})")


def ratio(name: str, a: Timing, b: Timing, target: str) -> float:
    """Print and return ``a / b`` of the medians, with the range of the ratios round by
    round: contenders run in turns, so a round's ratio is free of the machine's drift
    between rounds, and the range shows how firmly a target is met or missed."""
    value = a.median / b.median
    rounds = round_ratios(a, b)
    spread = f"  (rounds {min(rounds):.2f}-{max(rounds):.2f})" if len(rounds) > 1 else ""
    print(f"  {name:<44} {value:7.2f}   {target}{spread}")
    return value


def round_ratios(a: Timing, b: Timing) -> list[float]:
    """``a / b`` in each round: run by run when both were timed each round, else against
    the one value of a figure computed once (a limit, a floor)."""
    if len(b.seconds) == 1:
        return [x / b.seconds[0] for x in a.seconds]
    if len(a.seconds) == 1:
        return [a.seconds[0] / y for y in b.seconds]
    if len(a.seconds) == len(b.seconds):
        return [x / y for x, y in zip(a.seconds, b.seconds, strict=True)]
    return []
