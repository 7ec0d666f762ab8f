// The API docs page (/api/v1/docs): Swagger UI on the server's own OpenAPI description, with every "Try it
// out" request signed by KilnSigning (kiln-signing.js) with the credentials typed into the page.
//
// The credentials are kept in this tab's sessionStorage only (gone when the tab closes) and never sent: the
// requests carry the signature, not the secret.
(function () {
  "use strict";

  var STORAGE_KEY = "kiln.docs.credentials";
  var OPENAPI_URL = "/api/v1/openapi.json";

  function stored() {
    try {
      var value = JSON.parse(window.sessionStorage.getItem(STORAGE_KEY) || "null");
      return value && value.accessKey && value.secretKey ? value : null;
    } catch (e) {
      return null;
    }
  }

  function say(text, problem) {
    var status = document.getElementById("kiln-status");
    status.textContent = text;
    status.className = problem ? "kiln-problem" : "";
  }

  function showState() {
    var creds = stored();
    document.getElementById("kiln-forget").disabled = !creds;
    if (creds) {
      document.getElementById("kiln-access-key").value = creds.accessKey;
      say("Requests are signed as " + creds.accessKey + " (the secret stays in this tab).");
    } else {
      say("Enter an access key to try requests: every /api/v1 request is signed.");
    }
  }

  function use() {
    var accessKey = document.getElementById("kiln-access-key").value.trim();
    var secretInput = document.getElementById("kiln-secret-key");
    var problem = KilnSigning.credentialsProblem(accessKey, secretInput.value);
    if (problem) {
      say(problem, true);
      return;
    }
    window.sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ accessKey: accessKey, secretKey: secretInput.value }));
    secretInput.value = "";
    showState();
  }

  function forget() {
    window.sessionStorage.removeItem(STORAGE_KEY);
    document.getElementById("kiln-access-key").value = "";
    document.getElementById("kiln-secret-key").value = "";
    showState();
  }

  async function requestInterceptor(request) {
    try {
      return await KilnSigning.interceptRequest(request, stored(), window.location.origin);
    } catch (e) {
      say("This request was sent unsigned: " + e.message, true);
      return request;
    }
  }

  window.addEventListener("DOMContentLoaded", function () {
    // Never submitted (the page's policy has form-action 'none'): the credentials stay in this tab.
    document.getElementById("kiln-credentials-form").addEventListener("submit", function (event) {
      event.preventDefault();
      use();
    });
    document.getElementById("kiln-forget").addEventListener("click", forget);
    showState();
    window.ui = SwaggerUIBundle({
      url: OPENAPI_URL,
      dom_id: "#swagger-ui",
      deepLinking: true,
      validatorUrl: null, // the default sends the description to validator.swagger.io
      presets: [SwaggerUIBundle.presets.apis],
      layout: "BaseLayout",
      requestInterceptor: requestInterceptor,
    });
  });
})();
