// Stacked bar charts drawn as SVG by the page itself (no chart library, nothing fetched).
// Each chart carries its numbers as a table too, for screen readers and exact values.

import { h, s, table, uid } from "./dom.js";

const WIDTH = 640;
const HEIGHT = 240;
const MARGIN = { top: 12, right: 12, bottom: 34, left: 64 };

function niceMax(value) {
  // At least 4: four gridlines then fall on whole numbers for counts.
  if (value <= 4) return 4;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * magnitude >= value) return step * magnitude;
  return 10 * magnitude;
}

function shortLabel(text, max = 12) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function axis(top, format) {
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const lines = [];
  for (let i = 0; i <= 4; i += 1) {
    const y = MARGIN.top + plotH - (plotH * i) / 4;
    lines.push(
      s("line", { x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y, y2: y, class: "grid-line" }),
      s(
        "text",
        { x: MARGIN.left - 8, y: y + 4, class: "tick", "text-anchor": "end" },
        format((top * i) / 4),
      ),
    );
  }
  return lines;
}

function bars(categories, series, top) {
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const slot = plotW / Math.max(1, categories.length);
  const barW = Math.min(48, slot * 0.7);
  const out = [];
  categories.forEach((category, i) => {
    const x = MARGIN.left + i * slot + (slot - barW) / 2;
    let base = MARGIN.top + plotH;
    series.forEach((serie, k) => {
      const value = serie.values[i] || 0;
      const height = (plotH * value) / top;
      if (height > 0) {
        base -= height;
        out.push(
          s(
            "rect",
            { x, y: base, width: barW, height, class: `bar series-${k}` },
            s("title", {}, `${category} · ${serie.name}: ${serie.format(value)}`),
          ),
        );
      }
    });
    out.push(
      s(
        "text",
        { x: x + barW / 2, y: HEIGHT - MARGIN.bottom + 18, class: "tick", "text-anchor": "middle" },
        shortLabel(category),
        s("title", {}, category),
      ),
    );
  });
  return out;
}

/**
 * barChart({title, categories, series: [{name, values, format}], format, used}) -> <figure>.
 * Series stack on each category. `used`: whether the period had any usage at all, for a
 * chart whose values may all be zero while there was (cost at a price of $0); by default
 * a chart of zeros had none.
 */
export function barChart({ title, categories, series, format, used }) {
  const totals = categories.map((_, i) =>
    series.reduce((sum, serie) => sum + (serie.values[i] || 0), 0),
  );
  const anyUsage = used ?? totals.some((t) => t > 0);
  const top = niceMax(Math.max(0, ...totals));
  const captionId = uid("chart");
  const svg = s(
    "svg",
    {
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
      role: "img",
      "aria-labelledby": captionId,
      class: "chart",
      preserveAspectRatio: "xMidYMid meet",
    },
    axis(top, format),
    bars(categories, series, top),
    totals.some((t) => t > 0)
      ? null
      : s(
          "text",
          {
            x: (WIDTH + MARGIN.left) / 2,
            y: HEIGHT / 2,
            class: "chart-empty",
            "text-anchor": "middle",
          },
          anyUsage ? `All ${format(0)} in this period` : "No usage in this period",
        ),
  );
  const legend = h(
    "ul",
    { class: "legend", "aria-hidden": "true" },
    series.map((serie, k) => h("li", {}, h("span", { class: `swatch series-${k}` }), serie.name)),
  );
  const rows = categories.map((category, i) => ({ category, i }));
  const data = table({
    label: `${title} (data)`,
    rows,
    columns: [
      { label: "", cell: (r) => r.category },
      ...series.map((serie) => ({
        label: serie.name,
        num: true,
        cell: (r) => serie.format(serie.values[r.i] || 0),
      })),
    ],
  });
  return h(
    "figure",
    { class: "card chart-card" },
    h("figcaption", { id: captionId }, title),
    svg,
    legend,
    h("details", {}, h("summary", {}, "Show the numbers"), data),
  );
}
