// The usage page's chart: GPU-hours per user per day, drawn with the vendored uPlot.
(function () {
  "use strict";
  var holder = document.getElementById("usage-chart");
  var data = JSON.parse(document.getElementById("usage-data").textContent);
  var palette = ["#2563eb", "#16a34a", "#d97706", "#dc2626", "#7c3aed", "#0891b2",
                 "#be185d", "#65a30d", "#ea580c", "#4b5563"];
  var series = [{}];
  var columns = [data.x];
  data.series.forEach(function (s, i) {
    var color = palette[i % palette.length];
    series.push({ label: s.label, stroke: color, fill: color + "22", width: 2,
                  value: function (u, v) { return v == null ? "-" : v.toFixed(2) + " h"; } });
    columns.push(s.values);
  });
  var opts = {
    width: Math.max(320, holder.clientWidth || 800),
    height: 300,
    series: series,
    scales: { x: { time: true } },
    axes: [{}, { label: "GPU-hours", size: 60 }],
  };
  var chart = new uPlot(opts, columns, holder);
  window.addEventListener("resize", function () {
    chart.setSize({ width: Math.max(320, holder.clientWidth), height: 300 });
  });
})();
