// gbdoctor HTML report: the model strip's kind details, the charts (Chart.js, inlined above),
// the JSON twin's download. Everything it shows is in the page already (no network).
(function () {
  "use strict";
  function selectKind(cell) {
    var doc = cell.closest("article");
    doc.querySelectorAll(".cell.selected").forEach(function (c) { c.classList.remove("selected"); });
    doc.querySelectorAll(".kind-card.selected").forEach(function (c) { c.classList.remove("selected"); });
    cell.classList.add("selected");
    var card = document.getElementById(cell.dataset.card);
    if (card) {
      card.classList.add("selected");
      var where = card.querySelector(".layer");
      if (where) { where.textContent = cell.dataset.fqn; }
    }
  }
  document.querySelectorAll(".strip .cell").forEach(function (cell) {
    cell.addEventListener("click", function () { selectKind(cell); });
  });

  var charts = [];
  function axisTitle(text) { return text ? { display: true, text: text } : { display: false }; }
  function build(canvas, spec) {
    var datasets = spec.datasets.map(function (d) {
      var set = { label: d.label, data: d.data, backgroundColor: d.color, borderColor: d.border || d.color,
        borderWidth: d.type === "line" || spec.type === "line" ? 2 : 1, pointRadius: 2 };
      if (d.type) { set.type = d.type; }
      if (d.type === "line") { set.stack = "line"; }
      if (d.range) { set.grouped = false; set.barPercentage = 0.25; set.order = -1; }
      return set;
    });
    var config = {
      type: spec.type,
      data: { labels: spec.labels, datasets: datasets },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        plugins: { legend: { display: datasets.length > 1 },
          tooltip: { callbacks: { label: function (ctx) {
            var v = ctx.raw;
            var shown = Array.isArray(v) ? v[0] + " .. " + v[1] : (v === null ? "n/a" : v);
            return ctx.dataset.label + ": " + shown + (spec.unit ? " " + spec.unit : "");
          } } } },
        scales: { x: { stacked: !!spec.stacked, title: axisTitle(spec.xLabel) },
          y: { stacked: !!spec.stacked, beginAtZero: spec.beginAtZero !== false,
            title: axisTitle(spec.yLabel) } }
      }
    };
    charts.push(new Chart(canvas, config));
  }
  document.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
    var source = document.getElementById(canvas.dataset.chart);
    build(canvas, JSON.parse(source.textContent));
  });
  window.addEventListener("beforeprint", function () { charts.forEach(function (c) { c.resize(); }); });

  document.querySelectorAll("a[data-twin]").forEach(function (link) {
    link.addEventListener("click", function (event) {
      event.preventDefault();
      var text = document.getElementById(link.dataset.twin).textContent;
      var url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
      var a = document.createElement("a");
      a.href = url; a.download = link.dataset.name; document.body.appendChild(a); a.click();
      setTimeout(function () { URL.revokeObjectURL(url); a.remove(); }, 0);
    });
  });
  document.body.dataset.ready = "true";
})();
