// A running job's remaining walltime on its page, ticking each second (the server renders
// when it runs out: data-ends, Unix seconds; pushes re-render it after `berth extend`).
(function () {
  "use strict";

  function two(n) { return (n < 10 ? "0" : "") + n; }

  function left(seconds) {
    if (seconds <= 0) return "none: it is being stopped";
    const h = Math.floor(seconds / 3600), m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
    return (h ? h + "h " : "") + two(m) + "m " + two(s) + "s";
  }

  function tick() {
    const now = Date.now() / 1000;
    document.querySelectorAll("time.remaining[data-ends]").forEach(function (el) {
      el.textContent = left(Math.floor(Number(el.dataset.ends) - now));
      el.classList.toggle("bad", Number(el.dataset.ends) - now < 600);
    });
  }

  tick();
  setInterval(tick, 1000);
  document.addEventListener("htmx:wsAfterMessage", tick); // a push re-rendered the header
})();
