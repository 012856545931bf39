// The rollout viewer page: metric plots, then one step's samples grouped by prompt, with filters.
// State lives in the URL query (?step=&rmin=&rmax=&truncated=1&sort=), so a view can be linked or reloaded.
"use strict";

// Metric groups plotted when at least one of their keys is in metrics.jsonl; monitor/* keys are added after them.
const PLOTS = [
  { title: "reward", keys: ["train/reward", "validation/mean_reward"] },
  { title: "accuracy", keys: ["train/accuracy", "validation/accuracy"] },
  { title: "response length (tokens)", keys: ["train/rollout/mean_generation_length", "validation/avg_length"] },
  { title: "KL", keys: ["train/kl_penalty", "train/gen_kl_error", "train/policy_kl_error"] },
  { title: "entropy", keys: ["train/approx_entropy"] },
  { title: "mismatch (token_mult_prob_error)", keys: ["train/token_mult_prob_error"] },
];
const GAP_SATURATION = 1.0;  // |trainer − generation logprob| at which the colour is darkest

const state = { run: null, metrics: {}, rows: [], step: null };
const $ = (id) => document.getElementById(id);
const escapeHtml = (value) => String(value).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

async function getJson(url) {
  const response = await fetch(url, { cache: "no-store" });
  const payload = await response.json();
  if (!response.ok) throw new Error(payload.error || `${url}: HTTP ${response.status}`);
  return payload;
}

function showError(error) {
  $("error").hidden = false;
  $("error").textContent = `error: ${error.message || error}`;
}

function readQuery() {
  const query = new URLSearchParams(window.location.search);
  $("reward-min").value = query.get("rmin") ?? "";
  $("reward-max").value = query.get("rmax") ?? "";
  $("truncated-only").checked = query.get("truncated") === "1";
  $("sort").value = query.get("sort") || "group";
  return query.has("step") ? Number(query.get("step")) : null;
}

function writeQuery() {
  const query = new URLSearchParams();
  query.set("step", state.step);
  if ($("reward-min").value !== "") query.set("rmin", $("reward-min").value);
  if ($("reward-max").value !== "") query.set("rmax", $("reward-max").value);
  if ($("truncated-only").checked) query.set("truncated", "1");
  if ($("sort").value !== "group") query.set("sort", $("sort").value);
  window.history.replaceState(null, "", `?${query}`);
}

function renderPlots() {
  const plots = $("plots");
  plots.replaceChildren();
  const monitorKeys = Object.keys(state.metrics).filter((key) => key.includes("monitor/")).sort();
  // the 0/1 alerts share one plot; each monitor statistic gets its own
  const alerts = monitorKeys.filter((key) => key.endsWith("_alert"));
  const statistics = monitorKeys.filter((key) => !key.endsWith("_alert"));
  const groups = [
    ...PLOTS,
    ...(alerts.length ? [{ title: "monitor alerts (1 = alerting)", keys: alerts }] : []),
    ...statistics.map((key) => ({ title: key, keys: [key] })),
  ];
  for (const group of groups) {
    const series = group.keys.filter((key) => state.metrics[key]?.length)
      .map((key) => ({ name: key, points: state.metrics[key] }));
    if (series.length) plots.append(linePlot(group.title, series, state.step));
  }
}

function gapColour(gap) {
  const t = Math.min(1, gap / GAP_SATURATION);
  return `hsl(0, 85%, ${(100 - 45 * Math.sqrt(t)).toFixed(1)}%)`;
}

function renderLegend(hasTokens, hasGap) {
  const legend = $("legend");
  legend.replaceChildren();
  const add = (html) => { const span = document.createElement("span"); span.innerHTML = html; legend.append(span); };
  if (hasGap) add(`|trainer − generation logprob|: 0 <span class="scale"></span> ≥ ${GAP_SATURATION}`);
  if (hasTokens) {
    add('<span class="tok masked">grey</span>: not trained on (loss mask 0: environment replies, masked samples)');
    if (state.rows.some((row) => (row.segments || []).length > 1)) {
      add('<span class="turn assistant">assistant</span> <span class="turn other">environment</span>: turn starts');
    }
  }
  const notes = [];
  if (!hasTokens && state.rows.length) {
    notes.push("These rows carry text only (written by an older version): no per-token colouring.");
  } else if (!hasGap && state.rows.length) {
    notes.push("No gap colouring: this run did not compute the trainer's logprobs of the sampled tokens "
      + "(loss_fn.force_on_policy_ratio: true); set loss_fn.force_on_policy_ratio: false or "
      + "grpo.seq_logprob_error_threshold to get them.");
  }
  $("notes").textContent = notes.join(" ");
}

function tokenSpans(row) {
  const container = document.createElement("div");
  container.className = "tokens";
  const segments = row.segments || [["assistant", row.tokens.length]];
  const multiTurn = segments.length > 1;
  let index = 0;
  for (const [role, count] of segments) {
    if (multiTurn) {
      const marker = document.createElement("span");
      marker.className = `turn ${role === "assistant" ? "assistant" : "other"}`;
      marker.textContent = role;
      container.append(marker);
    }
    for (let k = index; k < index + count && k < row.tokens.length; k++) {
      const span = document.createElement("span");
      span.className = "tok";
      span.textContent = row.tokens[k];
      const masked = row.loss_mask ? row.loss_mask[k] === 0 : role !== "assistant";
      const details = [];
      if (row.generation_logprobs) details.push(`generation logprob ${row.generation_logprobs[k]}`);
      if (row.trainer_logprobs) {
        const gap = Math.abs(row.trainer_logprobs[k] - row.generation_logprobs[k]);
        details.push(`trainer logprob ${row.trainer_logprobs[k]}`, `|gap| ${gap.toFixed(4)}`);
        if (!masked) span.style.background = gapColour(gap);
      }
      details.push(masked ? "loss mask 0" : "loss mask 1");
      if (masked) span.classList.add("masked");
      span.title = details.join("\n");
      container.append(span);
    }
    index += count;
  }
  return container;
}

function sampleCard(row, showPrompt) {
  const card = document.createElement("article");
  card.className = "sample";
  card.dataset.reward = row.reward;
  const meta = document.createElement("div");
  meta.className = "meta";
  const parts = [`<b>reward ${escapeHtml(row.reward)}</b>`];
  if (row.advantage !== undefined) parts.push(`advantage ${Number(row.advantage.toFixed(4))}`);
  if (row.tokens) parts.push(`${row.tokens.length} tokens`);
  if (row.gap) parts.push(`|logprob gap| max ${row.gap.max} · mean ${row.gap.mean}`);
  if (showPrompt) parts.push(`prompt idx ${escapeHtml(row.idx)}`);
  meta.innerHTML = parts.join(" · ");
  if (row.reward === 1) meta.insertAdjacentHTML("beforeend", ' <span class="badge correct">correct</span>');
  if (row.truncated) meta.insertAdjacentHTML("beforeend", ' <span class="badge truncated">truncated</span>');
  card.append(meta);
  if (showPrompt) card.append(promptDetails(row.prompt));
  if (row.tokens) {
    card.append(tokenSpans(row));
  } else {
    const text = document.createElement("div");
    text.className = "plain";
    text.textContent = row.response;
    card.append(text);
  }
  return card;
}

function promptDetails(prompt) {
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = "prompt";
  const text = document.createElement("pre");
  text.textContent = prompt;
  details.append(summary, text);
  return details;
}

function filteredRows() {
  const low = $("reward-min").value === "" ? -Infinity : Number($("reward-min").value);
  const high = $("reward-max").value === "" ? Infinity : Number($("reward-max").value);
  const truncatedOnly = $("truncated-only").checked;
  return state.rows.filter((row) => row.reward >= low && row.reward <= high && (!truncatedOnly || row.truncated));
}

function renderSamples() {
  const shown = filteredRows();
  const samples = $("samples");
  samples.replaceChildren();
  const order = $("sort").value;
  if (order === "group") {
    const groups = new Map();
    for (const row of shown) {
      if (!groups.has(row.idx)) groups.set(row.idx, []);
      groups.get(row.idx).push(row);
    }
    for (const [idx, rows] of groups) {
      const section = document.createElement("section");
      section.className = "group";
      const heading = document.createElement("h2");
      const mean = rows.reduce((sum, row) => sum + row.reward, 0) / rows.length;
      heading.textContent = `prompt idx ${idx}: ${rows.length} responses, mean reward ${Number(mean.toFixed(4))}`;
      section.append(heading, promptDetails(rows[0].prompt), ...rows.map((row) => sampleCard(row, false)));
      samples.append(section);
    }
  } else {
    const key = order === "mismatch" ? (row) => (row.gap ? row.gap.max : -1) : (row) => row.reward;
    for (const row of [...shown].sort((a, b) => key(b) - key(a))) samples.append(sampleCard(row, true));
  }
  const groupCount = new Set(state.rows.map((row) => row.idx)).size;
  const summary = $("summary");
  summary.dataset.step = state.step;
  summary.dataset.steps = state.run.steps.length;
  summary.dataset.samples = state.rows.length;
  summary.dataset.groups = groupCount;
  summary.dataset.shown = shown.length;
  summary.textContent = `Step ${state.step} (${state.run.steps.length} steps logged): ${state.rows.length} samples `
    + `in ${groupCount} prompt groups, ${shown.length} shown`;
}

async function selectStep(step) {
  state.step = step;
  $("step").value = String(step);
  state.rows = await getJson(`api/steps/${step}`);
  writeQuery();
  renderPlots();
  renderLegend(state.rows.some((row) => row.tokens), state.rows.some((row) => row.gap));
  renderSamples();
}

function moveStep(offset) {
  const steps = state.run.steps.map((s) => s.step);
  const next = steps[steps.indexOf(state.step) + offset];
  if (next !== undefined) selectStep(next).catch(showError);
}

async function main() {
  const wanted = readQuery();
  [state.run, state.metrics] = await Promise.all([getJson("api/run"), getJson("api/metrics")]);
  $("run-note").textContent = state.run.note;
  const select = $("step");
  for (const { step, samples } of state.run.steps) {
    const option = document.createElement("option");
    option.value = String(step);
    option.textContent = `${step} (${samples} samples)`;
    select.append(option);
  }
  select.addEventListener("change", () => selectStep(Number(select.value)).catch(showError));
  $("prev").addEventListener("click", () => moveStep(-1));
  $("next").addEventListener("click", () => moveStep(1));
  for (const id of ["reward-min", "reward-max", "truncated-only", "sort"]) {
    $(id).addEventListener("input", () => { writeQuery(); renderSamples(); });
  }
  const steps = state.run.steps.map((s) => s.step);
  if (!steps.length) {
    renderPlots();
    $("summary").textContent = "No sample files (train_data_step*.jsonl) yet.";
  } else {
    await selectStep(steps.includes(wanted) ? wanted : steps[steps.length - 1]);
  }
  document.body.dataset.ready = "1";
}

main().catch((error) => { showError(error); document.body.dataset.ready = "1"; });
