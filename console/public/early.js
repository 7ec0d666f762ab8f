// The page's first requests, sent while the bundle still loads (index.html runs this script before the bundle; the
// server's policy allows no inline script): the session check on every page, and on a job's page the job and, on
// its Metrics or System tab, its metric summary. The app takes each answer once, for the same GET, instead of
// sending it again after the one before (src/early.ts, src/api.ts: send), so the first chart waits for fewer round
// trips; it forgets them all once signed out. An answer not taken within 10 s is dropped: later reads go to the
// server.
(function () {
  var early = {};
  var get = function (path) {
    var url = "/api/v1" + path;
    var answer = fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    answer.catch(function () {}); // a failure is the app's to report when it takes the answer
    early[url] = answer;
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
  window.__kilnEarly = early;
  setTimeout(function () {
    window.__kilnEarly = {};
  }, 10000);
})();
