// Live pages around the htmx ws extension (the server pushes fragments by id, dashboard/live.py):
// 1. A pushed row that the page does not have yet (a job or flow just created) is inserted at
//    the top of its list when the page shows the newest rows unfiltered (the list's body has
//    data-live-new), then swapped in like any other row.
// 2. When the socket drops, a banner says so; the extension reconnects (backoff capped at 10 s)
//    and, once back, the page catches up by re-fetching what its socket area shows.
(function () {
  "use strict";
  var lost = false;

  function banner() {
    var el = document.getElementById("ws-lost");
    if (!el) {
      el = document.createElement("div");
      el.id = "ws-lost";
      el.className = "ws-lost";
      el.setAttribute("role", "status");
      el.hidden = true;
      el.textContent = "Connection lost: live updates paused, reconnecting…";
      document.body.appendChild(el);
    }
    return el;
  }

  function insertNewRows(message) {
    var template = document.createElement("template");
    template.innerHTML = message;
    template.content.querySelectorAll("[data-live-insert]").forEach(function (row) {
      if (!row.id || document.getElementById(row.id)) return;
      var list = document.querySelector(row.getAttribute("data-live-insert"));
      if (!list || !list.hasAttribute("data-live-new")) return;
      list.querySelectorAll(":scope > .empty").forEach(function (e) { e.remove(); });
      var placeholder = document.createElement(row.tagName);
      placeholder.id = row.id;
      list.insertBefore(placeholder, list.firstElementChild);
    });
  }

  // Codes on which the ws extension reconnects by itself; 4401/4404: refused, do not retry.
  var EXTENSION_RETRIES = [1006, 1011, 1012, 1013];
  var REFUSED = [4401, 4404];

  function delay(retryCount) {
    var capped = Math.min(500 * Math.pow(2, retryCount), 10000);
    return capped / 2 + (Math.random() * capped) / 2;
  }

  // The page as a plain GET renders it (not an htmx request: views answer those with a
  // fragment), and in it the socket area with the same address as `socketArea`.
  function freshArea(socketArea) {
    return fetch(window.location.href, { credentials: "same-origin" }).then(function (response) {
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.text();
    }).then(function (html) {
      var page = new DOMParser().parseFromString(html, "text/html");
      var address = socketArea.getAttribute("ws-connect");
      var fresh = Array.from(page.querySelectorAll("[ws-connect]")).find(function (el) {
        return el.getAttribute("ws-connect") === address;
      });
      if (!fresh) throw new Error("no live area in the page");
      return fresh;
    });
  }

  // Back after a drop: swap in what the socket area shows now (missed pushes included).
  function catchUp(socketArea) {
    freshArea(socketArea).then(function (fresh) {
      socketArea.replaceChildren.apply(socketArea, Array.from(fresh.childNodes));
      Array.from(socketArea.children).forEach(function (el) { htmx.process(el); });
    }).catch(function () { /* the next push or a reload shows the changes */ });
  }

  // A close the extension does not retry (e.g. 1001 when the server restarts): replace the
  // socket area whole; the fresh element opens a new socket. Until the server answers, retry.
  function reconnect(socketArea, retryCount) {
    setTimeout(function () {
      if (!lost || !document.body.contains(socketArea)) return;
      freshArea(socketArea).then(function (fresh) {
        var adopted = document.importNode(fresh, true);
        socketArea.replaceWith(adopted);
        htmx.process(adopted);
      }).catch(function () { reconnect(socketArea, retryCount + 1); });
    }, delay(retryCount));
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!window.htmx) return;
    htmx.config.wsReconnectDelay = delay;
    document.body.addEventListener("htmx:wsBeforeMessage", function (event) {
      insertNewRows(event.detail.message);
    });
    document.body.addEventListener("htmx:wsClose", function (event) {
      var code = event.detail.event.code;
      if (REFUSED.indexOf(code) >= 0 || !document.body.contains(event.target)) return;
      lost = true;
      banner().hidden = false;
      if (EXTENSION_RETRIES.indexOf(code) < 0) reconnect(event.target, 0);
    });
    document.body.addEventListener("htmx:wsOpen", function (event) {
      if (!lost) return;
      lost = false;
      banner().hidden = true;
      catchUp(event.target);
    });
  });
})();
