"""The batched (vmap) backend: a round's clients trained as one stacked computation with the
reference loop's results. ``vmap`` splits a round into groups, ``stacked`` trains a group,
``schedule`` lays out the batches, ``functional`` makes BatchNorm and LSTM vmap-ready.
"""
