// Notifications: the caller's subscriptions (a webhook or an e-mail address for chosen events), created here with
// the webhook's signing secret shown once, paused, resumed, removed and tested; and each one's delivery log with
// "send again". What a receiver answered is shown as text only (it is the receiver's, not Kiln's: never markup).

import { useState } from "preact/hooks";
import { del, patch, post, seg } from "../api";
import { ActionButton, Code, Empty, ErrorBox, Loading, StateBadge } from "../components/ui";
import { ago } from "../format";
import { useApi } from "../hooks";
import { useAbilities } from "../session";
import type { Delivery, Items, Subscription } from "../types";

export function Notifications() {
  const can = useAbilities();
  const { data, error, reload } = useApi<Items<Subscription>>("/notifications/subscriptions", undefined, 5000);
  const [open, setOpen] = useState<string | null>(null);
  const [secret, setSecret] = useState<Subscription | null>(null);
  return (
    <div class="stack">
      <h1>Notifications</h1>
      <ErrorBox error={error} />
      {can.write ? (
        <CreateSubscription
          onDone={(made) => {
            setSecret(made.secret ? made : null);
            reload();
          }}
        />
      ) : null}
      {secret ? (
        <div class="card" role="status" data-testid="subscription-secret">
          <p>
            The signing secret of <strong>{secret.name}</strong>, shown this once: receivers verify each webhook with it
            (Standard Webhooks).
          </p>
          <Code>{secret.secret ?? ""}</Code>
          <ActionButton onClick={() => setSecret(null)}>I saved it</ActionButton>
        </div>
      ) : null}
      {!data ? (
        <Loading />
      ) : !data.items.length ? (
        <Empty>No subscriptions. `kiln notify add NAME --events 'job.*' --url https://…` makes one.</Empty>
      ) : (
        <div class="card table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Subscription</th>
                <th scope="col">Events</th>
                <th scope="col">Target</th>
                <th scope="col">State</th>
                <th scope="col"></th>
              </tr>
            </thead>
            <tbody>
              {data.items.map((sub) => (
                <SubscriptionRow key={sub.id} sub={sub} write={can.write} open={open === sub.id} onToggle={() => setOpen(open === sub.id ? null : sub.id)} onChange={reload} />
              ))}
            </tbody>
          </table>
        </div>
      )}
      {open ? <DeliveryLog subId={open} write={can.write} /> : null}
    </div>
  );
}

function SubscriptionRow(props: { sub: Subscription; write: boolean; open: boolean; onToggle: () => void; onChange: () => void }) {
  const { sub, write, onChange } = props;
  const path = `/notifications/subscriptions/${seg(sub.id)}`;
  const paused = sub.state === "paused";
  return (
    <tr data-testid="subscription-row" data-state={sub.state}>
      <td>
        <strong>{sub.name}</strong>
        <div class="mono small muted">{sub.id}</div>
      </td>
      <td class="mono small">{sub.events.join(", ")}</td>
      <td class="mono small">
        {sub.channel === "email" ? "✉ " : ""}
        {sub.target}
      </td>
      <td>
        <StateBadge state={paused ? "PAUSED" : "ACTIVE"} />
        {sub.paused_reason ? <div class="small muted" data-testid="paused-reason">{sub.paused_reason}</div> : null}
      </td>
      <td>
        <ActionButton onClick={props.onToggle} aria-expanded={props.open} data-testid="show-deliveries">
          {props.open ? "Hide log" : "Delivery log"}
        </ActionButton>
        {write ? (
          <>
            <ActionButton onClick={async () => { await patch(path, { paused: !paused }); onChange(); }} data-testid={paused ? "resume" : "pause"}>
              {paused ? "Resume" : "Pause"}
            </ActionButton>
            {!paused ? (
              <ActionButton onClick={async () => { await post(`${path}/test`); onChange(); }} data-testid="send-test">
                Send a test event
              </ActionButton>
            ) : null}
            <ActionButton kind="danger" onClick={async () => { await del(path); onChange(); }} data-testid="delete-subscription">
              Delete
            </ActionButton>
          </>
        ) : null}
      </td>
    </tr>
  );
}

function DeliveryLog({ subId, write }: { subId: string; write: boolean }) {
  const path = `/notifications/subscriptions/${seg(subId)}/deliveries`;
  const { data, error, reload } = useApi<Items<Delivery>>(path, undefined, 2000);
  return (
    <div class="card" data-testid="delivery-log">
      <h2>Deliveries of {subId}</h2>
      <ErrorBox error={error} />
      {!data ? (
        <Loading />
      ) : !data.items.length ? (
        <Empty>Nothing sent yet.</Empty>
      ) : (
        <div class="table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Event</th>
                <th scope="col">Status</th>
                <th scope="col">Attempts</th>
                <th scope="col">Response</th>
                <th scope="col">Latency</th>
                <th scope="col">Error</th>
                <th scope="col">When</th>
                <th scope="col"></th>
              </tr>
            </thead>
            <tbody>
              {data.items.map((d) => (
                <tr key={d.id} data-testid="delivery-row" data-status={d.status}>
                  <td class="mono small" title={d.event_id}>{d.event_type}</td>
                  <td><StateBadge state={d.status.toUpperCase()} /></td>
                  <td>{d.attempts}</td>
                  <td data-testid="response-code">{d.response_code ?? "-"}</td>
                  <td>{d.latency_ms === null ? "-" : `${d.latency_ms.toFixed(0)} ms`}</td>
                  {/* The receiver's words, as text: Preact escapes a string child, so markup shows as written. */}
                  <td class="small mono" data-testid="delivery-error">{d.error ?? ""}</td>
                  <td>{ago(d.delivered_at ?? d.created_at)}</td>
                  <td>
                    {write && d.status !== "pending" ? (
                      <ActionButton onClick={async () => { await post(`/notifications/subscriptions/${seg(subId)}/deliveries/${seg(d.id)}/resend`); reload(); }} data-testid="resend">
                        Send again
                      </ActionButton>
                    ) : null}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}

function CreateSubscription({ onDone }: { onDone: (made: Subscription) => void }) {
  const [name, setName] = useState("");
  const [events, setEvents] = useState("job.failed");
  const [target, setTarget] = useState("");
  const [match, setMatch] = useState("");
  const input = (set: (v: string) => void) => (e: Event) => set((e.target as HTMLInputElement).value);
  return (
    <form class="card row" data-testid="create-subscription" onSubmit={(e) => e.preventDefault()}>
      <label>
        Name <input value={name} onInput={input(setName)} name="name" />
      </label>
      <label>
        Events <input value={events} onInput={input(setEvents)} name="events" title="Comma-separated types or globs: job.*, study.best_trial, model.*" />
      </label>
      <label>
        Webhook URL or e-mail <input value={target} onInput={input(setTarget)} name="target" />
      </label>
      <label>
        Name pattern <input value={match} onInput={input(setMatch)} name="name_pattern" placeholder="resnet-*" />
      </label>
      <ActionButton
        kind="primary"
        data-testid="subscribe"
        onClick={async () => {
          const where = target.includes("@") && !target.includes("://") ? { email: target } : { url: target };
          const list = events.split(",").map((x) => x.trim()).filter(Boolean);
          const made = await post<Subscription>("/notifications/subscriptions", { name, events: list, ...where, name_pattern: match || null });
          setName("");
          setTarget("");
          onDone(made);
        }}
      >
        Subscribe
      </ActionButton>
    </form>
  );
}
