// forkpoint notebook widget (anywidget front end). core/notebook/widget.py appends this to the app's
// core/views/token_view.js, whose default export is renamed `fpTokenView`: the token view, hover
// cards and spike keys are that one renderer. This file only adds the notebook's controls around it:
// metric selector, take-over choices, notes, the branch beside the original and the branch tree.
// Model text is only ever set via textContent (the heatmap HTML is escaped by core.views.heatmap).

function wEl(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function wRender({ model, el }) {
  const root = wEl("div", "fp-widget");
  const bar = wEl("div", "fp-w-bar");
  const scoreLabel = wEl("label", "fp-w-label", "colour by ");
  const scoreSel = wEl("select", "fp-w-score");
  scoreLabel.append(scoreSel);
  const status = wEl("span", "fp-w-status");
  const flipLabel = wEl("label", "fp-w-label", " click flips the takeover ");
  const flip = wEl("input", "fp-w-flip");
  flip.type = "checkbox";
  flip.title = "On: a click on a token switches the reasoner's takeover there on or off (core.takeover)";
  flipLabel.prepend(flip);
  bar.append(scoreLabel, flipLabel, status);
  const pick = wEl("div", "fp-w-pick");
  const views = wEl("div", "fp-w-views");
  const notesBox = wEl("div", "fp-w-notes");
  const treeBox = wEl("div", "fp-w-tree");
  root.append(bar, pick, views, notesBox, treeBox);
  el.append(root);
  const mounts = [];
  let nonce = 0;

  function send(request) {
    nonce += 1;
    model.set("request", { ...request, n: nonce });
    model.save_changes();
  }

  function select(view, pos) {
    model.set("selected", { view, pos });
    model.save_changes();
  }

  function drawScores() {
    scoreSel.replaceChildren();
    for (const [name, label] of model.get("scores") || []) {
      const option = wEl("option", null, label);
      option.value = name;
      scoreSel.append(option);
    }
    scoreSel.value = model.get("score");
  }
  scoreSel.addEventListener("change", () => {
    model.set("score", scoreSel.value);
    model.save_changes();
  });

  function drawViews() {
    const list = model.get("views") || [];
    const sel = model.get("selected");
    while (mounts.length > list.length) {
      const m = mounts.pop();
      if (m.cleanup) m.cleanup();
      m.box.remove();
    }
    list.forEach((view, i) => {
      let m = mounts[i];
      if (!m) {
        m = { box: wEl("div", "fp-w-view"), title: wEl("div", "fp-w-title"), mount: wEl("div", "fp-w-mount") };
        m.box.append(m.title, m.mount);
        views.append(m.box);
        mounts[i] = m;
      }
      m.title.textContent = view.title;
      m.box.dataset.key = view.key || "";
      m.box.dataset.view = String(i);
      const selected = sel && sel.view === i ? sel.pos : null;
      m.cleanup = fpTokenView({
        data: { ...view.data, selected },
        parentElement: m.mount,
        setTriggerValue: (name, value) => {
          if (name !== "click" || !value || value.nav !== undefined) return;
          if (value.token !== undefined) send({ action: "force", view: i, pos: value.pos, token: value.token });
          else if (flip.checked) send({ action: "flip", view: i, pos: value.pos });
          else select(i, value.pos);
        },
      });
    });
    views.classList.toggle("fp-w-two", list.length > 1);
  }

  function drawPick() {
    pick.replaceChildren();
    const sel = model.get("selected");
    if (!sel) {
      pick.append(wEl("span", "fp-w-hint", "Click a token to branch there or to note it."));
      return;
    }
    pick.append(wEl("span", "fp-w-where", model.get("selection_label") || `token #${sel.pos}`));
    const choice = wEl("select", "fp-w-choice");
    (model.get("choices") || []).forEach(([label], j) => {
      const option = wEl("option", null, label);
      option.value = String(j);
      choice.append(option);
    });
    const go = wEl("button", "fp-w-branch", "branch here");
    go.type = "button";
    go.addEventListener("click", () => send({ action: "take_over", view: sel.view, pos: sel.pos, choice: Number(choice.value || 0) }));
    // edit and continue: type text at this token, the policy writes on from there (typed tokens are "forced")
    const typed = wEl("input", "fp-w-typed");
    typed.placeholder = "type here, Enter continues";
    typed.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && typed.value) send({ action: "edit", view: sel.view, pos: sel.pos, text: typed.value });
    });
    pick.append(choice, go, typed);
    if (model.get("can_note")) {
      const note = wEl("input", "fp-w-note");
      note.placeholder = "note on this token";
      const add = wEl("button", "fp-w-addnote", "add note");
      add.type = "button";
      add.addEventListener("click", () => {
        send({ action: "note", view: sel.view, pos: sel.pos, text: note.value });
        note.value = "";
      });
      pick.append(note, add);
    }
  }

  function drawNotes() {
    notesBox.replaceChildren();
    const notes = model.get("notes") || [];
    if (!notes.length) return;
    notesBox.append(wEl("div", "fp-w-head", "notes"));
    for (const note of notes) {
      const where = note.start === note.end ? `#${note.start}` : `#${note.start}–${note.end}`;
      const row = wEl("button", "fp-w-noterow", `${note.bookmark ? "🔖 " : ""}${where} (${note.title}): ${note.text}`);
      row.type = "button";
      row.addEventListener("click", () => select(note.view, note.start));
      notesBox.append(row);
    }
  }

  function drawTree() {
    treeBox.replaceChildren();
    const rows = model.get("tree") || [];
    if (rows.length < 2) return;
    treeBox.append(wEl("div", "fp-w-head", "branch tree"));
    for (const row of rows) {
      const node = wEl("button", `fp-w-node${row.shown ? " shown" : ""}`, row.label);
      node.type = "button";
      node.dataset.key = row.key;
      node.addEventListener("click", () => send({ action: "show", key: row.key }));
      treeBox.append(node);
    }
  }

  const onStatus = () => {
    status.textContent = model.get("status") || "";
    status.classList.toggle("fp-w-error", (model.get("status") || "").startsWith("error"));
  };
  const onSelected = () => { drawViews(); drawPick(); };
  const handlers = [
    ["change:scores", drawScores], ["change:score", drawScores], ["change:views", drawViews],
    ["change:selected", onSelected], ["change:choices", drawPick], ["change:selection_label", drawPick],
    ["change:notes", drawNotes], ["change:tree", drawTree], ["change:status", onStatus],
  ];
  handlers.forEach(([event, fn]) => model.on(event, fn));
  drawScores(); drawViews(); drawPick(); drawNotes(); drawTree(); onStatus();
  return () => {
    handlers.forEach(([event, fn]) => model.off(event, fn));
    mounts.forEach((m) => m.cleanup && m.cleanup());
  };
}

export default { render: wRender };
