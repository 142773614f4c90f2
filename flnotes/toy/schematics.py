"""The papers' method schematics, drawn for the teaching notebooks: FedMR's layer-wise
recombination (FedMR Figs. 4-5) from the method's own code, and FML's two models per client
(FML Figs. 1-2).

Pure functions: settings in, matplotlib Figure out. Colours come from the colour-blind-safe
palette of :mod:`flnotes.plots`, and every block also carries its number, so that nothing
is told by colour alone.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from flnotes.algorithms.fedmr import recombination_sources
from flnotes.plots import PALETTE
from flnotes.rng import torch_generator


def recombination_schematic(models: int = 4, layers: int = 5, segments: int = 0,
                            seed: int = 0) -> Figure:
    """FedMR's recombination (Sec. 4.2.2, Alg. 1 l.8): the K local models after training
    (left) and the K models the server sends next round (right), each layer (or FedMR-p
    segment) of each new model taken from one local model by a random permutation per
    layer. Drawn from :func:`flnotes.algorithms.fedmr.recombination_sources`, the code the
    method runs; block (l, j) on the right carries the number of its source model."""
    sources = recombination_sources(models, layers, segments,
                                    torch_generator(seed, "schematic")).tolist()
    fig, axes = plt.subplots(1, 2, figsize=(2.0 + 1.6 * models, 0.9 + 0.55 * layers))
    panels = [(axes[0], [list(range(models)) for _ in range(layers)],
               "local models after training"),
              (axes[1], sources, "recombined models, sent next round")]
    for ax, rows, title in panels:
        for layer, row in enumerate(rows):
            for model, source in enumerate(row):
                ax.add_patch(Rectangle((model + 0.08, layer + 0.1), 0.84, 0.8, gid="block",
                                       facecolor=PALETTE[source % len(PALETTE)],
                                       edgecolor="black", lw=0.6, alpha=0.85))
                ax.text(model + 0.5, layer + 0.5, str(source + 1), ha="center", va="center",
                        fontsize=9, color="white" if source % len(PALETTE) in (0, 3, 6)
                        else "black")
        ax.set(xlim=(0, models), ylim=(0, layers))
        ax.set_xticks([m + 0.5 for m in range(models)],
                      [f"model {m + 1}" for m in range(models)], fontsize=8)
        ax.set_yticks([lay + 0.5 for lay in range(layers)],
                      [f"layer {lay + 1}" for lay in range(layers)], fontsize=8)
        ax.tick_params(length=0)
        ax.spines[:].set_visible(False)
        ax.set_title(title, fontsize=10)
    how = "every layer" if segments == 0 else f"{segments} segments of layers"
    fig.suptitle(f"FedMR: a random permutation per unit ({how}); numbers: the source model",
                 fontsize=10)
    fig.tight_layout()
    return fig


def fml_schematic() -> Figure:
    """FML (Shen et al. 2023, Alg. 1 and Sec. 2): each client trains its personal model and a
    meme model forked from the global one side by side, each from the labels and from the
    other's predictions (deep mutual learning); only meme models go to the server, which
    averages them. Two clients shown."""
    fig, ax = plt.subplots(figsize=(9.0, 5.0))
    ax.set(xlim=(0, 10), ylim=(0, 6.3))
    ax.axis("off")

    def box(x, y, w, h, text, colour):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", gid="box",
                                    facecolor=colour, edgecolor="black", lw=0.8, alpha=0.9))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8.5)

    def arrow(start, end, style="-|>", rad=0.0):
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=11, lw=1,
                                     color="black", connectionstyle=f"arc3,rad={rad}",
                                     gid="arrow"))

    def label(x, y, text, **style):
        ax.text(x, y, text, ha="center", va="center", fontsize=7.5, **style)

    box(3.2, 5.1, 3.6, 0.9, "server: global model =\nmean of the meme models (Alg. 1 l.5)",
        "#d9d9d9")
    for k in (0, 1):
        x = 0.2 + 5.1 * k
        box(x, 2.4, 1.5, 1.0, "meme model\n(forked from\nthe global one)", PALETTE[5])
        box(x + 2.9, 2.4, 1.5, 1.0, "personal model\n(kept all run)", PALETTE[1])
        # each KL arrow points from the teacher's softmax to the student it trains
        arrow((x + 1.6, 3.15), (x + 2.8, 3.15))
        label(x + 2.2, 3.65, "KL(meme ‖ personal) × (1 − a)")
        arrow((x + 1.6, 2.65), (x + 2.8, 2.65), style="<|-")
        label(x + 2.2, 2.15, "KL(personal ‖ meme) × (1 − b)")
        label(x + 0.75, 1.7, "+ CE(labels) × b")
        label(x + 3.65, 1.7, "+ CE(labels) × a")
        label(x + 2.2, 1.2, f"client {k + 1}: its data and personal model never leave it",
              style="italic")
        arrow((x + 0.45, 3.5), (4.0 + 1.6 * k, 5.05), rad=-0.2)  # the meme goes up
        arrow((4.6 + 0.6 * k, 5.05), (x + 1.05, 3.5), rad=-0.2)  # the global comes down
    label(1.2, 4.55, "upload the meme\n(after local training)")
    label(8.75, 4.55, "fork the global model\nas the next meme")
    ax.text(5.0, 0.45, "Each round: both models step on the same batch, each from the labels "
            "(CE) and from the other's softmax (KL).", ha="center", fontsize=8)
    fig.suptitle("FML: a meme model and a personal model per client", fontsize=10)
    fig.tight_layout()
    return fig
