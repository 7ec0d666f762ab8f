"""A traffic split between two model versions of one service, as the API server makes it (kiln.domain.traffic_split
chooses, kiln.routing.router forwards), over two real replica servers (``python -m kiln.injob.serve``, the custom
predictor of tests/unit/runtime/test_serve.py): the stable one answers ``sum@1`` (scale 2), the canary ``sum@2``
(scale 3), so each answer says which version made it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from kiln.domain.traffic_split import Split, Track, bucket, choose
from kiln.errors import NotFound
from kiln.routing.router import Endpoint, Router
from tests.unit.runtime.test_serve import Replica, make_replica  # noqa: F401  (the fixture, shared)

SERVICE = "svc-1"
# A 10 % canary over N unkeyed predicts: the canary's count is Binomial(N, 0.1), mean N/10 and standard deviation
# sqrt(N * 0.1 * 0.9). With N = 2000 that is 200 ± 13.4, and the test's bound of 10 % ± 3 % (140 to 260) is
# 4.47 standard deviations either way: a correct split fails it about once in 125,000 runs (two-sided normal tail
# 7.8e-6), while a split of 7 % or 13 % (the bound's edges) would pass it only half the time.
N = 2000


def _body(*rows: list[float]) -> bytes:
    return json.dumps({"inputs": list(rows)}).encode()


def _endpoint(replica: Replica, replica_id: str, model: str, *, canary: bool = False) -> Endpoint:
    return Endpoint(
        replica_id, f"job-{replica_id}", str(replica.socket_path), replica.state["secret"], model, canary=canary
    )


@pytest.fixture
def two_versions(make_replica) -> Router:  # type: ignore[no-untyped-def]  # noqa: F811
    stable = make_replica(scale="2", model="sum@1")
    canary = make_replica(scale="3", model="sum@2")
    router = Router()
    router.add(SERVICE, _endpoint(stable, "stable", "sum@1"))
    router.add(SERVICE, _endpoint(canary, "canary", "sum@2", canary=True))
    return router


async def _predict(router: Router, split: Split, *, version: str | None = None, key: str | None = None) -> str:
    """The version that answered one predict with these headers, checked against its output."""
    track: Track = choose(split, version, key)
    answer = await router.predict(
        SERVICE, _body([1, 0, 0]), 30, track=track, version=int(version) if version is not None else None
    )
    assert answer.status == 200, answer.body
    scale = json.loads(answer.body)["outputs"][0][0]
    assert (answer.model, scale) in (("sum@1", 2.0), ("sum@2", 3.0))
    return answer.model


async def _many(router: Router, split: Split, count: int, **headers: Any) -> list[str]:
    models: list[str] = []
    for start in range(0, count, 50):  # 50 at a time: the replicas' batching is not what this measures
        batch = [_predict(router, split, **headers) for _ in range(start, min(count, start + 50))]
        models += await asyncio.gather(*batch)
    return models


def test_a_10_percent_canary_gets_10_percent_of_the_predicts(two_versions: Router) -> None:
    models = asyncio.run(_many(two_versions, Split(1, 2, 10), N))
    canary = models.count("sum@2")
    assert 0.07 * N <= canary <= 0.13 * N, f"{canary} of {N} predicts reached the canary"
    traffic = two_versions.version_traffic(SERVICE)  # per version, as the service read shows it
    assert (traffic[2].requests, traffic[1].requests, traffic[1].errors) == (canary, N - canary, 0)
    assert sum(traffic[2].buckets) == canary  # each predict in the version's latency histogram


def test_a_routing_key_always_reaches_the_same_version(two_versions: Router) -> None:
    split = Split(1, 2, 10)
    keys = [f"user-{i}" for i in range(200)]

    async def run() -> dict[str, set[str]]:
        reached: dict[str, set[str]] = {key: set() for key in keys}
        for _ in range(4):
            models = await asyncio.gather(*[_predict(two_versions, split, key=key) for key in keys])
            for key, model in zip(keys, models, strict=True):
                reached[key].add(model)
        return reached

    reached = asyncio.run(run())
    assert all(len(models) == 1 for models in reached.values()), {k: v for k, v in reached.items() if len(v) > 1}
    on_canary = {key for key, models in reached.items() if models == {"sum@2"}}
    # Which keys: those whose bucket is in the canary's 10 % (P(none of 200) = 0.9**200, below 1e-9).
    assert on_canary == {key for key in keys if bucket(key) < 1000} and on_canary


def test_a_targeted_version_answers_even_with_no_share_of_the_traffic(two_versions: Router) -> None:
    split = Split(1, 2, 0)  # the canary runs, with 0 % of the unkeyed predicts

    async def run() -> list[set[str]]:  # one event loop: the router's kept-alive connections belong to it
        return [
            set(await _many(two_versions, split, 100)),
            set(await _many(two_versions, split, 20, version="2")),
            set(await _many(two_versions, split, 20, version="1")),
        ]

    assert asyncio.run(run()) == [{"sum@1"}, {"sum@2"}, {"sum@1"}]
    with pytest.raises(NotFound, match="serves 1, 2"):
        choose(split, "5", None)


def test_a_rolled_back_canarys_share_goes_to_the_stable_version(two_versions: Router) -> None:
    # The canary's replica drains while a predict's split (looked up before the rollback) still names it.
    two_versions.drain(SERVICE, "canary")
    assert set(asyncio.run(_many(two_versions, Split(1, 2, 100), 20))) == {"sum@1"}


def test_a_promoted_canarys_replica_takes_the_stable_share(two_versions: Router) -> None:
    canary = two_versions._services[SERVICE]["canary"]
    # Its row now says it is a stable replica (every server's sync, or the serving task, tells the router so), and
    # the old version's replica drains.
    two_versions.add(SERVICE, dataclasses.replace(canary, canary=False))
    two_versions.drain(SERVICE, "stable")
    assert set(asyncio.run(_many(two_versions, Split(2), 20))) == {"sum@2"}
