// forkpoint token view: heatmap text with hover cards, click-to-select, a keyboard cursor and keys (? lists
// them), n / p walking the positions where a flip changes the text (`data.matters`; tokens_html marks them in
// the HTML), and the switchboard's live re-flow: with `data.live` a click (or Enter) posts the switch, or in edit
// mode the typed text, to the app's live route (app/live.py) and the new continuation streams into the text in
// place, then the finished view.
// Streamlit calls this function on mount and again whenever `data` changes; state lives on the
// parent element so listeners are attached once. Model text is only ever set via textContent.

const NEXT_KEYS = new Set(["n", "j", "]"]);
const PREV_KEYS = new Set(["p", "k", "["]);
const NAV_KEYS = { b: -1, f: 1 }; // back / forward through the switch history (the app's switchboard)
const KEY_LIST = [
  ["← →  ↑ ↓", "move the token cursor"],
  ["Enter / Space", "flip the takeover at the cursor (edit mode: type there)"],
  ["n / p", "next / previous token where a flip changes the text (select mode: spike)"],
  ["b / f", "back / forward through the switch states (as the browser's Back / Forward)"],
  ["Escape", "close the hover card, the editor or this list"],
  ["?", "this list"],
];

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && a < 0.001) return Number(v).toExponential(2);
  return String(Number(Number(v).toPrecision(4)));
}

// Probabilities: 3 significant digits (1.31e-2 never reads 0.000), or log p in nats.
function fmtP(p, mode) {
  if (p === null || p === undefined) return "–";
  if (mode === "logprob") return p > 0 ? Math.log(p).toFixed(3) : "−inf";
  if (p === 0) return "0";
  if (p >= 0.9995 && p < 1) return `1−${(1 - p).toExponential(1)}`;
  if (p < 0.001) return Number(p).toExponential(2);
  return String(Number(Number(p).toPrecision(3)));
}

// A token quoted for the card; `bidi` (the payload's, core.settings.BIDI_CONTROLS) characters shown as \uXXXX:
// applied, an override would mirror the rest of the card's line.
function visible(s, bidi) {
  const q = JSON.stringify(String(s).replace(/\r/g, "␍").replace(/\n/g, "↵").replace(/\t/g, "⇥"));
  return bidi ? q.replace(new RegExp(`[${bidi}]`, "g"), (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`) : q;
}

function buildCard(card, hover, pos, mode) {
  card.replaceChildren();
  const src = hover.source[pos];
  card.appendChild(el("div", "fp-card-title", `#${pos + (hover.offset || 0)}  ${visible(hover.tokens[pos], hover.bidi)}  · ${src}`));
  const score = el("div", "fp-card-score", `${hover.score_name}: ${fmt(hover.score[pos])}`);
  card.appendChild(score);
  if (hover.tags && hover.tags[pos] && !["", "none", "execute", "execution", "other"].includes(hover.tags[pos])) {
    card.appendChild(el("div", "fp-card-tag", `tag: ${hover.tags[pos]}`));
  }
  if (hover.notes && hover.notes[pos]) {
    card.appendChild(el("div", "fp-card-note", `✎ ${hover.notes[pos]}`));  // textContent: never HTML
  }
  const fx = hover.effects && hover.effects[String(pos)];
  if (fx) {  // a measured takeover effect (core.instruments.effects): numbers only, set as text
    const signed = (v) => (v >= 0 ? "+" : "−") + Math.abs(Number(v)).toFixed(2);
    card.appendChild(el("div", "fp-card-fx", `effect ${signed(fx.effect)} [${signed(fx.ci_low)}, ${signed(fx.ci_high)}]`
      + ` · acc with ${Number(fx.acc_with).toFixed(2)} / without ${Number(fx.acc_without).toFixed(2)} · n = ${fx.n} per arm`));
  }
  const grid = el("div", "fp-card-metrics");
  for (const [name, values] of Object.entries(hover.metrics)) {
    grid.appendChild(el("span", "fp-m-label", hover.labels[name] || name));
    grid.appendChild(el("span", "fp-m-value", fmt(values[pos])));
  }
  const tops = el("div", "fp-card-tops");
  const emitted = hover.ids[pos];
  for (const side of ["base", "reason"]) {
    const col = el("table", `fp-top fp-top-${side}`);
    const head = el("tr");
    head.appendChild(el("th", null, `${side} top-${hover.top[side][pos].length}`));
    head.appendChild(el("th", null, mode === "logprob" ? "log p" : "p"));
    col.appendChild(head);
    hover.top[side][pos].forEach((id, j) => {
      const row = el("tr", id === emitted ? "emitted" : "alt");
      row.dataset.token = String(id); // a click forces this token here (the switchboard)
      row.title = id === emitted ? "the emitted token" : "click: force this token here";
      row.appendChild(el("td", "fp-top-tok", visible(hover.vocab[String(id)] ?? `#${id}`, hover.bidi)));
      row.appendChild(el("td", "fp-top-p", fmtP(hover.prob[side][pos][j], mode)));
      col.appendChild(row);
    });
    tops.appendChild(col);
  }
  card.appendChild(tops); // the clickable alternatives first: a short window keeps them, the metrics scroll
  card.appendChild(grid);
}

// The card stays inside the token view's box, left to right (the switch list sits to its right) and never
// above its top (the page's header is there): below the token, else above it, else where it fits best.
function placeCard(card, target, box) {
  const r = target.getBoundingClientRect();
  const b = box.getBoundingClientRect();
  const minTop = Math.max(4, b.top), maxBottom = window.innerHeight - 4;
  card.style.maxWidth = `${Math.max(240, Math.min(560, b.width))}px`;
  card.style.maxHeight = "";
  card.hidden = false;
  const w = card.offsetWidth;
  let h = card.offsetHeight;
  const below = maxBottom - (r.bottom + 6), above = r.top - 6 - minTop;
  let top;
  if (h <= below) top = r.bottom + 6;
  else if (h <= above) top = r.top - h - 6;
  else if (below >= above) { top = r.bottom + 6; card.style.maxHeight = `${Math.max(80, below)}px`; }
  else { h = Math.max(80, above); card.style.maxHeight = `${h}px`; top = r.top - h - 6; }
  const right = Math.min(window.innerWidth - 4, b.right);
  const left = Math.max(Math.max(4, b.left), Math.min(r.left, right - w));
  card.style.left = `${left}px`;
  card.style.top = `${Math.max(minTop, top)}px`;
}

// The token at the same height, one line up or down, nearest in x (for ↑ ↓).
function lineNeighbour(nodes, from, dir) {
  const r = from.getBoundingClientRect();
  const cx = (r.left + r.right) / 2;
  let bestTop = null, best = null, bestDx = Infinity;
  for (const node of nodes) {
    const q = node.getBoundingClientRect();
    if (!q.width && !q.height) continue;
    const onNext = dir > 0 ? q.top >= r.bottom - 2 : q.bottom <= r.top + 2;
    if (!onNext) continue;
    const lineTop = dir > 0 ? q.top : q.bottom;
    if (bestTop !== null && (dir > 0 ? lineTop > bestTop + 2 : lineTop < bestTop - 2)) continue;
    if (bestTop === null || (dir > 0 ? lineTop < bestTop - 2 : lineTop > bestTop + 2)) { bestTop = lineTop; best = null; bestDx = Infinity; }
    const dx = Math.abs((q.left + q.right) / 2 - cx);
    if (dx < bestDx) { bestDx = dx; best = node; }
  }
  return best;
}

function typingIn(event) {
  const t = event.composedPath ? event.composedPath()[0] : event.target;
  if (!t || !t.tagName) return false;
  const tag = t.tagName.toLowerCase();
  return tag === "input" || tag === "textarea" || tag === "select" || t.isContentEditable;
}

export default function (component) {
  const { data, setTriggerValue, parentElement } = component;
  let s = parentElement.__fp;
  if (!s) {
    s = { version: null, sel: null, cur: null };
    const wrap = el("div", "fp-view");
    const help = el("div", "fp-help", "");
    const outcome = el("div", "fp-outcome", "");
    const note = el("div", "fp-note", "");
    note.hidden = true;
    note.setAttribute("role", "status");
    const keys = el("div", "fp-keys");
    keys.hidden = true;
    KEY_LIST.forEach(([k, what]) => { keys.append(el("kbd", null, k), el("span", null, what)); });
    const scroller = el("div", "fp-scroll");
    scroller.setAttribute("tabindex", "0");
    const card = el("div", "fp-card");
    card.hidden = true;
    card.setAttribute("role", "tooltip");
    wrap.append(help, keys, outcome, note, scroller);
    parentElement.append(wrap, card);
    Object.assign(s, { wrap, help, outcome, note, keys, scroller, card });

    s.node = (pos) => s.scroller.querySelector(`[data-pos="${pos}"]`);
    s.say = (text) => { s.note.textContent = text || ""; s.note.hidden = !text; };
    s.mark = (pos, scroll) => {
      const prev = s.scroller.querySelectorAll(".tok.sel");
      prev.forEach((node) => node.classList.remove("sel"));
      s.sel = pos;
      if (pos === null || pos === undefined) return;
      const node = s.node(pos);
      if (!node) return;
      node.classList.add("sel");
      if (scroll) node.scrollIntoView({ block: "nearest", inline: "nearest" });
    };
    // the keyboard's token cursor (drawn apart from the selection, which Python owns)
    s.cursor = (pos) => {
      s.scroller.querySelectorAll(".tok.cur").forEach((node) => node.classList.remove("cur"));
      s.cur = pos;
      const node = pos === null || pos === undefined ? null : s.node(pos);
      if (node) { node.classList.add("cur"); node.scrollIntoView({ block: "nearest", inline: "nearest" }); }
    };
    s.select = (pos, key = false) => {
      s.mark(pos, true);
      s.cursor(pos);
      s.setTrigger("click", key ? { pos, key: true } : { pos }); // n / p only select, never flip
    };
    // a click (or Enter) on a token: what the mode says
    s.act = (pos) => {
      s.card.hidden = true; // the response may re-flow under the pointer
      s.cursor(pos);
      const mode = s.data.mode || "select";
      if (mode === "edit") { s.edit(pos); return; }
      if (mode === "flip" && s.data.live) { s.liveSwitch(pos, null, null); return; }
      s.select(pos);
    };
    // edit and continue: a text box at the token; Enter sends the text (it replaces the text from there on)
    s.closeEdit = () => {
      if (s.editor) s.editor.remove();
      s.editor = null;
      s.scroller.querySelectorAll(".fp-cut").forEach((node) => node.classList.remove("fp-cut"));
    };
    s.edit = (pos) => {
      s.closeEdit();
      const node = s.node(pos);
      if (!node) return;
      const box = el("input", "fp-edit");
      box.type = "text";
      if (s.data.max_typed) box.maxLength = s.data.max_typed; // the most one edit takes (app/live.py MAX_TYPED)
      box.placeholder = "type, Enter";
      box.setAttribute("aria-label", `text from token #${pos}`);
      node.before(box);
      s.scroller.querySelectorAll("[data-pos]").forEach((n) => { if (Number(n.dataset.pos) >= pos) n.classList.add("fp-cut"); });
      s.editor = box;
      box.addEventListener("paste", (e) => {  // the box keeps maxLength characters: say so rather than cut quietly
        const pasted = (e.clipboardData && e.clipboardData.getData("text")) || "";
        if (box.maxLength > 0 && box.value.length + pasted.length > box.maxLength) {
          s.say(`Pasted text cut to ${box.maxLength.toLocaleString("en")} characters (the most one edit takes)`);
        }
      });
      box.addEventListener("keydown", (e) => {
        if (e.key === "Escape") { e.preventDefault(); s.closeEdit(); s.scroller.focus(); return; }
        if (e.key !== "Enter") return;
        e.preventDefault();
        const text = box.value;
        if (!text) { s.say(`Type the text to write from #${pos} first (Escape cancels)`); return; }
        s.say("");
        s.closeEdit();
        if (s.data.live) s.liveSwitch(pos, null, text);
        else s.setTrigger("click", { pos, text });
      });
      box.focus();
    };
    // a switch over the live route: the text from `start` on is replaced by the streamed tokens (in place: the
    // stream sits where the old text did), then by the finished trace's view; Streamlit hears of the stored
    // child last (its fragment run updates the rest of the page). Without the route, or on any failure, the
    // click goes the rerun way.
    s.reflow = (start) => {
      s.card.hidden = true;
      const stream = el("span", "fp-live");
      const nodes = [...s.scroller.querySelectorAll("[data-pos]")];
      const anchor = nodes.find((node) => Number(node.dataset.pos) >= start);
      if (anchor) anchor.before(stream);
      else (s.scroller.querySelector(".fp-heatmap .seg:last-of-type") || s.scroller.querySelector(".fp-heatmap") || s.scroller).append(stream);
      nodes.forEach((node) => { if (Number(node.dataset.pos) >= start) node.remove(); });
      s.streamDrawn = false; // set at the next frame: the streamed text has been drawn at least once
      requestAnimationFrame(() => { s.streamDrawn = true; });
      s.streamed = 0;
      s.outcome.textContent = "… writing";
      s.outcome.hidden = false;
      return stream;
    };
    s.draw = (html, version) => {
      s.scroller.innerHTML = html; // escaped server-side by core.views.heatmap.tokens_html
      s.version = version;
      s.editor = null;
      if (s.cur !== null && s.cur !== undefined) s.cursor(s.cur);
    };
    s.finish = (view, pos) => {
      s.data = { ...s.data, ...view, live: { ...s.data.live, key: view.key } };
      s.draw(view.html, view.version);
      s.outcome.textContent = view.outcome || "";
      s.outcome.hidden = !view.outcome;
      s.scroller.dataset.key = view.key;
      s.sel = null;
      s.mark(pos, false);
    };
    s.frame = () => new Promise((go) => { requestAnimationFrame(() => go()); setTimeout(go, 50); });
    s.liveSwitch = async (pos, token, text) => {
      if (s.busy) return;
      const live = s.data.live;
      const ask = { pos };
      if (token !== null && token !== undefined) ask.token = token;
      if (text) ask.text = text;
      const rerun = () => s.setTrigger("click", ask);
      s.busy = true;
      s.say("");
      s.mark(pos, false);
      const before = s.data; // drawn again if the switch fails, even after its view came (not stored)
      const restore = () => {
        s.data = before;
        s.draw(before.html, before.version);
        s.scroller.dataset.key = before.key || "";
        s.outcome.textContent = before.outcome || "";
        s.outcome.hidden = !before.outcome;
        s.sel = null;
        s.mark(pos, false);
      };
      let stream = null, drawn = false, failed = false;
      try {
        const res = await fetch(live.url, {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ session: live.session, key: live.key, pos, token: ask.token ?? null, text: text || null }),
        });
        if (!res.ok || !res.body) { rerun(); return; }
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += decoder.decode(value, { stream: true });
          let nl;
          while ((nl = buf.indexOf("\n")) >= 0) {
            const msg = JSON.parse(buf.slice(0, nl));
            buf = buf.slice(nl + 1);
            if ("start" in msg) stream = s.reflow(msg.start);
            else if ("text" in msg && stream) {
              stream.append(document.createTextNode(msg.text));
              s.streamed += 1;
              s.outcome.textContent = `… writing: ${s.streamed} new token${s.streamed === 1 ? "" : "s"}`;
            }
            else if ("done" in msg) {
              // the streamed text is drawn at least once, even when it arrived with the finished view
              if (stream && !s.streamDrawn) await s.frame();
              s.finish(msg.view, pos);
              drawn = true;
            }
            else if ("note" in msg) s.say(msg.note); // e.g. typed text that did not all fit
            else if ("stored" in msg) {
              await s.frame(); // the new view is painted before Streamlit's run for the rest of the page starts
              s.setTrigger("click", { opened: msg.stored, pos });
            }
            else if ("same" in msg) { // a switch that changes no token: no new trace, no history step
              failed = true;
              if (stream) restore();
              s.say(`#${pos}: ${msg.same}`);
              // the page's token panel follows the click (a selection, never a flip), and keeps the line
              s.setTrigger("click", { pos, key: true, same: `#${pos}: ${msg.same}` });
            }
            else if ("error" in msg) {
              failed = true;
              restore();
              s.outcome.textContent = `Could not switch: ${msg.error}`;
              s.outcome.hidden = false;
            }
          }
        }
        if (!drawn && !failed) { restore(); rerun(); } // the stream ended early: the Streamlit way instead
      } catch (err) {
        restore();
        if (!drawn) rerun(); // the route failed: the same switch through a Streamlit rerun
      } finally {
        s.busy = false;
      }
    };
    // the card stays while the pointer moves into it, so an alternative in its top-k can be clicked; after a
    // click it stays closed until the pointer moves on (the text re-flows under a still pointer)
    s.hideSoon = () => { clearTimeout(s.hideTimer); s.hideTimer = setTimeout(() => { s.card.hidden = true; }, 250); };
    // the quiet point outlives a re-render (a rerun re-mounts the view under the still pointer, and its
    // mouseover must not bring the card back over what lies below the text, such as the score plot)
    s.quiet = window.__fpQuiet || null;
    const hush = (e) => { s.card.hidden = true; s.quiet = window.__fpQuiet = { x: e.clientX, y: e.clientY }; };
    s.hover = (e) => {
      const target = e.target.closest ? e.target.closest("[data-pos]") : null;
      if (!target || !s.data || s.quiet || s.editor) return;
      clearTimeout(s.hideTimer);
      s.cardPos = Number(target.dataset.pos);
      buildCard(s.card, s.data.hover, s.cardPos - (s.data.offset || 0), s.data.prob_mode);
      placeCard(s.card, target, s.wrap);
    };
    scroller.addEventListener("pointermove", (e) => {
      if (s.quiet && Math.hypot(e.clientX - s.quiet.x, e.clientY - s.quiet.y) > 8) {
        s.quiet = window.__fpQuiet = null;
        s.hover(e); // the pointer moved on: the card of the token it is over
      }
    });
    scroller.addEventListener("mouseover", s.hover);
    scroller.addEventListener("mouseleave", () => s.hideSoon());
    card.addEventListener("mouseenter", () => clearTimeout(s.hideTimer));
    card.addEventListener("mouseleave", () => s.hideSoon());
    card.addEventListener("click", (e) => {
      const row = e.target.closest ? e.target.closest("tr[data-token]") : null;
      if (!row || row.classList.contains("emitted") || s.cardPos === undefined) return;
      hush(e);
      if (s.data.live) { s.liveSwitch(s.cardPos, Number(row.dataset.token), null); return; }
      s.mark(s.cardPos, false);
      s.setTrigger("click", { pos: s.cardPos, token: Number(row.dataset.token) });
    });
    scroller.addEventListener("scroll", () => { s.card.hidden = true; });
    scroller.addEventListener("click", (e) => {
      if (e.target.closest && e.target.closest(".fp-edit")) return;
      const target = e.target.closest ? e.target.closest("[data-pos]") : null;
      if (!target) return;
      hush(e);
      s.act(Number(target.dataset.pos));
    });
    // several views in one page (a notebook, a branch beside its original): n / p go to the view the
    // user last pointed at or clicked, not to whichever registered first
    const activate = () => { window.__fpActiveView = s; };
    scroller.addEventListener("mouseenter", activate);
    scroller.addEventListener("focus", activate);
    scroller.addEventListener("pointerdown", activate);
    s.range = () => {
      const lo = s.data.offset || 0;
      return [lo, lo + (s.data.n || 0) - 1];
    };
    s.onKey = (e) => {
      if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || typingIn(e) || !s.data) return;
      const active = window.__fpActiveView;
      if (active && active !== s && active.scroller && active.scroller.isConnected) return;
      const key = e.key;
      if (key === "Escape") {
        s.card.hidden = true;
        s.keys.hidden = true;
        s.closeEdit();
        return;
      }
      if (key === "?") { e.preventDefault(); s.keys.hidden = !s.keys.hidden; return; }
      if (key in NAV_KEYS) {
        e.preventDefault();
        const step = NAV_KEYS[key], nav = s.data.nav || {};
        if (s.data.history) { // the app: the browser's own history (app/state.py follows the URL)
          // Back only while there is a switch state before this one (not out of the Trace page); Forward
          // always: the browser has nothing forward, or the state this Back came from (even before the
          // page has caught up with that Back)
          if (step > 0) window.history.forward();
          else if (nav.back) window.history.back();
          return;
        }
        s.setTrigger("click", { nav: step });
        return;
      }
      const [lo, hi] = s.range();
      if (key === "ArrowLeft" || key === "ArrowRight" || key === "ArrowUp" || key === "ArrowDown") {
        if (hi < lo) return;
        e.preventDefault();
        s.card.hidden = true;
        const here = s.cur ?? s.sel;
        if (here === null || here === undefined) { s.cursor(lo); return; }
        let to = here;
        if (key === "ArrowLeft") to = Math.max(lo, here - 1);
        else if (key === "ArrowRight") to = Math.min(hi, here + 1);
        else {
          const from = s.node(here);
          const next = from && lineNeighbour(s.scroller.querySelectorAll("[data-pos]"), from, key === "ArrowDown" ? 1 : -1);
          if (next) to = Number(next.dataset.pos);
        }
        s.cursor(to);
        return;
      }
      if (key === "Enter" || key === " ") {
        const here = s.cur ?? s.sel;
        if (here === null || here === undefined || s.busy) return;
        e.preventDefault(); // Space would scroll the page
        s.act(here);
        return;
      }
      if (!NEXT_KEYS.has(key) && !PREV_KEYS.has(key)) return;
      const walk = (s.data.mode === "flip" || s.data.mode === "edit") ? (s.data.matters || []) : (s.data.spikes || []);
      if (!walk.length) return;
      const cur = s.cur ?? s.sel ?? -1;
      let pos;
      if (NEXT_KEYS.has(key)) pos = walk.find((p) => p > cur) ?? walk[0];
      else pos = [...walk].reverse().find((p) => p < cur) ?? walk[walk.length - 1];
      e.preventDefault();
      s.select(pos, true);
    };
    document.addEventListener("keydown", s.onKey);
    s.cleanup = () => {
      document.removeEventListener("keydown", s.onKey);
      if (window.__fpActiveView === s) window.__fpActiveView = null;
      delete parentElement.__fp;
    };
    parentElement.__fp = s;
  }
  s.data = data;
  s.setTrigger = setTriggerValue;
  s.help.textContent = data.help || "Hover a token for both models' top-k · click to select · n / p: next / previous spike · ? keys";
  if (data.go && data.go.id !== s.goDone) { // a back / forward button: the browser's history moves, the URL follows
    s.goDone = data.go.id;
    window.history.go(data.go.step);
  }
  if (s.busy) return s.cleanup; // a live switch is drawing: its own finish puts the new view in place
  s.outcome.textContent = data.outcome || "";
  s.outcome.hidden = !data.outcome;
  if (data.note) s.say(data.note);
  else if (s.scroller.dataset.key !== (data.key || "")) s.say("");
  s.scroller.dataset.key = data.key || "";
  s.scroller.dataset.mode = data.mode || "";
  if (data.height) s.scroller.style.maxHeight = `${data.height}px`;
  if (s.version !== data.version) {
    s.card.hidden = true;
    s.sel = null;
    s.draw(data.html, data.version);
  }
  const wanted = data.selected === undefined ? null : data.selected;
  if (wanted !== s.sel) s.mark(wanted, true);
  s.scroller.dataset.selected = wanted === null ? "" : String(wanted);
  if (data.charts_waiting && s.saidDrawn !== data) { // the app holds its charts back until the text is on screen
    s.saidDrawn = data;
    requestAnimationFrame(() => s.setTrigger("click", { drawn: true }));
  }
  return s.cleanup;
}
