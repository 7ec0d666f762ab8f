"""The machines a backend offers and what holds them now: each node's CPUs, memory and GPUs, and the jobs (and
GPUs) allocated on it. Another organisation's jobs count in the node's totals (and mark the GPUs they hold as
taken), but have no row of their own: neither an id or a name nor what each job, or each organisation, holds
(the platform admin sees every job)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select

from kiln.backends.base import Inventory
from kiln.db.session import Database
from kiln.db.tables import Job
from kiln.domain.nodes import NodeGpu, NodeJob, NodeRead
from kiln.domain.states import JobState
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.scheduler_inputs import slots_of


class NodeService:
    def __init__(self, db: Database, nodes: Callable[[], list[Inventory]]) -> None:
        self.db = db
        self.nodes = nodes

    def list_nodes(self, principal: Principal) -> list[NodeRead]:
        principal.require("jobs:read")
        inventory = self.nodes()
        default = inventory[0].name if inventory else "local"
        with self.db.read() as s:
            rows = s.execute(
                select(Job.id, Job.name, Job.org_id, Job.allocation).where(
                    Job.state.in_([str(JobState.STARTING), str(JobState.RUNNING)])
                )
            ).all()
        held: dict[str, list[NodeJob]] = {}  # the rows the principal may see
        totals: dict[str, list[float]] = {}  # node -> [cpus, memory, gpus] of every job on it
        gpu_holder: dict[tuple[str, int], NodeJob] = {}
        for job_id, name, org_id, allocation in rows:
            visible = principal.platform_admin or org_id == principal.org_id
            for slot in slots_of(allocation, default):
                entry = NodeJob(
                    id=job_id if visible else None,
                    name=name if visible else None,
                    other_org=not visible,
                    cpus=slot.cpus,
                    memory=slot.memory,
                    gpus=list(slot.gpus),
                )
                total = totals.setdefault(slot.node, [0.0, 0, 0])
                total[0] += slot.cpus
                total[1] += slot.memory or 0
                total[2] += len(slot.gpus)
                if visible:
                    held.setdefault(slot.node, []).append(entry)
                for index in slot.gpus:
                    gpu_holder[(slot.node, index)] = entry
        out = []
        for node in inventory:
            jobs = held.get(node.name, [])
            cpus, memory, gpu_count = totals.get(node.name, [0.0, 0, 0])
            gpus = [
                NodeGpu(
                    index=i,
                    name=node.gpu_names.get(i),
                    job_id=gpu_holder[(node.name, i)].id if (node.name, i) in gpu_holder else None,
                    job_name=gpu_holder[(node.name, i)].name if (node.name, i) in gpu_holder else None,
                    other_org=gpu_holder[(node.name, i)].other_org if (node.name, i) in gpu_holder else False,
                )
                for i in node.gpus
            ]
            out.append(
                NodeRead(
                    name=node.name,
                    cpus=node.cpus,
                    memory=node.memory,
                    labels=dict(node.labels),
                    gpus=gpus,
                    allocated_cpus=cpus,
                    allocated_memory=int(memory),
                    allocated_gpus=int(gpu_count),
                    jobs=jobs,
                )
            )
        return out
