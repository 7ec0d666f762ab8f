import { useState } from "preact/hooks";
import { describe, request } from "../api";
import { navigate, useLocation } from "../router";
import { setSession } from "../session";
import type { SessionBody } from "../types";

/** Sign in with an access key pair (`kiln keys create` prints one; a first start writes admin.env): the server
 * answers with an HttpOnly session cookie and the CSRF token, which stays in this page's memory only. */
export function SignIn() {
  const { query } = useLocation();
  const [keyId, setKeyId] = useState("");
  const [secret, setSecret] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const body = await request<SessionBody>("POST", "/session", { body: { key_id: keyId.trim(), secret: secret.trim() }, session: false });
      setSession(body);
      const next = query.get("next");
      navigate(next && next.startsWith("/") && !next.startsWith("//") ? next : "/", true);
    } catch (err) {
      setError(describe(err));
    } finally {
      setBusy(false);
    }
  };

  return (
    <main class="signin">
      <form class="card signin-card" onSubmit={submit} aria-labelledby="signin-title" data-testid="signin-form">
        <h1 id="signin-title">
          <span class="logo" aria-hidden="true">
            ◆
          </span>{" "}
          Sign in to Kiln
        </h1>
        <p class="muted">Use an access key: its id (AK…) and its secret.</p>
        <label class="field">
          <span class="label">Access key id</span>
          <input name="key_id" autocomplete="username" required value={keyId} onInput={(e) => setKeyId(e.currentTarget.value)} data-testid="signin-key" />
        </label>
        <label class="field">
          <span class="label">Secret key</span>
          <input
            name="secret"
            type="password"
            autocomplete="current-password"
            required
            value={secret}
            onInput={(e) => setSecret(e.currentTarget.value)}
            data-testid="signin-secret"
          />
        </label>
        {error ? (
          <div class="error" role="alert" data-testid="signin-error">
            {error}
          </div>
        ) : null}
        <button class="btn btn-primary" type="submit" disabled={busy} data-testid="signin-submit">
          {busy ? "Signing in…" : "Sign in"}
        </button>
      </form>
    </main>
  );
}
