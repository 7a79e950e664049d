// flopscope's HTML report (flopscope/render/html.py): draws the icicle chart of the module call tree from the
// JSON in #data. Units: MACs; FLOPs = 2 x MACs. Every rect carries data-macs (its MACs) and data-path (a module)
// or data-members (an aggregate of narrow neighbours, paths joined by "|").
"use strict";
(function () {
  const started = performance.now();
  window.addEventListener("error", (e) => { document.body.setAttribute("data-error", String(e.message)); });
  const data = JSON.parse(document.getElementById("data").textContent);
  const MIN_PIXELS = 1.0, ROW = 18, SVG = "http://www.w3.org/2000/svg";
  // MACs above 2^53 come as strings (a JSON number would round them): Number() to draw, BigInt() to print exactly
  const tree = data.tree, n = tree.length, total = Number(data.macs) || 1;
  const macs = (i) => Number(tree[i][3]);
  const children = Array.from({ length: n }, () => []), depth = new Array(n).fill(0);
  for (let i = 0; i < n; i++) {
    const parent = tree[i][0];
    if (parent >= 0) { children[parent].push(i); depth[i] = depth[parent] + 1; }
  }
  const maxDepth = depth.reduce((a, b) => Math.max(a, b), 0);
  const chart = document.getElementById("chart"), tip = document.getElementById("tip");
  const crumbs = document.getElementById("crumbs");
  const fmt = (x) => BigInt(x).toLocaleString("en-US");
  const twice = (x) => (2n * BigInt(x)).toString();
  function si(value, unit) {
    const x = Number(value), prefixes = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "K"]];
    for (const [scale, p] of prefixes) if (Math.abs(x) >= scale) return (x / scale).toFixed(2) + " " + p + unit;
    return x + " " + unit;
  }
  const rootName = data.root || "(model)";  // a pipeline's root: its class name
  function label(i) {  // the last name of the path; "h.0" rather than "0"
    if (tree[i][1] === "") return rootName;
    const parts = tree[i][1].split(".");
    return parts.length > 1 && /^\d+$/.test(parts[parts.length - 1]) ? parts.slice(-2).join(".") : parts.pop();
  }
  const colour = (role) => data.colours[role] || "#d9d9d9";

  function rect(svg, x, y, w, attrs, text) {
    const r = document.createElementNS(SVG, "rect");
    r.setAttribute("x", x.toFixed(2)); r.setAttribute("y", y); r.setAttribute("width", Math.max(w, 0).toFixed(2));
    r.setAttribute("height", ROW - 1);
    for (const [k, v] of Object.entries(attrs)) r.setAttribute(k, v);
    svg.appendChild(r);
    const chars = Math.floor((w - 6) / 6.2);
    if (chars >= 2 && text) {
      const t = document.createElementNS(SVG, "text");
      t.setAttribute("x", (x + 3).toFixed(2)); t.setAttribute("y", y + ROW - 5);
      t.textContent = text.length > chars ? text.slice(0, chars - 1) + "…" : text;
      svg.appendChild(t);
    }
    return r;
  }

  function node(svg, i, x, y, w, cls) {
    const row = tree[i];
    return rect(svg, x, y, w, { "data-i": i, "data-path": row[1], "data-macs": row[3], "class": cls,
                                "fill": colour(row[5]) }, label(i) + " (" + si(row[3], "MAC") + ")");
  }

  function render(focus) {
    const width = Math.max(chart.clientWidth || 0, 300);
    const ancestors = [];
    for (let a = tree[focus][0]; a >= 0; a = tree[a][0]) ancestors.unshift(a);
    const rows = ancestors.length + (maxDepth - depth[focus]) + 1;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", width); svg.setAttribute("height", rows * ROW);
    svg.setAttribute("data-focus", tree[focus][1]);
    ancestors.forEach((a, k) => node(svg, a, 0, k * ROW, width, "node ancestor"));
    const scale = width / (macs(focus) || 1);
    const top = ancestors.length * ROW;
    function lay(i, x, y) {
      const w = macs(i) * scale;
      node(svg, i, x, y, w, "node");
      let cx = x, run = [], runX = 0;
      const flush = () => {
        if (!run.length) return;
        const sum = run.reduce((s, c) => s + BigInt(tree[c][3]), 0n);
        rect(svg, runX, y + ROW, Number(sum) * scale, { "class": "agg", "data-macs": sum.toString(),
             "data-members": run.map((c) => tree[c][1]).join("|"), "data-parent": tree[i][1],
             "data-pi": i }, "+" + run.length);
        run = [];
      };
      const own = Number(tree[i][8]);
      if (own > 0 && children[i].some((c) => macs(c) > 0)) {  // the module's own ops, after its submodules
        const ox = x + w - own * scale;
        rect(svg, ox, y + ROW, own * scale, { "data-i": i, "data-self": "", "data-path": tree[i][1],
             "data-macs": tree[i][8], "class": "self", "fill": colour(tree[i][9]) }, "self (" + si(own, "MAC") + ")");
      }
      for (const c of children[i]) {
        const cw = macs(c) * scale;
        if (macs(c) === 0) continue;
        if (cw < MIN_PIXELS) { if (!run.length) runX = cx; run.push(c); }
        else { flush(); lay(c, cx, y + ROW); }
        cx += cw;
      }
      flush();
    }
    lay(focus, 0, top);
    chart.replaceChildren(svg);
    crumbs.replaceChildren();
    [...ancestors, focus].forEach((a, k) => {
      if (k) crumbs.append(" › ");
      const link = document.createElement(a === focus ? "span" : "a");
      link.textContent = label(a);
      if (a !== focus) link.addEventListener("click", () => render(a));
      crumbs.append(link);
    });
    current = focus;
  }

  function show(e) {
    const r = e.target.closest("rect");
    if (!r) { tip.style.display = "none"; return; }
    tip.innerHTML = describe(r);
    tip.style.display = "block";
    const x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = Math.max(x, 0) + "px"; tip.style.top = (e.clientY + 16) + "px";
  }
  function describe(r) {
    const share = (m) => fmt(m) + " MACs (" + si(m, "MAC") + ") = " + fmt(twice(m)) + " FLOPs ("
      + si(twice(m), "FLOP") + ")<br>share " + (100 * Number(m) / total).toFixed(2) + "% of the total";
    if (r.hasAttribute("data-members")) {
      const members = r.getAttribute("data-members").split("|");
      return "<b>" + members.length + " narrow modules</b> under " + esc(r.getAttribute("data-parent") || rootName)
        + "<br>" + share(r.getAttribute("data-macs")) + "<br>click to zoom into their parent";
    }
    const row = tree[Number(r.getAttribute("data-i"))];
    if (r.hasAttribute("data-self")) {
      return "<b>" + esc(row[1] || rootName) + "</b>: its own ops, outside its submodules<br>" + share(row[8])
        + (row[9] ? "<br>dominant role <b>" + esc(row[9]) + "</b>" : "");
    }
    const phases = row[10] ? "<br>" + Object.keys(data.phases).map((p, k) => esc(p) + " " + fmt(row[10][k]))
      .join(" · ") + " MACs" : "";
    return "<b>" + esc(row[1] || rootName) + "</b> " + esc(data.types[row[2]] || "") + "<br>" + share(row[3]) + phases
      + "<br>parameters " + fmt(row[4]) + " · calls " + (row[6] ? fmt(row[6]) : "0 (its submodules were called)")
      + (row[5] ? "<br>dominant role <b>" + esc(row[5]) + "</b>" : "")
      + (row[7] ? "<br>inputs (first call): " + esc(row[7]) : "");
  }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
                                                   "'": "&#39;" })[c]);
  }

  let current = 0;
  chart.addEventListener("mousemove", show);
  chart.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  chart.addEventListener("click", (e) => {
    const r = e.target.closest("rect");
    if (!r) return;
    if (r.hasAttribute("data-i")) render(Number(r.getAttribute("data-i")));
    else if (r.hasAttribute("data-pi")) render(Number(r.getAttribute("data-pi")));
  });
  document.getElementById("reset").addEventListener("click", () => render(0));
  let resized = null;
  window.addEventListener("resize", () => { clearTimeout(resized); resized = setTimeout(() => render(current), 100); });

  const legend = document.getElementById("legend");
  const used = new Set([...tree.map((row) => row[5]), ...tree.map((row) => row[9])].filter(Boolean));
  for (const [role, c] of Object.entries(data.colours)) {
    if (!used.has(role)) continue;
    const item = document.createElement("span");
    item.className = "item";
    item.innerHTML = "<span class=swatch style='background:" + c + "'></span>" + esc(role);
    legend.appendChild(item);
  }
  // the address may name a module to zoom into and one whose details to pin: report.html#focus=PATH&tip=PATH
  const wanted = new URLSearchParams(location.hash.slice(1));
  const focusOf = (w) => Math.max(w.has("focus") ? tree.findIndex((row) => row[1] === w.get("focus")) : 0, 0);
  render(focusOf(wanted));
  window.addEventListener("hashchange", () => {  // a link to #focus=PATH (a pipeline's components): zoom, show
    render(focusOf(new URLSearchParams(location.hash.slice(1))));
    document.getElementById("chart-section").scrollIntoView();
  });
  if (wanted.has("tip")) {
    const r = [...chart.querySelectorAll("rect.node")].find((x) => x.getAttribute("data-path") === wanted.get("tip"));
    if (r) {
      const box = r.getBoundingClientRect();
      show({ target: r, clientX: box.left + Math.min(box.width / 2, 40), clientY: box.bottom - 8 });
    }
  }
  document.body.setAttribute("data-rendered", String(chart.querySelectorAll("rect").length));
  document.body.setAttribute("data-render-ms", (performance.now() - started).toFixed(1));
  // from the start of navigation: the page read and parsed (the tables), the chart drawn
  document.body.setAttribute("data-drawn-ms", performance.now().toFixed(1));
})();
