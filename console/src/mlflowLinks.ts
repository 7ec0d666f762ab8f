// MLflow's client prints `<tracking URI>/#/experiments/E/runs/R` for every run it logs (and `#/models/NAME/...` for
// registered models). With Kiln the tracking URI is `<endpoint>/mlflow`, where the server answers this page; the
// fragment never reaches the server, so the console reads it here and replaces the address with its own page for
// that run, experiment or model before anything else (sign-in included) looks at the address.

const MLFLOW_UI = new Set(["/mlflow", "/mlflow/"]);

/** The console's address for an MLflow UI fragment ("#/experiments/1/runs/abc"). */
export function consolePathFor(fragment: string): string {
  const parts = fragment.replace(/^#\/?/, "").split("?")[0].split("/").filter(Boolean).map(decodeURIComponent);
  const query = new URLSearchParams();
  if (parts[0] === "experiments" && parts[1]) {
    query.set("experiment_id", parts[1]);
    if (parts[2] === "runs" && parts[3]) query.set("compare", parts[3]);
    return `/runs?${query.toString()}`;
  }
  if (parts[0] === "models") return parts[1] ? `/models/${encodeURIComponent(parts[1])}` : "/models";
  return "/runs";
}

/** At MLflow UI's address: go to the console's page for the fragment (replacing the history entry). */
export function followMlflowLink(): void {
  if (!MLFLOW_UI.has(window.location.pathname)) return;
  window.history.replaceState(null, "", consolePathFor(window.location.hash));
}
