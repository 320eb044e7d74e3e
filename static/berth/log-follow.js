// The job page's live output panes follow new output: a pane scrolled to its end stays at
// its end as pushes append to it; one the reader scrolled up is left where it is.
(function () {
  "use strict";
  const NEAR_END = 24; // pixels from the end that still count as "at the end"

  function atEnd(pane) {
    return pane.scrollHeight - pane.scrollTop - pane.clientHeight <= NEAR_END;
  }

  function follow(pane) {
    if (pane.dataset.following) return;
    pane.dataset.following = "1";
    let stuck = true;
    pane.scrollTop = pane.scrollHeight;
    pane.addEventListener("scroll", function () { stuck = atEnd(pane); });
    new MutationObserver(function () {
      if (stuck) pane.scrollTop = pane.scrollHeight;
    }).observe(pane, { childList: true, characterData: true, subtree: true });
  }

  function followAll() {
    document.querySelectorAll("pre.log[aria-live]").forEach(follow);
  }

  // A retry began (the pushed tasks table names a newer attempt): a pane that follows the
  // latest attempt moves on to the new one.
  function catchUp() {
    document.querySelectorAll(".task-log[data-live]").forEach(function (pane) {
      const row = document.getElementById("task-" + pane.dataset.task);
      const latest = row ? Number(row.dataset.attempt) : NaN;
      if (latest > Number(pane.dataset.attempt) && !pane.dataset.loading) {
        pane.dataset.loading = "1";
        htmx.ajax("GET", pane.dataset.url + "?attempt=" + latest,
                  { target: pane, swap: "outerHTML" });
      }
    });
  }

  document.addEventListener("DOMContentLoaded", followAll);
  document.addEventListener("htmx:wsAfterMessage", catchUp);
  document.addEventListener("htmx:afterSettle", followAll); // a pane the picker swapped in
})();
