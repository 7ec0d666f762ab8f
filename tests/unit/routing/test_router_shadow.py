"""Shadow traffic (kiln.routing.shadow) over two real replica servers (the custom predictor of
tests/unit/runtime/test_serve.py): the stable one answers ``sum@1`` (scale 2), the shadow ``sum@2`` (scale 3). A
predict never reaches the shadow; a copy handed to it is answered and compared; a full queue drops copies (counted)
rather than wait. And the comparison itself (kiln.domain.shadow)."""

from __future__ import annotations

import asyncio
import json

from kiln.domain.shadow import ShadowStats, compare
from kiln.routing.router import Router
from kiln.routing.shadow import Shadows
from tests.unit.routing.test_router_split import SERVICE, _body, _endpoint
from tests.unit.runtime.test_serve import make_replica  # noqa: F401  (the fixture, shared)


def _answers(*outputs: object) -> bytes:
    return json.dumps({"outputs": list(outputs)}).encode()


def _compared(shadows: Shadows) -> int:
    stats = shadows.stats(SERVICE).get(2, ShadowStats())
    return stats.instances + stats.errors


def test_the_comparison_counts_equal_outputs_and_the_numbers_difference() -> None:
    stats = ShadowStats()
    compare(_answers("cat", "dog", [1.0, 2.0]), _answers("cat", "cow", [1.5, 2.0]), stats)
    assert (stats.instances, stats.agreed, stats.numbers) == (3, 1, 2)
    assert stats.mean_abs_diff == 0.25 and stats.agreement_rate == 1 / 3
    compare(_answers(1), _answers(True), stats)  # a bool is not the number 1, nor equal to it
    assert (stats.instances, stats.agreed, stats.numbers) == (4, 1, 2)
    compare(_answers(1, 2), _answers(1), stats)  # not one output per instance: the shadow's error
    assert stats.errors == 1


def test_a_shadow_gets_copies_never_predicts_and_a_full_queue_drops(make_replica) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    stable = make_replica(scale="2", model="sum@1")
    shadow = make_replica(scale="3", model="sum@2")
    router = Router()
    router.add(SERVICE, _endpoint(stable, "stable", "sum@1"))
    endpoint = _endpoint(shadow, "shadow", "sum@2")
    endpoint.shadow = True
    router.add(SERVICE, endpoint)
    shadows = Shadows(router, queue=2)

    async def run() -> set[str]:
        models = set()
        for i in range(20):
            body = _body([i, 0, 0])
            answer = await router.predict(SERVICE, body, 30)
            models.add(answer.model)
            await shadows.copy(SERVICE, 2, body, answer.body, 30)
            while _compared(shadows) < i + 1:
                await asyncio.sleep(0.01)  # the worker's turn: each copy answered before the next predict
        # Ten at once (the worker gets no turn in between) into a queue of two: two wait, eight are dropped.
        for i in range(10):
            await shadows.copy(SERVICE, 2, _body([i, 0, 0]), _answers([2.0 * i]), 30)
        while _compared(shadows) < 22:
            await asyncio.sleep(0.01)
        return models

    assert asyncio.run(run()) == {"sum@1"}  # never the shadow's answer
    stats = shadows.stats(SERVICE)[2]
    assert (stats.copied, stats.errors, stats.agreed, stats.dropped) == (22, 0, 2, 8)  # agreed: the zeros
    assert stats.mean_abs_diff is not None and stats.mean_abs_diff > 0
    traffic = router.version_traffic(SERVICE)
    assert (traffic[1].requests, traffic[2].requests) == (20, 22)
