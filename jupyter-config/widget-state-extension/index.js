// A notebook whose widget state JupyterLab saved opens marked unsaved: jupyterlab_widgets'
// manager marks the notebook dirty whenever it registers a widget model (with "Save Widget
// State Automatically" on, flnotes' package default), and restoring the saved state, or the
// state of a running kernel after a reload, registers every model again. Nothing the student
// could lose has changed, so this plugin clears that mark: "unsaved" means the notebook's cells
// or metadata differ from the file as last loaded or saved, widget state aside. (So a change
// of widget state alone, with no output or cell changed, is not asked about on closing.)
//
// It needs no JupyterLab package of its own: a document widget extension (the application's
// document registry) is called for every notebook that opens.

function withoutWidgetState(model) {
  const notebook = model.toJSON();
  if (notebook.metadata) {
    delete notebook.metadata.widgets;
  }
  return JSON.stringify(notebook);
}

const watched = new WeakSet(); // contexts watched already (a second view shares one)

function watch(context) {
  if (watched.has(context)) {
    return;
  }
  watched.add(context);
  let onDisk = null; // the notebook as last loaded or saved, widget state aside
  const remember = () => {
    if (!context.model.dirty) { // never an unsaved edit taken for the file's content
      onDisk = withoutWidgetState(context.model);
    }
  };
  context.ready.then(remember);
  context.fileChanged.connect(remember); // after a save or a revert
  context.model.stateChanged.connect((model, change) => {
    if (change.name === 'dirty' && change.newValue && onDisk !== null
        && withoutWidgetState(model) === onDisk) {
      model.dirty = false;
    }
  });
}

module.exports = {
  id: 'flnotes-widget-state:plugin',
  description: 'A restored widget state does not mark the notebook unsaved.',
  autoStart: true,
  activate: (app) => {
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel, context) => {
        watch(context);
      }
    });
  }
};
