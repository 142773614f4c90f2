"""The method schematics (flnotes/toy/schematics.py): FedMR's recombination is drawn from the
method's own permutations, FML's diagram says which model learns from which."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from flnotes.algorithms.fedmr import recombination_sources  # noqa: E402
from flnotes.plots import PALETTE  # noqa: E402
from flnotes.rng import torch_generator  # noqa: E402
from flnotes.toy import schematics  # noqa: E402


def _blocks(ax) -> dict[tuple[int, int], tuple[str, str]]:
    """(layer, model) -> (face colour, number written on it)."""
    texts = {(round(t.get_position()[1] - 0.5), round(t.get_position()[0] - 0.5)): t.get_text()
             for t in ax.texts}
    return {(round(p.get_y() - 0.1), round(p.get_x() - 0.08)):
            (to_hex(p.get_facecolor()[:3]), texts[round(p.get_y() - 0.1),
                                                  round(p.get_x() - 0.08)])
            for p in ax.patches if p.get_gid() == "block"}


@pytest.mark.parametrize("models, layers, segments", [(4, 5, 0), (3, 6, 2)])
def test_the_recombination_schematic_is_fedmrs_own_permutation(models, layers, segments):
    fig = schematics.recombination_schematic(models, layers, segments, seed=7)
    left, right = fig.axes
    sources = recombination_sources(models, layers, segments,
                                    torch_generator(7, "schematic")).tolist()
    for (_, model), (colour, number) in _blocks(left).items():
        assert (colour, number) == (PALETTE[model], str(model + 1))
    drawn = _blocks(right)
    assert len(drawn) == models * layers
    for (layer, model), (colour, number) in drawn.items():
        assert (colour, number) == (PALETTE[sources[layer][model]], str(sources[layer][model] + 1))
    for layer in range(layers):  # every new model takes each layer from one local model
        assert sorted(int(drawn[layer, m][1]) for m in range(models)) == list(
            range(1, models + 1))
    if segments:  # FedMR-p: the layers of one segment move together
        assert len({tuple(row) for row in sources}) <= segments
    plt.close(fig)


def test_the_fml_schematic_names_each_loss_and_which_model_it_trains():
    fig = schematics.fml_schematic()
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    for words in ("KL(meme ‖ personal) × (1 − a)", "KL(personal ‖ meme) × (1 − b)",
                  "+ CE(labels) × a", "+ CE(labels) × b", "mean of the meme models"):
        assert sum(words in t for t in texts) >= 1, words
    arrows = [p for p in ax.patches if p.get_gid() == "arrow"]
    assert len(arrows) == 8  # per client: two KL arrows, the meme up, the global down
    plt.close(fig)
