// The job page's "Open" link for a job's web app (docs/interactive.md#web-apps): shown once
// the app answers through Berth's proxy. The proxy says 502 while the app does not answer
// and 404 to anyone but the job's owner; any other answer (a redirect included) means the
// app is up. The header is re-rendered by live pushes, so each probe finds it afresh.
(function () {
  "use strict";
  const EVERY_MS = 3000;

  function probe() {
    const box = document.querySelector("[data-app-url]");
    const link = box && box.querySelector(".app-open");
    if (!link || !link.hidden) return;
    fetch(box.dataset.appUrl, { method: "GET", redirect: "manual", credentials: "same-origin",
                                cache: "no-store" })
      .then(function (response) {
        const wait = box.querySelector(".app-wait");
        if (response.type === "opaqueredirect" || (response.status < 500 && response.status !== 404)) {
          link.hidden = false;
          if (wait) wait.remove();
        } else if (response.status === 404 && wait) {
          wait.textContent = " only its owner can open it";
        }
        if (response.body) response.body.cancel();
      })
      .catch(function () {});
  }

  probe();
  setInterval(probe, EVERY_MS);
})();
