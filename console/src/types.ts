// The shapes the console reads from /api/v1, named after the server's own schemas: src/generated/api.ts is
// generated from the server's OpenAPI document at build time (scripts/api-types.mjs, run by `npm run build` before
// `tsc`), so a field renamed or removed on the server fails the console's build where the console reads it.
// Nothing here restates a field; only what the document cannot say is written by hand, each saying why.

import type { components, paths } from "./generated/api";

type Schemas = components["schemas"];

/** What the server sends: every field of a response model, nested ones too (FastAPI serialises them all, defaults
 * included), though the document marks a field with a default as optional because a request may leave it out. */
export type Sent<T> = T extends (infer U)[] ? Sent<U>[] : T extends object ? { [K in keyof T]-?: Sent<T[K]> } : T;

/** The JSON a GET of ``path`` answers with 200, as sent. */
export type Answer<P extends keyof paths> = paths[P] extends { get: { responses: { 200: { content: { "application/json": infer T } } } } }
  ? Sent<T>
  : never;

export type JobState = Schemas["JobState"];
/** Every state, in the order of a job's life; `satisfies` and `AllOf` keep it equal to the server's enum. */
const states = ["QUEUED", "STARTING", "RUNNING", "RESTARTING", "SUCCEEDED", "FAILED", "CANCELLED"] as const satisfies readonly JobState[];
type AllOf<Union, List extends readonly unknown[]> = [Exclude<Union, List[number]>] extends [never] ? List : never;
export const JOB_STATES: AllOf<JobState, typeof states> = states;
export const ACTIVE_STATES: JobState[] = ["QUEUED", "STARTING", "RUNNING", "RESTARTING"];
export const isActive = (state: string): boolean => (ACTIVE_STATES as string[]).includes(state);

export type User = Sent<Schemas["WhoAmI"]>;
/** /readyz, outside /api/v1: the footer reads the server's version from it. */
export type Readiness = Sent<Schemas["Readiness"]>;
export type SessionBody = Sent<Schemas["SessionRead"]>;

export type Resources = Sent<Schemas["Resources"]>;
export type JobSpec = Sent<Schemas["JobSpec"]>;
/** What the submit form sends: the request schema itself (fields with defaults may be left out). */
export type JobSpecInput = Schemas["JobSpec"];
export type AllocationSlot = Sent<Schemas["AllocationSlot"]>;
export type Job = Sent<Schemas["JobRead"]>;
export type JobEvent = Sent<Schemas["EventRead"]>;
export type Why = Sent<Schemas["WhyRead"]>;

export type QuotaFields = Sent<Schemas["QuotaFields"]>;
export type QuotaReport = Sent<Schemas["QuotaReport"]>;

export type SeriesSummary = Sent<Schemas["MetricSeriesSummary"]>;
/** [step, time, value]: the document says only "lists of numbers, strings or nulls" (a tuple has no JSON Schema
 * the generator reads back as one); kiln.domain.metrics writes them in this order. */
export type Point = [number | null, number, number | string | null];
export type SeriesData = Omit<Sent<Schemas["MetricSeriesData"]>, "points"> & { points: Point[] };
export type MetricsSummary = Answer<"/api/v1/jobs/{job_id}/metrics/summary">;

export type Artifact = Sent<Schemas["ArtifactRead"]>;
export type TensorBoardImage = Sent<Schemas["TensorBoardImage"]>;
export type TensorBoardImages = Sent<Schemas["TensorBoardImageList"]>;
export type Runtime = Sent<Schemas["RuntimeRead"]>;

export type NodeGpu = Sent<Schemas["NodeGpu"]>;
export type NodeJob = Sent<Schemas["NodeJob"]>;
export type InventoryNode = Sent<Schemas["NodeRead"]>;
/** GET /admin/servers (platform admins): the servers on the database and what each holds. */
export type ServerRow = Sent<Schemas["ServerRead"]>;
export type ServerList = Sent<Schemas["ServerList"]>;

export type ExperimentRow = Sent<Schemas["ExperimentRead"]>;
export type Study = Sent<Schemas["StudyRead"]>;
export type Trial = Sent<Schemas["TrialRead"]>;

export type PipelineRun = Sent<Schemas["PipelineRunRead"]>;
export type PipelineStep = Sent<Schemas["PipelineStepRead"]>;
export type PipelineSchedule = Sent<Schemas["PipelineScheduleRead"]>;

export type Replica = Sent<Schemas["ReplicaRead"]>;
export type Service = Sent<Schemas["ServiceRead"]>;
export type Notebook = Sent<Schemas["NotebookRead"]>;

export type ModelSummary = Sent<Schemas["ModelSummary"]>;
export type ModelRead = Sent<Schemas["ModelRead"]>;
export type ModelVersion = Sent<Schemas["ModelVersionRead"]>;

/** GET /datasets and GET /datasets/{name} declare no response model on the server (the document says only "an
 * object"), so these two are written by hand from kiln.usecases.datasets; the versions themselves are generated. */
export interface DatasetSummary {
  name: string;
  latest_version: number;
  versions: number;
  files: number;
  size: number;
  updated_at: string;
}
export type DatasetVersion = Sent<Schemas["DatasetVersionRead"]>;
export type DatasetManifest = Sent<Schemas["DatasetManifest"]>;

export type UsageReport = Sent<Schemas["UsageReport"]>;
export type UsageRow = Sent<Schemas["UsageRow"]>;
export type PriceVersion = Sent<Schemas["PriceVersion"]>;
export type Budget = Sent<Schemas["BudgetRead"]>;
/** A budget's state: the document says only "a string" (kiln.domain.usage.BudgetRead.state), these three are what
 * kiln.usecases.budgets sends; another is shown as "ok" would be, without a banner. */
export type BudgetState = "ok" | "soft" | "hard";
/** GET /usage's query, as the document says (by and split: org, user, job, category, gpu_type, day). */
export type UsageQuery = NonNullable<paths["/api/v1/usage"]["get"]["parameters"]["query"]>;
export type UsageGroup = NonNullable<UsageQuery["by"]>;

export type Org = Sent<Schemas["OrgRead"]>;
export type Priority = Org["max_priority"];
const priorities = ["low", "normal", "high"] as const satisfies readonly Priority[];
export const PRIORITIES: AllOf<Priority, typeof priorities> = priorities;
export type UserRow = Sent<Schemas["UserRead"]>;
export type Key = Sent<Schemas["KeyRead"]> & { secret_key?: string };
export type KeyCreated = Sent<Schemas["KeyCreated"]>;
export type AuditRecord = Sent<Schemas["AuditRead"]>;

/** A request body, as the server's schema for it says (fields with a default may be left out). */
export type ApiRequest<N extends keyof Schemas> = Schemas[N];

export interface Items<T> {
  items: T[];
}

export type Subscription = Sent<Schemas["SubscriptionRead"]>;
export type Delivery = Sent<Schemas["DeliveryRead"]>;
