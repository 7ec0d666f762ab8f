"""Per-key rate limits: a burst, then 429 with Retry-After; the bucket refills; other keys are unaffected."""

from __future__ import annotations

import time

from tests.tenancy_helpers import Api, close_all, create_tenant


def test_a_key_over_its_rate_gets_429_and_others_do_not(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(rate_limit_per_second="2", rate_limit_burst="3")
    admin = Api.admin(server)
    alpha = create_tenant(admin, "rate-alpha", ("member",))  # uses the admin's bucket, not the member's
    member, other = alpha["member"].api, admin
    time.sleep(2)  # the admin's bucket refills (3 tokens at 2/s) after the set-up requests

    answers = [member.get("/whoami") for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [200, 200, 200], [a.text for a in answers]
    limited = answers[3]
    assert limited.status_code == 429, limited.text
    assert limited.json()["code"] == "rate_limited"
    assert alpha["member"].key_id in limited.json()["message"]
    retry_after = int(limited.headers["Retry-After"])
    assert 1 <= retry_after <= 2, limited.headers
    # A refused POST does nothing either (the limit applies before the route).
    refused = member.post("/jobs", {"spec": {"command": "echo limited"}})
    assert refused.status_code == 429, refused.text
    assert member.get("/whoami").status_code == 429

    # Another key is not affected.
    assert other.get("/whoami").status_code == 200

    time.sleep(retry_after + 0.1)
    assert member.get("/whoami").status_code == 200
    assert admin.ok("GET", "/jobs")["items"] == []  # the limited submission never happened
    close_all(alpha)
    admin.close()


def test_failed_authentications_are_not_charged_to_the_key(make_server) -> None:  # type: ignore[no-untyped-def]
    # 401s are refused before the limiter: someone without the secret cannot exhaust a key's bucket.
    server = make_server(rate_limit_per_second="2", rate_limit_burst="3")
    admin = Api.admin(server)
    alpha = create_tenant(admin, "rate-bravo", ("member",))
    member = alpha["member"]
    impostor = Api(server.url, member.key_id, "not-the-secret")
    assert [impostor.get("/whoami").status_code for _ in range(6)] == [401] * 6
    assert [member.api.get("/whoami").status_code for _ in range(3)] == [200, 200, 200]
    impostor.close()
    close_all(alpha)
    admin.close()
