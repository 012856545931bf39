// Line plots as inline SVG (no library): one figure per metric group, one polyline per metric.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const SERIES_COLOURS = ["#3568d4", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#0b7285"];

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  return element;
}

// Enough digits to tell ticks `span` apart (a series near 1.0000 that moves by 1e-5 still gets distinct labels).
function formatNumber(value, span = Math.abs(value)) {
  if (value === 0) return "0";
  const magnitude = Math.abs(value);
  if (magnitude >= 1e5 || magnitude < 1e-4) return value.toExponential(2);
  const decimals = Math.min(8, Math.max(0, Math.ceil(-Math.log10(span || magnitude)) + 1));
  return String(Number(value.toFixed(decimals)));
}

// series: [{name, points: [[step, value], ...]}]; markStep: the step shown below (a vertical line), or null.
function linePlot(title, series, markStep) {
  const width = 330, height = 160, left = 72, right = 8, top = 8, bottom = 22;
  const all = series.flatMap((s) => s.points);
  let [xMin, xMax] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [yMin, yMax] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (xMin === xMax) { xMin -= 1; xMax += 1; }
  if (yMin === yMax) { const pad = Math.abs(yMin) * 0.1 || 1; yMin -= pad; yMax += pad; }
  const x = (step) => left + ((step - xMin) / (xMax - xMin)) * (width - left - right);
  const y = (value) => top + (1 - (value - yMin) / (yMax - yMin)) * (height - top - bottom);

  const figure = document.createElement("figure");
  figure.className = "plot";
  figure.dataset.title = title;
  const caption = document.createElement("figcaption");
  caption.textContent = title;
  figure.append(caption);
  const svg = svgElement("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  svg.append(svgElement("rect", { x: left, y: top, width: width - left - right, height: height - top - bottom,
    fill: "#fff", stroke: "#c9ced8" }));
  for (const value of [yMin, (yMin + yMax) / 2, yMax]) {
    svg.append(svgElement("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), stroke: "#eef0f4" }));
    const label = svgElement("text", { x: left - 4, y: y(value) + 3, "text-anchor": "end" });
    label.textContent = formatNumber(value, yMax - yMin);
    svg.append(label);
  }
  for (const [step, anchor] of [[xMin, "start"], [xMax, "end"]]) {
    const label = svgElement("text", { x: x(step), y: height - 6, "text-anchor": anchor });
    label.textContent = `step ${step}`;
    svg.append(label);
  }
  if (markStep !== null && markStep >= xMin && markStep <= xMax) {
    svg.append(svgElement("line", { x1: x(markStep), x2: x(markStep), y1: top, y2: height - bottom,
      stroke: "#f08c00", "stroke-dasharray": "3 2" }));
  }
  const names = document.createElement("div");
  names.className = "series-names";
  series.forEach((s, i) => {
    const colour = SERIES_COLOURS[i % SERIES_COLOURS.length];
    const path = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    svg.append(svgElement("polyline", { points: path, fill: "none", stroke: colour, "stroke-width": 1.6 }));
    for (const [step, value] of s.points) {
      const dot = svgElement("circle", { cx: x(step), cy: y(value), r: 2.4, fill: colour });
      const tip = svgElement("title", {});
      tip.textContent = `${s.name} at step ${step}: ${value}`;
      dot.append(tip);
      svg.append(dot);
    }
    const name = document.createElement("span");
    name.style.color = colour;
    name.textContent = `● ${s.name}`;
    names.append(name);
  });
  figure.append(svg, names);
  return figure;
}
