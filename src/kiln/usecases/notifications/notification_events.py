"""The events of studies and services told to subscriptions (kiln.usecases.notifications.notification_outbox): a study's
end and
each new best trial, a service becoming DEGRADED (unhealthy) and READY again (recovered), a canary's share advanced,
the canary promoted or rolled back (by its rollout policy or by hand), written in the transaction
that records them. Their own module, so that the study and serving code call one function in the place that records
the event and stay about studies and serving."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kiln.db.tables import Service, TuningStudy, TuningTrial
from kiln.domain.studies import TrialState
from kiln.usecases.notifications.notification_outbox import Subject, recorded


def _subject(study: TuningStudy) -> Subject:
    labels = dict(((study.spec or {}).get("trial") or {}).get("labels") or {})  # its trials' labels
    return Subject("study", study.org_id, study.id, study.name, study.user_id, f"/studies/{study.id}", labels)


def study_ended(s: Session, study: TuningStudy) -> None:
    """``study`` moved to its terminal state (study.succeeded, study.failed or study.stopped)."""
    recorded(s, f"study.{study.state.lower()}", _subject(study), state=study.state, message=study.message or "")


def trial_succeeded(s: Session, study: TuningStudy, trial: TuningTrial, direction: str) -> None:
    """``trial`` succeeded with ``trial.value``: study.best_trial when no trial before it did better or as well
    (read in the same transaction, so two trials ending in one pass are compared with each other too)."""
    if trial.value is None:
        return
    better = TuningTrial.value <= trial.value if direction == "minimize" else TuningTrial.value >= trial.value
    beaten = s.scalar(
        select(func.count())
        .select_from(TuningTrial)
        .where(
            TuningTrial.study_id == study.id,
            TuningTrial.number != trial.number,
            TuningTrial.state == TrialState.SUCCEEDED,
            TuningTrial.value.is_not(None),
            better,
        )
    )
    if beaten:
        return
    details = {"trial": trial.number, "value": trial.value, "params": dict(trial.params or {})}
    message = f"trial {trial.number}: {trial.value:g}"
    recorded(s, "study.best_trial", _subject(study), state=study.state, message=message, details=details)


UNHEALTHY = "DEGRADED"  # kiln.domain.serving.ServiceState: fewer replicas ready than wanted, one failing
RECOVERED = "READY"


def service_state_changed(s: Session, service: Service, was: str) -> None:
    """``service`` moved from ``was`` to its state: service.unhealthy when it became DEGRADED, service.recovered
    when a DEGRADED service is READY again; nothing for the other moves (deploying, updating, idle)."""
    if service.state == UNHEALTHY and was != UNHEALTHY:
        kind = "service.unhealthy"
    elif service.state == RECOVERED and was == UNHEALTHY:
        kind = "service.recovered"
    else:
        return
    about = Subject("service", service.org_id, service.id, service.name, service.user_id, f"/services/{service.name}")
    recorded(s, kind, about, state=service.state, message=service.message or "")


CANARY_MOVES = {"advanced": "service.canary_advanced", "promoted": "service.canary_promoted"}
CANARY_MOVES |= {"rolled_back": "service.canary_rolled_back"}


def canary_moved(s: Session, service: Service, move: str, message: str, details: dict[str, object]) -> None:
    """The canary of ``service`` was advanced, promoted or rolled back (``move``, a key of CANARY_MOVES)."""
    about = Subject("service", service.org_id, service.id, service.name, service.user_id, f"/services/{service.name}")
    recorded(s, CANARY_MOVES[move], about, state=service.state, message=message, details=dict(details))
