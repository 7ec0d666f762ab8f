// The shapes the console reads from /api/v1 (kiln.domain.schemas on the server; /api/v1/openapi.json has them
// all). Only the fields the console uses are listed; the server may send more.

export type JobState = "QUEUED" | "STARTING" | "RUNNING" | "RESTARTING" | "SUCCEEDED" | "FAILED" | "CANCELLED";
export const JOB_STATES: JobState[] = ["QUEUED", "STARTING", "RUNNING", "RESTARTING", "SUCCEEDED", "FAILED", "CANCELLED"];
export const ACTIVE_STATES: JobState[] = ["QUEUED", "STARTING", "RUNNING", "RESTARTING"];
export const isActive = (state: string): boolean => (ACTIVE_STATES as string[]).includes(state);

export interface User {
  user_id: string;
  user_name: string;
  org_id: string;
  org_name: string;
  role: "admin" | "member" | "viewer" | string;
  platform_admin: boolean;
}

export interface SessionBody {
  user: User;
  csrf_token: string;
}

export interface Resources {
  cpus: number;
  memory: number | null;
  disk?: number | null;
  pids?: number | null;
  log?: number | null;
  gpus: number;
  gpu_type?: string | null;
}

export interface JobSpec {
  name?: string | null;
  command: string | string[];
  runtime: { framework?: string | null; version?: string | null; python?: string | null; image?: string | null };
  resources: Resources;
  labels: Record<string, string>;
  priority: string;
  distributed?: { framework: string; workers: number; procs_per_worker: number; ps: number } | null;
  [key: string]: unknown;
}

export interface AllocationSlot {
  node: string;
  cpus: number;
  memory: number | null;
  gpus: number[];
}

export interface Job {
  id: string;
  name: string;
  org_id: string;
  user_id: string;
  state: JobState;
  reason?: string | null;
  message?: string | null;
  spec: JobSpec;
  attempt: number;
  restarts: number;
  exit_code?: number | null;
  cancel_requested: boolean;
  allocation?: { cpus: number; memory: number | null; gpus: number[]; slots: AllocationSlot[] } | null;
  created_at: string;
  updated_at: string;
  started_at?: string | null;
  running_at?: string | null;
  finished_at?: string | null;
}

export interface JobEvent {
  id: number;
  time: string;
  from_state?: string | null;
  to_state?: string | null;
  reason: string;
  message: string;
}

export interface Why {
  job_id: string;
  state: JobState;
  waiting: boolean;
  kind?: string | null;
  message: string;
  position?: number | null;
  queue_length: number;
  priority: string;
  ahead: { id?: string | null; name?: string | null; other_org: boolean }[];
}

export interface QuotaFields {
  gpus: number | null;
  cpus: number | null;
  memory: number | null;
  count: number | null;
  storage: number | null;
}

export interface QuotaReport {
  org_id: string;
  org_name: string;
  categories: { category: string; limits: QuotaFields; used: QuotaFields }[];
}

export interface SeriesSummary {
  name: string;
  worker: string;
  kind: "scalar" | "text";
  source: string;
  count: number;
  first_step?: number | null;
  last_step?: number | null;
  last_time?: number | null;
  last_value?: number | string | null;
  min?: number | null;
  max?: number | null;
}

export type Point = [number | null, number, number | string | null];

export interface SeriesData {
  name: string;
  worker: string;
  kind: "scalar" | "text";
  source: string;
  axis: "step" | "time";
  count: number;
  points: Point[];
}

export interface Artifact {
  path: string;
  size: number;
}

export interface Runtime {
  name: string;
  framework: string;
  version: string;
  default: boolean;
  status: string;
  message?: string | null;
}

// What the inventory route answers (see nodes.ts for how an older server without it is read instead).
export interface NodeGpu {
  index: number;
  name?: string | null;
  job_id?: string | null;
  job_name?: string | null;
  other_org?: boolean;
}

export interface NodeJob {
  id?: string | null;
  name?: string | null;
  cpus: number;
  memory?: number | null;
  gpus: number[];
  other_org?: boolean;
}

export interface InventoryNode {
  name: string;
  cpus?: number | null;
  memory?: number | null;
  labels?: Record<string, string>;
  gpus: NodeGpu[];
  allocated?: { cpus: number; memory?: number | null; gpus?: number } | null;
  jobs: NodeJob[];
}

export interface Study {
  id: string;
  name: string;
  user_id: string;
  state: string;
  reason?: string | null;
  message?: string | null;
  spec: {
    objective: { metric: string; direction: "minimize" | "maximize"; aggregate?: string };
    parameters: Record<string, { type: string; low?: number | null; high?: number | null; log?: boolean; choices?: unknown[] | null }>;
    algorithm: string;
    max_trials: number;
    parallelism: number;
    early_stopping?: unknown;
  };
  planned_trials: number;
  trials: { total: number; running: number; succeeded: number; pruned: number; failed: number; cancelled: number };
  best?: Trial | null;
  created_at: string;
  finished_at?: string | null;
}

export interface Trial {
  study_id: string;
  number: number;
  job_id?: string | null;
  state: string;
  job_state?: string | null;
  params: Record<string, boolean | number | string>;
  value?: number | null;
  last_step?: number | null;
  last_value?: number | null;
  pruned_step?: number | null;
  message: string;
  created_at: string;
  finished_at?: string | null;
  duration_seconds?: number | null;
}

export interface Replica {
  id: string;
  job_id?: string | null;
  job_state?: string | null;
  revision: number;
  state: string;
  model_version: number;
  in_flight: number;
  message: string;
  created_at: string;
  ready_at?: string | null;
}

export interface Service {
  id: string;
  name: string;
  user_id: string;
  state: string;
  message?: string | null;
  spec: { model: string; predictor: { type: string }; replicas: number; autoscale?: unknown; resources: Resources };
  model_name: string;
  model_version: number;
  revision: number;
  desired_replicas: number;
  ready_replicas: number;
  replicas: Replica[];
  endpoint: string;
  created_at: string;
  updated_at: string;
}

export interface ModelSummary {
  name: string;
  latest_version?: number | null;
  versions: number;
  aliases: Record<string, number>;
  size: number;
  created_at: string;
  updated_at: string;
}

export interface ModelVersion {
  name: string;
  version: number;
  framework: string;
  description?: string | null;
  source_path: string;
  file_count: number;
  size: number;
  files: { path: string; size: number }[];
  aliases: string[];
  lineage: {
    job_id: string;
    job_name?: string | null;
    job_state?: string | null;
    metrics: Record<string, number>;
    study_id?: string | null;
    trial?: number | null;
  };
  created_by: string;
  created_at: string;
}

export interface DatasetSummary {
  name: string;
  latest_version: number;
  versions: number;
  files: number;
  size: number;
  updated_at: string;
}

export interface DatasetVersion {
  name: string;
  version: number;
  files: number;
  size: number;
  manifest_sha256: string;
  created_at: string;
}

export interface Org {
  id: string;
  name: string;
  share_weight: number;
  max_priority: string;
  created_at: string;
}

export interface UserRow {
  id: string;
  name: string;
  org_id: string;
  org_name: string;
  role: string;
  platform_admin: boolean;
  disabled: boolean;
  created_at: string;
}

export interface Key {
  id: string;
  user_id: string;
  user_name: string;
  org_id: string;
  enabled: boolean;
  expires_at?: string | null;
  created_at: string;
  last_used_at?: string | null;
  description: string;
  secret_key?: string;
}

export interface AuditRecord {
  id: number;
  time: string;
  org_id?: string | null;
  user_id?: string | null;
  key_id?: string | null;
  action: string;
  resource: string;
  outcome: string;
  status: number;
  client: string;
  detail: string;
}

export interface Items<T> {
  items: T[];
}
