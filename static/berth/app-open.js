// The job page's "Open" link for a job's web app (docs/interactive.md#web-apps): shown once
// the app answers through Berth's proxy. The proxy says 502 while the app does not answer
// and 404 to anyone but the job's owner; any other answer (a redirect included) means the
// app is up. Live pushes re-render the header (the link hidden again), so what was learnt
// is kept here and applied to whichever header is on the page.
(function () {
  "use strict";
  const EVERY_MS = 3000;
  let answered = false, notYours = false, asking = false;

  function apply() {
    const box = document.querySelector("[data-app-url]");
    const link = box && box.querySelector(".app-open");
    const wait = box && box.querySelector(".app-wait");
    if (!link) return null;
    if (answered) {
      link.hidden = false;
      if (wait) wait.remove();
    } else if (notYours && wait) {
      wait.textContent = " only its owner can open it";
    }
    return box;
  }

  function probe() {
    const box = apply();
    if (!box || answered || notYours || asking) return;
    asking = true;
    fetch(box.dataset.appUrl, { method: "GET", redirect: "manual", credentials: "same-origin",
                                cache: "no-store" })
      .then(function (response) {
        answered = response.type === "opaqueredirect" ||
          (response.status < 500 && response.status !== 404);
        notYours = response.status === 404;
        if (response.body) response.body.cancel();
        apply();
      })
      .catch(function () {})
      .finally(function () { asking = false; });
  }

  probe();
  setInterval(probe, EVERY_MS);
  document.addEventListener("htmx:wsAfterMessage", apply);
})();
