// The page's first requests, sent while the bundle still loads (index.html runs this script before the bundle; the
// server's policy allows no inline script): the session check on every page; on a job's page the job and, on its
// Metrics or System tab, its metric summary; on the Runs page the experiments and its first rows. The app takes
// each answer once, for the same GET, instead of sending it again after the one before (src/early.ts, src/api.ts),
// so the first chart waits for fewer round trips; it forgets them all once signed out. An answer not taken within
// 10 s is dropped: later reads go to the server.
(function () {
  var early = {};
  var ask = function (url) {
    var answer = fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    answer.catch(function () {}); // a failure is the app's to report when it takes the answer
    early[url] = answer;
  };
  var get = function (path) {
    ask("/api/v1" + path);
  };
  get("/session");
  var job = /^\/jobs\/([^/]+)$/.exec(location.pathname);
  if (job && job[1] !== "new") {
    var id;
    try {
      id = encodeURIComponent(decodeURIComponent(job[1])); // as the app writes it (router: match, api: seg)
    } catch (err) {
      id = null;
    }
    if (id) {
      get("/jobs/" + id);
      var tab = new URLSearchParams(location.search).get("tab");
      if (tab === "metrics" || tab === "system") get("/jobs/" + id + "/metrics/summary");
    }
  }
  if (location.pathname === "/runs" && !new URLSearchParams(location.search).get("experiment_id")) {
    // The Runs page: the experiments, and the first rows of the one shown, searched by its name: the same GET as
    // src/pages/Runs.tsx's searchQuery, key by key in its order (a query that differs is simply asked again).
    var page = new URLSearchParams(location.search);
    var search = new URLSearchParams();
    search.append("experiment_names", page.get("experiment") || "Default");
    if (page.get("filter")) search.append("filter", page.get("filter"));
    var sort = page.get("sort");
    if (sort) search.append("order_by", sort.charAt(0) === "-" ? sort.slice(1) + " DESC" : sort + " ASC");
    search.append("max_results", "100");
    var columns = (page.get("columns") || "").split(",").filter(Boolean);
    if (columns.length) columns.forEach(function (c) { search.append("columns", c); });
    else search.append("default_columns", "true");
    get("/experiments"); // the picker: every experiment with its run count
    ask("/mlflow/api/2.0/mlflow/runs/search?" + search.toString());
  }
  window.__kilnEarly = early;
  setTimeout(function () {
    window.__kilnEarly = {};
  }, 10000);
})();
