// The job page's terminal (docs/interactive.md): xterm.js (static/vendor/, v6.0.0) attached
// to /ws/jobs/<id>/shell/ over the page's own session; keystrokes go as binary frames of at
// most 16 KiB, resizes as {"type": "resize"}, output is written as it comes.
(function () {
  "use strict";
  const button = document.getElementById("terminal-open");
  if (!button) return;
  const FRAME = 16 * 1024;
  button.addEventListener("click", function () {
    button.disabled = true;
    const box = document.getElementById("terminal");
    const status = document.getElementById("terminal-status");
    box.hidden = false;
    box.textContent = "";
    const term = new Terminal({ cursorBlink: true });
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(scheme + "//" + location.host + button.dataset.url);
    ws.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    let ended = false;
    const end = function (text) { ended = true; status.textContent = "ended: " + text; };
    ws.onopen = function () {
      ws.send(JSON.stringify({ type: "open", rows: term.rows, cols: term.cols, term: "xterm-256color" }));
      status.textContent = "connecting to the node…";
    };
    ws.onmessage = function (event) {
      if (typeof event.data !== "string") { term.write(new Uint8Array(event.data)); return; }
      const message = JSON.parse(event.data);
      if (message.type === "ready") { status.textContent = "connected"; term.focus(); }
      else if (message.type === "exit") end("exit status " + message.status);
      else if (message.type === "error") end(message.message);
      else if (message.type === "notice") { term.write("\r\n\x1b[1;33m[" + message.message + "]\x1b[0m\r\n"); status.textContent = message.message; }
    };
    ws.onclose = function () { if (!ended) end("the connection closed"); button.disabled = false; };
    term.onData(function (data) {
      if (ws.readyState !== WebSocket.OPEN) return;
      const bytes = encoder.encode(data);
      for (let i = 0; i < bytes.length; i += FRAME) ws.send(bytes.subarray(i, i + FRAME));
    });
    term.onResize(function (size) {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", rows: size.rows, cols: size.cols }));
    });
    window.addEventListener("resize", function () { fit.fit(); });
  });
})();
