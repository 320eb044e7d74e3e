// Browser notifications when one of your jobs starts or ends (opt-in, per browser): the
// "Job alerts" button asks for the Notification permission; while on, a socket of its own
// (/ws/me/jobs/) receives the rows of your jobs that change, as the jobs page does, and a
// row whose state moved to Running or to a final state becomes a notification. Array
// elements are left out (their array's row says it). Each notification has a tag per job
// and state, so several open tabs show it once.
(function () {
  "use strict";
  const KEY = "berth-job-alerts";
  const FINAL = { Succeeded: "succeeded", Failed: "failed", Cancelled: "was cancelled" };
  const RECENT_SECONDS = 120;
  const button = document.getElementById("job-alerts");
  if (!button || !("Notification" in window) || !("WebSocket" in window)) return;
  const seen = {};
  let socket = null;

  function on() {
    return localStorage.getItem(KEY) === "on" && Notification.permission === "granted";
  }

  function show() {
    button.hidden = false;
    button.textContent = on() ? "Job alerts: on" : "Job alerts: off";
  }

  // A row is pushed for any change of its job (its position, a task): it tells of a start
  // or an end only when that happened lately, by the times the row carries.
  function recent(unix) { return unix && Date.now() / 1000 - Number(unix) < RECENT_SECONDS; }

  function tell(row) {
    const id = row.dataset.job, state = row.dataset.state;
    const before = seen[id];
    seen[id] = state;
    if (before === state || row.hasAttribute("data-element")) return;
    const links = row.querySelectorAll("a");
    const name = links.length > 1 ? links[1].textContent : "";
    let what = null;
    if (state === "Running" && recent(row.dataset.started)) what = "started";
    else if (FINAL[state] && recent(row.dataset.finished)) what = FINAL[state];
    if (!what) return;
    const note = new Notification("Job " + id + " " + what, {
      body: name + " · " + state, tag: "berth-job-" + id + "-" + state,
    });
    note.onclick = function () { window.focus(); location.href = "/jobs/" + id + "/"; };
  }

  function connect() {
    if (socket || !on()) return;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + button.dataset.ws);
    socket.onmessage = function (event) {
      const doc = new DOMParser().parseFromString("<table>" + event.data + "</table>", "text/html");
      doc.querySelectorAll("tr[data-job]").forEach(tell);
    };
    socket.onclose = function () {
      socket = null;
      setTimeout(connect, 5000); // the server restarted, or the network: try again
    };
  }

  button.addEventListener("click", function () {
    if (on()) {
      localStorage.setItem(KEY, "off");
      if (socket) { socket.onclose = null; socket.close(); socket = null; }
      show();
      return;
    }
    Notification.requestPermission().then(function (answer) {
      localStorage.setItem(KEY, answer === "granted" ? "on" : "off");
      show();
      connect();
    });
  });

  show();
  connect();
})();
