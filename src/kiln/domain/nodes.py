"""What GET /api/v1/nodes answers: each node's capacity and the jobs (and GPUs) that hold it."""

from __future__ import annotations

from pydantic import BaseModel, Field


class NodeJob(BaseModel):
    """A job's share of a node; another organisation's job has no id or name here (``other_org``)."""

    id: str | None = None
    name: str | None = None
    other_org: bool = False
    cpus: float
    memory: int | None = None
    gpus: list[int] = Field(default_factory=list)


class NodeGpu(BaseModel):
    index: int
    name: str | None = None
    job_id: str | None = Field(None, description="The job that holds it (None: free, or another organisation's).")
    job_name: str | None = None
    other_org: bool = False


class NodeRead(BaseModel):
    name: str
    cpus: float
    memory: int
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[NodeGpu] = Field(default_factory=list)
    allocated_cpus: float = 0.0
    allocated_memory: int = 0
    allocated_gpus: int = 0
    jobs: list[NodeJob] = Field(default_factory=list)


class NodeList(BaseModel):
    items: list[NodeRead]
