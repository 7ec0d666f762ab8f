"""Reasons shown outside an organisation name none of its jobs, nor what the reason says of them (their service,
their timeout): services.scheduler_inputs.redact."""

from __future__ import annotations

from kiln.usecases.jobs.scheduler_inputs import redact

MINE, THEIRS = "job-000000000000mine", "job-0000000000theirs"
ORG_OF = {MINE: "org-red", THEIRS: "org-blue"}
MESSAGE = (
    f"capacity: CPUs 2 asked, 0.5 free; next in line: it needs what {THEIRS} (a replica of service web: scale the "
    f"service down or stop it) and {MINE} (backfilled on its resources; preempted to give them back once it can "
    "start) hold, with no end in sight"
)


def test_another_organisations_job_is_hidden_with_what_is_said_of_it() -> None:
    shown = redact(MESSAGE, "org-red", ORG_OF)
    assert THEIRS not in shown and "service web" not in shown
    assert shown == (
        "capacity: CPUs 2 asked, 0.5 free; next in line: it needs what a job of another organisation and "
        f"{MINE} (backfilled on its resources; preempted to give them back once it can start) hold, with no end "
        "in sight"
    )


def test_its_own_jobs_and_a_platform_admin_see_everything() -> None:
    assert redact(MESSAGE, "org-blue", ORG_OF).count("a job of another organisation") == 1
    assert "service web" in redact(MESSAGE, "org-blue", ORG_OF)
    assert redact(MESSAGE, None, ORG_OF) == MESSAGE


def test_words_after_a_job_that_are_not_about_it_stay() -> None:
    message = f"preempting: waits until {THEIRS} stops (being preempted for it)"
    assert redact(message, "org-red", ORG_OF) == (
        "preempting: waits until a job of another organisation stops (being preempted for it)"
    )
