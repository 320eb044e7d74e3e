// GPU utilisation and memory charts (node and job pages), drawn with the vendored uPlot.
// Each holder names its JSON endpoint (data-url); the chart loads it whole, then asks every
// few seconds for what came after the last answer's `until` while the answer says `live`.
// A node's chart keeps only its window (data-window seconds); a job's keeps the job's life.
(function () {
  "use strict";
  var POLL_MS = 5000;
  var palette = ["#2563eb", "#16a34a", "#d97706", "#dc2626", "#7c3aed", "#0891b2",
                 "#be185d", "#65a30d", "#ea580c", "#4b5563"];
  var GI = 1024 * 1024 * 1024;

  function key(s) { return s.node + "/" + s.index; }

  function Chart(holder) {
    this.holder = holder;
    this.url = holder.dataset.url;
    this.window = Number(holder.dataset.window || 0);
    this.x = [];
    this.series = [];  // {key, label, utilization: [], memory: []}
    this.until = null;
    this.plots = [];
  }

  Chart.prototype.merge = function (data) {
    var self = this;
    var known = {};
    this.series.forEach(function (s, i) { known[s.key] = i; });
    data.series.forEach(function (s) {
      if (!(key(s) in known)) {
        known[key(s)] = self.series.length;
        self.series.push({ key: key(s), label: s.label, utilization: self.x.map(function () { return null; }),
                           memory: self.x.map(function () { return null; }) });
      }
    });
    var last = this.x.length ? this.x[this.x.length - 1] : -Infinity;
    data.x.forEach(function (t, j) {
      if (t <= last) return;  // already drawn
      self.x.push(t);
      var seen = {};
      data.series.forEach(function (s) {
        var target = self.series[known[key(s)]];
        seen[target.key] = true;
        target.utilization.push(s.utilization[j]);
        target.memory.push(s.memory_used[j] == null ? null : s.memory_used[j] / GI);
      });
      self.series.forEach(function (s) {
        if (!seen[s.key]) { s.utilization.push(null); s.memory.push(null); }
      });
    });
    if (this.window && this.x.length) {  // keep a node's window only
      var oldest = Date.now() / 1000 - this.window;
      var drop = 0;
      while (drop < this.x.length && this.x[drop] < oldest) drop++;
      if (drop) {
        this.x.splice(0, drop);
        this.series.forEach(function (s) { s.utilization.splice(0, drop); s.memory.splice(0, drop); });
      }
    }
    if (data.until != null) this.until = data.until;
  };

  Chart.prototype.columns = function (field) {
    return [this.x].concat(this.series.map(function (s) { return s[field]; }));
  };

  Chart.prototype.draw = function () {
    var empty = this.holder.querySelector(".chart-empty");
    if (empty) empty.hidden = this.x.length > 0;
    if (!this.x.length) return;
    var width = Math.max(320, this.holder.clientWidth || 800);
    if (this.plots.length && this.plots[0].series.length === this.series.length + 1) {
      this.plots[0].setData(this.columns("utilization"));
      this.plots[1].setData(this.columns("memory"));
      return;
    }
    this.plots.forEach(function (p) { p.destroy(); });
    var self = this;
    function opts(title, label, unit, max) {
      var series = [{}];
      self.series.forEach(function (s, i) {
        var color = palette[i % palette.length];
        series.push({ label: s.label, stroke: color, width: 2, spanGaps: true,
                      value: function (u, v) { return v == null ? "-" : v.toFixed(1) + unit; } });
      });
      return { title: title, width: width, height: 220, series: series,
               scales: { x: { time: true }, y: max ? { range: [0, max] } : { range: function (u, lo, hi) { return [0, Math.max(1, hi)]; } } },
               axes: [{}, { label: label, size: 60 }] };
    }
    var util = this.holder.querySelector(".gpu-util");
    var mem = this.holder.querySelector(".gpu-mem");
    this.plots = [
      new uPlot(opts("Utilisation", "%", " %", 100), this.columns("utilization"), util),
      new uPlot(opts("Memory in use", "GiB", " GiB", 0), this.columns("memory"), mem),
    ];
  };

  Chart.prototype.load = function () {
    var self = this;
    var url = this.url + (this.until != null ? (this.url.indexOf("?") < 0 ? "?" : "&") + "after=" + this.until : "");
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (data) {
        self.merge(data);
        self.draw();
        self.holder.dataset.points = String(self.x.length);
        if (data.live) setTimeout(function () { self.load(); }, POLL_MS);
      })
      .catch(function () { setTimeout(function () { self.load(); }, POLL_MS * 3); });
  };

  document.querySelectorAll("[data-gpu-chart]").forEach(function (holder) {
    var chart = new Chart(holder);
    chart.load();
    window.addEventListener("resize", function () {
      var width = Math.max(320, holder.clientWidth);
      chart.plots.forEach(function (p) { p.setSize({ width: width, height: 220 }); });
    });
  });
})();
