"""Chaos (issue 27): three servers on one PostgreSQL, one store and one server key, each with its own KILN_HOME on
this machine, the local backend. Jobs are submitted round-robin through all three (each with an Idempotency-Key; a
submit whose server died is sent again, with the same key, through the next one) while a random server is killed
with SIGKILL every 2-3 s, the holder of the task leases at least once, and started again on its home and port.
Afterwards, with all three running: every job ended SUCCEEDED exactly once, in its first attempt (an attempt on the
local backend belongs to its machine: the restarted server, or another server on the machine, adopts it), its whole
log reads the same through each server, no retried submit made a second job, and the audit trail has every submit
exactly once.

A tuning study and a two-replica service go through the same treatment: the study, started just before the first
kill, runs exactly its planned trials (one job each, each started once, in its first attempt) and ends SUCCEEDED;
the service answers a predict through one of the servers that are up every ~0.1 s for the whole run, and none is
lost (a predict whose server was killed under it is sent again through another, as a client would; a server that is
up and does not answer, or answers an error, loses it). On the local backend every replica outlives the server that
started it (its shim does), so some server that is up always owns the replicas.

The run is random (which server, when): its seed is printed and ``KILN_CHAOS_SEED`` replays it.
``KILN_CHAOS_JOBS`` sets the number of jobs (default 200, as issue 27 asks)."""

from __future__ import annotations

import itertools
import os
import random
import re
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import Engine, create_engine, text

from kiln.errors import KilnError
from kiln.sdk.client import Client
from tests.helpers import log_text, spec, wait_for
from tests.kilnserver import KilnServer

# 200 with the study and the service: about 80 s alone on a two-CPU machine, most of it the servers' restarts.
JOBS = int(os.environ.get("KILN_CHAOS_JOBS", "200"))
SERVERS = 3
LEASE_SECONDS = 4  # a dead server's job and task leases move on soon
KILL_EVERY = (2.0, 3.0)  # seconds between a restarted server's readiness and the next kill
MIN_KILLS = 5
SUBMITTERS = 2  # threads submitting at once (each job through the servers in turn)
LINES = 3
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
TRIALS = 10  # the study's: two at a time, each ~2 s, so it runs through several kills
PREDICT_EVERY = 0.1

# The service's predictor: a custom class that multiplies, on this interpreter (no runtime to build).
PREDICTOR = """
import json, pathlib

class Model:
    def load(self, path):
        path = pathlib.Path(path)
        self.scale = json.loads((path / "weights.json" if path.is_dir() else path).read_text())["scale"]

    def predict(self, batch):
        return [x * self.scale for x in batch]
"""
WEIGHTS = "import json, os; json.dump({'scale': 3}, open(os.environ['KILN_OUTPUT_DIR'] + '/weights.json', 'w'))"


def job_spec(i: int) -> dict[str, Any]:
    """The cheapest job that says something: a shell printing numbered lines, a sliver of a CPU."""
    name = f"chaos-{i}"
    command = "; ".join(f"echo {name} line {n}" for n in range(1, LINES + 1))
    # network none: no network namespace and pasta to set up per job (the API only)
    return {**spec(command, resources={"cpus": 0.01, "memory": "64M"}, network="none", max_restarts=0), "name": name}


def study_spec(seed: int) -> dict[str, Any]:
    """A random search of TRIALS trials, two at a time, each reporting its objective four times ~0.5 s apart."""
    steps = "; ".join(f"echo step={n} score={{x}}; sleep 0.5" for n in range(4))
    return {
        "trial": {
            "command": steps,
            "runtime": {"python": sys.executable},
            "resources": {"cpus": 0.01, "memory": "64M"},
            "network": "none",
        },
        "parameters": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "score", "direction": "maximize"},
        "algorithm": "random",
        "seed": seed % 1000,
        "max_trials": TRIALS,
        "parallelism": 2,
    }


def service_spec() -> dict[str, Any]:
    return {
        "name": "chaos-scaler",
        "model": "chaos-scaler@1",
        "predictor": {"type": "custom", "class": "predictor:Model"},
        "runtime": {"python": sys.executable},
        "resources": {"cpus": 0.05, "memory": "256M"},
        "replicas": 2,
        "request_timeout": 30,
    }


def expected_log(i: int) -> list[str]:
    return [f"chaos-{i} line {n}" for n in range(1, LINES + 1)]


@dataclass
class Chaos:
    """What happened, for the failure messages and the report."""

    seed: int
    kills: list[tuple[float, int, bool]] = field(default_factory=list)  # (time, server, was the lease holder)
    submit_retries: list[tuple[int, int, str]] = field(default_factory=list)  # (job, server, error)
    errors: list[BaseException] = field(default_factory=list)
    answered: int = 0  # predicts answered right
    predicts_resent: list[tuple[int, str]] = field(default_factory=list)  # (server killed under it, error)
    predicts_lost: list[tuple[float, int, str]] = field(default_factory=list)  # (time, server up, what it said)


@pytest.fixture
def chaos_seed() -> int:
    seed = int(os.environ.get("KILN_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"chaos seed {seed} (replay: KILN_CHAOS_SEED={seed})")
    return seed


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    engine = create_engine(postgres_url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def _lease_holder(engine: Engine) -> str | None:
    """The server holding the task leases now (the one that runs studies, serving and the purges): the owner of
    the most unexpired scopes."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT owner, count(*) FROM task_leases WHERE expires_at > :now GROUP BY owner ORDER BY 2 DESC"),
            {"now": _db_now(conn)},
        ).all()
    return str(rows[0][0]) if rows else None


def _db_now(conn: Any) -> Any:
    # The lease times are naive UTC written by the servers (kiln.db.tables.utcnow).
    return conn.execute(text("SELECT (now() AT TIME ZONE 'utc')")).scalar_one()


def _states(engine: Engine) -> dict[str, str]:
    """The chaos jobs' states (not the study's trials, the service's replicas or the model's job)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT name, state FROM jobs WHERE name LIKE 'chaos-%'")).all()
        return {name: state for name, state in rows if name[len("chaos-") :].isdigit()}


def _study_state(engine: Engine, study_id: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT state FROM tuning_studies WHERE id = :id"), {"id": study_id}).scalar_one())


@dataclass
class Servers:
    """Which servers are up (ready, not killed since), and how many times each was killed: a predict sent to a
    server that was killed before it was answered was cut short by the kill, not lost."""

    up: set[int]
    kills: list[int]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pick(self, rng: random.Random) -> tuple[int, int] | None:
        with self.lock:
            if not self.up:
                return None
            n = rng.choice(sorted(self.up))
            return n, self.kills[n]

    def killed(self, n: int) -> None:
        with self.lock:
            self.up.discard(n)
            self.kills[n] += 1

    def ready(self, n: int) -> None:
        with self.lock:
            self.up.add(n)


def _predict_until(stop: threading.Event, clients: list[Client], servers: Servers, chaos: Chaos) -> None:
    """A predict through a server that is up every PREDICT_EVERY seconds until ``stop``; one cut short by its
    server's kill is sent again through another."""
    rng = random.Random(chaos.seed)
    value = 0
    while not stop.wait(PREDICT_EVERY):
        value += 1
        while not stop.is_set():
            picked = servers.pick(rng)
            if picked is None:
                time.sleep(0.05)
                continue
            n, kills = picked
            try:
                answer = clients[n].predict("chaos-scaler", [value])
                outcome = None if answer.outputs == [3 * value] else f"answered {answer.outputs} for {value}"
            except (KilnError, httpx.HTTPError) as exc:
                outcome = f"{type(exc).__name__}: {exc}"[:300]
            if outcome is None:
                chaos.answered += 1
            elif servers.kills[n] != kills:
                chaos.predicts_resent.append((n, outcome))
                continue
            else:
                chaos.predicts_lost.append((round(time.monotonic(), 1), n, outcome))
            break


def _submit_all(clients: list[Client], chaos: Chaos, ids: dict[int, str], seed: int, part: int) -> None:
    """This submitter's part of the jobs, round-robin through the servers; a submit that fails (its server died
    under it, or is still starting) is sent again with the same key through the next server."""
    for i in range(part, JOBS, SUBMITTERS):
        key = f"chaos-{seed}-{i}"
        deadline = time.monotonic() + 120
        for server in itertools.count(i):
            client = clients[server % SERVERS]
            try:
                ids[i] = client.submit(job_spec(i), idempotency_key=key).id
                break
            except KilnError as exc:
                if exc.status < 500:
                    raise
                chaos.submit_retries.append((i, server % SERVERS, str(exc)[:200]))
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.mark.timeout(900)
def test_three_servers_killed_at_random_lose_double_and_drop_nothing(
    make_server: Any, postgres_url: str, engine: Engine, tmp_path: Path, chaos_seed: int
) -> None:
    rng = random.Random(chaos_seed)
    shared = {
        "server_key": Fernet.generate_key().decode(),
        "storage_url": str(tmp_path / "store"),
        "lease_seconds": str(LEASE_SECONDS),
        "rate_limit_per_second": "0",  # the test reads every job through every server
    }

    # The first makes the admin; the others start together.
    def server(n: int) -> KilnServer:
        return make_server(postgres_url, home=tmp_path / f"home{n}", instance_id=f"chaos-{n}", **shared)  # type: ignore[no-any-return]

    servers = [server(0)]
    with ThreadPoolExecutor(SERVERS - 1) as pool:
        servers += pool.map(server, range(1, SERVERS))
    creds = servers[0].credentials()
    keys = (creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])
    # The submitter's: a server that is starting has bound its port and answers nothing yet, so a submit there
    # gives up after a few seconds and goes to the next server (with its key: the first may create it after all).
    submitters = [[Client(s.url, *keys, retry_seconds=0, timeout=8) for s in servers] for _ in range(SUBMITTERS)]
    clients = [Client(s.url, *keys, retry_seconds=0) for s in servers]
    chaos = Chaos(chaos_seed)
    ids: dict[int, str] = {}

    # A model version and a two-replica service of it, READY before the first kill; then the study.
    admin = clients[0]
    weights = admin.submit(spec(["python", "-c", WEIGHTS]))
    assert wait_for(admin, weights.id, timeout=120).state == "SUCCEEDED"
    admin.register_model("chaos-scaler", weights.id, "weights.json", framework="custom")
    code = tmp_path / "predictor"
    code.mkdir()
    (code / "predictor.py").write_text(PREDICTOR)
    admin.serve(service_spec(), code_dir=code)
    deployed = admin.wait_service("chaos-scaler", timeout=180)
    assert (deployed.state, len(deployed.replicas)) == ("READY", 2), (deployed.message, deployed.replicas)
    predict_clients = [Client(s.url, *keys, retry_seconds=0, timeout=60) for s in servers]
    alive = Servers(set(range(SERVERS)), [0] * SERVERS)
    stop_predicts = threading.Event()
    predicts = threading.Thread(target=_predict_until, args=(stop_predicts, predict_clients, alive, chaos), daemon=True)
    predicts.start()
    study = admin.submit_study(study_spec(chaos_seed))
    started = time.monotonic()

    def submit(part: int) -> None:
        try:
            _submit_all(submitters[part], chaos, ids, chaos_seed, part)
        except BaseException as exc:
            chaos.errors.append(exc)

    def submitted() -> bool:
        return not any(thread.is_alive() for thread in threads)

    def all_ended() -> bool:
        states = _states(engine)
        ended = len(states) >= JOBS and all(state in TERMINAL for state in states.values())
        return ended and _study_state(engine, study.id) in {"SUCCEEDED", "FAILED", "STOPPED"}

    def restart(n: int) -> None:
        try:
            servers[n].start()
            alive.ready(n)
        except BaseException as exc:
            chaos.errors.append(exc)

    threads = [threading.Thread(target=submit, args=(part,), daemon=True) for part in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    restarts: dict[int, threading.Thread] = {}
    leader_kill = rng.randrange(3)  # from this kill on the lease holder is the victim until it has been hit once
    deadline = time.monotonic() + 600
    phases: dict[str, float] = {}
    while (
        len(chaos.kills) < MIN_KILLS
        or not any(was_holder for _, _, was_holder in chaos.kills)
        or not submitted()
        or not all_ended()
    ):
        assert time.monotonic() < deadline and not chaos.errors, f"still going after 600 s: {chaos}"
        if submitted():
            phases.setdefault("submitted", time.monotonic() - started)
        time.sleep(rng.uniform(*KILL_EVERY))
        up = [n for n in range(SERVERS) if n not in restarts or not restarts[n].is_alive()]
        if len(up) < 2:  # one server always serves (it is killed once another is back)
            continue
        holder = _lease_holder(engine)
        holder_index = int(holder.rsplit("-", 1)[1]) if holder else None
        victim = rng.choice(up)
        if len(chaos.kills) >= leader_kill and not any(was_holder for _, _, was_holder in chaos.kills):
            if holder_index not in up:
                continue  # no holder now (its lease ran out, nobody took it yet), or it is starting: wait for it
            victim = holder_index
        chaos.kills.append((round(time.monotonic() - started, 1), victim, victim == holder_index))
        alive.killed(victim)
        servers[victim].kill()
        restarts[victim] = threading.Thread(target=restart, args=(victim,), daemon=True)
        restarts[victim].start()
    phases["ended"] = time.monotonic() - started
    for thread in restarts.values():
        thread.join(180)
    for thread in threads:
        thread.join(10)
    phases["all up"] = time.monotonic() - started
    stop_predicts.set()
    predicts.join(90)
    print(f"{len(chaos.kills)} kills (time, server, lease holder): {chaos.kills}")
    print(f"{len(chaos.submit_retries)} submits sent again: {chaos.submit_retries}")
    print(f"{chaos.answered} predicts answered; {len(chaos.predicts_resent)} sent again: {chaos.predicts_resent}")
    print("phases (s):", {name: round(at, 1) for name, at in phases.items()})
    assert not chaos.errors, chaos.errors
    assert any(was_holder for _, _, was_holder in chaos.kills), chaos.kills
    assert not chaos.predicts_lost, f"predicts lost while their server was up: {chaos.predicts_lost}"
    assert chaos.answered >= 100, chaos.answered  # the predicts went on the whole time (~0.1 s apart)
    assert sorted(ids) == list(range(JOBS))
    assert len(set(ids.values())) == JOBS, "two submits answered the same job"

    # Every job once: no retried submit made a second one, each ended once, in its first attempt; its whole log
    # through every server, whichever ran it. Each server is read by a thread of its own.
    listed = clients[0].list_jobs(limit=JOBS + 200)
    jobs = {j.name: j for j in listed if j.name.startswith("chaos-") and j.name[len("chaos-") :].isdigit()}
    assert sorted(jobs) == sorted(f"chaos-{i}" for i in range(JOBS)), "a submit made no job or a second one"
    _check_study(clients[2], study.id, {j.id: j for j in listed})
    service = clients[1].get_service("chaos-scaler")
    assert (service.state, len(service.replicas)) == ("READY", 2), (service.message, service.replicas)

    takeovers: list[tuple[str, str]] = []  # (job id, message) of every TakenOver event

    def check(n: int) -> list[str]:
        wrong = []
        for i, job_id in ids.items():
            if log_text(clients[n], job_id) != expected_log(i):
                wrong.append(f"chaos-{i} {job_id} through server {n}: {log_text(clients[n], job_id)}")
            if i % SERVERS != n:
                continue
            job = jobs[f"chaos-{i}"]
            events = clients[n].events(job_id)
            moves = [(e.from_state, e.to_state) for e in events if e.to_state is not None]
            reasons = [e.reason for e in events]
            takeovers.extend((job_id, e.message) for e in events if e.reason == "TakenOver")
            if (
                (job.id, job.state, job.attempt, job.exit_code) != (job_id, "SUCCEEDED", 1, 0)
                or moves.count(("QUEUED", "STARTING")) != 1
                or sum(to in TERMINAL for _, to in moves) != 1
                # a re-attachment is claimed only where a shim was found
                or ("Reattached", "Relaunched") in itertools.pairwise(reasons)
            ):
                said = "\n    ".join(f"{e.time} {e.from_state}->{e.to_state} {e.reason}: {e.message}" for e in events)
                wrong.append(f"chaos-{i} {job_id} {job.state} attempt {job.attempt} exit {job.exit_code}:\n    {said}")
        return wrong

    with ThreadPoolExecutor(SERVERS) as pool:
        wrong = [line for found in pool.map(check, range(SERVERS)) for line in found]
    assert not wrong, f"seed {chaos_seed}: " + "\n".join(wrong)

    # Who holds what (issue 44): the three servers are listed live, each with its version and pid, holding none of
    # the run's jobs now that they have ended (the service's replicas they do); each takeover is an event naming the
    # server that took the job and the one, killed during the run, that stopped renewing it (a killed server back
    # in time takes its own leases back silently, so a run may have none).
    listing = clients[0].servers()
    live = {s.id: s for s in listing.items if s.live}
    assert set(live) == {f"chaos-{n}" for n in range(SERVERS)}, listing
    assert all(s.version and s.pid for s in live.values()), listing
    held = {job_id for s in listing.items for job_id in s.job_ids}
    assert not held & set(ids.values()), held  # the service's replicas are held; none of the ended jobs
    killed = {f"chaos-{n}" for _, n, _ in chaos.kills}
    for job_id, message in takeovers:
        found = re.fullmatch(r"Adopted by (\S+) after (\S+) stopped renewing", message)
        assert found and found[1] in live and found[2] in killed and found[1] != found[2], (job_id, message)
    print(f"{len(takeovers)} takeover events")

    # The audit trail: every submit exactly once as the request that created the job (a retry the server
    # answered from its key is a replay, recorded as such).
    audit = clients[1].audit(action="submit_job", limit=1000)
    created = [
        a.resource
        for a in audit
        if a.outcome == "success" and a.detail != "idempotent replay" and a.resource != f"id={weights.id}"
    ]
    assert sorted(created) == sorted(f"id={job_id}" for job_id in ids.values()), set(
        f"id={job_id}" for job_id in ids.values()
    ) ^ set(created)
    print(f"checked {JOBS} jobs: {time.monotonic() - started:.1f} s in all")


def _check_study(client: Client, study_id: str, jobs: dict[str, Any]) -> None:
    """The study ran exactly its planned trials, numbered 0.., each its own job started once and ended once in
    its first attempt, and ended SUCCEEDED."""
    study = client.get_study(study_id)
    assert (study.state, study.reason) == ("SUCCEEDED", "Completed"), (study.state, study.reason, study.message)
    trials = client.study_trials(study_id, order="number")
    assert [t.number for t in trials] == list(range(TRIALS)), [(t.number, t.state) for t in trials]
    failed = [t for t in trials if t.state != "SUCCEEDED"]
    assert not failed, "trials that did not succeed:\n" + "\n".join(
        f"trial {t.number} {t.state} job {t.job_id}:\n    "
        + "\n    ".join(
            f"{e.time} {e.from_state}->{e.to_state} {e.reason}: {e.message}" for e in client.events(t.job_id)
        )
        for t in failed
    )
    assert len({t.job_id for t in trials}) == TRIALS
    labelled = [j for j in jobs.values() if j.spec.labels.get("kiln-study") == study_id]
    assert sorted(j.id for j in labelled) == sorted(t.job_id for t in trials), "a trial made a second job"
    started = [e.trial for e in client.study_events(study_id) if e.reason == "TrialStarted"]
    assert sorted(started) == list(range(TRIALS)), started
    for trial in trials:
        job = jobs[trial.job_id]
        moves = [(e.from_state, e.to_state) for e in client.events(job.id) if e.to_state is not None]
        assert (job.state, job.attempt) == ("SUCCEEDED", 1), (trial.number, job.state, job.attempt)
        assert moves.count(("QUEUED", "STARTING")) == 1 and sum(to in TERMINAL for _, to in moves) == 1, moves
