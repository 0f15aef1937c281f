"""Conformance: the same scenario runs on LangGraph and on bulksync; the observations must match.

Method: a scenario is a plain function ``scenario(impl) -> observation``. It builds graphs with
the names on ``impl`` (``impl.StateGraph``, ``impl.Send``, ``impl.compile(builder, …)``, …), runs
them, and returns JSON-like data: final states, lists of stream chunks, ``get_state().next``,
interrupts, history lengths, errors (as exception objects, via ``harness.attempt`` and
``harness.collect``). The harness runs it once on LangGraph (the reference, cached per scenario)
and once per bulksync flavour, normalises ids in both (``normalize.py``) and asserts equality.
The comparison is the assertion: scenarios state no expected values of their own.

Adding a scenario: write ``def my_case(impl: Impl) -> Any`` in the ``test_<topic>.py`` file of
its topic, then ``def test_my_case(conform: Conform) -> None: conform(my_case)``. Keep it fast
(< 1 s), deterministic on LangGraph (force the finishing order of parallel tasks with
``ordering.FinishOrder``, never observe anything else timing dependent) and observe plain
data only.

Flavours: ``impls.DEFAULT_FLAVOURS`` (``bulksync`` in-process; ``celery``, the same graphs
attached to a Celery executor run by the session's in-process worker; ``remote``, the graphs
run through ``RemoteGraph`` by a coordinator service of each test's own, on that worker); set
``CONFORMANCE_FLAVOURS=bulksync`` to run one of them, or ``CONFORMANCE_FLAVOURS=langgraph`` to
self-check the scenarios against LangGraph alone. ``celery`` needs Redis and ``remote`` Redis
and Postgres: without them, their tests skip locally and fail under ``CI``, like every service
test. The few scenarios a flavour cannot observe like LangGraph are listed, each with its
reason, in ``impls.EXCLUDED`` (they skip on that flavour only); those a known bulksync bug
breaks, in ``impls.KNOWN_BUGS`` (expected failures there, failing once the bug is fixed).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .harness import Conform, Scenario
from .harness import conform as run_conform
from .impls import EXCLUDED, FIXTURES, KNOWN_BUGS, bind, flavours


def _params() -> list[object]:
    """The flavours as parameters; those needing services are marked ``integration``."""
    return [
        pytest.param(n, marks=pytest.mark.integration) if n in FIXTURES else n for n in flavours()
    ]


@pytest.fixture(params=_params())
def flavour(request: pytest.FixtureRequest) -> str:
    """The name of the implementation compared against LangGraph in this test."""
    name: str = request.param
    if name in FIXTURES:  # e.g. `celery` needs the cluster (skips when its services are absent)
        bind(name, request.getfixturevalue(FIXTURES[name]))
    return name


@pytest.fixture
def conform(flavour: str) -> Conform:
    """Compare a scenario's observation on `flavour` with LangGraph's."""

    def check(scenario: Scenario) -> None:
        name = scenario.__name__
        reason = EXCLUDED.get(flavour, {}).get(name)
        if reason is not None:
            pytest.skip(f"{name} is excluded on {flavour}: {reason}")
        bug = KNOWN_BUGS.get(flavour, {}).get(name)
        if bug is not None:
            try:
                run_conform(scenario, flavour)
            except AssertionError:
                pytest.xfail(f"{name} fails on {flavour} (known bug): {bug}")
            pytest.fail(f"{name} passes on {flavour} now: remove it from impls.KNOWN_BUGS", False)
        run_conform(scenario, flavour)

    return check


@pytest.fixture
def remote_service(cluster: Any, pg_schema: str) -> Iterator[Any]:
    """A coordinator on this test's own schema, for the `remote` flavour (see `remote.py`)."""
    from .remote import open_service

    with open_service(cluster, pg_schema) as service:
        yield service
