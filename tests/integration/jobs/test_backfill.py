"""The stalled queue of issue 26, on a real server and the real (two-CPU) inventory: a job with no end holds half
a CPU, a whole-machine job waits for it, and a small job behind them must start. The whole-machine job's reason
names what holds it and what would let it start; once that ends, the small job gives back what it borrowed
(preempted, not failed) and the whole-machine job runs first."""

from __future__ import annotations

from tests.tenancy_helpers import Api, close_all, create_tenant

ENDLESS = "sleep 600"  # no timeout: a notebook, a service's replica, a forgotten job
# Holds what it borrowed until it is preempted; its second attempt (after the checkpoint mark) ends at once.
SMALL = 'test -e "$KILN_CHECKPOINT_DIR/ran" && exit 0; touch "$KILN_CHECKPOINT_DIR/ran"; sleep 600'


def test_a_small_job_starts_behind_a_whole_machine_job_that_waits_for_an_endless_one(make_server, database_url):
    server = make_server(database_url, cpus="2", preemption_grace_seconds="5")
    admin = Api.admin(server)
    blue, red = create_tenant(admin, "blue", roles=("member",)), create_tenant(admin, "red", roles=("member",))
    try:
        endless = blue["member"].api.submit(ENDLESS, resources={"cpus": 0.5})
        blue["member"].api.wait(endless["id"], "RUNNING", timeout=60)
        member = red["member"].api
        big = member.submit("true", resources={"cpus": 2})
        member.wait_message(big["id"], "capacity:")
        small = member.submit(["sh", "-c", SMALL], resources={"cpus": 1})
        member.wait(small["id"], "RUNNING", timeout=60)
        assert member.job(big["id"])["state"] == "QUEUED"

        # What holds it and what would let it start; another organisation's job is not named to red...
        why = member.ok("GET", f"/jobs/{big['id']}/why")
        assert why["kind"] == "capacity", why
        message = why["message"]
        assert message.startswith("capacity: CPUs 2 asked, 0.5 free; next in line: it needs what "), message
        assert endless["id"] not in message and "a job of another organisation" in message, message
        assert f"{small['id']} (backfilled on its resources; preempted to give them back once it can start)" in (
            message
        )
        assert "it could start now asking for at most 0.5 CPUs" in message, message
        assert {"other_org": True, "id": None} in [{k: a[k] for k in ("other_org", "id")} for a in why["ahead"]]
        # ... and is to the platform admin, with what would end it.
        seen = admin.ok("GET", f"/jobs/{big['id']}/why")["message"]
        assert f"{endless['id']} (no timeout: wait for it to end or cancel it)" in seen, seen

        # The endless job ends: the whole-machine job takes back what the small one borrowed, and runs first.
        blue["member"].api.ok("POST", f"/jobs/{endless['id']}/cancel")
        done_big = member.wait(big["id"], timeout=60)
        assert done_big["state"] == "SUCCEEDED", done_big
        done_small = member.wait(small["id"], timeout=60)
        assert done_small["state"] == "SUCCEEDED", done_small
        assert (done_small["attempt"], done_small["restarts"]) == (2, 0), done_small  # preempted, not failed
        reasons = [e["reason"] for e in member.events(small["id"])]
        assert "Preempting" in reasons and "Preempted" in reasons, reasons
        preempting = next(e for e in member.events(small["id"]) if e["reason"] == "Preempting")
        assert preempting["message"] == (
            f"preempted by {big['id']}: this job had backfilled on resources reserved for it, which it can use now"
        )
        assert done_big["running_at"] < done_small["running_at"]
    finally:
        close_all(blue, red)
