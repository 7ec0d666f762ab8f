import type { ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";
import { onUnauthorized, request } from "./api";
import { Link, match, navigate, useLocation } from "./router";
import { type Abilities, setSession, useAbilities, useSession } from "./session";
import type { Readiness, SessionBody } from "./types";
import { BudgetBanner } from "./components/BudgetBanner";
import { NotificationBanner } from "./components/NotificationBanner";
import { Admin } from "./pages/Admin";
import { DatasetDetail, Datasets } from "./pages/Datasets";
import { JobDetail } from "./pages/JobDetail";
import { Jobs } from "./pages/Jobs";
import { JobSubmit } from "./pages/JobSubmit";
import { ModelDetail, Models } from "./pages/Models";
import { Notebooks } from "./pages/Notebooks";
import { Notifications } from "./pages/Notifications";
import { Runs } from "./pages/Runs";
import { Overview } from "./pages/Overview";
import { PipelineRunDetail, Pipelines } from "./pages/Pipelines";
import { ServiceDetail, Services } from "./pages/Services";
import { SignIn } from "./pages/SignIn";
import { Studies, StudyDetail } from "./pages/Studies";
import { Usage } from "./pages/Usage";

/** The pages in the header: a path, its name and, for some, who it is for (the page itself still opens for anyone
 * at its address, and shows the server's refusal). */
const NAV: [string, string, ((can: Abilities) => boolean)?][] = [
  ["/", "Overview"],
  ["/jobs", "Jobs"],
  ["/runs", "Runs"],
  ["/studies", "Studies"],
  ["/pipelines", "Pipelines"],
  ["/models", "Models"],
  ["/services", "Services"],
  ["/notebooks", "Notebooks"],
  ["/datasets", "Datasets"],
  ["/notifications", "Notifications"],
  ["/usage", "Usage", (can) => can.orgAdmin], // usage:read: an organisation's admins, the platform admin
  ["/admin", "Admin", (can) => can.orgAdmin],
  // The same page for a member or a viewer: their own keys, their organisation and its quotas.
  ["/admin", "Account", (can) => !can.orgAdmin],
];

type Page = (params: Record<string, string>) => ComponentChildren;
const ROUTES: [string, Page][] = [
  ["/", () => <Overview />],
  ["/jobs", () => <Jobs />],
  ["/jobs/new", () => <JobSubmit />],
  ["/jobs/:id", (p) => <JobDetail id={p.id} />],
  ["/runs", () => <Runs />],
  ["/studies", () => <Studies />],
  ["/studies/:id", (p) => <StudyDetail id={p.id} />],
  ["/pipelines", () => <Pipelines />],
  ["/pipelines/:id", (p) => <PipelineRunDetail id={p.id} />],
  ["/models", () => <Models />],
  ["/models/:name", (p) => <ModelDetail name={p.name} />],
  ["/services", () => <Services />],
  ["/services/:name", (p) => <ServiceDetail name={p.name} />],
  ["/notebooks", () => <Notebooks />],
  ["/datasets", () => <Datasets />],
  ["/datasets/:name", (p) => <DatasetDetail name={p.name} />],
  ["/notifications", () => <Notifications />],
  ["/usage", () => <Usage />],
  ["/admin", () => <Admin />],
];

function here(): string {
  return window.location.pathname + window.location.search;
}

function signInAgain(): void {
  setSession(null);
  if (window.location.pathname !== "/signin") navigate(`/signin?next=${encodeURIComponent(here())}`, true);
}

export function App() {
  const session = useSession();
  const can = useAbilities();
  const location = useLocation();
  const [checked, setChecked] = useState(false);

  useEffect(() => {
    onUnauthorized(signInAgain);
    request<SessionBody>("GET", "/session", { session: false })
      .then((body) => setSession(body))
      .catch(() => setSession(null))
      .finally(() => setChecked(true));
  }, []);

  useEffect(() => {
    if (!checked) return;
    if (!session && location.path !== "/signin") navigate(`/signin?next=${encodeURIComponent(here())}`, true);
  }, [checked, session, location.path]);

  useEffect(() => {
    const name = NAV.find(
      ([href, , only]) => (!only || only(can)) && (href === "/" ? location.path === "/" : location.path.startsWith(href)),
    )?.[1];
    document.title = name ? `${name} · Kiln` : "Kiln";
  }, [location.path, can.orgAdmin]);

  if (!checked) return <p class="muted boot">Loading…</p>;
  if (location.path === "/signin" || !session) return <SignIn />;

  let page: ComponentChildren = <NotFound />;
  for (const [pattern, render] of ROUTES) {
    const params = match(pattern, location.path);
    if (params) {
      page = render(params);
      break;
    }
  }
  return (
    <div class="shell">
      <a class="skip" href="#main">
        Skip to content
      </a>
      <Header />
      <BudgetBanner />
      <NotificationBanner />
      <main id="main" class="main" tabIndex={-1}>
        {page}
      </main>
      <Footer />
    </div>
  );
}

/** The server's release and commit (0.2.0+g1f6b6de), from /readyz: which Kiln an operator is looking at. */
function Footer() {
  const [version, setVersion] = useState<string | null>(null);
  useEffect(() => {
    fetch("/readyz")
      .then((r) => r.json() as Promise<Readiness>)
      .then((body) => setVersion(body.version))
      .catch(() => setVersion(null));
  }, []);
  return (
    <footer class="footer muted" data-testid="footer">
      Kiln {version ?? ""}
    </footer>
  );
}

function Header() {
  const session = useSession();
  const { path } = useLocation();
  const can = useAbilities();
  const user = session?.user;
  const signOut = async () => {
    try {
      await request("DELETE", "/session", { session: false });
    } finally {
      setSession(null);
      navigate("/signin", true);
    }
  };
  return (
    <header class="topbar">
      <Link href="/" class="brand" aria-label="Kiln overview">
        <span class="logo" aria-hidden="true">
          ◆
        </span>{" "}
        Kiln
      </Link>
      <nav aria-label="Main">
        <ul>
          {NAV.filter(([, , only]) => !only || only(can)).map(([href, label]) => {
            const active = href === "/" ? path === "/" : path === href || path.startsWith(`${href}/`);
            return (
              <li key={href}>
                <Link href={href} aria-current={active ? "page" : undefined} data-testid={`nav-${label.toLowerCase()}`}>
                  {label}
                </Link>
              </li>
            );
          })}
        </ul>
      </nav>
      <div class="who" data-testid="whoami">
        <span title={user?.user_id}>{user?.user_name}</span>
        <span class="muted"> @ {user?.org_name}</span>{" "}
        <span class="badge tone-muted" data-testid="role">
          {user?.platform_admin ? "platform admin" : user?.role}
        </span>
        {!can.write ? (
          <span class="badge tone-wait" title="This user may read but not change anything">
            read-only
          </span>
        ) : null}
        <button type="button" class="btn btn-plain" onClick={signOut} data-testid="signout">
          Sign out
        </button>
      </div>
    </header>
  );
}

function NotFound() {
  return (
    <div class="card">
      <h1>Not found</h1>
      <p>
        Nothing here. <Link href="/">Back to the overview</Link>
      </p>
    </div>
  );
}
