// KILN-HMAC-SHA256 request signing in the browser (WebCrypto), for the API docs page's "Try it out".
//
// The same scheme as kiln.auth.signing (docs/signing.md): an HMAC-SHA256, keyed with the secret key, over
//   KILN-HMAC-SHA256 \n METHOD \n path \n canonical query \n X-Kiln-Date \n X-Kiln-Nonce \n X-Kiln-Content-SHA256
// The secret key never leaves this code: only the signature is sent.
//
// A classic script with no dependencies: the docs page loads it with a <script> tag, and the tests run it in
// Node (globalThis.crypto.subtle) against a real server. It defines globalThis.KilnSigning.
(function (root) {
  "use strict";

  var ALGORITHM = "KILN-HMAC-SHA256";
  var API_PREFIX = "/api/v1/";
  // Served without a signature (kiln.api.auth.PUBLIC_PATHS): the page fetches the description unsigned.
  var PUBLIC_PATHS = ["/api/v1/openapi.json", "/api/v1/docs", "/api/v1/docs/oauth2-redirect"];
  var ACCESS_KEY = /^AK[A-Z0-9]{18}$/;
  var encoder = new TextEncoder();

  function hex(buffer) {
    return Array.from(new Uint8Array(buffer), function (b) {
      return b.toString(16).padStart(2, "0");
    }).join("");
  }

  // application/x-www-form-urlencoded decoding as Python's parse_qsl does it: "+" is a space, each run of %XX
  // escapes is UTF-8 (invalid UTF-8 becomes U+FFFD), a "%" not followed by two hex digits stays as it is.
  function formDecode(text) {
    return text.replace(/\+/g, " ").replace(/(?:%[0-9A-Fa-f]{2})+/g, function (run) {
      var bytes = new Uint8Array(run.length / 3);
      for (var i = 0; i < bytes.length; i++) bytes[i] = parseInt(run.substr(3 * i + 1, 2), 16);
      return new TextDecoder("utf-8").decode(bytes);
    });
  }

  // RFC 3986: A-Z a-z 0-9 - _ . ~ stay, every other byte of the UTF-8 text is %XX (upper-case hex).
  function encode(text) {
    return encodeURIComponent(text).replace(/[!'()*]/g, function (c) {
      return "%" + c.charCodeAt(0).toString(16).toUpperCase();
    });
  }

  // The canonical query of a raw query string (without the "?"): pairs decoded, encoded, sorted by name then
  // value, joined by "&".
  function canonicalQuery(rawQuery) {
    var pairs = [];
    rawQuery.split("&").forEach(function (part) {
      if (part === "") return;
      var eq = part.indexOf("=");
      var name = eq < 0 ? part : part.slice(0, eq);
      var value = eq < 0 ? "" : part.slice(eq + 1);
      pairs.push([encode(formDecode(name)), encode(formDecode(value))]);
    });
    pairs.sort(function (a, b) {
      if (a[0] !== b[0]) return a[0] < b[0] ? -1 : 1;
      return a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0;
    });
    return pairs
      .map(function (p) {
        return p[0] + "=" + p[1];
      })
      .join("&");
  }

  // The exact bytes fetch() will send for a body Swagger UI built: a string (JSON, text), a File or Blob (a
  // binary upload), URLSearchParams, an ArrayBuffer or a typed array. A multipart FormData has a boundary that
  // only fetch() chooses, so it cannot be signed here.
  async function bodyBytes(body) {
    if (body === undefined || body === null || body === "") return new Uint8Array(0);
    if (typeof body === "string") return encoder.encode(body);
    if (typeof URLSearchParams !== "undefined" && body instanceof URLSearchParams) {
      return encoder.encode(body.toString());
    }
    if (typeof Blob !== "undefined" && body instanceof Blob) return new Uint8Array(await body.arrayBuffer());
    if (body instanceof ArrayBuffer) return new Uint8Array(body);
    if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
    throw new Error("this request's body (" + Object.prototype.toString.call(body) + ") cannot be signed here");
  }

  function randomNonce() {
    var bytes = new Uint8Array(16);
    root.crypto.getRandomValues(bytes);
    return hex(bytes); // 32 characters of [0-9a-f]
  }

  async function hmacHex(secretKey, text) {
    var key = await root.crypto.subtle.importKey(
      "raw",
      encoder.encode(secretKey),
      { name: "HMAC", hash: "SHA-256" },
      false,
      ["sign"],
    );
    return hex(await root.crypto.subtle.sign("HMAC", key, encoder.encode(text)));
  }

  // The four headers that authenticate one request. request: {method, url (absolute), body}; credentials:
  // {accessKey, secretKey}; options: {date (Unix seconds), nonce} for a fixed input, else now and a random one.
  // The path and query are taken from the URL as fetch() will send it (new URL() parses it the same way).
  async function signRequest(request, credentials, options) {
    options = options || {};
    var url = new URL(request.url);
    var query = canonicalQuery(url.search.replace(/^\?/, ""));
    var date = String(options.date === undefined ? Math.floor(Date.now() / 1000) : options.date);
    var nonce = options.nonce || randomNonce();
    var contentSha256 = hex(await root.crypto.subtle.digest("SHA-256", await bodyBytes(request.body)));
    var method = String(request.method || "GET").toUpperCase();
    var text = [ALGORITHM, method, url.pathname, query, date, nonce, contentSha256].join("\n");
    var signature = await hmacHex(credentials.secretKey, text);
    return {
      "X-Kiln-Date": date,
      "X-Kiln-Nonce": nonce,
      "X-Kiln-Content-SHA256": contentSha256,
      Authorization: ALGORITHM + " Credential=" + credentials.accessKey + ", Signature=" + signature,
    };
  }

  // Whether a request to this URL is one the server wants signed: same origin, under /api/v1/, not public.
  function needsSignature(url, origin) {
    var parsed = new URL(url, origin);
    return (
      parsed.origin === new URL(origin).origin &&
      parsed.pathname.indexOf(API_PREFIX) === 0 &&
      PUBLIC_PATHS.indexOf(parsed.pathname) < 0
    );
  }

  // What Swagger UI's requestInterceptor does with its request object ({url, method, headers, body}): add the
  // signature headers when the request goes to this server's API and there are credentials. Returns the request.
  async function interceptRequest(request, credentials, origin) {
    if (!credentials || !credentials.accessKey || !credentials.secretKey) return request;
    if (!needsSignature(request.url, origin)) return request;
    var absolute = new URL(request.url, origin).href;
    var headers = await signRequest({ method: request.method, url: absolute, body: request.body }, credentials);
    request.headers = request.headers || {};
    Object.keys(headers).forEach(function (name) {
      request.headers[name] = headers[name];
    });
    return request;
  }

  // Why these credentials cannot sign, or "" when they look right.
  function credentialsProblem(accessKey, secretKey) {
    if (!ACCESS_KEY.test(accessKey)) {
      return "the access key id is AK followed by 18 capital letters and digits (KILN_ACCESS_KEY in admin.env)";
    }
    if (!secretKey) return "the secret key is empty (KILN_SECRET_KEY in admin.env)";
    return "";
  }

  root.KilnSigning = {
    canonicalQuery: canonicalQuery,
    signRequest: signRequest,
    needsSignature: needsSignature,
    interceptRequest: interceptRequest,
    credentialsProblem: credentialsProblem,
  };
})(globalThis);
