// A banner at the top of every page while one of the signed-in user's subscriptions is paused because its
// deliveries failed (not one its owner paused): events wait unsent until it is resumed. GET
// /notifications/subscriptions is asked once per page load and signed-in user, as the budgets banner asks; a
// failed call shows nothing (the Notifications page says more).

import { useEffect, useState } from "preact/hooks";
import { get } from "../api";
import { Link } from "../router";
import { useSession } from "../session";
import type { Items, Subscription } from "../types";

/** Paused by the delivery task (it says "paused after N failed deliveries …"), not by a person. */
export const pausedByFailures = (s: Subscription): boolean => s.state === "paused" && Boolean(s.paused_reason?.startsWith("paused after"));

export function NotificationBanner() {
  const me = useSession()?.user.user_id;
  const [paused, setPaused] = useState<Subscription[]>([]);
  useEffect(() => {
    setPaused([]);
    if (!me) return undefined;
    const abort = new AbortController();
    get<Items<Subscription>>("/notifications/subscriptions", undefined, abort.signal)
      .then((answer) => setPaused(answer.items.filter((s) => s.user_id === me && pausedByFailures(s))))
      .catch(() => {});
    return () => abort.abort();
  }, [me]);
  if (!paused.length) return null;
  const names = paused.map((s) => s.name).join(", ");
  return (
    <div class="banners" data-testid="notification-banner">
      <div class="banner warn" role="status">
        <strong>Notifications paused.</strong> {paused.length === 1 ? "Your subscription" : "Your subscriptions"} {names}{" "}
        failed to deliver and {paused.length === 1 ? "was" : "were"} paused: events are not sent until resumed.{" "}
        <Link href="/notifications">Fix and resume</Link>
      </div>
    </div>
  );
}
