// Charts of the sbretry console, drawn with uPlot (static/uplot, vendored). The pages carry the
// address of their data in data-series / data-timeline; this script fetches it and draws. When every
// chart of the page is drawn, body gets data-charts="ready" (the browser test waits for it).
"use strict";
(function () {
  var palette = ["#2f6fde", "#c0362c", "#1f9d55", "#9a6700", "#7c3aed", "#0e7490", "#be185d", "#4d7c0f"];
  var pending = 0;

  function done() {
    pending--;
    if (pending === 0) document.body.dataset.charts = "ready";
  }

  function width(el) { return Math.max(320, el.clientWidth || 800); }

  function chart(el, title, times, series, bars) {
    var box = document.createElement("div");
    box.className = "chart-one";
    el.appendChild(box);
    var opts = {
      title: title,
      width: width(el),
      height: 220,
      scales: { x: { time: true } },
      axes: [{}, { size: 50 }],
      series: [{}].concat(series.map(function (s, i) {
        var o = { label: s.label, stroke: palette[i % palette.length], width: 2 };
        if (bars) {
          o.fill = palette[i % palette.length] + "99";
          o.paths = uPlot.paths.bars({ size: [0.8, 60] });
        }
        return o;
      })),
    };
    return new uPlot(opts, [times].concat(series.map(function (s) { return s.values; })), box);
  }

  function overview(el) {
    pending++;
    fetch(el.dataset.series, { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (d) {
        var kinds = [["deadLetters", "Dead letters"], ["pending", "Pending retries"], ["active", "Active"]];
        kinds.forEach(function (k) {
          chart(el, k[1], d.times, d.entities.map(function (e) { return { label: e.entity, values: e[k[0]] }; }), false);
        });
      })
      .catch(function (e) { el.textContent = "chart unavailable: " + e; })
      .finally(done);
  }

  function timeline(el) {
    pending++;
    fetch(el.dataset.timeline, { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (d) {
        if (!d.total) { el.textContent = "No pending retries."; return; }
        var title = d.total + (d.total === 1 ? " pending retry" : " pending retries") + " by due time" + (d.truncated ? " (among the messages read)" : "");
        if (d.later) title += "; " + d.later + " due after " + new Date(d.horizon * 1000).toISOString().slice(0, 10) + ", not drawn";
        if (d.fromIndex) title += " (from the retry-state index)";
        chart(el, title, d.starts, [{ label: "due", values: d.counts }], true);
      })
      .catch(function (e) { el.textContent = "chart unavailable: " + e; })
      .finally(done);
  }

  document.addEventListener("DOMContentLoaded", function () {
    pending++; // held until every chart of the page has started
    document.querySelectorAll("[data-series]").forEach(overview);
    document.querySelectorAll("[data-timeline]").forEach(timeline);
    done();
  });
})();
