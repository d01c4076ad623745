// forkpoint token view: heatmap text with hover cards, click-to-select and n/p spike keys, and the
// switchboard's live re-flow: with `data.live` a click posts the switch to the app's live route
// (app/live.py) and the new continuation streams into the text in place, then the finished view.
// Streamlit calls this function on mount and again whenever `data` changes; state lives on the
// parent element so listeners are attached once. Model text is only ever set via textContent.

const NEXT_KEYS = new Set(["n", "j", "]"]);
const PREV_KEYS = new Set(["p", "k", "["]);
const NAV_KEYS = { b: -1, f: 1 }; // back / forward through the switch history (the app's switchboard)

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

function visible(s) {
  return JSON.stringify(String(s).replace(/\r/g, "␍").replace(/\n/g, "↵").replace(/\t/g, "⇥"));
}

function buildCard(card, hover, pos, mode) {
  card.replaceChildren();
  const src = hover.source[pos];
  card.appendChild(el("div", "fp-card-title", `#${pos + (hover.offset || 0)}  ${visible(hover.tokens[pos])}  · ${src}`));
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
  card.appendChild(grid);
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
      row.appendChild(el("td", "fp-top-tok", visible(hover.vocab[String(id)] ?? `#${id}`)));
      row.appendChild(el("td", "fp-top-p", fmtP(hover.prob[side][pos][j], mode)));
      col.appendChild(row);
    });
    tops.appendChild(col);
  }
  card.appendChild(tops);
}

function placeCard(card, target) {
  const r = target.getBoundingClientRect();
  card.hidden = false;
  const w = card.offsetWidth, h = card.offsetHeight;
  let left = Math.min(r.left, window.innerWidth - w - 8);
  let top = r.bottom + 6;
  if (top + h > window.innerHeight - 4) top = Math.max(4, r.top - h - 6);
  card.style.left = `${Math.max(4, left)}px`;
  card.style.top = `${top}px`;
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
    s = { version: null, sel: null };
    const wrap = el("div", "fp-view");
    const help = el("div", "fp-help", "");
    const outcome = el("div", "fp-outcome", "");
    const scroller = el("div", "fp-scroll");
    scroller.setAttribute("tabindex", "0");
    const card = el("div", "fp-card");
    card.hidden = true;
    card.setAttribute("role", "tooltip");
    wrap.append(help, outcome, scroller);
    parentElement.append(wrap, card);
    s.help = help;
    s.outcome = outcome;
    s.scroller = scroller;
    s.card = card;

    s.mark = (pos, scroll) => {
      const prev = s.scroller.querySelectorAll(".tok.sel");
      prev.forEach((node) => node.classList.remove("sel"));
      s.sel = pos;
      if (pos === null || pos === undefined) return;
      const node = s.scroller.querySelector(`[data-pos="${pos}"]`);
      if (!node) return;
      node.classList.add("sel");
      if (scroll) node.scrollIntoView({ block: "nearest", inline: "nearest" });
    };
    s.select = (pos, key = false) => {
      s.mark(pos, true);
      s.setTrigger("click", key ? { pos, key: true } : { pos }); // n / p only select, never flip
    };
    // a switch over the live route: the text from `start` on is replaced by the streamed tokens, then by
    // the finished trace's view; Streamlit hears of the stored child last (its fragment run updates the
    // rest of the page). Without the route, or on any failure, the click goes the rerun way.
    s.reflow = (start) => {
      s.card.hidden = true;
      s.scroller.querySelectorAll("[data-pos]").forEach((node) => {
        if (Number(node.dataset.pos) >= start) node.remove();
      });
      const host = s.scroller.querySelector(".fp-heatmap") || s.scroller;
      const stream = el("span", "fp-live");
      host.append(stream);
      s.streamDrawn = false; // set at the next frame: the streamed text has been drawn at least once
      requestAnimationFrame(() => { s.streamDrawn = true; });
      s.outcome.textContent = "…";
      s.outcome.hidden = false;
      return stream;
    };
    s.finish = (view, pos) => {
      s.data = { ...s.data, ...view, live: { ...s.data.live, key: view.key } };
      s.scroller.innerHTML = view.html; // escaped server-side by core.views.heatmap.tokens_html
      s.version = view.version;
      s.outcome.textContent = view.outcome || "";
      s.outcome.hidden = !view.outcome;
      s.scroller.dataset.key = view.key;
      s.sel = null;
      s.mark(pos, false);
    };
    s.frame = () => new Promise((go) => { requestAnimationFrame(() => go()); setTimeout(go, 50); });
    s.liveSwitch = async (pos, token) => {
      if (s.busy) return;
      const live = s.data.live;
      const rerun = () => s.setTrigger("click", token === null ? { pos } : { pos, token });
      s.busy = true;
      s.mark(pos, false);
      const before = s.data; // drawn again if the switch fails, even after its view came (not stored)
      const restore = () => {
        s.data = before;
        s.scroller.innerHTML = before.html;
        s.version = before.version;
        s.scroller.dataset.key = before.key || "";
        s.outcome.textContent = before.outcome || "";
        s.sel = null;
        s.mark(pos, false);
      };
      let stream = null, drawn = false, failed = false;
      try {
        const res = await fetch(live.url, {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ session: live.session, key: live.key, pos, token }),
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
            else if ("text" in msg && stream) stream.append(document.createTextNode(msg.text));
            else if ("done" in msg) {
              // the streamed text is drawn at least once, even when it arrived with the finished view
              if (stream && !s.streamDrawn) await s.frame();
              s.finish(msg.view, pos);
              drawn = true;
            }
            else if ("stored" in msg) {
              await s.frame(); // the new view is painted before Streamlit's run for the rest of the page starts
              s.setTrigger("click", { opened: msg.stored, pos });
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
    // the card stays while the pointer moves into it, so an alternative in its top-k can be clicked
    s.hideSoon = () => { clearTimeout(s.hideTimer); s.hideTimer = setTimeout(() => { s.card.hidden = true; }, 250); };
    scroller.addEventListener("mouseover", (e) => {
      const target = e.target.closest ? e.target.closest("[data-pos]") : null;
      if (!target || !s.data) return;
      clearTimeout(s.hideTimer);
      s.cardPos = Number(target.dataset.pos);
      buildCard(s.card, s.data.hover, s.cardPos - (s.data.offset || 0), s.data.prob_mode);
      placeCard(s.card, target);
    });
    scroller.addEventListener("mouseleave", () => s.hideSoon());
    card.addEventListener("mouseenter", () => clearTimeout(s.hideTimer));
    card.addEventListener("mouseleave", () => s.hideSoon());
    card.addEventListener("click", (e) => {
      const row = e.target.closest ? e.target.closest("tr[data-token]") : null;
      if (!row || row.classList.contains("emitted") || s.cardPos === undefined) return;
      s.card.hidden = true;
      if (s.data.live) { s.liveSwitch(s.cardPos, Number(row.dataset.token)); return; }
      s.mark(s.cardPos, false);
      s.setTrigger("click", { pos: s.cardPos, token: Number(row.dataset.token) });
    });
    scroller.addEventListener("scroll", () => { s.card.hidden = true; });
    scroller.addEventListener("click", (e) => {
      const target = e.target.closest ? e.target.closest("[data-pos]") : null;
      if (!target) return;
      s.card.hidden = true; // the response may re-flow under the pointer
      if (s.data.live) { s.liveSwitch(Number(target.dataset.pos), null); return; }
      s.select(Number(target.dataset.pos));
    });
    // several views in one page (a notebook, a branch beside its original): n / p go to the view the
    // user last pointed at or clicked, not to whichever registered first
    const activate = () => { window.__fpActiveView = s; };
    scroller.addEventListener("mouseenter", activate);
    scroller.addEventListener("focus", activate);
    scroller.addEventListener("pointerdown", activate);
    s.onKey = (e) => {
      if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || typingIn(e) || !s.data) return;
      const active = window.__fpActiveView;
      if (active && active !== s && active.scroller && active.scroller.isConnected) return;
      const key = e.key;
      if (key in NAV_KEYS) {
        e.preventDefault();
        s.setTrigger("click", { nav: NAV_KEYS[key] });
        return;
      }
      if (!NEXT_KEYS.has(key) && !PREV_KEYS.has(key)) return;
      const spikes = s.data.spikes || [];
      if (!spikes.length) return;
      const cur = s.sel === null || s.sel === undefined ? -1 : s.sel;
      let pos;
      if (NEXT_KEYS.has(key)) pos = spikes.find((p) => p > cur) ?? spikes[0];
      else pos = [...spikes].reverse().find((p) => p < cur) ?? spikes[spikes.length - 1];
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
  s.help.textContent = data.help || "Hover a token for both models' top-k · click to select · n / p: next / previous spike";
  if (s.busy) return s.cleanup; // a live switch is drawing: its own finish puts the new view in place
  s.outcome.textContent = data.outcome || "";
  s.outcome.hidden = !data.outcome;
  s.scroller.dataset.key = data.key || "";
  if (data.height) s.scroller.style.maxHeight = `${data.height}px`;
  if (s.version !== data.version) {
    s.scroller.innerHTML = data.html; // escaped server-side by core.views.heatmap.tokens_html
    s.version = data.version;
    s.card.hidden = true;
    s.sel = null;
  }
  const wanted = data.selected === undefined ? null : data.selected;
  if (wanted !== s.sel) s.mark(wanted, true);
  s.scroller.dataset.selected = wanted === null ? "" : String(wanted);
  return s.cleanup;
}
