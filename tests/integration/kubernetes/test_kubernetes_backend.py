"""The Kubernetes backend (the controller) through the official ``kubernetes`` client, over HTTP, against a FAKE
Kubernetes API server (tests/fakes/kube_api.py): no cluster is involved."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.backends.base import Launch, Phase
from kiln.backends.capabilities import OutputCollector
from kiln.backends.kubernetes.backend import KubernetesBackend
from kiln.backends.kubernetes.render import KubeConfig, cleanup_selector, main_job_name
from kiln.domain.catalog import DEFAULT_CATALOG, Catalog, CatalogEntry
from kiln.domain.spec import JobSpec
from kiln.errors import InvalidInput
from kiln.injob.logline import parse_tagged
from kiln.storage.logs import LogStore
from kiln.tasks.runner import TaskRunner, TaskStatus
from tests.fakes.kube_api import FakeKubeAPI
from tests.helpers import run_background_work, thread_starts

ORG = "org-1"


def launch(job_id: str, workers: int = 1, attempt: int = 1, **fields: Any) -> Launch:
    body: dict[str, Any] = {"command": "python train.py", "runtime": {"image": "ghcr.io/acme/train:1"}, **fields}
    if workers > 1:
        body["distributed"] = {"framework": "pytorch", "workers": workers}
    spec = JobSpec.model_validate(body)
    return Launch(job_id, ORG, attempt, spec, cpus=1, memory=None, gpus=(), code_key=None, job_token="tok")


def wait_for(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {check}")
        time.sleep(0.02)


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as api:
        api.add_node("node-1", cpu="16", memory="64Gi", gpus=2, labels={"nvidia.com/gpu.product": "NVIDIA-H200"})
        yield api


class Env:
    def __init__(self, fake: FakeKubeAPI, tmp: Path) -> None:
        self.fake = fake
        self.tmp = tmp
        self.logs = LogStore(tmp / "logs")
        self.backends: list[KubernetesBackend] = []
        self.runners: list[TaskRunner] = []

    def backend(self, config: KubeConfig | None = None, catalog: Catalog | None = None) -> KubernetesBackend:
        backend = KubernetesBackend(
            self.fake.api_client(),
            config or KubeConfig(namespace="kiln"),
            endpoint="http://kiln:8080",
            logs=self.logs,
            state_dir=self.tmp / "state",
            image_pull_grace=0.0,
            watch_timeout=2,
            catalog=catalog,
        )
        self.backends.append(backend)
        self.runners.append(run_background_work(backend))  # its informers, as a server's task runner runs them
        return backend

    def close(self) -> None:
        for runner in self.runners:
            runner.stop()
        for backend in self.backends:
            backend.close()


@pytest.fixture
def env(fake: FakeKubeAPI, tmp_path: Path) -> Iterator[Env]:
    e = Env(fake, tmp_path)
    yield e
    e.close()


def poll_until(backend: KubernetesBackend, handle: dict[str, Any], phase: Phase, timeout: float = 5.0) -> Any:
    return wait_for(lambda: (s := backend.poll(handle)).phase is phase and s, timeout)


def log_lines(logs: LogStore, job_id: str) -> list[tuple[str, str]]:
    data, _ = logs.read(job_id)
    return [(member, text) for _, _, member, text in map(parse_tagged, data.decode().splitlines())]


def test_job_success(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-ok"))
    name = main_job_name("job-ok", 1, False)
    kinds = [
        k for k in (o["kind"] for o in fake.list("Secret", "kiln")["items"] + fake.list("ConfigMap", "kiln")["items"])
    ]
    assert kinds == ["Secret", "ConfigMap"]
    uid = fake.jobs()[0]["metadata"]["uid"]
    for obj in fake.list("Secret", "kiln")["items"] + fake.list("ConfigMap", "kiln")["items"]:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid  # patched once the Job existed
    assert backend.poll(handle).phase is Phase.STARTING
    pod = fake.pod(name)
    fake.set_running(pod)
    running = poll_until(backend, handle, Phase.RUNNING)
    assert running.running_at is not None
    lists = sum(1 for m, p in fake.requests if m == "GET" and "/pods" in p)
    for _ in range(20):
        backend.poll(handle)
    assert sum(1 for m, p in fake.requests if m == "GET" and "/pods" in p) <= lists + 1  # the cache, not the API
    fake.append_log(pod, "epoch 1", "epoch 2")
    fake.set_terminated(pod, 0)
    done = poll_until(backend, handle, Phase.EXITED)
    assert (done.exit_code, done.reason) == (0, "Completed")
    wait_for(lambda: len(log_lines(env.logs, "job-ok")) == 2)
    assert log_lines(env.logs, "job-ok") == [("", "epoch 1"), ("", "epoch 2")]  # a single worker: untagged
    assert not isinstance(backend, OutputCollector)  # the pod's sidecar uploads its outputs: nothing to collect


def test_a_catalog_runtime_runs_the_image_of_the_servers_catalog(env: Env) -> None:
    own = DEFAULT_CATALOG.extended([CatalogEntry("pytorch", "9.9", (), "registry.example/torch:9.9", default=True)])
    backend, fake = env.backend(catalog=own), env.fake
    spec = JobSpec.model_validate({"command": "python train.py", "runtime": {"framework": "pytorch"}})
    backend.validate(spec)
    backend.start(Launch("job-img", ORG, 1, spec, cpus=1, memory=None, gpus=(), code_key=None, job_token="tok"))
    [job] = fake.jobs()
    [container] = [c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "job"]
    assert container["image"] == "registry.example/torch:9.9"  # the operator's entry, not the built-in one


def test_worker_failure_names_the_worker_and_stops_the_gang(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-gang", workers=2))
    name = main_job_name("job-gang", 1, True)
    assert len(fake.pods(f"job-name={name}")) == 2
    assert fake.list("Service", "kiln")["items"], "a gang has its headless Service"
    for index in (0, 1):
        fake.set_running(fake.pod(name, index))
    poll_until(backend, handle, Phase.RUNNING)
    fake.set_terminated(fake.pod(name, 1), 3)
    status = poll_until(backend, handle, Phase.EXITED)
    assert status.exit_code == 3
    assert status.reason == "Error"
    assert "worker1" in status.message
    # The rest of the gang is stopped: the Job is deleted (pods too).
    wait_for(lambda: not fake.jobs())
    assert backend.poll(handle) == status  # the outcome is kept once known


def test_oom_killed(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-oom"))
    pod = fake.pod(main_job_name("job-oom", 1, False))
    fake.set_running(pod)
    fake.set_terminated(pod, 137, reason="OOMKilled")
    status = poll_until(backend, handle, Phase.EXITED)
    assert (status.exit_code, status.reason) == (137, "OOMKilled")


def test_eviction(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-evict"))
    pod = fake.pod(main_job_name("job-evict", 1, False))
    fake.set_running(pod)
    fake.evict(pod, "The node was low on resource: ephemeral-storage.")
    status = poll_until(backend, handle, Phase.EXITED)
    assert status.reason == "Evicted"
    assert "ephemeral-storage" in status.message


def test_image_pull_failure(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-pull"))
    pod = fake.pod(main_job_name("job-pull", 1, False))
    fake.image_pull_backoff(pod, 'Back-off pulling image "ghcr.io/acme/train:1": not found')
    status = poll_until(backend, handle, Phase.EXITED)
    assert status.reason == "ImagePullError"
    assert "ghcr.io/acme/train:1" in status.message and "not found" in status.message


def test_unschedulable_stays_starting_with_the_schedulers_message(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-big"))
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    fake.unschedulable(fake.pod(main_job_name("job-big", 1, False)), message)
    status = wait_for(lambda: (s := backend.poll(handle)).message and message in s.message and s)
    assert status.phase is Phase.STARTING


def test_node_lost(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-lost"))
    pod = fake.pod(main_job_name("job-lost", 1, False))
    fake.set_running(pod)
    poll_until(backend, handle, Phase.RUNNING)
    fake.delete_pod(pod)
    status = poll_until(backend, handle, Phase.LOST)
    assert status.reason == "NodeLost"
    backend.cleanup(handle)
    assert not fake.jobs() and not fake.list("Secret", "kiln")["items"]


def test_controller_restart_mid_job(env: Env) -> None:
    fake = env.fake
    first = env.backend()
    handle = first.start(launch("job-restart", workers=2))
    name = main_job_name("job-restart", 1, True)
    pods = [fake.pod(name, i) for i in (0, 1)]
    for pod in pods:
        fake.set_running(pod)
    poll_until(first, handle, Phase.RUNNING)
    fake.append_log(pods[0], "w0 line 1", "w0 line 2")
    fake.append_log(pods[1], "w1 line 1")
    wait_for(lambda: len(log_lines(env.logs, "job-restart")) == 3)
    first.close()
    created_before = sum(1 for method, _ in fake.requests if method == "POST")

    second = env.backend()
    assert second.start(launch("job-restart", workers=2)) == handle  # again: nothing new is created
    assert len(fake.jobs()) == 1
    assert len(fake.pods()) == 2
    assert sum(1 for method, _ in fake.requests if method == "POST") - created_before >= 1  # it tried (409)
    assert poll_until(second, handle, Phase.RUNNING)
    fake.append_log(pods[1], "w1 line 2")
    fake.append_log(pods[0], "w0 line 3")
    for pod in pods:
        fake.set_terminated(pod, 0)
    status = poll_until(second, handle, Phase.EXITED)
    assert (status.exit_code, status.reason) == (0, "Completed")
    wait_for(lambda: len(log_lines(env.logs, "job-restart")) >= 5)
    time.sleep(0.3)  # nothing more arrives
    lines = log_lines(env.logs, "job-restart")
    assert sorted(lines) == [
        ("worker0", "w0 line 1"),
        ("worker0", "w0 line 2"),
        ("worker0", "w0 line 3"),
        ("worker1", "w1 line 1"),
        ("worker1", "w1 line 2"),
    ]


def test_watch_410_gone_relists_and_continues(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-gone"))
    pod = fake.pod(main_job_name("job-gone", 1, False))
    wait_for(lambda: any("watch=true" in path for _, path in fake.requests))
    lists_before = sum(1 for m, p in fake.requests if m == "GET" and "/pods?" in p and "watch=true" not in p)
    fake.expire_watches(2)  # the pods' and the Jobs' next watch
    fake.set_running(pod)  # this change may land in the expired window: only a re-list sees it
    poll_until(backend, handle, Phase.RUNNING, timeout=8)
    wait_for(
        lambda: (
            sum(1 for m, p in fake.requests if m == "GET" and "/pods?" in p and "watch=true" not in p) > lists_before
        ),
        timeout=8,
    )
    fake.set_terminated(pod, 0)
    assert poll_until(backend, handle, Phase.EXITED, timeout=8).exit_code == 0


def test_cancel_deletes_the_jobs_idempotently(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-cancel", workers=2))
    name = main_job_name("job-cancel", 1, True)
    fake.set_running(fake.pod(name, 0))
    backend.cancel(handle, 5)
    assert not fake.jobs() and not fake.pods()
    backend.cancel(handle, 5)  # again: nothing to delete, no error
    status = poll_until(backend, handle, Phase.EXITED)
    assert status.reason == "Cancelled"
    deletes = [p for m, p in fake.requests if m == "DELETE" and "/jobs/" in p]
    assert len(deletes) == 1 and "propagationPolicy=Foreground" in deletes[0]  # by name: no deletecollection
    backend.cleanup(handle)
    assert not fake.list("ConfigMap", "kiln")["items"] and not fake.list("Service", "kiln")["items"]
    assert cleanup_selector("job-cancel", 1).startswith("app.kubernetes.io/managed-by=kiln")


def test_logs_are_tagged_per_worker(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-logs", workers=2))
    name = main_job_name("job-logs", 1, True)
    for index in (0, 1):
        pod = fake.pod(name, index)
        fake.set_running(pod)
        fake.append_log(pod, f"hello from {index}")
    poll_until(backend, handle, Phase.RUNNING)
    wait_for(lambda: len(log_lines(env.logs, "job-logs")) == 2)
    assert sorted(log_lines(env.logs, "job-logs")) == [("worker0", "hello from 0"), ("worker1", "hello from 1")]
    assert b" O@worker1 hello from 1\n" in env.logs.read("job-logs")[0]


def pod_logs_task(runner: TaskRunner) -> TaskStatus:
    return next(task for task in runner.status() if task.name == "k8s-pod-logs")


def stream_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("kiln-task-k8s-pod-logs[")]


def test_pod_logs_are_followed_on_the_task_runners_threads_and_no_other(env: Env) -> None:
    """Issue 27: the per-pod log streams are the backend's background work, run by the server's task runner (a
    thread per pod it follows, reported as one task); the backend starts no thread itself."""
    fake = env.fake
    with thread_starts() as starters:
        backend = env.backend()
        handle = backend.start(launch("job-threads", workers=2))
        name = main_job_name("job-threads", 1, True)
        pods = [fake.pod(name, index) for index in (0, 1)]
        for index, pod in enumerate(pods):
            fake.set_running(pod)
            fake.append_log(pod, f"hello from {index}")
        poll_until(backend, handle, Phase.RUNNING)
        wait_for(lambda: len(log_lines(env.logs, "job-threads")) == 2)
    ours = [module for module in starters if module.startswith("kiln.")]
    assert ours and set(ours) == {"kiln.tasks.runner"}, f"threads started outside the task runner: {ours}"
    runner = env.runners[-1]
    uids = sorted(fake.get("Pod", "kiln", pod)["metadata"]["uid"] for pod in pods)
    assert sorted(stream_threads()) == [f"kiln-task-k8s-pod-logs[{uid}]" for uid in uids]
    wait_for(lambda: pod_logs_task(runner).active == 2)
    assert [task.name for task in runner.status()].count("k8s-pod-logs") == 1  # one line, however many pods

    for pod in pods:
        fake.set_terminated(pod, 0)
    poll_until(backend, handle, Phase.EXITED)
    wait_for(lambda: stream_threads() == [] and pod_logs_task(runner).active == 0)  # each stream read to its end
    status = pod_logs_task(runner)
    assert status.runs >= 2 and status.errors == 0
    assert sorted(log_lines(env.logs, "job-threads")) == [("worker0", "hello from 0"), ("worker1", "hello from 1")]


def test_stopping_the_runner_ends_the_open_log_streams_at_once(env: Env) -> None:
    backend, fake = env.backend(), env.fake
    handle = backend.start(launch("job-stop"))
    pod = fake.pod(main_job_name("job-stop", 1, False))
    fake.set_running(pod)
    fake.append_log(pod, "epoch 1")
    poll_until(backend, handle, Phase.RUNNING)
    wait_for(lambda: log_lines(env.logs, "job-stop") == [("", "epoch 1")])
    assert len(stream_threads()) == 1  # blocked in the pod's follow stream, which the fake keeps open
    clock = time.monotonic()
    env.runners[-1].stop()  # the server stops: the runner interrupts the backend's work
    assert time.monotonic() - clock < 3
    assert stream_threads() == []
    fake.append_log(pod, "epoch 2")
    time.sleep(0.3)
    assert log_lines(env.logs, "job-stop") == [("", "epoch 1")]  # nothing stored after the stop


def test_nodes_and_validate(env: Env) -> None:
    backend = env.backend()
    (node,) = backend.nodes()
    assert (node.name, node.cpus, node.memory, node.gpus) == ("node-1", 16.0, 64 * 2**30, (0, 1))
    assert node.gpu_names == {0: "NVIDIA-H200", 1: "NVIDIA-H200"}
    assert backend.inventory() == node
    with pytest.raises(InvalidInput, match=r"runtime\.python"):
        backend.validate(JobSpec.model_validate({"command": "x", "runtime": {"python": "/usr/bin/python3"}}))
    backend.validate(JobSpec.model_validate({"command": "x", "runtime": {"image": "busybox"}}))
    staged = {"command": "x", "runtime": {"image": "busybox"}, "inputs": [{"dataset": "mnist@1"}]}
    backend.validate(JobSpec.model_validate(staged))
    mounted = dict(staged, inputs=[{"dataset": "mnist@1"}, {"dataset": "imagenet@2", "mode": "mount"}])
    with pytest.raises(InvalidInput, match=r"inputs\[1\]\.mode: mount is not available on the Kubernetes backend"):
        backend.validate(JobSpec.model_validate(mounted))


def test_the_network_policy_is_applied_with_the_attempt_and_deleted_with_it(env: Env) -> None:
    fake = env.fake
    backend = env.backend(KubeConfig(namespace="kiln", job_egress=["deny 10.0.0.0/8"], network_host_orgs=["acme"]))
    handle = backend.start(launch("job-net", workers=2))
    (policy,) = fake.list("NetworkPolicy", "kiln")["items"]
    assert policy["metadata"]["labels"]["kiln.io/job"] == "job-net"
    assert policy["spec"]["egress"][-1]["to"][0]["ipBlock"] == {
        "cidr": "0.0.0.0/0",
        "except": ["10.0.0.0/8", "169.254.0.0/16"],
    }
    uid = fake.jobs()[0]["metadata"]["uid"]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == uid  # patched once the Job existed: goes with it
    created = [p for m, p in fake.requests if m == "POST"]
    policy_at = next(i for i, p in enumerate(created) if "/apis/networking.k8s.io/v1/" in p)
    assert policy_at < next(i for i, p in enumerate(created) if "/jobs" in p)  # before any pod exists
    other = backend.start(launch("job-other"))  # another job's policy stays
    backend.cancel(handle, 5)
    backend.cleanup(handle)
    assert [p["metadata"]["labels"]["kiln.io/job"] for p in fake.list("NetworkPolicy", "kiln")["items"]] == [
        "job-other"
    ]
    backend.cleanup(handle)  # again: nothing left to delete, no error
    backend.cleanup(other)
    assert not fake.list("NetworkPolicy", "kiln")["items"]
    # host: no policy (hostNetwork pods), and only where the operator allows it.
    backend.start(launch("job-host", network="host"))
    assert not fake.list("NetworkPolicy", "kiln")["items"]
    (pod,) = fake.pods()
    assert pod["spec"]["hostNetwork"] is True


def test_validate_refuses_host_unless_the_operator_allows_it(env: Env) -> None:
    host = JobSpec.model_validate({"command": "x", "runtime": {"image": "busybox"}, "network": "host"})
    with pytest.raises(InvalidInput, match="KILN_NETWORK_HOST_ORGS") as info:
        env.backend().validate(host)
    assert info.value.details == {"field": "spec.network"}
    env.backend(KubeConfig(namespace="kiln", network_host_orgs=["acme"])).validate(host)
    mpi = {"command": "x", "runtime": {"image": "busybox"}, "network": "host"}
    mpi["distributed"] = {"framework": "mpi", "workers": 2}
    with pytest.raises(InvalidInput, match="MPI gang"):
        env.backend(KubeConfig(namespace="kiln", network_host_orgs=["acme"])).validate(JobSpec.model_validate(mpi))
