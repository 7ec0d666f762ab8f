"""What GET /api/v1/nodes answers: each node's capacity and the jobs (and GPUs) that hold it."""

from __future__ import annotations

from pydantic import BaseModel, Field


class NodeJob(BaseModel):
    """A job's share of a node: only the caller's organisation's jobs have one (the platform admin's: every
    job's); other organisations' jobs count in the node's ``allocated_*`` totals only. ``other_org`` stays for
    clients that read it (always false now)."""

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
    jobs: list[NodeJob] = Field(
        default_factory=list,
        description="The jobs holding the node that the caller may see: its organisation's (the platform admin: "
        "all). Other organisations' jobs count in the allocated_* totals only.",
    )


class NodeList(BaseModel):
    items: list[NodeRead]
